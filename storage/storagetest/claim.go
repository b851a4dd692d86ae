package storagetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

var claimTests = map[string]func(*testing.T, *Harness){
	"ExclusiveUnderConcurrency": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		const steps = 200
		ps := make([]storage.CreateParams, steps/4)
		for i := range ps {
			ps[i] = params(spec("a"), spec("b"), spec("c"), spec("d"))
		}
		b.create(ps...)

		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			seen = map[int64]int{}
			errs []error
		)
		for w := range 8 {
			wg.Go(func() {
				for i := 0; ; i++ {
					got, err := b.store.ClaimSteps(context.Background(), storage.ClaimParams{
						WorkerID: "w", Limit: 1 + (w+i)%5, Lease: time.Minute,
					})
					mu.Lock()
					if err != nil {
						errs = append(errs, err)
					}
					for _, c := range got {
						seen[c.StepID]++
					}
					mu.Unlock()
					if err != nil || len(got) == 0 {
						return
					}
				}
			})
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
		require.Len(t, seen, steps)
		for id, n := range seen {
			require.Equal(t, 1, n, "step %d claimed %d times", id, n)
		}
	},

	"Claimed": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b", "a"))
		b.clock.Advance(time.Second)
		got := b.claim(storage.ClaimParams{WorkerID: "worker-7", Lease: 30 * time.Second, Limit: 10})
		require.Len(t, got, 1)
		c := got[0]
		require.Positive(t, c.StepID)
		require.Equal(t, id, c.InstanceID)
		require.Equal(t, "a", c.Step)
		require.Positive(t, c.Fence)
		require.Equal(t, "wf", c.Workflow)
		require.Equal(t, "h.a", c.Handler)
		require.Equal(t, "q.a", c.Queue)
		require.JSONEq(t, string(stepInput(t, "a", nil)), string(c.Input))
		require.Equal(t, 1, c.Attempt)
		require.Equal(t, storage.RetryPolicy{MaxAttempts: 3, Backoff: time.Second, MaxBackoff: time.Minute}, c.Retry)
		require.Equal(t, 10*time.Second, c.Timeout)
		now := start.Add(time.Second)
		require.True(t, c.FirstStartedAt.Equal(now), "first started %v", c.FirstStartedAt)
		require.True(t, c.ReadyAt.Equal(start), "ready at %v", c.ReadyAt)
		require.True(t, c.LeaseUntil.Equal(now.Add(30*time.Second)), "lease until %v", c.LeaseUntil)

		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.NotNil(t, in.StartedAt)
		require.True(t, in.StartedAt.Equal(now))
		begun := events(in, "", storage.EventInstanceStarted)
		require.Len(t, begun, 1)
		require.Equal(t, "worker-7", begun[0].Message, "the claim that started it names its worker, as the step's start does")
		a := step(t, in, "a")
		require.Equal(t, storage.StepRunning, a.Status)
		require.Equal(t, 1, a.Attempts)
		require.Equal(t, "worker-7", a.WorkerID)
		require.NotNil(t, a.StartedAt)
		require.True(t, a.StartedAt.Equal(now))
		require.NotNil(t, a.LeaseUntil)
		require.True(t, a.LeaseUntil.Equal(c.LeaseUntil))
		started := events(in, "a", storage.EventStepStarted)
		require.Len(t, started, 1)
		require.Equal(t, 1, started[0].Attempt)

		// Nothing else is ready; a second attempt gets a new fence and
		// attempt but keeps FirstStartedAt.
		require.Empty(t, b.claim(storage.ClaimParams{}))
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finish(storage.StepResult{
			Claim: c.Claim, Outcome: storage.OutcomeRetry, Error: "flaky", RunAfter: now,
		}))
		b.clock.Advance(time.Second)
		again := b.claimStep(id, "a")
		require.Equal(t, 2, again.Attempt)
		require.Greater(t, again.Fence, c.Fence)
		require.True(t, again.FirstStartedAt.Equal(now))
		require.Len(t, events(b.get(id), "", storage.EventInstanceStarted), 1, "the instance starts once")
	},

	"QueueFilter": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		var ss []storage.StepSpec
		for _, q := range []string{"a", "b", "c", "a"} {
			s := spec("s" + q + string(rune('0'+len(ss))))
			s.Queue = q
			ss = append(ss, s)
		}
		b.createOne(ss...)
		queues := func(cs []storage.ClaimedStep) []string {
			var out []string
			for _, c := range cs {
				out = append(out, c.Queue)
			}
			return out
		}
		require.Empty(t, b.claim(storage.ClaimParams{Queues: []string{"nope"}}))
		require.Equal(t, []string{"a", "a"}, queues(b.claim(storage.ClaimParams{Queues: []string{"a"}})))
		require.ElementsMatch(t, []string{"b", "c"}, queues(b.claim(storage.ClaimParams{Queues: []string{"b", "c", "d"}})))
		require.Empty(t, b.claim(storage.ClaimParams{}))
	},

	"QueueFilterUnsetQueue": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		s := spec("a")
		s.Queue = ""
		b.createOne(s)
		got := b.claim(storage.ClaimParams{Queues: []string{"default"}})
		require.Len(t, got, 1, "an empty queue is the queue named default")
		require.Equal(t, "default", got[0].Queue)
	},

	"InstanceFilter": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		one := b.createOne(spec("a"), spec("b"))
		two := b.createOne(spec("a"), spec("b"))
		got := b.claim(storage.ClaimParams{InstanceID: two})
		require.Len(t, got, 2)
		for _, c := range got {
			require.Equal(t, two, c.InstanceID)
		}
		require.Empty(t, b.claim(storage.ClaimParams{InstanceID: two}))
		got = b.claim(storage.ClaimParams{})
		require.Len(t, got, 2)
		require.Equal(t, one, got[0].InstanceID)
	},

	"PriorityThenAge": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		mk := func(prio int) string {
			p := params(spec("a"))
			p.Priority = prio
			b.create(p)
			b.clock.Advance(time.Second)
			return p.ID
		}
		old := mk(0)
		high := mk(5)
		young := mk(0)
		higher := mk(9)
		highYoung := mk(5)
		got := b.claim(storage.ClaimParams{Limit: 3})
		var order []string
		for _, c := range got {
			order = append(order, c.InstanceID)
		}
		require.Equal(t, []string{higher, high, highYoung}, order)
		order = nil
		for range 2 {
			got := b.claim(storage.ClaimParams{Limit: 1})
			require.Len(t, got, 1)
			order = append(order, got[0].InstanceID)
		}
		require.Equal(t, []string{old, young}, order)
	},

	"OldestReadyFirst": func(t *testing.T, h *Harness) {
		// Age is when a step became claimable (its run_after), not when
		// its instance was created: a retried step queues behind steps
		// that became ready before its retry delay ended.
		b := h.setup(t)
		first := b.createOne(spec("a"))
		c := b.claimStep(first, "a")
		second := b.createOne(spec("a"))
		b.clock.Advance(time.Second)
		third := b.createOne(spec("a"))
		b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeRetry, Error: "x", RunAfter: start.Add(2 * time.Second)})
		b.clock.Advance(5 * time.Second)
		var order []string
		for _, c := range b.claim(storage.ClaimParams{}) {
			order = append(order, c.InstanceID)
		}
		require.Equal(t, []string{second, third, first}, order)
	},

	"MadeReadyTakesItsInstancesPlace": func(t *testing.T, h *Harness) {
		// A step made ready by its dependencies is due from its instance's
		// run_after: it goes before the steps of instances started after
		// its own, so that a backlog's instances finish in the order they
		// started instead of every first step running before any second.
		b := h.setup(t)
		onQueue := func(s storage.StepSpec) storage.StepSpec { s.Queue = "q"; return s }
		chain := []storage.StepSpec{onQueue(spec("a")), onQueue(spec("b", "a"))}
		first := b.createOne(chain...)
		b.clock.Advance(time.Second)
		second := b.createOne(chain...)
		b.clock.Advance(time.Second)
		got := b.claim(storage.ClaimParams{Limit: 1})
		require.Len(t, got, 1)
		require.Equal(t, first, got[0].InstanceID)
		b.clock.Advance(time.Second)
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finish(completed(got[0].Claim, `1`)))
		in := b.get(first)
		ready := step(t, in, "b")
		require.Equal(t, storage.StepPending, ready.Status)
		require.True(t, ready.RunAfter.Equal(in.RunAfter), "due from its instance's run_after")
		require.True(t, ready.ReadyAt.Equal(b.now()), "ready since its dependency finished")

		var order []string
		for _, c := range b.claim(storage.ClaimParams{}) {
			order = append(order, c.InstanceID+"/"+c.Step)
		}
		require.Equal(t, []string{first + "/b", second + "/a"}, order)
	},

	"ItemsTakeTheirInstancesPlace": func(t *testing.T, h *Harness) {
		// The items of a forEach step are due from their instance's
		// run_after too: before the steps of an instance started later.
		b := h.setup(t)
		onQueue := func(s storage.StepSpec) storage.StepSpec { s.Queue = "q"; return s }
		p := itemsParams(2, onQueue(spec("first")), onQueue(eachSpec("each", "first")))
		_, err := b.store.CreateInstances(b.ctx, nil, []storage.CreateParams{p}, ItemsPlan)
		require.NoError(t, err)
		b.clock.Advance(time.Second)
		younger := b.createOne(onQueue(spec("a")))
		b.clock.Advance(time.Second)
		got := b.claim(storage.ClaimParams{Limit: 1})
		require.Len(t, got, 1)
		require.Equal(t, p.ID+"/first", got[0].InstanceID+"/"+got[0].Step)
		b.clock.Advance(time.Second)
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finishItems(completed(got[0].Claim, `1`)))

		var order []string
		for _, c := range b.claim(storage.ClaimParams{}) {
			order = append(order, fmt.Sprintf("%s/%s/%d", c.InstanceID, c.Step, c.Item))
		}
		require.Equal(t, []string{p.ID + "/each/0", p.ID + "/each/1", younger + "/a/-1"}, order)
	},

	"InvalidLease": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		b.createOne(spec("a"))
		_, err := b.store.ClaimSteps(b.ctx, storage.ClaimParams{Limit: 1})
		require.Error(t, err)
		require.Len(t, b.claim(storage.ClaimParams{}), 1, "a failed claim takes nothing")
	},

	"FutureStepsKeepTheirPriorityOnceDue": func(t *testing.T, h *Harness) {
		// Steps that are not due yet never come before due ones, whatever
		// their priority; once due they take their place in claim order,
		// and a step retried again waits for its new time.
		b := h.setup(t)
		delayed := params(spec("a"))
		delayed.Priority = 9
		delayed.RunAfter = start.Add(time.Minute)
		b.create(delayed)
		low := b.createOne(spec("a"))
		got := b.claim(storage.ClaimParams{Limit: 10})
		require.Len(t, got, 1)
		require.Equal(t, low, got[0].InstanceID)
		retried := b.createOne(spec("a"))
		c := b.claimStep(retried, "a")
		b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeRetry, Error: "x", RunAfter: start.Add(30 * time.Second)})
		b.clock.Advance(40 * time.Second)
		lowLater := b.createOne(spec("a"))

		b.clock.Advance(20 * time.Second)
		var order []string
		for range 3 {
			got := b.claim(storage.ClaimParams{Limit: 1})
			require.Len(t, got, 1)
			order = append(order, got[0].InstanceID)
			if got[0].InstanceID == retried {
				c = got[0]
			}
		}
		require.Equal(t, []string{delayed.ID, retried, lowLater}, order, "priority first, then the time each became due")

		b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeSnooze, RunAfter: b.now().Add(time.Hour)})
		require.Empty(t, b.claim(storage.ClaimParams{Limit: 10}), "a step claimed once must wait for its next time again")
		// The delayed instance's start is due too until the sweep a worker
		// runs then (see DeferredStarts).
		_, err := b.store.StartDeferred(b.ctx, 0, Plan)
		require.NoError(t, err)
		next, err := b.store.NextWake(b.ctx, storage.ClaimParams{})
		require.NoError(t, err)
		require.True(t, next.Equal(b.now().Add(time.Hour)), "next wake %v", next)
		b.clock.Advance(time.Hour)
		got = b.claim(storage.ClaimParams{Limit: 10})
		require.Len(t, got, 1)
		require.Equal(t, retried, got[0].InstanceID)
	},

	"NextWakeLooksOnlyAFewStepsPastOthers": func(t *testing.T, h *Harness) {
		// A worker of one queue, or of some handlers, beside many delayed
		// steps of others (here snoozed): its next wake may come before
		// its own step is due (it then looks again), never after, and its
		// looks move on until they find its step, at the step's own time.
		for _, worker := range []storage.ClaimParams{{Queues: []string{"q.mine"}}, {Handlers: []string{"h.mine"}}} {
			t.Run(fmt.Sprintf("queues %v handlers %v", worker.Queues, worker.Handlers), func(t *testing.T) {
				b := h.setup(t)
				ps := make([]storage.CreateParams, 150)
				for i := range ps {
					ps[i] = params(spec("theirs"))
				}
				b.create(ps...)
				b.create(params(spec("mine")))
				claimed := b.claim(storage.ClaimParams{Limit: 200})
				require.Len(t, claimed, 151)
				var results []storage.StepResult
				due := start.Add(10 * time.Hour) // the worker's own step
				for i, c := range claimed {
					runAfter := start.Add(time.Duration(i+1) * time.Minute)
					if c.Step == "mine" {
						runAfter = due
					}
					results = append(results, storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeSnooze, RunAfter: runAfter})
				}
				b.finish(results...)

				var wakes int
				for previous := b.now(); ; wakes++ {
					require.Less(t, wakes, 150, "the worker's looks do not move on")
					next, err := b.store.NextWake(b.ctx, worker)
					require.NoError(t, err)
					require.True(t, next.After(previous), "look %d: wake %v, not after %v", wakes, next, previous)
					require.False(t, next.After(due), "look %d: wake %v, after the worker's own step at %v", wakes, next, due)
					b.clock.Advance(next.Sub(b.now()))
					if got := b.claim(worker); len(got) > 0 {
						require.Len(t, got, 1)
						require.Equal(t, "mine", got[0].Step)
						require.True(t, next.Equal(due), "claimed at %v", next)
						break
					}
					previous = next
				}
				t.Logf("%d early wakes past 150 delayed steps of others", wakes)
			})
		}
	},

	"NotBeforeRunAfter": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"))
		c := b.claimStep(id, "a")
		b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeRetry, Error: "later", RunAfter: start.Add(time.Hour)})
		require.Empty(t, b.claim(storage.ClaimParams{}))
		b.clock.Advance(time.Hour)
		require.Len(t, b.claim(storage.ClaimParams{}), 1)
	},
}
