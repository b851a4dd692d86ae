package dagrun

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/storage"
)

// plan is the engine's storage.PlanFunc: given an instance as it stands
// inside a store transaction, it decides which blocked steps are now ready
// (resolving their when and input expressions against the stored outputs),
// and whether the instance has finished. It is pure: it reads only its
// argument and the definition cache, so a store may call it under a write
// transaction and again on a retried transaction.
func (e *Engine) plan(state *storage.InstanceState) (*storage.Plan, error) {
	if state.Status.Finished() {
		// A failed or cancelled instance unblocks nothing; steps still
		// running finish their attempt and that is all.
		return &storage.Plan{}, nil
	}
	w, err := e.definition(state.DefinitionHash, state.LoadDefinition)
	var unparsable *unparsableSnapshotError
	if errors.As(err, &unparsable) {
		// An error would roll back every commit and every lease-recovery
		// batch that touches this instance, again and again, and hold up
		// the other results in them; failing the instance ends it, and a
		// version that can parse it can retry it.
		return &storage.Plan{Instance: &storage.InstanceChange{Status: storage.InstanceFailed, Error: err.Error()}}, nil
	}
	if err != nil {
		return nil, err
	}
	p := planner{w: w, state: state, engine: e, config: e.config, status: make(map[string]storage.StepStatus, len(state.Steps)), index: make(map[string]int, len(state.Steps))}
	for i, s := range state.Steps {
		p.status[s.Name] = s.Status
		p.index[s.Name] = i
	}
	return p.run()
}

type planner struct {
	w      *dag.Workflow
	state  *storage.InstanceState
	engine *Engine // the workflows a workflow step starts, and new IDs
	config *Config // the size limits
	status map[string]storage.StepStatus
	index  map[string]int

	input   any
	decoded bool
	outputs map[string]any
	errors  map[string]string          // of the steps this plan fails
	direct  map[string]json.RawMessage // outputs of the steps this plan completes (a forEach over [])
	usage   dag.Usage                  // of the expressions evaluated so far

	failedStep string           // the step outcome found failed for good
	failure    *storage.Failure // the instance's failure, for the onFailure steps
}

func (p *planner) run() (*storage.Plan, error) {
	if p.state.Failure != nil || p.state.TimedOut > 0 {
		return p.runFailure(), nil
	}
	plan := &storage.Plan{}
	p.promote(plan, p.w.TopologicalOrder())
	plan.Instance = p.outcome()
	return p.settle(plan), nil
}

// promote makes the blocked steps of order whose dependencies let them
// proceed ready (or skipped, failed, waiting, expanded), adding the
// changes to plan.
func (p *planner) promote(plan *storage.Plan, order []*dag.Step) {
	resolved := 0 // bytes of the inputs resolved so far
	// A pending or running step will bring another transition; only then
	// may ready steps be left for it (see MaxPlanInputBytes).
	later := false
	for _, s := range p.state.Steps {
		later = later || s.Status == storage.StepPending || s.Status == storage.StepRunning
	}
	// Topological order lets a skip cascade through a chain in one pass.
	for _, step := range order {
		if p.status[step.Name] != storage.StepBlocked || !p.ready(step) {
			continue
		}
		if p.state.Deferred && startsWithoutAWorker(step) {
			plan.Deferred = true
			continue
		}
		if later && (resolved >= p.config.MaxPlanInputBytes || p.usage.Steps >= int64(p.config.MaxPlanExprSteps)) {
			break
		}
		change := p.resolve(step)
		resolved += len(change.Input)
		for _, in := range change.Items {
			resolved += len(in)
		}
		later = later || change.Status == storage.StepPending || change.Status == storage.StepRunning
		p.status[step.Name] = change.Status
		if change.Status == storage.StepCompleted {
			if p.direct == nil {
				p.direct = map[string]json.RawMessage{}
			}
			p.direct[step.Name] = change.Output
		}
		if change.Error != "" {
			if p.errors == nil {
				p.errors = map[string]string{}
			}
			p.errors[step.Name] = change.Error
		}
		plan.Steps = append(plan.Steps, change)
	}
}

// startsWithoutAWorker reports whether making step ready starts its
// instance in the same transaction, with no claim: a wait step begins
// waiting (and takes signals), a workflow step starts its children, a
// forEach step is expanded into its items and runs (or, over an empty
// list, completes). An instance that may not start yet (a delayed start,
// a concurrency limit) leaves such steps to Store.StartDeferred; a step
// that runs a handler needs no such care, as its claim waits for the
// delay and the slot.
func startsWithoutAWorker(step *dag.Step) bool {
	return step.Wait != nil || step.Workflow != "" || step.ForEach != nil
}

// ready reports whether every dependency of step let it proceed.
func (p *planner) ready(step *dag.Step) bool {
	for _, dep := range step.DependsOn {
		switch p.status[dep] {
		case storage.StepCompleted, storage.StepSkipped:
		case storage.StepFailed:
			if !p.w.Step(dep).ContinueOnError {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// resolve evaluates a ready step's when and input. An expression that fails
// at run time fails the step for good: retrying cannot change the data it
// reads.
func (p *planner) resolve(step *dag.Step) storage.StepChange {
	var refs []string
	if step.Input != nil {
		refs = append(refs, step.Input.References()...)
	}
	if step.When != nil {
		refs = append(refs, step.When.References()...)
	}
	if step.ForEach != nil {
		refs = append(refs, step.ForEach.References()...)
	}
	refs = append(refs, keyReferences(step)...)
	env, err := p.env(refs)
	if err != nil {
		return storage.StepChange{Name: step.Name, Status: storage.StepFailed, Error: err.Error()}
	}
	if step.When != nil {
		ok, err := step.When.Bool(env)
		if err != nil {
			return storage.StepChange{Name: step.Name, Status: storage.StepFailed, Error: "when: " + err.Error()}
		}
		if !ok {
			return storage.StepChange{Name: step.Name, Status: storage.StepSkipped}
		}
	}
	if step.ForEach != nil {
		return p.expand(step, env)
	}
	input := json.RawMessage("null")
	if step.Input != nil {
		value, err := step.Input.Eval(env)
		if err != nil {
			return storage.StepChange{Name: step.Name, Status: storage.StepFailed, Error: "input: " + err.Error()}
		}
		if input, err = dag.MarshalJSON(value); err != nil {
			return storage.StepChange{Name: step.Name, Status: storage.StepFailed, Error: fmt.Sprintf("input: encode resolved value: %v", err)}
		}
		// The same bound as a start input: the handler gets no more than a
		// caller could have sent.
		if len(input) > p.config.MaxInputBytes {
			return storage.StepChange{Name: step.Name, Status: storage.StepFailed, Error: fmt.Sprintf("input: the resolved input is %d bytes, over the limit of %d bytes; pass a reference to large data instead", len(input), p.config.MaxInputBytes)}
		}
	}
	if step.Wait != nil {
		return storage.StepChange{Name: step.Name, Status: storage.StepWaiting, Input: input}
	}
	if step.Workflow != "" {
		if step.Input == nil {
			input = json.RawMessage("{}") // the input of a start without one
		}
		return p.startChildren(step, storage.StepChange{Name: step.Name, Status: storage.StepRunning, Input: input}, []json.RawMessage{input})
	}
	change := storage.StepChange{Name: step.Name, Status: storage.StepPending, Input: input}
	if err := limitStep(step, env, &change); err != nil {
		return storage.StepChange{Name: step.Name, Status: storage.StepFailed, Error: err.Error()}
	}
	return change
}

// outcome finishes the instance when a step failed for good or when every
// step is finished.
func (p *planner) outcome() *storage.InstanceChange {
	for _, s := range p.state.Steps {
		if step := p.w.Step(s.Name); p.status[s.Name] == storage.StepFailed && !step.ContinueOnError && !step.OnFailure {
			p.failedStep = s.Name
			msg := fmt.Sprintf("step %s failed", s.Name)
			if errText := p.errorOf(s.Name); errText != "" {
				msg += ": " + errText
			}
			return &storage.InstanceChange{Status: storage.InstanceFailed, Error: msg}
		}
	}
	for _, s := range p.state.Steps {
		switch p.status[s.Name] {
		case storage.StepCompleted, storage.StepSkipped, storage.StepFailed:
		default:
			if !p.w.Step(s.Name).OnFailure {
				return nil
			}
		}
	}
	output := json.RawMessage("null")
	if p.w.Output != nil {
		env, err := p.env(p.w.Output.References())
		if err != nil {
			return &storage.InstanceChange{Status: storage.InstanceFailed, Error: "output: " + err.Error()}
		}
		value, err := p.w.Output.Eval(env)
		if err != nil {
			return &storage.InstanceChange{Status: storage.InstanceFailed, Error: "output: " + err.Error()}
		}
		if output, err = dag.MarshalJSON(value); err != nil {
			return &storage.InstanceChange{Status: storage.InstanceFailed, Error: fmt.Sprintf("output: encode: %v", err)}
		}
		if len(output) > p.config.MaxOutputBytes {
			return &storage.InstanceChange{Status: storage.InstanceFailed, Error: fmt.Sprintf("output: the workflow output is %d bytes, over the limit of %d bytes; return a reference to large data instead", len(output), p.config.MaxOutputBytes)}
		}
	}
	return &storage.InstanceChange{Status: storage.InstanceCompleted, Output: output}
}

func (p *planner) errorOf(name string) string {
	if msg, ok := p.errors[name]; ok {
		return msg
	}
	if i, ok := p.index[name]; ok {
		return p.state.Steps[i].Error
	}
	return ""
}

// env builds the expression environment, decoding only the outputs the
// expressions reference: a fan-in over large outputs would otherwise decode
// every output of the instance for every step.
func (p *planner) env(refs []string) (*dag.Env, error) {
	if !p.decoded {
		p.decoded = true
		if len(p.state.Input) > 0 {
			if err := decodeValue(p.state.Input, &p.input); err != nil {
				return nil, fmt.Errorf("decode instance input: %w", err)
			}
		}
		p.outputs = map[string]any{}
	}
	// Only the referenced steps: an expression names every step it reads,
	// and a map of all steps per ready step would make a wide instance's
	// planning quadratic.
	env := &dag.Env{
		Input:    p.input,
		Steps:    make(map[string]dag.StepEnv, len(refs)),
		Workflow: p.workflowEnv(),
		Usage:    &p.usage,
	}
	if p.config.Now != nil {
		env.Now = p.config.Now()
	}
	for _, name := range refs {
		i, ok := p.index[name]
		if !ok {
			continue
		}
		out, done := p.outputs[name]
		if !done {
			raw := p.state.Steps[i].Output
			if direct, ok := p.direct[name]; ok {
				raw = direct
			}
			if len(raw) > 0 {
				if err := decodeValue(raw, &out); err != nil {
					return nil, fmt.Errorf("decode output of step %s: %w", name, err)
				}
			}
			p.outputs[name] = out
		}
		env.Steps[name] = dag.StepEnv{Status: string(p.status[name]), Output: out}
	}
	return env, nil
}

// decodeValue decodes JSON for expressions (see dag.UnmarshalJSON).
func decodeValue(raw []byte, v *any) error {
	var err error
	*v, err = dag.UnmarshalJSON(raw)
	return err
}
