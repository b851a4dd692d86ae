package storagetest

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

var scheduleSpec = storage.ScheduleSpec{Workflow: "wf", Index: 0, Fingerprint: "fp-1"}

func (b *bundle) register(specs ...storage.ScheduleSpec) []storage.Schedule {
	b.t.Helper()
	got, err := b.store.RegisterSchedules(b.ctx, storage.RegisterSchedulesParams{Specs: specs, Now: b.now()})
	require.NoError(b.t, err)
	require.Len(b.t, got, len(specs))
	return got
}

// fireParams is the tick's instance as the engine builds it: its key names
// the schedule and the tick.
func fireParams(sp storage.ScheduleSpec, tick time.Time) storage.FireParams {
	inst := params(spec("a"))
	inst.Key = "schedule:" + sp.Fingerprint + ":" + tick.UTC().Format(time.RFC3339)
	return storage.FireParams{Schedule: sp, Tick: tick, Instance: inst}
}

func (b *bundle) fire(p storage.FireParams) storage.FireResult {
	b.t.Helper()
	res, err := b.store.FireSchedule(b.ctx, p, Plan)
	require.NoError(b.t, err)
	return res
}

func (b *bundle) schedule(workflow string, index int) storage.Schedule {
	b.t.Helper()
	all, err := b.store.ListSchedules(b.ctx)
	require.NoError(b.t, err)
	for _, s := range all {
		if s.Workflow == workflow && s.Index == index {
			return s
		}
	}
	require.FailNowf(b.t, "no such schedule", "schedule %d of %s is not listed", index, workflow)
	return storage.Schedule{}
}

func (b *bundle) instanceCount() int {
	b.t.Helper()
	all, err := b.store.ListInstances(b.ctx, storage.ListParams{Limit: 1000})
	require.NoError(b.t, err)
	return len(all)
}

var scheduleTests = map[string]func(*testing.T, *Harness){
	"RegisterStartsFromNowAndKeepsState": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		registered := b.now()
		got := b.register(scheduleSpec, storage.ScheduleSpec{Workflow: "wf", Index: 1, Fingerprint: "fp-b"})
		require.Equal(t, "fp-1", got[0].Fingerprint)
		require.True(t, got[0].LastTick.Equal(registered), "no tick before the registration fires")
		require.False(t, got[0].Paused)
		require.Empty(t, got[0].LastInstanceID)
		require.Equal(t, 1, got[1].Index)

		b.clock.Advance(time.Hour)
		again := b.register(scheduleSpec)
		require.True(t, again[0].LastTick.Equal(registered), "loading the same schedule again changes nothing")

		edited := storage.ScheduleSpec{Workflow: "wf", Index: 0, Fingerprint: "fp-2"}
		got = b.register(edited)
		require.Equal(t, "fp-2", got[0].Fingerprint)
		require.True(t, got[0].LastTick.Equal(b.now()), "an edited schedule starts over from the edit")

		all, err := b.store.ListSchedules(b.ctx)
		require.NoError(t, err)
		require.Len(t, all, 2)
		require.Equal(t, []int{0, 1}, []int{all[0].Index, all[1].Index})
	},

	"FiresEachTickOnce": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		b.register(scheduleSpec)
		tick := b.now().Add(time.Minute)
		res := b.fire(fireParams(scheduleSpec, tick))
		require.Equal(t, storage.FireStarted, res.Outcome)
		in := b.get(res.InstanceID)
		require.Equal(t, "wf", in.Workflow)
		require.Equal(t, "schedule:fp-1:"+tick.Format(time.RFC3339), in.Key)

		require.Equal(t, storage.FireResult{Outcome: storage.FireStale}, b.fire(fireParams(scheduleSpec, tick)), "the same tick again")
		require.Equal(t, storage.FireResult{Outcome: storage.FireStale}, b.fire(fireParams(scheduleSpec, tick.Add(-time.Second))), "an older tick")
		require.Equal(t, storage.FireResult{Outcome: storage.FireStale}, b.fire(fireParams(scheduleSpec, b.now())), "the registration time itself")
		require.Equal(t, 1, b.instanceCount())

		s := b.schedule("wf", 0)
		require.True(t, s.LastTick.Equal(tick))
		require.Equal(t, res.InstanceID, s.LastInstanceID)
		require.Equal(t, storage.InstancePending, s.LastInstanceStatus, "not yet claimed")
		require.Equal(t, int64(1), s.Fired)
	},

	"ConcurrentFiresStartOne": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		b.register(scheduleSpec)
		tick := b.now().Add(time.Second)
		const racers = 8
		results := make([]storage.FireResult, racers)
		errs := make([]error, racers)
		var wg sync.WaitGroup
		for i := range racers {
			wg.Go(func() {
				results[i], errs[i] = b.store.FireSchedule(b.ctx, fireParams(scheduleSpec, tick), Plan)
			})
		}
		wg.Wait()
		started := 0
		for i := range racers {
			require.NoError(t, errs[i])
			if results[i].Outcome == storage.FireStarted {
				started++
			} else {
				require.Equal(t, storage.FireStale, results[i].Outcome)
			}
		}
		require.Equal(t, 1, started)
		require.Equal(t, 1, b.instanceCount())
		require.Equal(t, int64(1), b.schedule("wf", 0).Fired)
	},

	"OverlapSkip": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		b.register(scheduleSpec)
		t1, t2, t3 := b.now().Add(time.Minute), b.now().Add(2*time.Minute), b.now().Add(3*time.Minute)
		first := b.fire(fireParams(scheduleSpec, t1))
		require.Equal(t, storage.FireStarted, first.Outcome)

		skip := fireParams(scheduleSpec, t2)
		skip.SkipIfRunning = true
		require.Equal(t, storage.FireResult{Outcome: storage.FireSkipped, InstanceID: first.InstanceID}, b.fire(skip))
		s := b.schedule("wf", 0)
		require.True(t, s.LastTick.Equal(t2), "a skipped tick is handled: it is not tried again")
		require.Equal(t, int64(1), s.Skipped)
		require.Equal(t, first.InstanceID, s.LastInstanceID)
		require.Equal(t, storage.FireResult{Outcome: storage.FireStale}, b.fire(skip), "nor counted twice")
		require.Equal(t, int64(1), b.schedule("wf", 0).Skipped)
		require.Equal(t, 1, b.instanceCount())

		b.complete(first.InstanceID, "a", `1`)
		next := fireParams(scheduleSpec, t3)
		next.SkipIfRunning = true
		require.Equal(t, storage.FireStarted, b.fire(next).Outcome, "the last instance finished")
	},

	"OverlapStateFollowsTheSchedule": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		long := storage.ScheduleSpec{Workflow: "wf", Index: 0, Fingerprint: "fp-long"}
		b.register(long)
		running := b.fire(fireParams(long, b.now().Add(time.Minute)))
		require.Equal(t, storage.FireStarted, running.Outcome)

		// A schedule inserted before it: the running instance follows its
		// schedule to index 1, and the new one at index 0 has none.
		b.clock.Advance(time.Minute)
		moved := storage.ScheduleSpec{Workflow: "wf", Index: 1, Fingerprint: "fp-long"}
		inserted := storage.ScheduleSpec{Workflow: "wf", Index: 0, Fingerprint: "fp-new"}
		got := b.register(inserted, moved)
		require.Empty(t, got[0].LastInstanceID, "a new schedule waits for no instance of another")
		require.Equal(t, running.InstanceID, got[1].LastInstanceID, "a moved schedule keeps its last instance")

		tick := b.now().Add(time.Minute)
		first, second := fireParams(inserted, tick), fireParams(moved, tick)
		first.SkipIfRunning, second.SkipIfRunning = true, true
		require.Equal(t, storage.FireStarted, b.fire(first).Outcome, "overlap: skip of the new schedule")
		require.Equal(t, storage.FireResult{Outcome: storage.FireSkipped, InstanceID: running.InstanceID}, b.fire(second),
			"overlap: skip of the moved one still sees its running instance")

		// An edit starts a schedule over: its old version's instance is
		// not its own.
		b.clock.Advance(time.Minute)
		edited := storage.ScheduleSpec{Workflow: "wf", Index: 1, Fingerprint: "fp-long-2"}
		got = b.register(inserted, edited)
		require.Empty(t, got[1].LastInstanceID)
	},
	"OverlapStateSurvivesAScheduleMovingBack": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		a0 := storage.ScheduleSpec{Workflow: "wf", Index: 0, Fingerprint: "fp-a"}
		b1 := storage.ScheduleSpec{Workflow: "wf", Index: 1, Fingerprint: "fp-b"}
		b.register(a0, b1)
		first := b.fire(fireParams(b1, b.now().Add(time.Minute)))
		require.Equal(t, storage.FireStarted, first.Outcome)
		b.complete(first.InstanceID, "a", `1`)

		// A is removed: B moves to index 0 and starts an instance there,
		// while the row of index 1 stays behind with B's first one.
		b.clock.Advance(time.Hour)
		b0 := storage.ScheduleSpec{Workflow: "wf", Index: 0, Fingerprint: "fp-b"}
		b.register(b0)
		running := b.fire(fireParams(b0, b.now().Add(time.Minute)))
		require.Equal(t, storage.FireStarted, running.Outcome)

		// A is back: B returns to index 1 and still waits for its running
		// instance.
		b.clock.Advance(time.Hour)
		got := b.register(a0, b1)
		require.Equal(t, running.InstanceID, got[1].LastInstanceID)
		skip := fireParams(b1, b.now().Add(time.Minute))
		skip.SkipIfRunning = true
		require.Equal(t, storage.FireResult{Outcome: storage.FireSkipped, InstanceID: running.InstanceID}, b.fire(skip))
	},
	"RegisterOnlyNewLeavesRegisteredSchedules": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		b.register(scheduleSpec)
		other := storage.ScheduleSpec{Workflow: "wf", Index: 0, Fingerprint: "fp-other"}
		added := storage.ScheduleSpec{Workflow: "wf", Index: 1, Fingerprint: "fp-b"}
		got, err := b.store.RegisterSchedules(b.ctx, storage.RegisterSchedulesParams{Specs: []storage.ScheduleSpec{other, added}, Now: b.now(), OnlyNew: true})
		require.NoError(t, err)
		require.Equal(t, "fp-1", got[0].Fingerprint, "a registered schedule is left as it is")
		require.Equal(t, "fp-b", got[1].Fingerprint, "a new one is registered")
	},
	"OverlapAllow": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		b.register(scheduleSpec)
		require.Equal(t, storage.FireStarted, b.fire(fireParams(scheduleSpec, b.now().Add(time.Minute))).Outcome)
		require.Equal(t, storage.FireStarted, b.fire(fireParams(scheduleSpec, b.now().Add(2*time.Minute))).Outcome)
		require.Equal(t, 2, b.instanceCount())
	},

	"PrunedLastInstanceCountsAsFinished": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		b.register(scheduleSpec)
		first := b.fire(fireParams(scheduleSpec, b.now().Add(time.Minute)))
		b.complete(first.InstanceID, "a", `1`)
		b.clock.Advance(time.Hour)
		n, err := b.store.Prune(b.ctx, b.now(), false)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Empty(t, b.schedule("wf", 0).LastInstanceStatus)
		p := fireParams(scheduleSpec, b.now().Add(time.Minute))
		p.SkipIfRunning = true
		require.Equal(t, storage.FireStarted, b.fire(p).Outcome)
	},

	"PauseAndResume": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		b.register(scheduleSpec)
		require.NoError(t, b.store.SetSchedulePaused(b.ctx, storage.SetPausedParams{Workflow: "wf", Index: 0, Paused: true, Now: b.now()}))
		require.True(t, b.schedule("wf", 0).Paused)
		require.True(t, b.register(scheduleSpec)[0].Paused, "loading the workflow again keeps the pause")
		require.True(t, b.register(storage.ScheduleSpec{Workflow: "wf", Index: 0, Fingerprint: "fp-edited"})[0].Paused,
			"so does editing the schedule at that index")
		b.register(scheduleSpec)

		during := b.now().Add(time.Minute)
		require.Equal(t, storage.FireStale, b.fire(fireParams(scheduleSpec, during)).Outcome)
		require.Zero(t, b.instanceCount())

		b.clock.Advance(time.Hour)
		require.NoError(t, b.store.SetSchedulePaused(b.ctx, storage.SetPausedParams{Workflow: "wf", Index: 0, Paused: false, Now: b.now()}))
		s := b.schedule("wf", 0)
		require.False(t, s.Paused)
		require.True(t, s.LastTick.Equal(b.now()), "the ticks of the pause are not caught up")
		require.Equal(t, storage.FireStale, b.fire(fireParams(scheduleSpec, during.Add(time.Second))).Outcome)
		require.Equal(t, storage.FireStarted, b.fire(fireParams(scheduleSpec, b.now().Add(time.Second))).Outcome)

		// Resuming a running schedule moves nothing.
		last := b.schedule("wf", 0).LastTick
		b.clock.Advance(time.Hour)
		require.NoError(t, b.store.SetSchedulePaused(b.ctx, storage.SetPausedParams{Workflow: "wf", Index: 0, Paused: false, Now: b.now()}))
		require.True(t, b.schedule("wf", 0).LastTick.Equal(last))
	},

	"Stale": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		b.register(scheduleSpec)
		other := storage.ScheduleSpec{Workflow: "wf", Index: 0, Fingerprint: "fp-other"}
		require.Equal(t, storage.FireResult{Outcome: storage.FireStale}, b.fire(fireParams(other, b.now().Add(time.Minute))),
			"a process that loaded another version of the file fires nothing")
		require.Zero(t, b.instanceCount())
		require.Zero(t, b.schedule("wf", 0).Fired)
	},

	"Errors": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		missing := storage.ScheduleSpec{Workflow: "wf", Index: 3, Fingerprint: "fp"}
		_, err := b.store.FireSchedule(b.ctx, fireParams(missing, b.now().Add(time.Minute)), Plan)
		require.ErrorIs(t, err, storage.ErrNotFound)
		require.ErrorIs(t, b.store.SetSchedulePaused(b.ctx, storage.SetPausedParams{Workflow: "wf", Index: 3, Paused: true}), storage.ErrNotFound)

		b.register(scheduleSpec)
		noKey := fireParams(scheduleSpec, b.now().Add(time.Minute))
		noKey.Instance.Key = ""
		_, err = b.store.FireSchedule(b.ctx, noKey, Plan)
		require.ErrorContains(t, err, "idempotency key")
		_, err = b.store.RegisterSchedules(b.ctx, storage.RegisterSchedulesParams{Specs: []storage.ScheduleSpec{{Workflow: "wf", Index: -1, Fingerprint: "x"}}})
		require.ErrorContains(t, err, "must not be negative")
		require.Zero(t, b.instanceCount())
		require.Zero(t, b.schedule("wf", 0).Fired)
	},
}
