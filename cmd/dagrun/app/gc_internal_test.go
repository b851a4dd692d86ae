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
		live uint64
		want int
	}{
		{live: 0, want: 1600},             // Go's floor, 4 MiB × 16, is the floor
		{live: 2 * mib, want: 1600},       // 34 MiB at 1600: the floor rules
		{live: 8 * mib, want: 700},        // 8 × 8 = 64 MiB
		{live: 16 * mib, want: 300},       // 16 × 4 = 64 MiB
		{live: 22 * mib, want: 200},       // three times 22 passes the floor
		{live: 1024 * mib, want: 200},     // a large heap: three times it
		{live: 64*mib + 1, want: 200},     // above the floor already
		{live: 21*mib + mib/3, want: 200}, // 3 × live = 64 MiB exactly
	}
	for _, tt := range tests {
		got := gcPercentFor(tt.live)
		require.Equal(t, tt.want, got, "live %d bytes", tt.live)
		// The next collection starts at the floor or at three times live,
		// whichever is larger, within a percent's rounding.
		goal := max(float64(tt.live)*(1+float64(got)/100), 4*mib*float64(got)/100)
		require.InDelta(t, max(float64(heapFloor), 3*float64(tt.live)), goal, float64(tt.live)/100+1)
	}
}

// TestGCTunerFollowsTheLiveHeap: after a collection that finds much live,
// the target falls to defaultGCPercent; after one that finds little, it
// rises to keep the floor.
func TestGCTunerFollowsTheLiveHeap(t *testing.T) {
	before := debug.SetGCPercent(100)
	stop := startGCTuner()
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
	percentAfterGC(maxGCPercent)
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
