package postgres

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// The store's own transactions tell other processes of the steps they made
// ready after they commit, not with a NOTIFY inside them. A transaction
// that notified takes, as it commits, a lock PostgreSQL holds for the whole
// server until the commit is done, its WAL flush included: every such
// transaction commits alone, one after the other, never in a group. In a
// fleet of 20 workers (log_min_duration_statement on the fleet's
// database), 928 commits took longer than 100 ms, 159 s in all; without
// the NOTIFY, 21 did. A NOTIFY sent on its own writes nothing, so its
// transaction flushes nothing and holds that lock for microseconds.
//
// One goroutine at a time sends them: queues made ready while a NOTIFY is
// on its way go out together in the next one, so a busy store sends at
// most one per round trip whatever its commit rate, and each worker of a
// fleet wakes the others' listeners that much less. A process that dies
// between a commit and its NOTIFY loses the NOTIFY: other processes find
// the steps at their next poll, as when their listener was down.
//
// A caller's transaction still notifies inside itself: the store does not
// see its commit.

// notifyTimeout bounds one NOTIFY, so that Close never waits long for a
// server that stopped answering.
const notifyTimeout = 5 * time.Second

// notifier coalesces a store's notifications.
type notifier struct {
	// send delivers one payload.
	send func(ctx context.Context, payload string) error
	// failed reports a payload that could not be sent.
	failed func(err error)

	mu      sync.Mutex
	pending map[string]struct{} // queues made ready since the last send began
	// unlisted is set when steps of queues the store does not know were
	// made ready since the last send began (see addUnlisted).
	unlisted bool
	origin   string
	running  bool
	closed   bool
	idle     sync.WaitGroup
}

// add queues the queues of a commit for the next notification, and starts
// the sender unless it runs.
func (n *notifier) add(queues map[string]struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || len(queues) == 0 {
		return
	}
	if n.pending == nil {
		n.pending = make(map[string]struct{}, len(queues))
	}
	maps.Copy(n.pending, queues)
	n.start()
}

// addUnlisted queues a notification for steps made ready whose queues the
// store does not know: the due steps a claim promoted (promote_due says
// how many, not where). Its payload lists no queue, as when listing them
// would be too long; listeners wake their subscribers either way.
func (n *notifier) addUnlisted() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	n.unlisted = true
	n.start()
}

// start starts the sender unless it runs; n.mu is held.
func (n *notifier) start() {
	if !n.running {
		n.running = true
		n.idle.Add(1)
		go n.run()
	}
}

// run sends until nothing is pending.
func (n *notifier) run() {
	defer n.idle.Done()
	for {
		n.mu.Lock()
		queues, unlisted := n.pending, n.unlisted
		n.pending, n.unlisted = nil, false
		if len(queues) == 0 && !unlisted {
			n.running = false
			n.mu.Unlock()
			return
		}
		n.mu.Unlock()
		text := payload(n.origin, queues)
		if unlisted {
			text = payload(n.origin, nil)
		}
		ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
		if err := n.send(ctx, text); err != nil && n.failed != nil {
			n.failed(err)
		}
		cancel()
	}
}

// close sends what is pending, then stops the notifier for good.
func (n *notifier) close() {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	n.idle.Wait()
}

// payload is a notification's text, "ORIGIN:QUEUES": the notifying store's
// origin (empty for a caller's transaction, whose commit this store's own
// subscribers must hear about too) and the queues of the steps made ready,
// sorted; none when listing them would pass PostgreSQL's 8000 bytes, or
// when the store does not know them all (see addUnlisted).
func payload(origin string, queues map[string]struct{}) string {
	list := strings.Join(slices.Sorted(maps.Keys(queues)), ",")
	if len(list) > 7000 {
		list = ""
	}
	return origin + ":" + list
}

// parsePayload splits a notification's text into its origin and its
// queues: none when it lists none (steps of queues its sender did not
// know, or a list too long to send).
func parsePayload(text string) (origin string, queues []string) {
	origin, list, _ := strings.Cut(text, ":")
	if list == "" {
		return origin, nil
	}
	return origin, strings.Split(list, ",")
}
