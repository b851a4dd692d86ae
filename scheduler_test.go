package dagrun_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// fakeClock is the scheduler's clock in these tests: it moves only when
// told to.
type fakeClock struct{ *storagetest.Clock }

func newFakeClock(start time.Time) *fakeClock { return &fakeClock{storagetest.NewClock(start)} }

// Set moves the clock to t, which is not before its time.
func (c *fakeClock) Set(t time.Time) { c.Advance(t.Sub(c.Now())) }

// tickObserver counts what a scheduler reports.
type tickObserver struct {
	mu             sync.Mutex
	fired, skipped int
	lags           []time.Duration
}

func (o *tickObserver) InstanceStarted(string)                          {}
func (o *tickObserver) InstanceFinished(string, storage.InstanceStatus) {}
func (o *tickObserver) AttemptFinished(dagrun.AttemptReport)            {}
func (o *tickObserver) TickFired(_ string, lag time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.fired++
	o.lags = append(o.lags, lag)
}
func (o *tickObserver) TickSkipped(string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.skipped++
}

func newRegistry() *handlers.Registry {
	r := handlers.NewRegistry()
	handlers.RegisterBuiltins(r)
	return r
}

// scheduledWorkflow is a one-step workflow with the given schedule: items.
func scheduledWorkflow(name string, schedules ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "name: %s\nschedule:\n", name)
	for _, s := range schedules {
		fmt.Fprintf(&b, "  - %s\n", s)
	}
	b.WriteString("steps:\n  - name: a\n    handler: echo\n")
	return b.String()
}

// newScheduler returns a scheduler of an engine over store with the given
// workflow sources, on clock.
func newScheduler(t *testing.T, store storage.Store, clock *fakeClock, observer dagrun.Observer, sources ...string) (*dagrun.Engine, *dagrun.Scheduler) {
	t.Helper()
	var workflows []*dag.Workflow
	for _, src := range sources {
		w, err := dag.Parse("", []byte(src), nil)
		require.NoError(t, err)
		workflows = append(workflows, w)
	}
	engine, err := dagrun.New(store, newRegistry(), &dagrun.Config{Workflows: workflows, Observer: observer})
	require.NoError(t, err)
	s, err := engine.NewScheduler(&dagrun.SchedulerConfig{Now: clock.Now})
	require.NoError(t, err)
	require.NoError(t, s.Register(t.Context()))
	return engine, s
}

// runUntil drives a scheduler as Run does, on the fake clock: to each next
// tick it returns, one second late, until end.
func runUntil(t *testing.T, s *dagrun.Scheduler, clock *fakeClock, end time.Time) {
	t.Helper()
	for {
		next, err := s.FireDue(t.Context())
		require.NoError(t, err)
		if next.IsZero() || next.After(end) {
			clock.Set(end)
			_, err := s.FireDue(t.Context())
			require.NoError(t, err)
			return
		}
		clock.Set(next.Add(time.Second))
	}
}

// ticks returns the tick times of the instances schedule sch started, in
// order, from their idempotency keys.
func ticks(t *testing.T, store storage.Store, sch *dag.Schedule) []time.Time {
	t.Helper()
	all, err := store.ListInstances(t.Context(), storage.ListParams{Limit: 10_000})
	require.NoError(t, err)
	prefix := "schedule:" + sch.Fingerprint() + ":"
	var out []time.Time
	for _, in := range all {
		if rest, ok := strings.CutPrefix(in.Key, prefix); ok {
			tick, err := time.Parse(time.RFC3339, rest)
			require.NoError(t, err)
			out = append(out, tick)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// expectedWallTicks lists, for [from, to), the first instant at which the
// wall clock of loc shows each minute match accepts, written without the
// cron library or the scheduler's own arithmetic.
func expectedWallTicks(loc *time.Location, from, to time.Time, match func(wall time.Time) bool) []time.Time {
	var out []time.Time
	seen := map[string]bool{}
	for m := from; m.Before(to); m = m.Add(time.Minute) {
		wall := m.In(loc)
		key := wall.Format(time.DateTime)
		if match(wall) && !seen[key] {
			out = append(out, m.UTC())
		}
		seen[key] = true
	}
	return out
}

// TestSchedulerAcrossDST runs schedules over both 2027 transitions of two
// zones on a fake clock: each wall-clock time the cron names that exists
// in the zone starts exactly one instance, none is skipped and none
// doubled (02:30 on the night the clocks go back fires once; on the night
// they go forward it does not exist).
func TestSchedulerAcrossDST(t *testing.T) {
	t.Parallel()
	transitions := []struct {
		zone string
		day  time.Time
	}{
		{"Europe/Berlin", time.Date(2027, 3, 28, 0, 0, 0, 0, time.UTC)},
		{"Europe/Berlin", time.Date(2027, 10, 31, 0, 0, 0, 0, time.UTC)},
		{"America/New_York", time.Date(2027, 3, 14, 0, 0, 0, 0, time.UTC)},
		{"America/New_York", time.Date(2027, 11, 7, 0, 0, 0, 0, time.UTC)},
	}
	crons := []struct {
		cron  string
		match func(wall time.Time) bool
	}{
		{"30 2 * * *", func(w time.Time) bool { return w.Hour() == 2 && w.Minute() == 30 }},
		{"30 1 * * *", func(w time.Time) bool { return w.Hour() == 1 && w.Minute() == 30 }},
		{"0 * * * *", func(w time.Time) bool { return w.Minute() == 0 }},
	}
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		for _, tr := range transitions {
			t.Run(tr.zone+"/"+tr.day.Format(time.DateOnly), func(t *testing.T) {
				t.Parallel()
				store := open(t)
				var items []string
				for _, c := range crons {
					items = append(items, fmt.Sprintf("{cron: %q, timezone: %s, overlap: allow}", c.cron, tr.zone))
				}
				start, end := tr.day.Add(-30*time.Hour), tr.day.Add(54*time.Hour)
				clock := newFakeClock(start)
				engine, s := newScheduler(t, store, clock, nil, scheduledWorkflow("dst", items...))
				runUntil(t, s, clock, end)
				w, _ := engine.Workflow("dst")
				for i, c := range crons {
					want := expectedWallTicks(w.Schedules[i].Location, start.Add(time.Minute), end.Add(time.Minute), c.match)
					require.Equal(t, want, ticks(t, store, w.Schedules[i]), "cron %q in %s", c.cron, tr.zone)
				}
			})
		}
	})
}

// TestSchedulersRacingStartEachTickOnce runs three schedulers on one
// database, all firing at every tick at once.
func TestSchedulersRacingStartEachTickOnce(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		store := open(t)
		start := time.Date(2027, 5, 1, 12, 0, 0, 0, time.UTC)
		clock := newFakeClock(start)
		src := scheduledWorkflow("racy", `{cron: "@every 1s", overlap: allow}`)
		var schedulers []*dagrun.Scheduler
		for range 3 {
			_, s := newScheduler(t, store, clock, nil, src)
			schedulers = append(schedulers, s)
		}
		const n = 20
		for i := 1; i <= n; i++ {
			clock.Set(start.Add(time.Duration(i) * time.Second))
			var wg sync.WaitGroup
			for _, s := range schedulers {
				wg.Go(func() {
					_, err := s.FireDue(t.Context())
					require.NoError(t, err)
				})
			}
			wg.Wait()
		}
		w, err := dag.Parse("", []byte(src), nil)
		require.NoError(t, err)
		var want []time.Time
		for i := 1; i <= n; i++ {
			want = append(want, start.Add(time.Duration(i)*time.Second))
		}
		require.Equal(t, want, ticks(t, store, w.Schedules[0]))
	})
}

// TestSchedulerCatchup stops every scheduler for 50 minutes of a schedule
// that ticks every 10: a new one starts the missed ticks no older than
// catchup, each once, and none when catchup is absent.
func TestSchedulerCatchup(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		catchup string
		want    []int // minutes after the start
	}{
		{"None", "", []int{10, 60}},
		{"FifteenMinutes", "catchup: 15m,", []int{10, 40, 50, 60}},
		{"OneHour", "catchup: 1h,", []int{10, 20, 30, 40, 50, 60}},
	}
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				store := open(t)
				start := time.Date(2027, 5, 1, 12, 0, 0, 0, time.UTC)
				clock := newFakeClock(start)
				src := scheduledWorkflow("catchup", fmt.Sprintf(`{cron: "*/10 * * * *", %s overlap: allow}`, tc.catchup))
				_, first := newScheduler(t, store, clock, nil, src)
				clock.Set(start.Add(10*time.Minute + time.Second))
				_, err := first.FireDue(t.Context())
				require.NoError(t, err)

				// Every process was down from 12:10 to 12:55.
				clock.Set(start.Add(55 * time.Minute))
				engine, second := newScheduler(t, store, clock, nil, src)
				for range 2 {
					_, err := second.FireDue(t.Context())
					require.NoError(t, err)
				}
				runUntil(t, second, clock, start.Add(61*time.Minute))

				w, _ := engine.Workflow("catchup")
				var want []time.Time
				for _, m := range tc.want {
					want = append(want, start.Add(time.Duration(m)*time.Minute))
				}
				require.Equal(t, want, ticks(t, store, w.Schedules[0]))
			})
		}
	})
}

// TestSchedulerCatchupUnderOverlapSkip: catchup starts every missed tick
// under the default overlap: skip too, not only the oldest (the others
// would find it unfinished); the first tick after the catch-up, which
// comes while they run, is skipped.
func TestSchedulerCatchupUnderOverlapSkip(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		store := open(t)
		start := time.Date(2027, 5, 1, 12, 0, 0, 0, time.UTC)
		clock := newFakeClock(start)
		src := scheduledWorkflow("nightly", `{cron: "*/10 * * * *", catchup: 1h}`)
		newScheduler(t, store, clock, nil, src)

		// Every process was down from 12:00 to 12:55.
		clock.Set(start.Add(55 * time.Minute))
		obs := &tickObserver{}
		engine, s := newScheduler(t, store, clock, obs, src)
		runUntil(t, s, clock, start.Add(61*time.Minute))

		w, _ := engine.Workflow("nightly")
		var want []time.Time
		for _, m := range []int{10, 20, 30, 40, 50} {
			want = append(want, start.Add(time.Duration(m)*time.Minute))
		}
		require.Equal(t, want, ticks(t, store, w.Schedules[0]))
		require.Equal(t, 1, obs.skipped, "13:00 came while the caught-up instances ran")
	})
}

// TestSchedulerLateTickIsNotMissed: a running scheduler that wakes late
// (a slow database, a busy machine) still starts the tick, without
// catchup.
func TestSchedulerLateTickIsNotMissed(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		store := open(t)
		start := time.Date(2027, 5, 1, 12, 0, 0, 0, time.UTC)
		clock := newFakeClock(start)
		obs := &tickObserver{}
		engine, s := newScheduler(t, store, clock, obs, scheduledWorkflow("late", `{cron: "@every 1m", overlap: allow}`))
		clock.Set(start.Add(time.Minute + 20*time.Second))
		_, err := s.FireDue(t.Context())
		require.NoError(t, err)
		w, _ := engine.Workflow("late")
		require.Equal(t, []time.Time{start.Add(time.Minute)}, ticks(t, store, w.Schedules[0]))
		require.Equal(t, []time.Duration{20 * time.Second}, obs.lags, "the lag is reported")
	})
}

func TestSchedulerOverlapSkip(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		store := open(t)
		start := time.Date(2027, 5, 1, 12, 0, 0, 0, time.UTC)
		clock := newFakeClock(start)
		obs := &tickObserver{}
		engine, s := newScheduler(t, store, clock, obs, scheduledWorkflow("slow", `{cron: "@every 1m"}`))
		runUntil(t, s, clock, start.Add(3*time.Minute+time.Second))
		w, _ := engine.Workflow("slow")
		got := ticks(t, store, w.Schedules[0])
		require.Equal(t, []time.Time{start.Add(time.Minute)}, got, "nothing starts while the first instance is unfinished")
		require.Equal(t, 1, obs.fired)
		require.Equal(t, 2, obs.skipped)

		list, err := store.ListInstances(t.Context(), storage.ListParams{})
		require.NoError(t, err)
		require.NoError(t, engine.Cancel(t.Context(), list[0].ID))
		runUntil(t, s, clock, start.Add(4*time.Minute+time.Second))
		require.Len(t, ticks(t, store, w.Schedules[0]), 2, "the next tick after it finished starts")

		infos, err := engine.Schedules(t.Context(), clock.Now(), 3)
		require.NoError(t, err)
		require.Len(t, infos, 1)
		require.Equal(t, int64(2), infos[0].Fired)
		require.Equal(t, int64(2), infos[0].Skipped)
		require.Equal(t, []time.Time{start.Add(5 * time.Minute), start.Add(6 * time.Minute), start.Add(7 * time.Minute)}, infos[0].Next)
	})
}

// TestSchedulerEdits loads edited versions of a workflow file, as a
// restart after an edit does, right after a tick fired: the tick is not
// fired again, and the edit applies from the next tick.
func TestSchedulerEdits(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		store := open(t)
		start := time.Date(2027, 5, 1, 2, 0, 0, 0, time.UTC)
		clock := newFakeClock(start)
		daily := `{cron: "0 3 * * *", overlap: allow, catchup: 2h}`
		hourly := `{cron: "0 * * * *", overlap: allow, catchup: 2h}`
		halfHourly := `{cron: "30 * * * *", overlap: allow, catchup: 2h}`
		_, v1 := newScheduler(t, store, clock, nil, scheduledWorkflow("report", daily, halfHourly))
		runUntil(t, v1, clock, start.Add(time.Hour+time.Second)) // 02:30 and 03:00 fired

		// The cron of schedule 0 changes, and the schedules swap places.
		clock.Advance(10 * time.Second)
		engine, v2 := newScheduler(t, store, clock, nil, scheduledWorkflow("report", halfHourly, hourly))
		runUntil(t, v2, clock, start.Add(2*time.Hour+time.Second))
		all, err := store.ListInstances(t.Context(), storage.ListParams{Limit: 100})
		require.NoError(t, err)
		w, _ := engine.Workflow("report")
		require.Equal(t, []time.Time{start.Add(30 * time.Minute), start.Add(90 * time.Minute)}, ticks(t, store, w.Schedules[0]),
			"the half-hourly schedule moved to index 0 and went on, with no tick twice")
		require.Equal(t, []time.Time{start.Add(2 * time.Hour)}, ticks(t, store, w.Schedules[1]),
			"the new hourly schedule starts after the edit: 03:00 is not fired again, nor caught up")
		require.Len(t, all, 4)

		// Removing every schedule stops them.
		clock.Advance(10 * time.Second)
		_, v3 := newScheduler(t, store, clock, nil, "name: report\nsteps:\n  - name: a\n    handler: echo\n")
		runUntil(t, v3, clock, start.Add(4*time.Hour))
		all, err = store.ListInstances(t.Context(), storage.ListParams{Limit: 100})
		require.NoError(t, err)
		require.Len(t, all, 4)
	})
}

func TestSchedulerPause(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		store := open(t)
		// PauseSchedule reads the real clock: the fake one runs behind it.
		start := time.Now().UTC().Truncate(time.Minute).Add(-30 * time.Minute)
		clock := newFakeClock(start)
		src := scheduledWorkflow("paused", `{cron: "@every 1m", overlap: allow, catchup: 1h}`)
		engine, s := newScheduler(t, store, clock, nil, src)
		require.NoError(t, engine.PauseSchedule(t.Context(), "paused", 0, true))
		runUntil(t, s, clock, start.Add(5*time.Minute+time.Second))
		w, _ := engine.Workflow("paused")
		require.Empty(t, ticks(t, store, w.Schedules[0]))

		// A restart keeps the pause.
		engine, s = newScheduler(t, store, clock, nil, src)
		infos, err := engine.Schedules(t.Context(), clock.Now(), 1)
		require.NoError(t, err)
		require.True(t, infos[0].Paused)
		runUntil(t, s, clock, start.Add(6*time.Minute+time.Second))
		require.Empty(t, ticks(t, store, w.Schedules[0]))

		require.NoError(t, engine.PauseSchedule(t.Context(), "paused", -1, false))
		states, err := store.ListSchedules(t.Context())
		require.NoError(t, err)
		resumed := states[0].LastTick
		end := start.Add(34 * time.Minute)
		runUntil(t, s, clock, end)
		var want []time.Time
		for tick := resumed.Truncate(time.Minute).Add(time.Minute); !tick.After(end); tick = tick.Add(time.Minute) {
			want = append(want, tick)
		}
		require.NotEmpty(t, want)
		require.Equal(t, want, ticks(t, store, w.Schedules[0]), "resumed: the ticks of the pause are not caught up")

		// A pause and a resume from a checkout whose file differs (a
		// process that runs no scheduler) leave the schedulers' version
		// registered, so that they go on firing it.
		w2, err := dag.Parse("", []byte(scheduledWorkflow("paused", `{cron: "@every 2m", overlap: allow}`)), nil)
		require.NoError(t, err)
		checkout, err := dagrun.New(store, newRegistry(), &dagrun.Config{Workflows: []*dag.Workflow{w2}})
		require.NoError(t, err)
		require.NoError(t, checkout.PauseSchedule(t.Context(), "paused", 0, true))
		require.NoError(t, checkout.PauseSchedule(t.Context(), "paused", 0, false))
		after, err := store.ListSchedules(t.Context())
		require.NoError(t, err)
		require.Equal(t, states[0].Fingerprint, after[0].Fingerprint)
		next := ticks(t, store, w.Schedules[0])
		runUntil(t, s, clock, end.Add(2*time.Minute))
		require.Len(t, ticks(t, store, w.Schedules[0]), len(next)+2, "the schedulers' version still fires")

		require.ErrorIs(t, engine.PauseSchedule(t.Context(), "paused", 1, true), storage.ErrNotFound)
		var unknown *dagrun.UnknownWorkflowError
		require.ErrorAs(t, engine.PauseSchedule(t.Context(), "nope", 0, true), &unknown)
	})
}

// TestSchedulerRunStartsInstancesAndStops runs the real loop for a few
// ticks of @every 1s.
func TestSchedulerRunStartsInstancesAndStops(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		store := open(t)
		w, err := dag.Parse("", []byte(scheduledWorkflow("loop", `{cron: "@every 1s", overlap: allow}`)), nil)
		require.NoError(t, err)
		engine, err := dagrun.New(store, newRegistry(), &dagrun.Config{Workflows: []*dag.Workflow{w}})
		require.NoError(t, err)
		s, err := engine.NewScheduler(nil)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		require.Eventually(t, func() bool { return len(ticks(t, store, w.Schedules[0])) >= 2 }, 10*time.Second, 20*time.Millisecond)
		cancel()
		require.NoError(t, <-done)
	})
}

// TestSchedulerMixedVersions runs an old and a new version of a file side
// by side, as a rolling deploy does: the schedule at index 0 is the one the
// process started last registered, and the other process fires nothing
// there, rather than both taking the index back from each other.
func TestSchedulerMixedVersions(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		store := open(t)
		start := time.Date(2027, 5, 1, 12, 0, 0, 0, time.UTC)
		clock := newFakeClock(start)
		_, old := newScheduler(t, store, clock, nil, scheduledWorkflow("report", `{cron: "@every 1m", overlap: allow}`))
		clock.Advance(10 * time.Second)
		engine, current := newScheduler(t, store, clock, nil, scheduledWorkflow("report", `{cron: "@every 2m", overlap: allow}`))
		for m := 1; m <= 10; m++ {
			clock.Set(start.Add(time.Duration(m)*time.Minute + time.Second))
			for _, s := range []*dagrun.Scheduler{old, current} {
				_, err := s.FireDue(t.Context())
				require.NoError(t, err)
			}
		}
		w, _ := engine.Workflow("report")
		var want []time.Time
		for m := 2; m <= 10; m += 2 {
			want = append(want, start.Add(time.Duration(m)*time.Minute))
		}
		require.Equal(t, want, ticks(t, store, w.Schedules[0]))
		all, err := store.ListInstances(t.Context(), storage.ListParams{Limit: 100})
		require.NoError(t, err)
		require.Len(t, all, len(want), "the old version fired nothing")
	})
}
