package dagrun

import "sync"

// slots is a worker's concurrency, owned in one place: every claim, eager
// or not, takes its slots here before it asks the store for steps, and
// every step it got keeps one slot until its attempt is settled. So
// however the claim loop, a group commit's eager claim and an eager start
// race, no more than the limit of attempts ever run.
//
// golang.org/x/sync/semaphore cannot serve: a claim wants "as many free
// slots as there are, up to n" (TryAcquire is all or nothing) and hands
// back those its claim did not fill.
type slots struct {
	mu    sync.Mutex
	limit int
	used  int
	// freed receives a value (coalesced) whenever slots are given back, so
	// a claim loop that found none free knows when to look again.
	freed chan struct{}
}

func newSlots(limit int) *slots {
	return &slots{limit: limit, freed: make(chan struct{}, 1)}
}

// take takes up to n free slots and returns how many it took.
func (s *slots) take(n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n = max(min(n, s.limit-s.used), 0)
	s.used += n
	return n
}

// give hands back n slots.
func (s *slots) give(n int) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	s.used -= n
	if s.used < 0 {
		s.mu.Unlock()
		panic("dagrun: worker gave back more slots than it took")
	}
	s.mu.Unlock()
	select {
	case s.freed <- struct{}{}:
	default:
	}
}
