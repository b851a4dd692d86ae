package dagrun

import (
	"context"
	"sync"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// followPoll is how often Follow looks for new events of an instance when
// nothing in this process signalled a change (a worker in another process
// may be running it).
const followPoll = 200 * time.Millisecond

// changes broadcasts "something changed" from this process's workers to
// followers: a closed channel wakes every waiter at once.
type changes struct {
	mu sync.Mutex
	ch chan struct{}
}

func (c *changes) wait() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch == nil {
		c.ch = make(chan struct{})
	}
	return c.ch
}

func (c *changes) signal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch != nil {
		close(c.ch)
		c.ch = nil
	}
}

func (e *Engine) notifyChanged() { e.changes.signal() }

// Follow calls observe with the instance and the events of its history
// that are news to the follower, whenever it may have changed, until it is
// finished or ctx ends, and returns its final state. The first call gets
// the latest storage.FollowTail events of the history so far; each later
// call gets the events that appeared since, each event exactly once (see
// storage.Store.FollowEvents), and comes only when there are some.
//
// A look while nothing happened reads only the new events, none: the
// instance and its steps are read again only when events came, however
// long the history.
func (e *Engine) Follow(ctx context.Context, id string, observe func(*storage.Instance, []storage.Event)) (*storage.Instance, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	poll := time.NewTicker(followPoll)
	defer poll.Stop()
	var (
		cursor storage.EventCursor
		inst   *storage.Instance
	)
	for {
		changed := e.changes.wait()
		events, next, err := e.store.FollowEvents(ctx, id, cursor)
		if err != nil {
			return nil, err
		}
		cursor = next
		if inst == nil || len(events) > 0 {
			// The instance is read after its events, so it may be newer
			// than them: once it is finished, the events that led there
			// are all visible, and one more look collects them.
			if inst, err = e.store.GetInstance(ctx, id); err != nil {
				return nil, err
			}
			done := inst.Status.Finished() && !hasRunningSteps(inst)
			if done {
				last, next, err := e.store.FollowEvents(ctx, id, cursor)
				if err != nil {
					return nil, err
				}
				events, cursor = append(events, last...), next
			}
			if observe != nil {
				observe(inst, events)
			}
			if done {
				return inst, nil
			}
		}
		select {
		case <-ctx.Done():
			return inst, ctx.Err()
		case <-changed:
		case <-poll.C:
		}
	}
}

func hasRunningSteps(inst *storage.Instance) bool {
	for _, s := range inst.Steps {
		if s.Status == storage.StepRunning {
			return true
		}
	}
	return false
}
