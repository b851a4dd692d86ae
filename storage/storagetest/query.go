package storagetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

var queryTests = map[string]func(*testing.T, *Harness){
	"GetInstance": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("zeta"), spec("alpha", "zeta"), spec("mid"))
		b.complete(id, "zeta", `1`)
		b.clock.Advance(time.Second)
		b.complete(id, "mid", `2`)

		in := b.get(id)
		var names []string
		for _, s := range in.Steps {
			names = append(names, s.Name)
			require.Positive(t, s.ID)
		}
		require.Equal(t, []string{"zeta", "alpha", "mid"}, names, "definition order")
		require.Equal(t, "name: wf\n", string(in.Definition))
		require.NotEmpty(t, in.Events)
		for i, e := range in.Events {
			require.Equal(t, id, e.InstanceID)
			if i > 0 {
				require.Greater(t, e.ID, in.Events[i-1].ID)
				require.False(t, e.At.Before(in.Events[i-1].At))
			}
		}
		var types []storage.EventType
		for _, e := range in.Events {
			if e.Step == "zeta" || e.Step == "" {
				types = append(types, e.Type)
			}
		}
		require.Equal(t, []storage.EventType{
			storage.EventInstanceCreated, storage.EventStepReady, storage.EventStepStarted,
			storage.EventInstanceStarted, storage.EventStepCompleted,
		}, reorderStart(types))

		_, err := b.store.GetInstance(b.ctx, "no-such-instance")
		require.ErrorIs(t, err, storage.ErrNotFound)
	},

	"ListInstances": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		var wfA, wfB []string
		for i := range 5 {
			p := params(spec("a"))
			if i%2 == 0 {
				wfA = append(wfA, p.ID)
			} else {
				p.Workflow = "other"
				wfB = append(wfB, p.ID)
			}
			b.create(p)
		}
		b.complete(wfA[1], "a", `1`)
		ids := func(list []storage.Instance) []string {
			var out []string
			for _, in := range list {
				out = append(out, in.ID)
				require.Empty(t, in.Events, "lists carry no events")
				require.Len(t, in.Steps, 1, "lists carry steps")
			}
			return out
		}
		list := func(p storage.ListParams) []storage.Instance {
			out, err := b.store.ListInstances(b.ctx, p)
			require.NoError(t, err)
			return out
		}
		all := list(storage.ListParams{})
		require.Equal(t, []string{wfA[2], wfB[1], wfA[1], wfB[0], wfA[0]}, ids(all), "newest first")
		require.Equal(t, []string{wfA[2], wfA[1], wfA[0]}, ids(list(storage.ListParams{Workflow: "wf"})))
		require.Equal(t, []string{wfA[1]}, ids(list(storage.ListParams{Status: storage.InstanceCompleted})))
		require.Equal(t, []string{wfA[2], wfA[0]}, ids(list(storage.ListParams{Workflow: "wf", Status: storage.InstancePending})))
		require.Empty(t, list(storage.ListParams{Workflow: "nope"}))
		completed := list(storage.ListParams{Status: storage.InstanceCompleted})[0]
		require.Equal(t, storage.StepCompleted, completed.Steps[0].Status)
		require.NotNil(t, completed.FinishedAt)

		// Paging by BeforeID walks everything once.
		var paged []string
		before := ""
		for {
			page := list(storage.ListParams{Limit: 2, BeforeID: before})
			require.LessOrEqual(t, len(page), 2)
			if len(page) == 0 {
				break
			}
			paged = append(paged, ids(page)...)
			before = page[len(page)-1].ID
		}
		require.Equal(t, ids(all), paged)
		require.Equal(t, []string{wfA[1], wfA[0]}, ids(list(storage.ListParams{Workflow: "wf", BeforeID: wfA[2]})))
	},

	"ListDefaultLimit": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		ps := make([]storage.CreateParams, 60)
		for i := range ps {
			ps[i] = params(spec("a"))
		}
		b.create(ps...)
		out, err := b.store.ListInstances(b.ctx, storage.ListParams{})
		require.NoError(t, err)
		require.Len(t, out, 50)
		require.Equal(t, ps[59].ID, out[0].ID)
	},
}

// reorderStart lets the instance.started event come before or after the
// first step.started event of the same claim: both happen in one
// transaction and the interface does not order them.
func reorderStart(types []storage.EventType) []storage.EventType {
	for i := 0; i+1 < len(types); i++ {
		if types[i] == storage.EventInstanceStarted && types[i+1] == storage.EventStepStarted {
			types[i], types[i+1] = types[i+1], types[i]
		}
	}
	return types
}

var statsTests = map[string]func(*testing.T, *Harness){
	"DurationsOverRecentInstances": statsDurationsOverRecentInstances,
	"Unserved":                     statsUnserved,
	"Figures": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		// Twenty completed steps taking 1s, 2s, ... 20s.
		for i := 1; i <= 20; i++ {
			id := b.createOne(spec("a"))
			c := b.claimStep(id, "a")
			b.clock.Advance(time.Duration(i) * time.Second)
			b.finish(completed(c.Claim, `1`))
		}
		// One running step stuck past its lease.
		stuck := b.createOne(spec("a"))
		b.claimStep(stuck, "a")
		b.clock.Advance(31 * time.Second)
		// Two ready steps, the older ready for 5s, and one not yet ready.
		b.createOne(spec("a"))
		b.clock.Advance(5 * time.Second)
		b.createOne(spec("a"))
		delayed := params(spec("a"))
		delayed.RunAfter = b.now().Add(time.Hour)
		b.create(delayed)
		// Another workflow.
		other := params(spec("a"))
		other.Workflow = "other"
		b.create(other)
		require.NoError(t, b.store.CancelInstance(b.ctx, other.ID, "x", Plan))

		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		byName := map[string]storage.WorkflowStats{}
		for _, w := range st.Workflows {
			byName[w.Workflow] = w
		}
		require.Len(t, byName, 2)
		wf := byName["wf"]
		require.Equal(t, 20, wf.Instances[storage.InstanceCompleted])
		require.Equal(t, 1, wf.Instances[storage.InstanceRunning])
		require.Equal(t, 3, wf.Instances[storage.InstancePending])
		require.Zero(t, wf.Instances[storage.InstanceFailed])
		require.Equal(t, 1, wf.RunningSteps, "the stuck step still counts as running")
		require.Equal(t, 1, wf.StuckSteps)
		require.Equal(t, 2, wf.ReadySteps)
		require.Equal(t, 5*time.Second, wf.OldestReady)
		require.Equal(t, 10*time.Second, wf.StepP50)
		require.Equal(t, 19*time.Second, wf.StepP95)

		o := byName["other"]
		require.Equal(t, 1, o.Instances[storage.InstanceCancelled])
		require.Zero(t, o.ReadySteps)
		require.Zero(t, o.RunningSteps)
		require.Zero(t, o.OldestReady)
		require.Zero(t, o.StepP50)

		// Every step ran on q.a: the delayed one is not ready, the completed
		// and cancelled ones count nowhere.
		require.Equal(t, []storage.QueueStats{{Queue: "q.a", Ready: 2, Running: 1, Stuck: 1}}, st.Queues)
	},

	"PerQueue": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		on := func(queue, name string, deps ...string) storage.StepSpec {
			s := spec(name, deps...)
			s.Queue = queue
			return s
		}
		claimOn := func(id, queue string) storage.ClaimedStep {
			t.Helper()
			got := b.claim(storage.ClaimParams{InstanceID: id, Queues: []string{queue}})
			require.Len(t, got, 1)
			return got[0]
		}
		// On "busy": a completed step (not counted), a step stuck past its
		// 30s lease, a step running within its lease, a ready step of
		// workflow wf and one of workflow other, and one due in an hour.
		done := b.createOne(on("busy", "a"))
		b.finish(completed(claimOn(done, "busy").Claim, `1`))
		stuck := b.createOne(on("busy", "a"))
		claimOn(stuck, "busy")
		b.createOne(on("busy", "a"))
		b.clock.Advance(31 * time.Second)
		running := b.createOne(on("busy", "a"))
		claimOn(running, "busy")
		other := params(on("busy", "a"))
		other.Workflow = "other"
		b.create(other)
		delayed := params(on("busy", "a"))
		delayed.RunAfter = b.now().Add(time.Hour)
		b.create(delayed)
		// On "first" a ready step whose successor waits, blocked, on
		// "blocked"; on "later" only a step due in a minute.
		b.createOne(on("first", "x"), on("blocked", "y", "x"))
		later := params(on("later", "a"))
		later.RunAfter = b.now().Add(time.Minute)
		b.create(later)

		stats := func() (map[string]storage.WorkflowStats, []storage.QueueStats) {
			t.Helper()
			st, err := b.store.Stats(b.ctx)
			require.NoError(t, err)
			byName := map[string]storage.WorkflowStats{}
			for _, w := range st.Workflows {
				byName[w.Workflow] = w
			}
			return byName, st.Queues
		}
		wfs, queues := stats()
		require.Equal(t, []storage.QueueStats{
			{Queue: "busy", Ready: 2, Running: 2, Stuck: 1},
			{Queue: "first", Ready: 1},
		}, queues, "blocked and not-yet-due steps are not ready; idle queues are absent")
		require.Equal(t, 2, wfs["wf"].RunningSteps)
		require.Equal(t, 1, wfs["wf"].StuckSteps)
		require.Equal(t, 2, wfs["wf"].ReadySteps, "one on busy, one on first")
		require.Equal(t, 31*time.Second, wfs["wf"].OldestReady)
		require.Equal(t, 1, wfs["other"].ReadySteps)
		require.Zero(t, wfs["other"].RunningSteps)
		require.Zero(t, wfs["other"].StuckSteps)

		// A minute on, the second lease has expired too and the step on
		// "later" is due (run_after == now counts as ready).
		b.clock.Advance(time.Minute)
		wfs, queues = stats()
		require.Equal(t, []storage.QueueStats{
			{Queue: "busy", Ready: 2, Running: 2, Stuck: 2},
			{Queue: "first", Ready: 1},
			{Queue: "later", Ready: 1},
		}, queues)
		require.Equal(t, 2, wfs["wf"].RunningSteps)
		require.Equal(t, 2, wfs["wf"].StuckSteps)
		require.Equal(t, 3, wfs["wf"].ReadySteps)
		require.Equal(t, 91*time.Second, wfs["wf"].OldestReady, "the oldest across queues")
	},

	"OldestReadyCountsFromReady": func(t *testing.T, h *Harness) {
		// A step made ready by its dependencies is due from its instance's
		// start (claim order), but its age counts from when it became
		// ready; a delayed step's from when its time came.
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b", "a"))
		b.clock.Advance(10 * time.Second)
		b.complete(id, "a", `1`)
		b.clock.Advance(3 * time.Second)
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Len(t, st.Workflows, 1)
		require.Equal(t, 1, st.Workflows[0].ReadySteps)
		require.Equal(t, 3*time.Second, st.Workflows[0].OldestReady)
	},

	"Empty": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Empty(t, st.Workflows)
		require.Empty(t, st.Queues)
	},
}

var pruneTests = map[string]func(*testing.T, *Harness){
	"FinishedOlderThan": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		old := b.createOne(spec("a"))
		b.complete(old, "a", `1`)
		oldFailed := b.createOne(spec("a"))
		c := b.claimStep(oldFailed, "a")
		b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeFailed, Error: "x"})
		unfinished := b.createOne(spec("a"), spec("b"))
		b.complete(unfinished, "a", `1`)
		b.clock.Advance(time.Hour)
		recent := b.createOne(spec("a"))
		require.NoError(t, b.store.CancelInstance(b.ctx, recent, "x", Plan))
		bound := b.now().Add(-30 * time.Minute)

		n, err := b.store.Prune(b.ctx, bound, true)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		b.get(old) // a dry run deletes nothing

		n, err = b.store.Prune(b.ctx, bound, false)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		for _, id := range []string{old, oldFailed} {
			_, err := b.store.GetInstance(b.ctx, id)
			require.ErrorIs(t, err, storage.ErrNotFound)
		}
		require.Len(t, b.get(unfinished).Steps, 2, "unfinished instances stay, however old")
		require.NotEmpty(t, b.get(recent).Events)
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Len(t, st.Workflows, 1)
		require.Zero(t, st.Workflows[0].Instances[storage.InstanceCompleted], "steps went with their instance")
		require.Zero(t, st.Workflows[0].StepP50, "completed steps went with their instance")

		n, err = b.store.Prune(b.ctx, b.now().Add(time.Second), false)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		b.get(unfinished)
	},

	// A definition snapshot goes with the last instance that used it: a
	// start with the same hash afterwards stores its own source again,
	// which a kept row would have shadowed (the first snapshot of a hash
	// wins).
	"DefinitionsNoInstanceUses": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		withDefinition := func(hash, source string) storage.CreateParams {
			p := params(spec("a"))
			p.DefinitionHash, p.Definition = hash, []byte(source)
			return p
		}
		gone, shared, kept := withDefinition("hash-gone", "v1"), withDefinition("hash-shared", "v1"), withDefinition("hash-shared", "v1")
		b.create(gone, shared, kept)
		b.complete(gone.ID, "a", `1`)
		b.complete(shared.ID, "a", `1`)
		b.clock.Advance(time.Hour)

		n, err := b.store.Prune(b.ctx, b.now(), false)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		require.Equal(t, "v1", string(b.get(kept.ID).Definition), "a definition an unfinished instance uses stays")

		again, sharedAgain := withDefinition("hash-gone", "v2"), withDefinition("hash-shared", "v2")
		b.create(again, sharedAgain)
		require.Equal(t, "v2", string(b.get(again.ID).Definition), "the pruned instance's definition was deleted")
		require.Equal(t, "v1", string(b.get(sharedAgain.ID).Definition))
	},
}

// statsDurationsOverRecentInstances: percentiles cover only the
// storage.StatsWindow most recently finished instances.
func statsDurationsOverRecentInstances(t *testing.T, h *Harness) {
	b := h.setup(t)
	// A hundred old instances whose steps took an hour, then a window's
	// worth whose steps took a second. Over all of them the p95 would be an
	// hour (the old ones are 9% of the steps); over the window it is a
	// second.
	finishAll := func(n int, took time.Duration) {
		ps := make([]storage.CreateParams, n)
		for i := range ps {
			ps[i] = params(spec("a"))
		}
		b.create(ps...)
		claimed := b.claim(storage.ClaimParams{Limit: n})
		require.Len(t, claimed, n)
		b.clock.Advance(took)
		rs := make([]storage.StepResult, len(claimed))
		for i, c := range claimed {
			rs[i] = completed(c.Claim, `1`)
		}
		b.finish(rs...)
	}
	finishAll(100, time.Hour)
	st, err := b.store.Stats(b.ctx)
	require.NoError(t, err)
	require.Equal(t, time.Hour, st.Workflows[0].StepP95)

	b.clock.Advance(time.Minute)
	finishAll(storage.StatsWindow, time.Second)
	st, err = b.store.Stats(b.ctx)
	require.NoError(t, err)
	require.Equal(t, storage.StatsWindow+100, st.Workflows[0].Instances[storage.InstanceCompleted])
	require.Equal(t, time.Second, st.Workflows[0].StepP95, "only the most recent instances count")
}
