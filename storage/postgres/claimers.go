package postgres

import (
	"strings"
	"sync"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// listenSettle is how long every claimer of a store must have been busy
// before its listener stops listening, so that a worker whose slots free
// up and fill again between two steps does not make it UNLISTEN and
// LISTEN again each time.
const listenSettle = 200 * time.Millisecond

// claimers tracks whether a store needs its listener. A NOTIFY is
// delivered to every listening connection of the server, and with a fleet
// of workers that all have work, each commit woke every other worker's
// listener and process only for the wake-up to be ignored: a worker whose
// every slot is taken claims again when a slot frees, not when told. So a
// store listens only while one of its claimers may wait for work: the
// last claim of a worker's claim loop
// (ClaimSteps) or of its recorder (FinishAndClaim) came back with fewer
// steps than it asked for. The two are kept apart because they run at
// once and share the worker's free slots: a short claim of one and a full
// claim of the other may leave the worker with a free slot and nothing
// ready, and the full one must not hide the short one. When one starts
// waiting, the listener LISTENs again and then signals every subscriber
// once, for the steps made ready while it did not listen.
type claimers struct {
	mu sync.Mutex
	// short holds, by claimer, whether its last claim came back short.
	short map[claimer]bool
	// waiting counts the claimers in short whose last claim came back
	// short.
	waiting int
	// busySince is when the last waiting claimer got work.
	busySince time.Time
	// started is signalled when a claimer starts waiting.
	started chan struct{}
	// settled holds, by worker and filters, the store's signal count as of
	// the worker's claim loop's last claim, if that claim found nothing
	// left to claim and nothing due later (see settledSince).
	settled map[settledKey]uint64
}

// settledKey is a worker and the filters of its claims.
type settledKey struct {
	workerID, instanceID string
	queues, handlers     string
}

func settledKeyOf(p storage.ClaimParams) settledKey {
	return settledKey{workerID: p.WorkerID, instanceID: p.InstanceID,
		queues: strings.Join(p.Queues, "\x00"), handlers: strings.Join(p.Handlers, "\x00")}
}

// claimer is one worker's claim loop or its recorder.
type claimer struct {
	workerID string
	finish   bool // FinishAndClaim rather than ClaimSteps
}

func newClaimers() *claimers {
	return &claimers{short: map[claimer]bool{}, settled: map[settledKey]uint64{}, started: make(chan struct{}, 1)}
}

// lastShort reports whether the last claim of p's claimer (its
// FinishAndClaim when finish) came back short, or it has made none.
func (c *claimers) lastShort(p storage.ClaimParams, finish bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	short, known := c.short[claimer{p.WorkerID, finish}]
	return short || !known
}

// claimed records a claim of p that returned n steps, made by ClaimSteps or
// (finish) by FinishAndClaim.
func (c *claimers) claimed(p storage.ClaimParams, finish bool, n int) {
	if p.Limit <= 0 {
		return // a finish that claimed nothing: no news of the claimer
	}
	short := n < p.Limit
	c.mu.Lock()
	defer c.mu.Unlock()
	key := claimer{p.WorkerID, finish}
	was, known := c.short[key]
	if known && was == short {
		return
	}
	c.short[key] = short
	switch {
	case short:
		c.waiting++
		if c.waiting == 1 {
			select {
			case c.started <- struct{}{}:
			default:
			}
		}
	default:
		if known {
			c.waiting--
		}
		if c.waiting == 0 {
			c.busySince = time.Now()
		}
	}
}

// wanted reports whether the listener should listen now: while a claimer
// waits, and for listenSettle after the last one got work.
func (c *claimers) wanted(now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waiting > 0 || now.Sub(c.busySince) < listenSettle
}

// needed reports whether the listener needs a connection: a claimer
// waits. Unlike wanted, it has no settling time: a connection is opened
// for a claimer that waits now, not for one that waited a moment ago.
func (c *claimers) needed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waiting > 0
}

// looked records a claim of p's claim loop (ClaimSteps or
// ClaimStepsAndWake) made when the store had sent signals signals to its
// subscribers: settled when it came back short and knew of no step due
// later, or left nothing for its worker to find until told.
func (c *claimers) looked(p storage.ClaimParams, signals uint64, settled bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if settled {
		c.settled[settledKeyOf(p)] = signals
	} else {
		delete(c.settled, settledKeyOf(p))
	}
}

// settledSince reports whether p's worker's claim loop found nothing to
// claim and nothing due later at its last claim, and the store has sent
// its subscribers no signal since (signals is the count now). A step that
// became claimable since then was made ready either by another process,
// whose NOTIFY is on its way to the listener and will wake the claim loop,
// or by this one, whose commit would have signalled: either way the claim
// loop is to hear of it, so an eager claim made now could only take it
// from the claim loop a moment sooner. A finish that made nothing ready
// then leaves its eager claim out (see Store.eagerClaimNeeded).
func (c *claimers) settledSince(p storage.ClaimParams, signals uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.settled[settledKeyOf(p)]
	return ok && at == signals
}
