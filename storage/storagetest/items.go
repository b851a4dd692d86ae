package storagetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// eachSpec is a forEach step: itemsPlan expands it into the items of the
// instance input's "items".
func eachSpec(name string, deps ...string) storage.StepSpec {
	s := spec(name, deps...)
	s.ForEach = true
	return s
}

// itemsParams is an instance whose input lists n items, 0..n-1.
func itemsParams(n int, steps ...storage.StepSpec) storage.CreateParams {
	p := params(steps...)
	items := make([]int, n)
	for i := range items {
		items[i] = i
	}
	p.Input, _ = json.Marshal(map[string]any{"items": items})
	return p
}

// ItemsPlan is Plan for instances with forEach steps: a step whose name
// begins with "each" expands, when Plan would make it pending, into one
// item {"item": ELEMENT} per element of the instance input's "items", or
// completes with [] when there is none.
func ItemsPlan(st *storage.InstanceState) (*storage.Plan, error) {
	var in struct{ Items []json.RawMessage }
	if len(st.Input) > 0 {
		if err := json.Unmarshal(st.Input, &in); err != nil {
			return nil, err
		}
	}
	// A plan must hold its own cascade: after completing an empty forEach
	// step, Plan is asked again about the state the changes leave.
	work := *st
	work.Steps = append([]storage.StepState(nil), st.Steps...)
	out := &storage.Plan{}
	for {
		p, err := Plan(&work)
		if err != nil {
			return nil, err
		}
		again := false
		for _, c := range p.Steps {
			if c.Status == storage.StepPending && strings.HasPrefix(c.Name, "each") {
				c.Input = nil
				if len(in.Items) == 0 {
					c.Status, c.Output = storage.StepCompleted, json.RawMessage(`[]`)
					again = true
				} else {
					c.Status = storage.StepRunning
					for _, item := range in.Items {
						c.Items = append(c.Items, json.RawMessage(fmt.Sprintf(`{"item":%s}`, item)))
					}
				}
			}
			for i := range work.Steps {
				if work.Steps[i].Name == c.Name {
					work.Steps[i].Status, work.Steps[i].Output = c.Status, c.Output
				}
			}
			out.Steps = append(out.Steps, c)
		}
		out.Instance = p.Instance
		if !again {
			return out, nil
		}
	}
}

func (b *bundle) createItems(n int, steps ...storage.StepSpec) string {
	b.t.Helper()
	p := itemsParams(n, steps...)
	res, err := b.store.CreateInstances(b.ctx, nil, []storage.CreateParams{p}, ItemsPlan)
	require.NoError(b.t, err)
	require.Len(b.t, res, 1)
	return p.ID
}

func (b *bundle) items(id, name string) []storage.Item {
	b.t.Helper()
	got, err := b.store.ListItems(b.ctx, storage.ItemsParams{InstanceID: id, Step: name, Limit: 1000})
	require.NoError(b.t, err)
	return got
}

// claimItems claims up to limit items of step name (on its own queue, see
// spec) of instance id.
func (b *bundle) claimItems(id, name string, limit int) []storage.ClaimedStep {
	b.t.Helper()
	got := b.claim(storage.ClaimParams{InstanceID: id, Queues: []string{"q." + name}, Limit: limit})
	for _, c := range got {
		require.Equal(b.t, name, c.Step)
		require.GreaterOrEqual(b.t, c.Item, 0, "an item of %s", name)
	}
	return got
}

func (b *bundle) finishItems(rs ...storage.StepResult) []storage.FinishResult {
	b.t.Helper()
	got, err := b.store.FinishSteps(b.ctx, rs, ItemsPlan)
	require.NoError(b.t, err)
	require.Len(b.t, got, len(rs))
	return got
}

// itemOutput is what the tests' items return: their index times ten.
func itemOutput(c storage.ClaimedStep) string { return fmt.Sprint(c.Item * 10) }

func failedFor(c storage.Claim, msg string) storage.StepResult {
	return storage.StepResult{Claim: c, Outcome: storage.OutcomeFailed, Error: msg}
}

func itemStatuses(items []storage.Item) []storage.StepStatus {
	out := make([]storage.StepStatus, len(items))
	for i, it := range items {
		out[i] = it.Status
	}
	return out
}

var itemTests = map[string]func(*testing.T, *Harness){
	"ExpansionCreatesPendingItemsInTheReadyTransaction": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(3, spec("first"), eachSpec("each", "first"), spec("after", "each"))
		require.Empty(t, b.items(id, "each"), "no items before the step is ready")
		c := b.claimStep(id, "first")
		b.clock.Advance(time.Second)
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finishItems(completed(c.Claim, `1`)))

		in := b.get(id)
		require.Len(t, in.Steps, 3, "items are not steps")
		each := step(t, in, "each")
		require.Equal(t, storage.StepRunning, each.Status)
		require.Nil(t, each.LeaseUntil, "a forEach step is never claimed")
		require.Equal(t, &storage.ItemCounts{Total: 3, Pending: 3}, each.Items)
		require.Nil(t, step(t, in, "first").Items, "not a forEach step")
		require.Len(t, events(in, "each", storage.EventStepReady), 1)

		items := b.items(id, "each")
		require.Len(t, items, 3)
		for i, it := range items {
			require.Equal(t, i, it.Index)
			require.Equal(t, storage.StepPending, it.Status)
			require.JSONEq(t, fmt.Sprintf(`{"item":%d}`, i), string(it.Input))
		}
		// The items are claimed like steps, with the step's handler and queue.
		got := b.claimItems(id, "each", 10)
		require.Len(t, got, 3)
		for i, c := range got {
			require.Equal(t, i, c.Item)
			require.Equal(t, "h.each", c.Handler)
			require.Equal(t, "q.each", c.Queue)
			require.Equal(t, 1, c.Attempt)
			require.Equal(t, 3, c.Retry.MaxAttempts)
			require.JSONEq(t, fmt.Sprintf(`{"item":%d}`, i), string(c.Input))
		}
		require.Equal(t, &storage.ItemCounts{Total: 3, Running: 3}, step(t, b.get(id), "each").Items)
	},
	"StepsClaimWithItemMinusOne": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(1, spec("a"))
		require.Equal(t, -1, b.claimStep(id, "a").Item)
	},
	"ExpandedAtCreation": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(2, eachSpec("each"))
		require.Equal(t, &storage.ItemCounts{Total: 2, Pending: 2}, step(t, b.get(id), "each").Items)
		require.Len(t, b.claimItems(id, "each", 10), 2)
	},
	"EmptyListCompletesAtOnce": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(0, eachSpec("each"), spec("after", "each"))
		in := b.get(id)
		each := step(t, in, "each")
		require.Equal(t, storage.StepCompleted, each.Status)
		require.JSONEq(t, `[]`, string(each.Output))
		require.Equal(t, storage.StepPending, step(t, in, "after").Status)
		require.JSONEq(t, string(stepInput(t, "after", map[string]string{"each": `[]`})), string(step(t, in, "after").Input))
	},
	"CompletionCollectsOutputsInIndexOrder": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(4, eachSpec("each"), spec("after", "each"))
		got := b.claimItems(id, "each", 10)
		require.Len(t, got, 4)
		// Out of order, in two commits: the step completes with the last.
		b.finishItems(completed(got[3].Claim, itemOutput(got[3])), completed(got[1].Claim, itemOutput(got[1])))
		require.Equal(t, storage.StepRunning, b.status(id, "each"))
		b.clock.Advance(time.Second)
		b.finishItems(completed(got[2].Claim, itemOutput(got[2])), completed(got[0].Claim, itemOutput(got[0])))
		in := b.get(id)
		each := step(t, in, "each")
		require.Equal(t, storage.StepCompleted, each.Status)
		require.JSONEq(t, `[0, 10, 20, 30]`, string(each.Output))
		require.True(t, each.FinishedAt.Equal(b.now()))
		require.Equal(t, &storage.ItemCounts{Total: 4, Completed: 4}, each.Items)
		require.Len(t, events(in, "each", storage.EventStepCompleted), 1)
		after := step(t, in, "after")
		require.Equal(t, storage.StepPending, after.Status)
		require.JSONEq(t, string(stepInput(t, "after", map[string]string{"each": `[0,10,20,30]`})), string(after.Input))
	},
	"LastTwoItemsFinishingAtOnceCompleteTheStepOnce": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		for range 5 {
			id := b.createItems(3, eachSpec("each"), spec("after", "each"))
			got := b.claimItems(id, "each", 10)
			b.finishItems(completed(got[0].Claim, `0`))
			// Two workers finish the last two items at the same moment.
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i, c := range got[1:] {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[i] = b.store.FinishSteps(b.ctx, []storage.StepResult{completed(c.Claim, itemOutput(c))}, ItemsPlan)
				}()
			}
			wg.Wait()
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			in := b.get(id)
			require.Equal(t, storage.StepCompleted, step(t, in, "each").Status)
			require.JSONEq(t, `[0, 10, 20]`, string(step(t, in, "each").Output))
			require.Len(t, events(in, "each", storage.EventStepCompleted), 1, "completed exactly once")
			require.Len(t, events(in, "after", storage.EventStepReady), 1, "its dependent made ready once")
		}
	},
	"ItemFailureFailsTheStepAndCancelsTheOtherItems": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(5, eachSpec("each"), spec("after", "each"))
		got := b.claimItems(id, "each", 3) // 0, 1, 2 running; 3, 4 pending
		b.finishItems(completed(got[0].Claim, `0`))
		res := b.finishItems(failedFor(got[1].Claim, "boom"))
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, res)

		in := b.get(id)
		each := step(t, in, "each")
		require.Equal(t, storage.StepFailed, each.Status)
		require.Equal(t, "item 1 failed: boom", each.Error)
		require.Equal(t, &storage.ItemCounts{Total: 5, Completed: 1, Failed: 1, Cancelled: 3}, each.Items)
		require.Equal(t, storage.InstanceFailed, in.Status, "the plan saw the step fail")
		require.Equal(t, storage.StepCancelled, step(t, in, "after").Status)
		require.Equal(t, []storage.StepStatus{storage.StepCompleted, storage.StepFailed, storage.StepCancelled,
			storage.StepCancelled, storage.StepCancelled}, itemStatuses(b.items(id, "each")))

		// The running item's claim went stale: its heartbeat reports it
		// lost, and its result is refused as cancelled.
		lost, err := b.store.ExtendLeases(b.ctx, []storage.Claim{got[2].Claim}, time.Minute)
		require.NoError(t, err)
		require.Equal(t, []storage.Claim{got[2].Claim}, lost)
		require.Equal(t, []storage.FinishResult{{Cancelled: true}}, b.finishItems(completed(got[2].Claim, `20`)))
		require.Empty(t, b.claimItems(id, "each", 10), "cancelled items are not claimed")
	},
	"ContinueOnErrorWaitsForEveryItemAndKeepsNull": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		each := eachSpec("each")
		each.ContinueOnError = true
		id := b.createItems(3, each)
		got := b.claimItems(id, "each", 10)
		b.finishItems(failedFor(got[1].Claim, "boom"))
		require.Equal(t, storage.StepRunning, b.status(id, "each"), "the other items go on")
		b.finishItems(completed(got[0].Claim, `0`))
		b.finishItems(completed(got[2].Claim, `20`))
		st := step(t, b.get(id), "each")
		require.Equal(t, storage.StepFailed, st.Status)
		require.Equal(t, "item 1 failed: boom", st.Error)
		require.JSONEq(t, `[0, null, 20]`, string(st.Output))
		require.Equal(t, &storage.ItemCounts{Total: 3, Completed: 2, Failed: 1}, st.Items)
	},
	"ConcurrentClaimersNeverExceedAnItemCap": func(t *testing.T, h *Harness) {
		// Claimers of several processes race for the items of capped
		// steps; whatever the interleaving, no committed state holds more
		// running items of a step than its cap, and every item runs.
		b := h.setup(t)
		const (
			claimers = 6
			perStep  = 12
			limit    = 2
		)
		each := eachSpec("each")
		each.ItemConcurrency = limit
		ids := []string{b.createItems(perStep, each), b.createItems(perStep, each), b.createItems(perStep, each)}
		running := func() (most, done int, err error) {
			for _, id := range ids {
				items, err := b.store.ListItems(b.ctx, storage.ItemsParams{InstanceID: id, Step: "each", Limit: 1000})
				if err != nil {
					return 0, 0, err
				}
				n := 0
				for _, it := range items {
					switch it.Status {
					case storage.StepRunning:
						n++
					case storage.StepCompleted:
						done++
					}
				}
				most = max(most, n)
			}
			return most, done, nil
		}
		var (
			wg   sync.WaitGroup
			errs = make(chan error, claimers)
		)
		for w := range claimers {
			wg.Go(func() {
				deadline := time.Now().Add(time.Minute)
				for time.Now().Before(deadline) {
					cs, err := b.store.ClaimSteps(b.ctx, storage.ClaimParams{WorkerID: fmt.Sprint("w", w), Limit: 3, Lease: time.Minute})
					if err != nil {
						errs <- err
						return
					}
					most, done, err := running()
					if err != nil {
						errs <- err
						return
					}
					if most > limit {
						errs <- fmt.Errorf("%d items of one step running, over its cap of %d", most, limit)
						return
					}
					if done == len(ids)*perStep {
						return
					}
					rs := make([]storage.StepResult, len(cs))
					for i, c := range cs {
						rs[i] = completed(c.Claim, itemOutput(c))
					}
					if len(rs) > 0 {
						if _, err := b.store.FinishSteps(b.ctx, rs, ItemsPlan); err != nil {
							errs <- err
							return
						}
					}
				}
				errs <- errors.New("the items did not all complete within a minute")
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		for _, id := range ids {
			require.Equal(t, storage.InstanceCompleted, b.get(id).Status)
		}
	},

	"ConcurrencyCapHoldsWithinOneClaim": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		each := eachSpec("each")
		each.ItemConcurrency = 2
		id := b.createItems(5, each)
		other := b.createItems(5, each)
		got := b.claimItems(id, "each", 10)
		require.Len(t, got, 2, "one claim takes no more than the cap")
		require.Equal(t, []int{0, 1}, []int{got[0].Item, got[1].Item})
		require.Empty(t, b.claimItems(id, "each", 10), "the cap is reached")
		require.Len(t, b.claimItems(other, "each", 10), 2, "the cap is per instance")
		b.finishItems(completed(got[0].Claim, `0`))
		next := b.claimItems(id, "each", 10)
		require.Len(t, next, 1)
		require.Equal(t, 2, next[0].Item)
		// A retried item waiting for its backoff does not hold a place.
		b.finishItems(storage.StepResult{Claim: next[0].Claim, Outcome: storage.OutcomeRetry, Error: "again", Delay: time.Minute})
		more := b.claimItems(id, "each", 10)
		require.Len(t, more, 1)
		require.Equal(t, 3, more[0].Item)
	},
	// The ready figures count a capped step's items as a claim would take
	// them: the others wait on the cap, as held steps wait on a limit, and
	// no worker added could run them sooner.
	"ReadyFiguresCountOnlyItemsTheCapLeavesRoomFor": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		each := eachSpec("each")
		each.ItemConcurrency = 2
		id := b.createItems(5, each)
		ready := func(msg string) int {
			t.Helper()
			st, err := b.store.Stats(b.ctx)
			require.NoError(t, err)
			var queue, workflow, unserved int
			for _, q := range st.Queues {
				if q.Queue == "q.each" {
					queue = q.Ready
				}
			}
			for _, w := range st.Workflows {
				workflow += w.ReadySteps
			}
			for _, u := range st.Unserved {
				if u.Handler == "h.each" {
					unserved = u.Ready
				}
			}
			require.Equal(t, queue, workflow, "the workflow's ready steps and the queue's: %s", msg)
			require.Equal(t, queue, unserved, "the unserved handler's ready steps and the queue's: %s", msg)
			return queue
		}
		// dagrun queues counts every due item in the queue's depth and those
		// beyond the cap as held, as it counts steps a limit holds.
		depth := func(msg string) (ready, held int) {
			t.Helper()
			qs, err := b.store.Queues(b.ctx)
			require.NoError(t, err)
			for _, q := range qs {
				if q.Queue == "q.each" {
					return q.Ready, q.Held
				}
			}
			t.Fatalf("no queue q.each: %s", msg)
			return 0, 0
		}
		stage := func(msg string, wantReady, wantDepth, wantHeld int) {
			t.Helper()
			require.Equal(t, wantReady, ready(msg), "ready: %s", msg)
			d, h := depth(msg)
			require.Equal(t, []int{wantDepth, wantHeld}, []int{d, h}, "the queue's depth and held items: %s", msg)
		}
		stage("five due items under a cap of two", 2, 5, 3)
		got := b.claimItems(id, "each", 1)
		stage("one running leaves room for one", 1, 4, 3)
		got = append(got, b.claimItems(id, "each", 10)...)
		require.Len(t, got, 2)
		stage("the cap is reached", 0, 3, 3)
		b.finishItems(completed(got[0].Claim, `0`))
		stage("one finished", 1, 3, 2)
		// A retried item waiting for its backoff is not due and holds no
		// place, as in ConcurrencyCapHoldsWithinOneClaim.
		b.finishItems(storage.StepResult{Claim: got[1].Claim, Outcome: storage.OutcomeRetry, Error: "again", Delay: time.Minute})
		stage("one backing off", 2, 3, 1)
	},
	"LeaseRecoveryRetriesItemsAndFailsTheStepWhenExhausted": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		each := eachSpec("each")
		each.Retry = storage.RetryPolicy{MaxAttempts: 2}
		id := b.createItems(3, each)
		got := b.claim(storage.ClaimParams{InstanceID: id, Queues: []string{"q.each"}, Limit: 2, Lease: time.Second})
		require.Len(t, got, 2)
		b.clock.Advance(2 * time.Second)
		n, err := b.store.RecoverExpired(b.ctx, 100, ItemsPlan)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		items := b.items(id, "each")
		require.Equal(t, []storage.StepStatus{storage.StepPending, storage.StepPending, storage.StepPending}, itemStatuses(items))
		require.Equal(t, []int{1, 1, 0}, []int{items[0].Attempts, items[1].Attempts, items[2].Attempts}, "the lost attempts count")
		require.Equal(t, storage.StepRunning, b.status(id, "each"))

		again := b.claim(storage.ClaimParams{InstanceID: id, Queues: []string{"q.each"}, Limit: 3, Lease: time.Second})
		require.Len(t, again, 3)
		b.clock.Advance(2 * time.Second)
		_, err = b.store.RecoverExpired(b.ctx, 100, ItemsPlan)
		require.NoError(t, err)
		in := b.get(id)
		st := step(t, in, "each")
		require.Equal(t, storage.StepFailed, st.Status)
		require.Contains(t, st.Error, "item 0 failed: lease expired on attempt 2")
		require.Equal(t, storage.InstanceFailed, in.Status)
	},
	"CancelInstanceCancelsItems": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(3, eachSpec("each"))
		got := b.claimItems(id, "each", 1)
		require.NoError(t, b.store.CancelInstance(b.ctx, id, "stop", Plan))
		in := b.get(id)
		require.Equal(t, storage.StepCancelled, step(t, in, "each").Status)
		require.Equal(t, &storage.ItemCounts{Total: 3, Cancelled: 3}, step(t, in, "each").Items)
		lost, err := b.store.ExtendLeases(b.ctx, []storage.Claim{got[0].Claim}, time.Minute)
		require.NoError(t, err)
		require.Len(t, lost, 1, "the running item's claim is stale")
		require.Len(t, events(in, "each", storage.EventStepCancelled), 1, "one event for the step, none per item")
	},
	"RetryReRunsOnlyFailedAndCancelledItems": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(4, eachSpec("each"), spec("after", "each"))
		got := b.claimItems(id, "each", 2)
		b.finishItems(completed(got[0].Claim, `0`))
		b.finishItems(failedFor(got[1].Claim, "boom"))
		require.Equal(t, storage.InstanceFailed, b.get(id).Status)

		require.NoError(t, b.store.RetryInstance(b.ctx, id, ItemsPlan))
		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		each := step(t, in, "each")
		require.Equal(t, storage.StepRunning, each.Status)
		require.Empty(t, each.Error)
		require.Equal(t, &storage.ItemCounts{Total: 4, Completed: 1, Pending: 3}, each.Items)
		items := b.items(id, "each")
		require.JSONEq(t, `0`, string(items[0].Output), "a completed item keeps its output")
		require.Zero(t, items[1].Attempts, "a re-armed item starts over")
		require.Equal(t, storage.StepBlocked, step(t, in, "after").Status)

		rest := b.claimItems(id, "each", 10)
		require.Equal(t, []int{1, 2, 3}, []int{rest[0].Item, rest[1].Item, rest[2].Item})
		require.Greater(t, rest[0].Fence, got[1].Fence, "the old claim stays stale")
		for _, c := range rest {
			b.finishItems(completed(c.Claim, itemOutput(c)))
		}
		in = b.get(id)
		require.JSONEq(t, `[0, 10, 20, 30]`, string(step(t, in, "each").Output))
		require.Equal(t, storage.StepPending, step(t, in, "after").Status)
	},
	"RetryFromKeepsTheItemsOfAFailedStepOutsideIt": func(t *testing.T, h *Harness) {
		// A failed forEach step that is not downstream of the step a retry
		// starts from runs again as a plain retry runs it: only its failed
		// and cancelled items, its completed ones keeping their outputs.
		b := h.setup(t)
		id := b.createItems(4, eachSpec("each"), spec("a"), spec("b", "a"))
		for _, n := range []string{"a", "b"} {
			c := b.claimStep(id, n)
			b.finishItems(completed(c.Claim, `1`))
		}
		got := b.claimItems(id, "each", 2)
		b.finishItems(completed(got[0].Claim, `0`))
		b.finishItems(failedFor(got[1].Claim, "boom"))
		require.Equal(t, storage.InstanceFailed, b.get(id).Status)

		require.NoError(t, b.op().RetryFrom(b.ctx, id, "b", ItemsPlan))
		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.Equal(t, storage.StepPending, step(t, in, "b").Status, "b runs afresh")
		each := step(t, in, "each")
		require.Equal(t, storage.StepRunning, each.Status)
		require.Equal(t, &storage.ItemCounts{Total: 4, Completed: 1, Pending: 3}, each.Items)
		require.JSONEq(t, `0`, string(b.items(id, "each")[0].Output), "a completed item keeps its output")
		require.Len(t, events(in, "", storage.EventInstanceRetried), 1)

		rest := b.claimItems(id, "each", 10)
		require.Len(t, rest, 3)
		for _, c := range rest {
			b.finishItems(completed(c.Claim, itemOutput(c)))
		}
		c := b.claimStep(id, "b")
		b.finishItems(completed(c.Claim, `2`))
		in = b.get(id)
		require.Equal(t, storage.InstanceCompleted, in.Status)
		require.JSONEq(t, `[0, 10, 20, 30]`, string(step(t, in, "each").Output))
	},
	"RetryOfAStepThatNeverExpandedBlocksIt": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(2, spec("first"), eachSpec("each", "first"))
		c := b.claimStep(id, "first")
		b.finishItems(failedFor(c.Claim, "no"))
		require.NoError(t, b.store.RetryInstance(b.ctx, id, ItemsPlan))
		require.Equal(t, storage.StepBlocked, b.status(id, "each"))
		c = b.claimStep(id, "first")
		b.finishItems(completed(c.Claim, `1`))
		require.Equal(t, &storage.ItemCounts{Total: 2, Pending: 2}, step(t, b.get(id), "each").Items)
	},
	"ListItemsPagesAndFilters": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(250, eachSpec("each"), spec("a"))
		page, err := b.store.ListItems(b.ctx, storage.ItemsParams{InstanceID: id, Step: "each"})
		require.NoError(t, err)
		require.Len(t, page, 100, "the default page")
		page, err = b.store.ListItems(b.ctx, storage.ItemsParams{InstanceID: id, Step: "each", Offset: 240, Limit: 50})
		require.NoError(t, err)
		require.Len(t, page, 10)
		require.Equal(t, 240, page[0].Index)
		got := b.claimItems(id, "each", 3)
		b.finishItems(completed(got[1].Claim, `10`))
		page, err = b.store.ListItems(b.ctx, storage.ItemsParams{InstanceID: id, Step: "each", Status: storage.StepRunning})
		require.NoError(t, err)
		require.Equal(t, []int{0, 2}, []int{page[0].Index, page[1].Index})
		require.Len(t, page, 2)
		require.Equal(t, "worker-1", page[0].WorkerID)
		require.NotNil(t, page[0].StartedAt)

		page, err = b.store.ListItems(b.ctx, storage.ItemsParams{InstanceID: id, Step: "a"})
		require.NoError(t, err)
		require.Empty(t, page, "a step that is no forEach step has no items")
		_, err = b.store.ListItems(b.ctx, storage.ItemsParams{InstanceID: id, Step: "nope"})
		require.ErrorIs(t, err, storage.ErrNotFound)
		_, err = b.store.ListItems(b.ctx, storage.ItemsParams{InstanceID: "nope", Step: "each"})
		require.ErrorIs(t, err, storage.ErrNotFound)
	},
	"ListInstancesCountsItems": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		ids := []string{b.createItems(3, eachSpec("each")), b.createItems(2, eachSpec("each"))}
		b.claimItems(ids[0], "each", 1)
		list, err := b.store.ListInstances(b.ctx, storage.ListParams{})
		require.NoError(t, err)
		counts := map[string]*storage.ItemCounts{}
		for _, in := range list {
			require.Len(t, in.Steps, 1)
			counts[in.ID] = in.Steps[0].Items
		}
		require.Equal(t, &storage.ItemCounts{Total: 3, Pending: 2, Running: 1}, counts[ids[0]])
		require.Equal(t, &storage.ItemCounts{Total: 2, Pending: 2}, counts[ids[1]])
	},
	"PlanSeesStepsOnly": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(3, eachSpec("each"), spec("after", "each"))
		got := b.claimItems(id, "each", 10)
		var seen []string
		plan := func(st *storage.InstanceState) (*storage.Plan, error) {
			for _, s := range st.Steps {
				seen = append(seen, fmt.Sprintf("%s:%s", s.Name, s.Status))
			}
			return ItemsPlan(st)
		}
		var results []storage.StepResult
		for _, c := range got {
			results = append(results, completed(c.Claim, itemOutput(c)))
		}
		_, err := b.store.FinishSteps(b.ctx, results, plan)
		require.NoError(t, err)
		require.Equal(t, []string{"each:completed", "after:blocked"}, seen)
	},
	"StatsCountItemsLikeSteps": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(3, eachSpec("each"))
		b.claimItems(id, "each", 1)
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Equal(t, []storage.QueueStats{{Queue: "q.each", Ready: 2, Running: 1}}, st.Queues,
			"the forEach step itself is neither ready nor running work")
	},
	"PruneDeletesItems": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(3, eachSpec("each"))
		require.NoError(t, b.store.CancelInstance(b.ctx, id, "stop", Plan))
		b.clock.Advance(time.Hour)
		n, err := b.store.Prune(b.ctx, b.now(), false)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		_, err = b.store.ListItems(b.ctx, storage.ItemsParams{InstanceID: id, Step: "each"})
		require.ErrorIs(t, err, storage.ErrNotFound)
	},
}
