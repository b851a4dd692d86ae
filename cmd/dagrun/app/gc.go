package app

import "runtime/debug"

// defaultGCPercent is the garbage collector's target (GOGC) of a dagrun
// process whose environment does not set one: the heap may grow to three
// times what is live between collections, where Go's default is twice.
//
// A worker's live heap is small and what it allocates is short-lived:
// rows read to plan an instance, results, records. At Go's default the
// collector took 10-12% of the CPU of a chain4 bench on two cores, where
// its mark workers take cycles from the SQLite writer that sets the pace.
// At 200, chain4 on SQLite ran 10% faster for 17 MB more resident memory
// (57 to 74 MB; six rounds alternating with Go's default, see the README's
// Performance section). Set GOGC (or GOMEMLIMIT, which still applies) to
// choose otherwise.
const defaultGCPercent = 200

// gcPercent returns the GOGC target Main sets, and whether to set one:
// none when the environment names its own.
func gcPercent(getenv func(string) string) (int, bool) {
	if getenv("GOGC") != "" {
		return 0, false
	}
	return defaultGCPercent, true
}

// tuneGC sets the process's GOGC target as gcPercent says.
func tuneGC(getenv func(string) string) {
	if percent, ok := gcPercent(getenv); ok {
		debug.SetGCPercent(percent)
	}
}
