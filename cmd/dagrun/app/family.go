package app

import (
	"context"
	"sync"
	"time"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/storage"
)

// familyPoll is how often a following start looks for new child instances
// of the instance it follows.
const familyPoll = 200 * time.Millisecond

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

	mu      sync.Mutex
	workers map[string]*familyWorker
	retired []*familyWorker // stopped, perhaps not yet done
}

type familyWorker struct {
	stop context.CancelFunc
	done chan struct{}
}

func newFamilyWorkers(ctx context.Context, engine *dagrun.Engine, lease time.Duration) *familyWorkers {
	return &familyWorkers{engine: engine, ctx: ctx, lease: lease, workers: map[string]*familyWorker{}}
}

// serve starts a worker for one instance unless it has one.
func (f *familyWorkers) serve(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.workers[id]; ok {
		return nil
	}
	worker, err := f.engine.NewWorker(&dagrun.WorkerConfig{InstanceID: id, Lease: f.lease})
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(f.ctx)
	fw := &familyWorker{stop: stop, done: make(chan struct{})}
	f.workers[id] = fw
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

// watch serves the unfinished descendants of root as they appear, until
// ctx ends. Only the subtrees still running are read on each round.
func (f *familyWorkers) watch(ctx context.Context, root string) {
	tick := time.NewTicker(familyPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		parents := []string{root}
		for len(parents) > 0 {
			var next []string
			for _, id := range parents {
				children, err := f.engine.List(ctx, storage.ListParams{Parent: id, Limit: dagrun.MaxListLimit})
				if err != nil {
					break // the next round tries again
				}
				for _, child := range children {
					if child.Status.Finished() {
						f.retire(child.ID)
						continue
					}
					if f.serve(child.ID) == nil {
						next = append(next, child.ID)
					}
				}
			}
			parents = next
		}
	}
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
