package sqlite

import (
	"context"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Wake-ups from other processes. Another process's commit appends to the
// file's write-ahead log; the store watches the log's folder for writes
// (inotify on Linux: no wake-up at all while nothing is written) and then
// asks SQLite, through PRAGMA data_version on the writer connection,
// whether the write was a commit of another connection. Where the folder
// cannot be watched, it asks every dataVersionPoll instead.
const (
	// dataVersionPoll is how often a store that cannot watch the folder
	// looks. A look reads the WAL index in shared memory, no disk, about
	// 5 µs of CPU; waking up to look costs more (on the project's VM about
	// 100 µs of CPU per timer wake of an otherwise idle Go process).
	dataVersionPoll = 20 * time.Millisecond
	// lookGap spaces the looks that writes trigger: a busy process writes
	// its own log many times a second, and each look takes the writer
	// connection for a moment.
	lookGap = 2 * time.Millisecond
	// settleGap is how long after a burst of writes that showed no other
	// connection's commit the store looks once more. A commit writes its
	// last frame to the log and only then publishes itself in the log's
	// index (shared memory, which no file event reports); a look that
	// falls between the two sees nothing, and no later write would call
	// for another look. settleGap covers a committer descheduled between
	// the two steps for that long; the worker's poll covers the rest.
	settleGap = 20 * time.Millisecond
)

// watcher is the goroutine that turns other processes' commits into
// Subscribe signals; cancel stops it, ready is closed once it read the
// version every later commit is compared with.
type watcher struct {
	cancel context.CancelFunc
	ready  chan struct{}
}

// startWatchLocked starts the watcher if the store opened the file itself
// and none runs, and returns the running one (nil if none). The caller
// holds s.mu, and waits for ready after releasing it.
func (s *Store) startWatchLocked() *watcher {
	if s.watch != nil || !s.own || s.path == "" {
		return s.watch
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{cancel: cancel, ready: make(chan struct{})}
	s.watch = w
	s.watchers.Go(func() { s.watchDataVersion(ctx, w) })
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
	// A context that is never done: with one, database/sql and the driver
	// start a goroutine per query to watch it. The look is short; stopping
	// waits for it.
	never := context.Background()
	stmt, err := s.w.PrepareContext(never, `PRAGMA data_version`)
	if err != nil {
		close(w.ready)
		return
	}
	defer stmt.Close()
	var (
		last  int64
		known bool
	)
	look := func() bool {
		var v int64
		if err := stmt.QueryRowContext(never).Scan(&v); err != nil {
			known = false
			return false
		}
		changed := known && v != last
		if changed {
			s.notify()
		}
		last, known = v, true
		return changed
	}

	// Watch the folder, not the log: SQLite deletes the log when the last
	// connection closes and creates it again.
	var events <-chan fsnotify.Event
	fw, err := fsnotify.NewWatcher()
	if err == nil {
		if err = fw.Add(filepath.Dir(s.path)); err != nil {
			_ = fw.Close()
		}
	}
	if err == nil {
		defer fw.Close()
		events = fw.Events
	}
	look()
	close(w.ready)

	var poll <-chan time.Time
	if events == nil {
		tick := time.NewTicker(dataVersionPoll)
		defer tick.Stop()
		poll = tick.C
	}
	log := s.path + "-wal"
	var errs <-chan error
	if events != nil {
		errs = fw.Errors
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-poll:
			look()
			continue
		case ev, ok := <-events:
			if !ok {
				return
			}
			if !logWrite(ev, log) {
				continue
			}
		case <-errs: // events were lost (queue overflow): look anyway
		}
		if !followWrites(ctx, events, log, look, time.After) {
			return
		}
	}
}

// followWrites answers a write to the log: it looks at once, again lookGap
// later for as long as more writes come, and, when none of those looks saw
// another connection's commit, once more settleGap after the last write,
// unless a write comes sooner, which starts the answer over. It reports
// false when ctx ended or the events stopped meanwhile. after is
// time.After but in tests.
func followWrites(ctx context.Context, events <-chan fsnotify.Event, log string, look func() bool,
	after func(time.Duration) <-chan time.Time) bool {
	for {
		seen := look()
		for more := true; more; {
			select {
			case <-ctx.Done():
				return false
			case <-after(lookGap):
			}
			if more = drain(events, log); more {
				seen = look() || seen
			}
		}
		if seen {
			return true
		}
		switch settled(ctx, events, log, after(settleGap)) {
		case settledQuietly:
			look()
			return true
		case settledStopped:
			return false
		}
		// settledByWrite: another burst, answered the same way
	}
}

type settleEnd int

const (
	settledQuietly settleEnd = iota // the settling time passed without a write
	settledByWrite                  // the log was written first
	settledStopped                  // ctx ended or the events stopped
)

// settled waits for timer, or for the next write to log, whichever comes
// first.
func settled(ctx context.Context, events <-chan fsnotify.Event, log string, timer <-chan time.Time) settleEnd {
	for {
		select {
		case <-ctx.Done():
			return settledStopped
		case <-timer:
			return settledQuietly
		case ev, ok := <-events:
			if !ok {
				return settledStopped
			}
			if logWrite(ev, log) {
				return settledByWrite
			}
		}
	}
}

func logWrite(ev fsnotify.Event, log string) bool {
	return ev.Name == log && ev.Has(fsnotify.Write|fsnotify.Create)
}

// drain takes the events already queued and reports whether one was a
// write to log.
func drain(events <-chan fsnotify.Event, log string) bool {
	found := false
	for {
		select {
		case ev, ok := <-events:
			if !ok { // stopped: settled (or the caller's loop) finds out
				return found
			}
			found = found || logWrite(ev, log)
		default:
			return found
		}
	}
}
