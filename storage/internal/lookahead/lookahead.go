// Package lookahead remembers, for the stores, whether a claim's walk of
// the ready steps would pass over many steps of handlers the claimer
// lacks before reaching its own.
//
// A worker claims only steps of the handlers it has. The stores' claims
// walk their ready index in claim order and pass over the others' steps
// one entry at a time, which is cheap while few come first; when a
// backlog of a handler no live worker has (or of one whose own pool of
// workers fell behind) does, a store reads the head of each of the
// claimer's handlers instead. Which way to claim is decided by a look at
// the first steps the walk would meet, made at most once per Recheck for
// each claim filter: a look at every claim cost a fleet of 40 workers
// about 5% of its throughput. A backlog that builds up is read past
// within Recheck; one that drains leaves the claims reading heads until
// the next look, which is as correct, only a little dearer.
package lookahead

import (
	"strings"
	"sync"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// Recheck is how long a verdict holds.
const Recheck = time.Second

// Verdicts are a store's verdicts, by claim filter. The zero value is
// ready to use.
type Verdicts struct {
	mu      sync.Mutex
	byClaim map[key]verdict
}

type key struct{ queues, handlers string }

type verdict struct {
	heads   bool
	at      time.Time
	looking bool
}

func keyOf(p storage.ClaimParams) key {
	return key{queues: strings.Join(p.Queues, "\x00"), handlers: strings.Join(p.Handlers, "\x00")}
}

// MayHelp reports whether a claim with p's filters may read its handlers'
// heads: one that names handlers, not bound to one instance (whose own
// steps are few).
func MayHelp(p storage.ClaimParams) bool { return len(p.Handlers) > 0 && p.InstanceID == "" }

// Heads reports whether a claim with p's filters reads its handlers'
// heads, as last seen (no by default).
func (v *Verdicts) Heads(p storage.ClaimParams) bool {
	if !MayHelp(p) {
		return false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.byClaim[keyOf(p)].heads
}

// Begin reports whether a claim with p's filters should look ahead now:
// it may read heads, its verdict is older than Recheck, and no other
// look of it is under way. A true answer must be followed by Done.
func (v *Verdicts) Begin(p storage.ClaimParams, now time.Time) bool {
	if !MayHelp(p) {
		return false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	k := keyOf(p)
	got := v.byClaim[k]
	if got.looking || now.Sub(got.at) < Recheck {
		return false
	}
	got.looking = true
	if v.byClaim == nil {
		v.byClaim = map[key]verdict{}
	}
	v.byClaim[k] = got
	return true
}

// Done records what the look Begin allowed saw at now: whether the claim
// should read heads. A look that failed (ok false) keeps the verdict it
// had, and the next claim looks again.
func (v *Verdicts) Done(p storage.ClaimParams, heads, ok bool, now time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k := keyOf(p)
	got := v.byClaim[k]
	got.looking = false
	if ok {
		got.heads, got.at = heads, now
	}
	v.byClaim[k] = got
}
