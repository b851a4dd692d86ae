package app

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/stretchr/testify/require"
)

func TestTunesGC(t *testing.T) {
	tests := []struct {
		name string
		gogc string
		want bool
	}{
		{name: "unset", gogc: "", want: true},
		{name: "a number", gogc: "50", want: false},
		{name: "off", gogc: "off", want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tunesGC(func(name string) string {
				if name == "GOGC" {
					return tt.gogc
				}
				return ""
			}))
		})
	}
}

func TestGCPercentFor(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		live, floor uint64
		want        int
	}{
		{live: 0, floor: maxFloor, want: 1600},             // Go's floor, 4 MiB × 16, is the floor
		{live: 2 * mib, floor: maxFloor, want: 1600},       // 34 MiB at 1600: the floor rules
		{live: 8 * mib, floor: maxFloor, want: 700},        // 8 × 8 = 64 MiB
		{live: 16 * mib, floor: maxFloor, want: 300},       // 16 × 4 = 64 MiB
		{live: 22 * mib, floor: maxFloor, want: 200},       // three times 22 passes the floor
		{live: 1024 * mib, floor: maxFloor, want: 200},     // a large heap: three times it
		{live: 64*mib + 1, floor: maxFloor, want: 200},     // above the floor already
		{live: 21*mib + mib/3, floor: maxFloor, want: 200}, // 3 × live = 64 MiB exactly
		{live: 0, floor: startFloor, want: 200},            // the starting floor: 4 MiB × 2
		{live: 2 * mib, floor: startFloor, want: 200},      // Go's floor at 200 is the floor
		{live: 3 * mib, floor: startFloor, want: 200},      // three times 3 passes the floor
		{live: 0, floor: 2 * startFloor, want: 400},        // raised once: 4 MiB × 4
		{live: 4 * mib, floor: 2 * startFloor, want: 300},  // 4 × 4 = 16 MiB
	}
	for _, tt := range tests {
		got := gcPercentFor(tt.live, tt.floor)
		require.Equal(t, tt.want, got, "live %d bytes, floor %d", tt.live, tt.floor)
		// The next collection starts at the floor or at three times live,
		// whichever is larger, within a percent's rounding.
		goal := max(float64(tt.live)*(1+float64(got)/100), 4*mib*float64(got)/100)
		require.InDelta(t, max(float64(tt.floor), 3*float64(tt.live)), goal, float64(tt.live)/100+1)
	}
}

// TestGCTunerRaisesTheFloorWhenCollectionsComeFast: collections a second
// apart keep the starting floor; each that follows the one before within
// fastCycle doubles it, up to maxFloor, where slow ones then leave it.
func TestGCTunerRaisesTheFloorWhenCollectionsComeFast(t *testing.T) {
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })
	const live = 1 << 20
	now := time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC)
	g := newGCTuner(func() time.Time { return now })
	debug.SetGCPercent(g.percent) // as startGCTuner does
	collection := func(after time.Duration, wantFloor uint64) {
		t.Helper()
		now = now.Add(after)
		g.retarget(live)
		require.Equal(t, wantFloor, g.floor, "floor after a collection %s after the one before", after)
		require.Equal(t, gcPercentFor(live, wantFloor), g.percent)
		require.Equal(t, g.percent, currentGCPercent(), "GOGC")
	}
	collection(time.Second, startFloor)
	collection(time.Second, startFloor)
	collection(fastCycle, startFloor) // not within it
	collection(fastCycle-time.Millisecond, 2*startFloor)
	collection(100*time.Millisecond, 4*startFloor)
	collection(100*time.Millisecond, 8*startFloor)
	collection(100*time.Millisecond, maxFloor)
	collection(10*time.Millisecond, maxFloor)
	collection(time.Minute, maxFloor)
}

// TestGCTunerFollowsTheLiveHeap: after a collection that finds much live,
// the target falls to defaultGCPercent; after one that finds little, it
// rises to keep the floor.
func TestGCTunerFollowsTheLiveHeap(t *testing.T) {
	before := debug.SetGCPercent(100)
	// A clock that stands still: every collection follows the one before
	// within fastCycle, so the floor is up at maxFloor after three, however
	// slowly the machine collects.
	stop := newGCTuner(func() time.Time { return time.Unix(0, 0) }).start()
	t.Cleanup(func() {
		stop()
		debug.SetGCPercent(before)
	})
	percentAfterGC := func(want int) {
		t.Helper()
		require.Eventually(t, func() bool {
			runtime.GC()
			return currentGCPercent() == want
		}, 10*time.Second, 10*time.Millisecond, "GOGC %d, want %d", currentGCPercent(), want)
	}
	ballast := make([]*[1 << 20]byte, 48) // 48 MiB live, in pieces the collector must scan
	for i := range ballast {
		ballast[i] = new([1 << 20]byte)
	}
	percentAfterGC(defaultGCPercent)
	runtime.KeepAlive(ballast)
	ballast = nil
	percentAfterGC(gcPercentFor(0, maxFloor))
}

func currentGCPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// TestLimitMemory: a container's memory limit bounds the heap at 90% of
// it; the environment's GOMEMLIMIT, or none to read, leaves Go's.
func TestLimitMemory(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	tests := []struct {
		name       string
		gomemlimit string
		provider   memlimit.Provider
		want       int64
	}{
		{name: "a cgroup limit", provider: memlimit.Limit(1 << 30), want: 1 << 30 * 9 / 10},
		{name: "no limit", provider: func() (uint64, error) { return 0, memlimit.ErrNoLimit }, want: math.MaxInt64},
		{name: "GOMEMLIMIT set", gomemlimit: "2GiB", provider: memlimit.Limit(1 << 30), want: math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("GOMEMLIMIT", tt.gomemlimit)
			debug.SetMemoryLimit(math.MaxInt64)
			limitMemory(tt.provider)
			require.InDelta(t, tt.want, debug.SetMemoryLimit(-1), 1)
		})
	}
}
