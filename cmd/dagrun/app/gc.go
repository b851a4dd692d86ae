package app

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// A dagrun process whose environment sets no GOGC collects when its heap
// reaches the larger of heapFloor and three times what is live
// (defaultGCPercent), where Go's default is twice what is live with a
// 4 MiB floor.
//
// A worker's live heap is small (2-3 MB in a chain4 bench) and what it
// allocates is short-lived: rows read to plan an instance, results,
// records. With Go's 4 MiB floor the collector ran about 45 times a second
// in a chain4 bench on SQLite, and its mark workers and assists took
// cycles from the one writer that sets the pace. GOGC=200 gained 10%; the
// floor another 5-10% (see the README's Performance section). The floor
// costs resident memory only while a process allocates that fast, and is
// bounded: a process with a large live heap is collected at three times
// it, as before.
//
// Go has no setting for a floor: GOGC scales both the floor (4 MiB ×
// GOGC/100) and the multiple of the live heap. So the target is set again
// after each collection, from the live heap it found (gcTuner): high
// while little is live, defaultGCPercent once three times the live heap
// passes the floor. So that the floor never takes a process in a
// container past the container's memory, GOMEMLIMIT is set to 90% of the
// cgroup's memory limit, if it has one (automemlimit): the collector then
// runs before the heap reaches it, whatever GOGC says. Set GOGC (or
// GOMEMLIMIT, which then still applies) to choose otherwise.
const (
	defaultGCPercent = 200
	heapFloor        = 64 << 20
	// maxGCPercent puts Go's own floor (4 MiB × GOGC/100) at heapFloor.
	maxGCPercent = heapFloor / (4 << 20) * 100
)

// gcPercentFor returns the GOGC target that has the next collection start
// at the larger of heapFloor and three times live bytes.
func gcPercentFor(live uint64) int {
	if live == 0 {
		return maxGCPercent
	}
	need := int(heapFloor*100/live) - 100
	return min(max(need, defaultGCPercent), maxGCPercent)
}

// tunesGC reports whether Main tunes the collector: not when the
// environment names its own GOGC.
func tunesGC(getenv func(string) string) bool {
	return getenv("GOGC") == ""
}

// tuneGC starts a gcTuner, and bounds the heap by the container's memory,
// unless the environment sets GOGC. The tuner lives as long as the
// process.
func tuneGC(getenv func(string) string) {
	if tunesGC(getenv) {
		limitMemory(memlimit.FromCgroup)
		startGCTuner()
	}
}

// limitMemory sets GOMEMLIMIT to 90% of the memory limit provider reads,
// unless the environment sets GOMEMLIMIT or AUTOMEMLIMIT=off; with no
// limit (or none it can read: not Linux, no cgroup) the heap is left
// unbounded, as Go leaves it.
func limitMemory(provider memlimit.Provider) {
	_, _ = memlimit.Set(memlimit.WithProvider(provider), memlimit.WithRatio(0.9))
}

// gcTuner sets GOGC after each collection from the live heap it found.
// It learns of a collection from the cleanup of an object it drops at
// once, which runs after the first collection that finds it unreachable,
// and then drops another.
type gcTuner struct {
	percent int
	stopped atomic.Bool
	live    []metrics.Sample
}

// startGCTuner sets the target for an empty heap and arms the tuner; stop
// ends it after the next collection.
func startGCTuner() (stop func()) {
	g := &gcTuner{percent: gcPercentFor(0), live: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	debug.SetGCPercent(g.percent)
	g.arm()
	return func() { g.stopped.Store(true) }
}

// gcSentinel is the object a gcTuner drops to learn of a collection. It
// is larger than 16 bytes and holds a pointer, so that it is not one of
// the tiny allocations that share a block and may be freed late.
type gcSentinel struct {
	_ *byte
	_ [24]byte
}

func (g *gcTuner) arm() {
	runtime.AddCleanup(new(gcSentinel), func(g *gcTuner) { g.collected() }, g)
}

// collected runs on the cleanup goroutine after a collection.
func (g *gcTuner) collected() {
	if g.stopped.Load() {
		return
	}
	metrics.Read(g.live)
	if v := g.live[0].Value; v.Kind() == metrics.KindUint64 {
		if p := gcPercentFor(v.Uint64()); p != g.percent {
			g.percent = p
			debug.SetGCPercent(p)
		}
	}
	g.arm()
}
