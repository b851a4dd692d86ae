package sqlite

import (
	"context"
	"time"
)

// dataVersionPoll is how often a store with subscribers asks SQLite whether
// another process committed, so that a start in another process reaches an
// idle worker within milliseconds instead of at its next poll. A look reads
// the WAL index in shared memory, no disk, about 5 µs of CPU; waking up to
// look costs more (on the project's VM about 100 µs of CPU per timer wake
// of an otherwise idle Go process), which is why it is 20 ms and not less.
const dataVersionPoll = 20 * time.Millisecond

// watcher is the goroutine that turns other processes' commits into
// Subscribe signals; cancel stops it, ready is closed once it read the
// version every later commit is compared with, done once it returned.
type watcher struct {
	cancel context.CancelFunc
	ready  chan struct{}
	done   chan struct{}
}

// startWatchLocked starts the watcher if the store opened the file itself
// and none runs, and returns the running one (nil if none). The caller
// holds s.mu, and waits for ready after releasing it.
func (s *Store) startWatchLocked() *watcher {
	if s.watch != nil || !s.own || s.path == "" {
		return s.watch
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{cancel: cancel, ready: make(chan struct{}), done: make(chan struct{})}
	s.watch = w
	go s.watchDataVersion(ctx, w)
	return w
}

// stopWatchLocked stops the watcher without waiting for it (it may be
// waiting for s.mu to signal). The caller holds s.mu.
func (s *Store) stopWatchLocked() *watcher {
	w := s.watch
	if w != nil {
		w.cancel()
		s.watch = nil
	}
	return w
}

// watchDataVersion signals the subscribers whenever PRAGMA data_version
// changes on the writer connection. SQLite changes it on a connection when
// another connection committed, never for the connection's own commits:
// on the writer, whose pool holds exactly one connection, it changes only
// for other processes' commits, which is what Subscribe cannot otherwise
// learn of (this process's own commits signal through notify already, so
// they cost no second wake-up). An error forgets the last value: a commit
// it hid is found by the worker's polling.
func (s *Store) watchDataVersion(ctx context.Context, w *watcher) {
	defer close(w.done)
	var (
		last  int64
		known bool
	)
	// A context that is never done: with one, database/sql and the driver
	// start a goroutine per query to watch it, which would be most of an
	// idle look's cost. The look is short; stopping waits for it.
	never := context.Background()
	stmt, err := s.w.PrepareContext(never, `PRAGMA data_version`)
	if err != nil {
		close(w.ready)
		return
	}
	defer stmt.Close()
	look := func() {
		var v int64
		if err := stmt.QueryRowContext(never).Scan(&v); err != nil {
			known = false
			return
		}
		if known && v != last {
			s.notify()
		}
		last, known = v, true
	}
	look()
	close(w.ready)
	tick := time.NewTicker(dataVersionPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			look()
		}
	}
}
