package storage

import (
	"encoding/json"
	"fmt"
)

// NewInstance is an instance as its creation writes it: every step starts
// blocked, then the PlanFunc's answer is applied in memory, so that a store
// inserts each row once, in its final state, instead of inserting the steps
// and updating the ready ones in a second statement.
type NewInstance struct {
	Params *CreateParams
	// Status is pending; running when a root step waits for a signal (the
	// store sets its started_at); or finished when the plan finished the
	// instance at once (every step skipped, say); Output and Error go with
	// a finish.
	Status InstanceStatus
	Output json.RawMessage
	Error  string
	// Failing, with Status running, tells that the plan recorded a
	// Failure at once (Error, FailedStep): the onFailure steps run.
	Failing    bool
	FailedStep string
	// Steps is parallel to Params.Steps.
	Steps []NewStep
	// Events is the creation's history in order, instance.created first.
	Events []NewEvent
	// Deferred tells that the instance may not start yet (a delayed start,
	// a workflow concurrency limit; see PlanNew): the store marks it for
	// Store.StartDeferred, and the plans of it see InstanceState.Deferred
	// until then.
	Deferred bool
	// Parked tells that Admit held the instance because its key was full
	// when its time had come, not for a delayed start: the store parks it
	// for a finish of its key, which alone can admit it, and no sweep reads
	// it (see Store.StartDeferred).
	Parked bool
	// stepsDeferred is the plan's Plan.Deferred: it left ready steps
	// blocked, which StartAdmitted plans again.
	stepsDeferred bool
}

// NewStep is one step's state at creation.
type NewStep struct {
	Status StepStatus
	// Input is the resolved input of a pending or skipped step.
	Input json.RawMessage
	Error string
	// Items are the resolved inputs of an expanded forEach step (Status
	// running), one item row each; Output is the output of a step the plan
	// completed directly.
	Items  []json.RawMessage
	Output json.RawMessage
	// ConcurrencyKey is a pending step's StepChange.ConcurrencyKey.
	ConcurrencyKey string
	// Children are the child instances of a workflow step the plan
	// started (Status running), one per item for a forEach step: the
	// store creates them once the step's row (and items) exist.
	Children []CreateParams
}

// Finished reports whether the step ends with its creation (skipped, failed
// or cancelled), so its finished_at is the creation time.
func (s NewStep) Finished() bool {
	return s.Status != StepBlocked && s.Status != StepPending && s.Status != StepRunning && s.Status != StepWaiting
}

// NewEvent is one history entry of a creation.
type NewEvent struct {
	Step    string
	Type    EventType
	Message string
}

// PlanNew asks plan about a new instance whose steps are all blocked and
// returns the instance with the answer applied, after checking it the way a
// store checks any Plan. The state's LoadDefinition returns p.Definition
// (a definition stored by the same call is not in the table yet), or calls
// loadStored when p has none. The state is Deferred when p has a RunAfter
// or a workflow concurrency limit: whether the instance is held is decided
// after its plan (an instance the plan finishes at once takes no slot),
// and a RunAfter already past costs only an early StartDeferred (see
// StartAdmitted for one admitted at once). A child's RunAfter is its
// parent's (see ChildParams), which has come: a parent starts its
// children only once it may start.
func PlanNew(p *CreateParams, plan PlanFunc, loadStored func() ([]byte, error)) (*NewInstance, error) {
	return planNew(p, plan, loadStored, p.Parent == nil && !p.RunAfter.IsZero() || p.ConcurrencyLimit > 0 && p.ConcurrencyKey != "")
}

// StartAdmitted starts, as it creates them, the new instances deferred
// only for their workflow concurrency limit (no RunAfter) that the store
// admitted (not in held): it clears their mark, and plans again those
// whose plans left steps blocked, so that these start in the creating
// transaction as any other does, rather than at the next StartDeferred.
// loadStored is PlanNew's, by definition hash. An instance whose new plan
// would finish it while the first did not, or the other way round, keeps
// its first plan and its mark: its admission counted on it
// (StartDeferred starts it).
func StartAdmitted(instances []*NewInstance, held map[string]bool, plan PlanFunc, loadStored func(hash string) func() ([]byte, error)) error {
	for i, n := range instances {
		p := n.Params
		if !n.Deferred || held[p.ID] || p.Parent == nil && !p.RunAfter.IsZero() {
			continue
		}
		if !n.stepsDeferred {
			n.Deferred = false // nothing to start but what its claims start
			continue
		}
		m, err := planNew(p, plan, loadStored(p.DefinitionHash), false)
		if err != nil {
			return err
		}
		if m.Status.Finished() == n.Status.Finished() {
			instances[i] = m
		}
	}
	return nil
}

func planNew(p *CreateParams, plan PlanFunc, loadStored func() ([]byte, error), deferred bool) (*NewInstance, error) {
	loadDefinition := loadStored
	if len(p.Definition) > 0 {
		loadDefinition = func() ([]byte, error) { return p.Definition, nil }
	}
	n := &NewInstance{
		Params:   p,
		Status:   InstancePending,
		Steps:    make([]NewStep, len(p.Steps)),
		Events:   []NewEvent{{Type: EventInstanceCreated}},
		Deferred: deferred,
	}
	if p.Parent != nil {
		n.Events[0].Message = ChildCreatedMessage(p.Parent)
	}
	state := InstanceState{
		ID:             p.ID,
		Workflow:       p.Workflow,
		DefinitionHash: p.DefinitionHash,
		Status:         InstancePending,
		Input:          p.Input,
		Depth:          p.Depth,
		TraceParent:    p.TraceParent,
		Steps:          make([]StepState, len(p.Steps)),
		LoadDefinition: loadDefinition,
		Deferred:       deferred,
	}
	for i := range p.Steps {
		n.Steps[i].Status = StepBlocked
		state.Steps[i] = StepState{Name: p.Steps[i].Name, DependsOn: p.Steps[i].DependsOn, Status: StepBlocked}
	}
	pl, err := plan(&state)
	if err != nil {
		return nil, fmt.Errorf("plan instance %s: %w", p.ID, err)
	}
	if pl == nil {
		return n, nil
	}
	for _, c := range pl.Steps {
		i := stepIndex(p.Steps, c.Name)
		if i < 0 {
			return nil, fmt.Errorf("plan for instance %s names unknown step %q", p.ID, c.Name)
		}
		s := &n.Steps[i]
		if s.Status != StepBlocked {
			return nil, fmt.Errorf("plan for instance %s moves step %q to %s, but it is %s, not blocked", p.ID, c.Name, c.Status, s.Status)
		}
		switch c.Status {
		case StepPending:
			s.Input, s.ConcurrencyKey = c.Input, c.ConcurrencyKey
			n.event(c.Name, EventStepReady, "")
		case StepWaiting:
			// A new instance has no signals yet: the step waits.
			if err := CheckWait(p.ID, p.Steps[i].Wait != nil, c.Name); err != nil {
				return nil, err
			}
			s.Input = c.Input
			n.event(c.Name, EventStepReady, WaitingMessage(p.Steps[i].Wait.Signal))
			if n.Status == InstancePending {
				// A step that waits has started its instance, as a
				// claimed step would have.
				n.Status = InstanceRunning
				n.event("", EventInstanceStarted, "")
			}
		case StepSkipped:
			s.Input = c.Input
			n.event(c.Name, EventStepSkipped, "")
		case StepFailed:
			s.Error = c.Error
			n.event(c.Name, EventStepFailed, c.Error)
		case StepRunning:
			if len(c.Children) > 0 || p.Steps[i].Workflow != "" {
				if err := CheckChildren(p.ID, &p.Steps[i], c); err != nil {
					return nil, err
				}
				s.Input, s.Items, s.Children = c.Input, c.Items, c.Children
				if len(c.Items) > 0 {
					n.event(c.Name, EventStepReady, fmt.Sprintf("%d items", len(c.Items)))
				}
				n.event(c.Name, EventStepStarted, ChildrenStartedMessage(c.Children))
				if n.Status == InstancePending {
					// A step that starts a child has started its
					// instance, as a claimed step would have.
					n.Status = InstanceRunning
					n.event("", EventInstanceStarted, "")
				}
				break
			}
			if err := CheckExpansion(p.ID, &p.Steps[i], c); err != nil {
				return nil, err
			}
			s.Items = c.Items
			n.event(c.Name, EventStepReady, fmt.Sprintf("%d items", len(c.Items)))
		case StepCompleted:
			s.Output = c.Output
			n.event(c.Name, EventStepCompleted, "")
		default:
			return nil, fmt.Errorf("plan for instance %s moves step %q to %q: only pending, waiting (a wait step), running (a forEach expansion), completed, skipped or failed are allowed", p.ID, c.Name, c.Status)
		}
		s.Status = c.Status
	}
	if err := n.recordFailure(pl, &state); err != nil {
		return nil, err
	}
	if ic := pl.Instance; ic != nil {
		if !ic.Status.Finished() {
			return nil, fmt.Errorf("plan for instance %s sets status %q: only completed, failed or cancelled are allowed", p.ID, ic.Status)
		}
		n.Status, n.Output, n.Error = ic.Status, ic.Output, ic.Error
		if ic.FailedStep != "" {
			n.FailedStep = ic.FailedStep
		}
		for i := range n.Steps {
			if s := &n.Steps[i]; !s.Finished() {
				s.Status, s.Items, s.Children = StepCancelled, nil, nil
				n.event(p.Steps[i].Name, EventStepCancelled, ic.Error)
			}
		}
		n.event("", InstanceEventOf(ic.Status), ic.Error)
	}
	n.Deferred = deferred && !n.Status.Finished()
	n.stepsDeferred = pl.Deferred
	return n, nil
}

// recordFailure applies a Plan's Failure to a new instance: its main
// steps not yet finished are cancelled, and it runs its onFailure steps.
func (n *NewInstance) recordFailure(pl *Plan, state *InstanceState) error {
	f := pl.Failure
	if err := CheckFailure(n.Params.ID, pl, state); err != nil || f == nil {
		return err
	}
	for i := range n.Steps {
		if s := &n.Steps[i]; !n.Params.Steps[i].OnFailure && !s.Finished() {
			s.Status, s.Items = StepCancelled, nil
			n.event(n.Params.Steps[i].Name, EventStepCancelled, f.Error)
		}
	}
	if n.Status == InstancePending {
		n.Status = InstanceRunning
		n.event("", EventInstanceStarted, "")
	}
	n.Error, n.FailedStep, n.Failing = f.Error, f.Step, true
	n.event("", EventInstanceFailing, f.Error)
	return nil
}

func (n *NewInstance) event(step string, typ EventType, msg string) {
	n.Events = append(n.Events, NewEvent{Step: step, Type: typ, Message: msg})
}

func stepIndex(steps []StepSpec, name string) int {
	for i := range steps {
		if steps[i].Name == name {
			return i
		}
	}
	return -1
}

// InstanceEventOf is the event recording an instance's move to a finished
// status.
func InstanceEventOf(status InstanceStatus) EventType {
	switch status {
	case InstanceCompleted:
		return EventInstanceCompleted
	case InstanceFailed:
		return EventInstanceFailed
	case InstanceCancelled:
		return EventInstanceCancelled
	}
	return ""
}

// CheckExpansion checks a StepChange that expands a forEach step: the step
// must be one, and have at least one item (an empty list completes it).
func CheckExpansion(instanceID string, spec *StepSpec, c StepChange) error {
	if spec != nil && !spec.ForEach {
		return fmt.Errorf("plan for instance %s expands step %q, which is not a forEach step", instanceID, c.Name)
	}
	if len(c.Items) == 0 {
		return fmt.Errorf("plan for instance %s expands step %q into no items: complete it with output [] instead", instanceID, c.Name)
	}
	return nil
}

// CountItem adds n items of status to c.
func CountItem(c *ItemCounts, status StepStatus, n int) {
	c.Total += n
	switch status {
	case StepPending, StepBlocked:
		c.Pending += n
	case StepRunning:
		c.Running += n
	case StepCompleted:
		c.Completed += n
	case StepFailed:
		c.Failed += n
	case StepCancelled, StepSkipped:
		c.Cancelled += n
	}
}

// HoldItems counts n running items of c as pending: items of a forEach
// workflow step whose child instances wait to be admitted under their
// concurrency limit, so that nothing of theirs runs yet.
func HoldItems(c *ItemCounts, n int) {
	c.Running -= n
	c.Pending += n
}

// ForEachSteps returns the expanded forEach steps of instances for which
// keep holds, by row ID, and their IDs in order: what a backend fills in
// from the items (their counts, their children) with one query.
func ForEachSteps(instances []Instance, keep func(*Step) bool) (map[int64]*Step, []int64) {
	byID := map[int64]*Step{}
	var ids []int64
	for i := range instances {
		for j := range instances[i].Steps {
			if st := &instances[i].Steps[j]; st.Items != nil && keep(st) {
				byID[st.ID] = st
				ids = append(ids, st.ID)
			}
		}
	}
	return byID, ids
}
