package dagrun

import (
	"context"
	"log/slog"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// Worker presence: a running worker tells the store which handlers it has,
// so that `dagrun stats` can name the ready steps no live worker can run
// (those of a binary not deployed, or not running), and claims only the
// steps whose handler it has, so that workers of different binaries share
// one database safely.

// presenceInterval is how often a running worker renews its announcement:
// a third of storage.PresenceTTL, so one failed renewal does not make it
// look gone.
const presenceInterval = storage.PresenceTTL / 3

// noHandler is the handler list of an engine with no handler registered.
// The store reads an empty list as "any handler", so such an engine's
// workers name a handler no step can have (registries reject the empty
// name) and claim nothing.
var noHandler = []string{""}

// claimHandlers returns the handlers the engine's workers claim steps of:
// the registry's, read at each claim so handlers registered while workers
// run are claimed too.
func (e *Engine) claimHandlers() []string {
	if names := e.registry.Names(); len(names) > 0 {
		return names
	}
	return noHandler
}

// announce records the worker in the store's worker presence and renews the
// record every presenceInterval until the returned function is called,
// which stops the renewals and removes the record. Renewals go on while the
// worker drains after ctx ends: it is alive until Run returns. A store
// that cannot record it only costs the stats their view of this worker, so
// failures are logged, never fatal.
//
// A worker bound to one instance (a following start's) does not announce
// itself: it cannot take other instances' steps, so counting it would hide
// them from the stats.
func (w *Worker) announce(ctx context.Context) (stop func()) {
	if w.config.InstanceID != "" {
		return func() {}
	}
	store := w.engine.store
	record := func(ctx context.Context) {
		err := store.AnnounceWorker(ctx, storage.WorkerInfo{
			ID: w.config.ID, Handlers: w.engine.registry.Names(), Queues: w.config.Queues,
		})
		if err != nil && ctx.Err() == nil {
			w.logger.Warn("dagrun: announce worker; stats may list its handlers as served by no worker", slog.Any("error", err))
		}
	}
	record(ctx)
	renewCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(presenceInterval)
		defer tick.Stop()
		for {
			select {
			case <-renewCtx.Done():
				return
			case <-tick.C:
				record(renewCtx)
			}
		}
	}()
	return func() {
		cancel()
		<-done
		removeCtx, cancelRemove := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancelRemove()
		if err := store.RemoveWorker(removeCtx, w.config.ID); err != nil {
			w.logger.Warn("dagrun: remove worker announcement; it expires on its own", slog.Any("error", err))
		}
	}
}
