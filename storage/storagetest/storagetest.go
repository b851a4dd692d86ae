// Package storagetest is the conformance suite every storage backend passes:
// one exported Run that a backend's own test calls with a Harness.
//
// The suite drives time through a fake clock it hands to the backend, which
// takes it in place of its usual clock (the server's, for PostgreSQL), so
// lease expiry, delays and statistics are tested without sleeping. Behaviour that needs a
// backend-specific value, such as a caller's own transaction, comes in
// through optional Harness hooks; the suite never asks which backend it runs.
//
// It may import storage, the standard library and testify; never a backend.
package storagetest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// Harness adapts a backend to the suite.
type Harness struct {
	// NewStore returns a new, empty, migrated store that takes the current
	// time only from now, and releases it in t.Cleanup. It is called once
	// per test, from parallel tests. Required.
	NewStore func(t *testing.T, now func() time.Time) storage.Store

	// BeginTx begins a transaction of the caller's own on the database
	// behind s, of the type s.CreateInstances accepts, and returns it with
	// functions that commit and roll it back. Optional: when nil, the
	// caller-transaction tests are skipped.
	BeginTx func(t *testing.T, s storage.Store) (tx any, commit, rollback func() error)

	// AppendEventTx begins a transaction of its own on the database behind
	// s that appends an event of type typ to instance id's history, taking
	// the event's ID at once, and returns a function that commits it.
	// Optional: nil for a backend whose writers take event IDs one
	// transaction at a time, in commit order (the test of an event that
	// commits after a greater one is then skipped).
	AppendEventTx func(t *testing.T, s storage.Store, id string, typ storage.EventType) (commit func() error)

	// Settle waits until what s does in the background on behalf of its
	// subscribers, set off by the calls made so far, is done, so that a
	// test can then check that a call sends no signal. A PostgreSQL store,
	// for one, opens its listener connection once a claim comes back
	// short, and signals its subscribers once it LISTENs. Optional: nil
	// for a backend that does nothing of the kind.
	Settle func(t *testing.T, s storage.Store)
}

// Run runs the whole suite against the backend h describes.
func Run(t *testing.T, h Harness) {
	if h.NewStore == nil {
		t.Fatal("storagetest: Harness.NewStore is required")
	}
	groups := []struct {
		name  string
		tests map[string]func(*testing.T, *Harness)
	}{
		{"Create", createTests},
		{"Claim", claimTests},
		{"Lease", leaseTests},
		{"Finish", finishTests},
		{"RepeatedFinish", repeatedTests},
		{"Release", releaseTests},
		{"Adopt", adoptTests},
		{"Cancel", cancelTests},
		{"Retry", retryTests},
		{"Query", queryTests},
		{"Stats", statsTests},
		{"Counts", countTests},
		{"Prune", pruneTests},
		{"CallerTx", txTests},
		{"Subscribe", subscribeTests},
		{"FinishAndClaim", eagerTests},
		{"CreateAndClaim", eagerStartTests},
		{"ClaimStepsAndWake", wakeClaimTests},
		{"Schedules", scheduleTests},
		{"Handlers", handlerTests},
		{"Presence", presenceTests},
		{"Items", itemTests},
		{"Signals", signalTests},
		{"Operations", operationTests},
		{"Failure", failureTests},
		{"Limits", limitTests},
		{"Logs", logTests},
		{"Events", eventTests},
		{"Trace", traceTests},
		{"Subflows", subflowTests},
		{"DeferredStarts", deferredTests},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for name, fn := range g.tests {
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					fn(t, &h)
				})
			}
		})
	}
}

// Clock is a fake clock that moves only when told to.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock stopped at start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// start is where every test's clock begins: whole seconds, so that every
// backend's time precision round-trips it exactly.
var start = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// bundle is what one test works with.
type bundle struct {
	t     *testing.T
	ctx   context.Context
	store storage.Store
	clock *Clock
}

func (h *Harness) setup(t *testing.T) *bundle {
	t.Helper()
	clock := NewClock(start)
	s := h.NewStore(t, clock.Now)
	require.NotNil(t, s)
	return &bundle{t: t, ctx: t.Context(), store: s, clock: clock}
}

func (b *bundle) now() time.Time { return b.clock.Now() }

var idSeq atomic.Int64

// newID returns a new instance ID that sorts after every earlier one.
func newID() string { return fmt.Sprintf("inst-%012d", idSeq.Add(1)) }

// spec returns a step with the suite's defaults: three attempts, 1s backoff,
// and a queue of its own ("q.NAME") so that claimStep can pick it alone.
func spec(name string, deps ...string) storage.StepSpec {
	return storage.StepSpec{
		Name:      name,
		Handler:   "h." + name,
		Queue:     "q." + name,
		DependsOn: deps,
		Retry:     storage.RetryPolicy{MaxAttempts: 3, Backoff: time.Second, MaxBackoff: time.Minute},
		Timeout:   10 * time.Second,
	}
}

// params returns an instance of workflow "wf" with the given steps.
func params(steps ...storage.StepSpec) storage.CreateParams {
	return storage.CreateParams{
		ID:             newID(),
		Workflow:       "wf",
		DefinitionHash: "hash-wf-1",
		Definition:     []byte("name: wf\n"),
		Input:          json.RawMessage(`{"order":42}`),
		Steps:          steps,
	}
}

func (b *bundle) create(ps ...storage.CreateParams) []storage.CreateResult {
	b.t.Helper()
	res, err := b.store.CreateInstances(b.ctx, nil, ps, Plan)
	require.NoError(b.t, err)
	require.Len(b.t, res, len(ps))
	return res
}

// createOne creates one instance of the given steps and returns its ID.
func (b *bundle) createOne(steps ...storage.StepSpec) string {
	b.t.Helper()
	p := params(steps...)
	b.create(p)
	return p.ID
}

func (b *bundle) claim(p storage.ClaimParams) []storage.ClaimedStep {
	b.t.Helper()
	if p.Lease == 0 {
		p.Lease = 30 * time.Second
	}
	if p.Limit == 0 {
		p.Limit = 100
	}
	if p.WorkerID == "" {
		p.WorkerID = "worker-1"
	}
	got, err := b.store.ClaimSteps(b.ctx, p)
	require.NoError(b.t, err)
	return got
}

// claimStep claims the ready step name (on its own queue, see spec) of
// instance id.
func (b *bundle) claimStep(id, name string) storage.ClaimedStep {
	b.t.Helper()
	got := b.claim(storage.ClaimParams{InstanceID: id, Queues: []string{"q." + name}, Limit: 100})
	require.Len(b.t, got, 1, "step %s of %s should be ready", name, id)
	require.Equal(b.t, name, got[0].Step)
	return got[0]
}

func (b *bundle) finish(rs ...storage.StepResult) []storage.FinishResult {
	b.t.Helper()
	got, err := b.store.FinishSteps(b.ctx, rs, Plan)
	require.NoError(b.t, err)
	require.Len(b.t, got, len(rs))
	return got
}

func completed(c storage.Claim, output string) storage.StepResult {
	return storage.StepResult{Claim: c, Outcome: storage.OutcomeCompleted, Output: json.RawMessage(output)}
}

// complete claims and completes step name of instance id.
func (b *bundle) complete(id, name, output string) {
	b.t.Helper()
	c := b.claimStep(id, name)
	require.Equal(b.t, []storage.FinishResult{{Accepted: true}}, b.finish(completed(c.Claim, output)))
}

func (b *bundle) get(id string) *storage.Instance {
	b.t.Helper()
	in, err := b.store.GetInstance(b.ctx, id)
	require.NoError(b.t, err)
	return in
}

func step(t *testing.T, in *storage.Instance, name string) storage.Step {
	t.Helper()
	for _, s := range in.Steps {
		if s.Name == name {
			return s
		}
	}
	require.FailNowf(t, "no such step", "instance %s has no step %s", in.ID, name)
	return storage.Step{}
}

func (b *bundle) status(id, name string) storage.StepStatus {
	b.t.Helper()
	return step(b.t, b.get(id), name).Status
}

// events returns the instance's events of type typ for step ("" for the
// instance's own).
func events(in *storage.Instance, step string, typ storage.EventType) []storage.Event {
	var out []storage.Event
	for _, e := range in.Events {
		if e.Step == step && e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// Plan is the suite's PlanFunc, a stand-in for the engine: a blocked step
// whose dependencies are all completed or skipped becomes pending with the
// input {"step": NAME, "deps": {DEP: OUTPUT...}} (waiting, a wait step's,
// if its name begins with "await"; left blocked, with Plan.Deferred, while
// the instance is Deferred), or skipped if its name begins with
// "skip"; any failed step fails the instance; when every step
// is finished the instance completes with {"steps": N}.
func Plan(st *storage.InstanceState) (*storage.Plan, error) {
	status := make(map[string]storage.StepStatus, len(st.Steps))
	output := make(map[string]json.RawMessage, len(st.Steps))
	for _, s := range st.Steps {
		status[s.Name], output[s.Name] = s.Status, s.Output
	}
	p := &storage.Plan{}
	for changed := true; changed; { // skipping cascades
		changed = false
		for _, s := range st.Steps {
			if status[s.Name] != storage.StepBlocked {
				continue
			}
			deps := map[string]json.RawMessage{}
			ready := true
			for _, d := range s.DependsOn {
				switch status[d] {
				case storage.StepCompleted, storage.StepSkipped:
					deps[d] = output[d]
				default:
					ready = false
				}
			}
			if !ready {
				continue
			}
			if st.Deferred && strings.HasPrefix(s.Name, "await") {
				p.Deferred = true
				continue
			}
			changed = true
			if len(s.Name) >= 4 && s.Name[:4] == "skip" {
				status[s.Name] = storage.StepSkipped
				p.Steps = append(p.Steps, storage.StepChange{Name: s.Name, Status: storage.StepSkipped})
				continue
			}
			in, err := json.Marshal(map[string]any{"step": s.Name, "deps": deps})
			if err != nil {
				return nil, err
			}
			next := storage.StepPending
			if strings.HasPrefix(s.Name, "await") {
				next = storage.StepWaiting
			}
			status[s.Name] = next
			p.Steps = append(p.Steps, storage.StepChange{Name: s.Name, Status: next, Input: in})
		}
	}
	done := true
	for _, s := range st.Steps {
		switch status[s.Name] {
		case storage.StepFailed:
			p.Instance = &storage.InstanceChange{Status: storage.InstanceFailed, Error: "step " + s.Name + " failed"}
			return p, nil
		case storage.StepCompleted, storage.StepSkipped, storage.StepCancelled:
		default:
			done = false
		}
	}
	if done {
		out, _ := json.Marshal(map[string]int{"steps": len(st.Steps)})
		p.Instance = &storage.InstanceChange{Status: storage.InstanceCompleted, Output: out}
	}
	return p, nil
}

// stepInput is the input Plan gives a step.
func stepInput(t *testing.T, name string, deps map[string]string) json.RawMessage {
	t.Helper()
	m := map[string]json.RawMessage{}
	for k, v := range deps {
		m[k] = json.RawMessage(v)
	}
	b, err := json.Marshal(map[string]any{"step": name, "deps": m})
	require.NoError(t, err)
	return b
}
