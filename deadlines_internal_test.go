package dagrun

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/storage"
)

func TestIdleTimerFiresByTheEarliestDeadline(t *testing.T) {
	now := time.Now()
	soon, later, latest := now.Add(time.Hour), now.Add(2*time.Hour), now.Add(3*time.Hour)
	for _, tc := range []struct {
		name  string
		steps func(*idleTimer)
		want  time.Time // zero: not set
	}{
		{"a deadline sets a stopped timer", func(t *idleTimer) { t.fireBy(later) }, later},
		{"an earlier deadline moves it", func(t *idleTimer) { t.fireBy(later); t.fireBy(soon) }, soon},
		{"a later deadline does not put it off", func(t *idleTimer) { t.fireBy(soon); t.fireBy(later) }, soon},
		{"no deadline leaves it", func(t *idleTimer) { t.fireBy(later); t.fireBy(time.Time{}) }, later},
		{"a store's next wake replaces it", func(t *idleTimer) { t.fireBy(soon); t.set(time.Until(latest)) }, latest},
		{"once fired, a later deadline sets it", func(t *idleTimer) { t.fireBy(soon); t.fired(); t.fireBy(later) }, later},
		{"once fired, it is not set", func(t *idleTimer) { t.fireBy(soon); t.fired() }, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			timer := newIdleTimer()
			defer timer.Stop()
			tc.steps(timer)
			if tc.want.IsZero() {
				require.True(t, timer.at.IsZero(), "set to %v", timer.at)
				return
			}
			require.WithinDuration(t, tc.want, timer.at, time.Second)
		})
	}
}

func TestWakeTimesKeepTheEarliestUntilTaken(t *testing.T) {
	d := newWakeTimes()
	now := time.Now()
	d.add(now.Add(2 * time.Second))
	d.add(now.Add(time.Second))
	d.add(now.Add(3 * time.Second))
	select {
	case <-d.told:
	default:
		t.Fatal("adding a deadline did not tell the claim loop")
	}
	require.Equal(t, now.Add(time.Second), d.take())
	require.True(t, d.take().IsZero(), "a deadline taken twice")
}

func TestDeadlinesInAPlan(t *testing.T) {
	w, err := dag.Parse("approval.yaml", []byte(`
name: approval
timeout: 1h
steps:
  - {name: quick, wait: {signal: a, timeout: 5m}}
  - {name: slow, wait: {signal: b, timeout: 30m}}
  - {name: forever, wait: {signal: c}}
  - {name: work, handler: noop}
`), nil)
	require.NoError(t, err)
	waiting := func(names ...string) []storage.StepChange {
		var changes []storage.StepChange
		for _, n := range names {
			changes = append(changes, storage.StepChange{Name: n, Status: storage.StepWaiting})
		}
		return changes
	}
	for _, tc := range []struct {
		name   string
		status storage.InstanceStatus
		plan   storage.Plan
		want   time.Duration // 0: none
	}{
		{"a new instance's timeout", storage.InstancePending, storage.Plan{Steps: []storage.StepChange{{Name: "work", Status: storage.StepPending}}}, time.Hour},
		{"a new instance's shorter wait", storage.InstancePending, storage.Plan{Steps: waiting("slow")}, 30 * time.Minute},
		{"the shortest of the waits begun", storage.InstanceRunning, storage.Plan{Steps: waiting("forever", "slow", "quick")}, 5 * time.Minute},
		{"a wait with no timeout", storage.InstanceRunning, storage.Plan{Steps: waiting("forever")}, 0},
		{"a running instance's timeout counts already", storage.InstanceRunning, storage.Plan{Steps: []storage.StepChange{{Name: "work", Status: storage.StepPending}}}, 0},
		{"a deferred instance has not started", storage.InstancePending, storage.Plan{Deferred: true}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := deadlinesIn(w, &storage.InstanceState{Status: tc.status}, &tc.plan)
			require.Equal(t, tc.want != 0, ok)
			require.Equal(t, tc.want, got)
		})
	}
}
