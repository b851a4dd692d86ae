package dagrun

import (
	"sync"
	"time"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/storage"
)

// Deadlines told to the claim loops: times this process's plans set, which
// no store signal tells of (a delayed start's steps are signalled, as steps
// made ready that the claim left). A wait step that starts waiting with a
// timeout gets its deadline in the transaction whose plan made it wait (a
// finish, a signal, a sweep or a start), and an instance with a workflow
// timeout gets its own when it starts, which for a child instance is in its
// parent's finish. The stores wake claim loops for steps made ready, not
// for times, and a claim loop learns of a deadline from the next-wake
// answer of its next short claim: an idle one slept on until its poll, so a
// wait that began after another step, or a child's workflow timeout, fired
// up to a poll late. The plans are this engine's, so the engine tells its
// claim loops when to look, which costs each a timer rather than a claim
// (a start once made every claim loop claim and look up its next wake time
// instead). Other processes learn of a deadline from the store (a NOTIFY,
// a watched file) or at their poll.

// wakeTimes holds the earliest deadline told to one claim loop since it
// last took them.
type wakeTimes struct {
	mu       sync.Mutex
	earliest time.Time
	told     chan struct{} // a deadline was added
}

func newWakeTimes() *wakeTimes { return &wakeTimes{told: make(chan struct{}, 1)} }

// add tells the claim loop to look for due work at t.
func (d *wakeTimes) add(t time.Time) {
	d.mu.Lock()
	if d.earliest.IsZero() || t.Before(d.earliest) {
		d.earliest = t
	}
	d.mu.Unlock()
	select {
	case d.told <- struct{}{}:
	default:
	}
}

// take returns the earliest deadline added since the last take, zero if
// none.
func (d *wakeTimes) take() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	t := d.earliest
	d.earliest = time.Time{}
	return t
}

// idleTimer fires when the claim loop should next look for due work
// without having been woken: a step's run_after, a wait's or a workflow's
// deadline.
type idleTimer struct {
	*time.Timer
	at time.Time // when it fires; zero once it fired or while it is stopped
}

func newIdleTimer() *idleTimer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &idleTimer{Timer: t}
}

// set makes the timer fire in d, whenever it was to fire before.
func (t *idleTimer) set(d time.Duration) {
	t.Reset(d)
	t.at = time.Now().Add(d)
}

// fireBy makes the timer fire at at, unless it fires sooner already.
func (t *idleTimer) fireBy(at time.Time) {
	if at.IsZero() || !t.at.IsZero() && !at.Before(t.at) {
		return
	}
	t.set(time.Until(at))
}

// fired records that the claim loop received the timer's tick.
func (t *idleTimer) fired() { t.at = time.Time{} }

// wakeLocalWorkersBy tells every running worker of this engine to look for
// due work at t.
func (e *Engine) wakeLocalWorkersBy(t time.Time) {
	e.local.mu.Lock()
	workers := append([]*Worker(nil), e.local.list...)
	e.local.mu.Unlock()
	for _, w := range workers {
		w.wakeTimes.add(t)
	}
}

// deadlinesIn returns the shortest time from p's commit to a deadline p
// starts, and whether it starts any: the timeout of each wait step it
// makes waiting, and the workflow's timeout when the instance has not
// started yet (a new instance, a child among them), since it starts at
// the earliest now. A deadline told early costs a look that finds it not
// due, and the claim loop then learns the exact time from the store.
func deadlinesIn(w *dag.Workflow, state *storage.InstanceState, p *storage.Plan) (time.Duration, bool) {
	var (
		shortest time.Duration
		found    bool
	)
	consider := func(d time.Duration) {
		if d > 0 && (!found || d < shortest) {
			shortest, found = d, true
		}
	}
	if state.Status == storage.InstancePending && !p.Deferred {
		consider(w.Timeout)
	}
	for _, ch := range p.Steps {
		if ch.Status != storage.StepWaiting {
			continue
		}
		if step := w.Step(ch.Name); step != nil && step.Wait != nil {
			consider(step.Wait.Timeout)
		}
	}
	return shortest, found
}
