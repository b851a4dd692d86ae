package dagrun

import (
	"context"
	"sync"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// followPoll is how often Follow re-reads an instance when nothing in this
// process signalled a change (a worker in another process may be running it).
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

// Follow calls observe with the instance whenever it may have changed, until
// it is finished or ctx ends, and returns its final state.
func (e *Engine) Follow(ctx context.Context, id string, observe func(*storage.Instance)) (*storage.Instance, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	poll := time.NewTicker(followPoll)
	defer poll.Stop()
	for {
		changed := e.changes.wait()
		inst, err := e.store.GetInstance(ctx, id)
		if err != nil {
			return nil, err
		}
		if observe != nil {
			observe(inst)
		}
		if inst.Status.Finished() && !hasRunningSteps(inst) {
			return inst, nil
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
