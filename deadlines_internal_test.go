package dagrun

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
