package dagrun

import (
	"context"
	"log/slog"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// A worker compares its clock with the database's when the store keeps
// one (storage.Clock: PostgreSQL's server). Leases, retry backoffs and
// delayed starts go by the database's clock, but some times are still
// this machine's: the worker weighs its own claims' leases by its clock,
// a snooze's time and a schedule's ticks are computed here. A skew shifts
// those by as much, so it is worth a warning that names both clocks.
const (
	// clockSkewTolerance is the skew beyond which a worker warns.
	clockSkewTolerance = time.Second
	// clockCheckInterval is how often a running worker checks again.
	clockCheckInterval = 5 * time.Minute
)

// watchClock checks the worker's clock against the store's at once, then
// every clockCheckInterval until ctx ends; stop ends the checks and waits
// for them. With a store that keeps no clock of its own it does nothing.
func (w *Worker) watchClock(ctx context.Context) (stop func()) {
	clock, ok := w.engine.store.(storage.Clock)
	if !ok {
		return func() {}
	}
	checkClock(ctx, w.logger, clock, time.Now)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(clockCheckInterval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				checkClock(ctx, w.logger, clock, time.Now)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// checkClock reads the store's clock once and warns when now differs from
// it by more than clockSkewTolerance. The database's time is compared with
// the midpoint of the round trip, and a skew no larger than half the round
// trip is not reported, since it may be the trip's.
func checkClock(ctx context.Context, logger *slog.Logger, clock storage.Clock, now func() time.Time) {
	sent := now()
	dbTime, err := clock.Now(ctx)
	received := now()
	if err != nil {
		// The claim loop reports an unreachable database.
		logger.DebugContext(ctx, "dagrun: could not read the database's clock", slog.Any("error", err))
		return
	}
	local := sent.Add(received.Sub(sent) / 2)
	skew := local.Sub(dbTime)
	if skew.Abs()-received.Sub(sent)/2 <= clockSkewTolerance {
		return
	}
	logger.WarnContext(ctx, "dagrun: this machine's clock differs from the database's; synchronize it (NTP): "+
		"this worker's leases, snoozes and schedule ticks go by this clock",
		slog.Time("worker_time", local), slog.Time("database_time", dbTime), slog.Duration("skew", skew))
}
