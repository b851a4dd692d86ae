package app

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// A dagrun process whose environment sets no GOGC collects when its heap
// reaches the larger of a floor and three times what is live
// (defaultGCPercent), where Go's default is twice what is live with a
// 4 MiB floor.
//
// A worker's live heap is small (2-3 MB in a chain4 bench) and what it
// allocates is short-lived: rows read to plan an instance, results,
// records. With Go's 4 MiB floor the collector ran about 45 times a second
// in a chain4 bench on SQLite, and its mark workers and assists took
// cycles from the one writer that sets the pace. GOGC=200 gained 10%; a
// 64 MiB floor another 5-10% (see the README's Performance section).
//
// But the heap below the floor is memory the process touches for the
// first time: each page costs a page fault, about 20 µs on a VM that
// traps them. A worker that allocates slowly gains nothing from a high
// floor and pays for it: latency4's worker (300 instances on PostgreSQL,
// about 32 MB a second) faulted in 48 MB of fresh heap with the 64 MiB
// floor, 12,000 page faults and a fifth of its CPU. So the floor starts
// at startFloor and doubles, up to maxFloor, each time a collection
// follows the one before within fastCycle: a process that allocates fast
// (chain4 on SQLite: a collection about every 45 ms at 8 MiB) reaches the high
// floor within its first few hundred milliseconds, and one that does not
// stays low (latency4: 5,100 page faults, half the resident memory).
// The floor costs resident memory only while a process allocates that
// fast, and is bounded: a process with a large live heap is collected at
// three times it, as before.
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
	startFloor       = 8 << 20
	maxFloor         = 64 << 20
	fastCycle        = 250 * time.Millisecond
)

// gcPercentFor returns the GOGC target that has the next collection start
// at the larger of floor and three times live bytes.
func gcPercentFor(live, floor uint64) int {
	// Go's own floor, 4 MiB × GOGC/100, at floor.
	top := int(floor / (4 << 20) * 100)
	if live == 0 {
		return top
	}
	need := int(floor*100/live) - 100
	return min(max(need, defaultGCPercent), top)
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

// gcTuner sets GOGC after each collection from the live heap it found
// and the floor, which it raises when collections come fast. It learns of
// a collection from the cleanup of an object it drops at once, which runs
// after the first collection that finds it unreachable, and then drops
// another.
type gcTuner struct {
	percent int
	floor   uint64
	last    time.Time // when the tuner last learnt of a collection
	now     func() time.Time
	stopped atomic.Bool
	live    []metrics.Sample
}

// startGCTuner starts a tuner on the process's clock.
func startGCTuner() (stop func()) {
	return newGCTuner(time.Now).start()
}

// start sets the target for an empty heap and arms the tuner; stop ends
// it after the next collection.
func (g *gcTuner) start() (stop func()) {
	debug.SetGCPercent(g.percent)
	g.arm()
	return func() { g.stopped.Store(true) }
}

func newGCTuner(now func() time.Time) *gcTuner {
	return &gcTuner{
		percent: gcPercentFor(0, startFloor), floor: startFloor, last: now(), now: now,
		live: []metrics.Sample{{Name: "/gc/heap/live:bytes"}},
	}
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
		g.retarget(v.Uint64())
	}
	g.arm()
}

// retarget sets GOGC for a collection that found live bytes live, after
// raising the floor if it came within fastCycle of the one before.
func (g *gcTuner) retarget(live uint64) {
	now := g.now()
	if now.Sub(g.last) < fastCycle {
		g.floor = min(2*g.floor, maxFloor)
	}
	g.last = now
	if p := gcPercentFor(live, g.floor); p != g.percent {
		g.percent = p
		debug.SetGCPercent(p)
	}
}
