package app

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/storage"
)

// familyPoll is how often a following start looks for new child instances
// of the instance it follows, at most: a round that reads many children
// waits twice as long as it took before the next.
const familyPoll = 200 * time.Millisecond

// maxFamilyWorkers bounds the child instances a following start runs at
// once. Each has a worker of its own, with its claims, timers and
// goroutines: a forEach of 10,000 children had 10,000 of them, and read
// them all every round. The others wait their turn; any other worker may
// run them meanwhile.
const maxFamilyWorkers = 256

// familyWorkers are the in-process workers of a following start: one for
// the followed instance and one for each of its unfinished descendants. A
// worker restricted to one instance claims none of its children's steps,
// so without them `dagrun start` of a workflow with workflow steps would
// wait for a separate worker to run its children. Each is started when a
// workflow step creates its instance and stopped when the instance
// finishes.
type familyWorkers struct {
	engine *dagrun.Engine
	ctx    context.Context // the workers' context
	lease  time.Duration
	limit  int // of child instances served at once: maxFamilyWorkers
	most   int // the most instances ever served at once, for tests

	mu      sync.Mutex
	workers map[string]*familyWorker
	retired []*familyWorker // stopped, perhaps not yet done
}

type familyWorker struct {
	stop context.CancelFunc
	done chan struct{}
}

func newFamilyWorkers(ctx context.Context, engine *dagrun.Engine, lease time.Duration) *familyWorkers {
	return &familyWorkers{engine: engine, ctx: ctx, lease: lease, limit: maxFamilyWorkers, workers: map[string]*familyWorker{}}
}

// serve starts a worker for one instance unless it has one. A child
// instance waits for a free place (errFamilyFull) when maxFamilyWorkers
// run; the followed instance always gets one.
func (f *familyWorkers) serve(id string, child bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.workers[id]; ok {
		return nil
	}
	if child && len(f.workers) > f.limit {
		return errFamilyFull
	}
	worker, err := f.engine.NewWorker(&dagrun.WorkerConfig{InstanceID: id, Lease: f.lease})
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(f.ctx)
	fw := &familyWorker{stop: stop, done: make(chan struct{})}
	f.workers[id] = fw
	f.most = max(f.most, len(f.workers))
	go func() {
		defer close(fw.done)
		_ = worker.Run(ctx) // the instance lives on in the database whatever happens here
	}()
	return nil
}

// retire stops the worker of an instance that has finished; a retry that
// runs it again gets a new one.
func (f *familyWorkers) retire(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fw := f.workers[id]; fw != nil {
		fw.stop()
		delete(f.workers, id)
		f.retired = append(f.retired, fw)
	}
}

// errFamilyFull is serve's answer for a child instance that must wait
// for a place among maxFamilyWorkers.
var errFamilyFull = errors.New("dagrun: the following start runs as many child instances as it may")

// watch serves the unfinished descendants of root as they appear, until
// ctx ends. A round reads what the served instances are: the finished
// are retired, and those that start children are asked for their
// unfinished ones, up to the free places; so its cost follows
// the limit of served instances, not the number of children.
func (f *familyWorkers) watch(ctx context.Context, root string) {
	parents := map[string]bool{root: true} // served instances that may start children
	wait := familyPoll
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		began := time.Now()
		for _, id := range f.served() {
			if id == root {
				continue
			}
			inst, err := f.engine.Get(ctx, id)
			if err == nil && inst.Status.Finished() || errors.Is(err, storage.ErrNotFound) {
				f.retire(id)
				delete(parents, id)
			}
		}
		for _, parent := range slices.Sorted(maps.Keys(parents)) {
			for _, status := range []storage.InstanceStatus{storage.InstancePending, storage.InstanceRunning} {
				children, err := f.engine.List(ctx, storage.ListParams{Parent: parent, Status: status, Limit: 2 * f.limit})
				if err != nil {
					continue // the next round tries again
				}
				for _, child := range children {
					if f.serve(child.ID, true) == nil && hasWorkflowSteps(&child) {
						parents[child.ID] = true
					}
				}
			}
		}
		wait = max(familyPoll, 2*time.Since(began))
	}
}

// served returns the instances with a worker.
func (f *familyWorkers) served() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Collect(maps.Keys(f.workers))
}

// stopAll stops every worker and waits for them.
func (f *familyWorkers) stopAll() {
	f.mu.Lock()
	workers := append([]*familyWorker(nil), f.retired...)
	for _, fw := range f.workers {
		workers = append(workers, fw)
	}
	f.mu.Unlock()
	for _, fw := range workers {
		fw.stop()
	}
	for _, fw := range workers {
		<-fw.done
	}
}

// hasWorkflowSteps reports whether an instance may start children.
func hasWorkflowSteps(inst *storage.Instance) bool {
	for _, s := range inst.Steps {
		if s.Workflow != "" {
			return true
		}
	}
	return false
}
