package postgres

import (
	"cmp"
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// subscriber is one Subscribe call's channel, buffered so that signals
// coalesce: a subscriber that has not yet read the last one misses nothing.
type subscriber struct {
	ch chan struct{}
}

// Subscribe implements storage.Store. The first call starts the store's one
// listener connection, which LISTENs on the store's channel: every commit,
// in any process, that makes steps ready sends one NOTIFY there. Commits of
// this store also signal its subscribers directly, without the round trip.
func (s *Store) Subscribe() (<-chan struct{}, func()) {
	sub := &subscriber{ch: make(chan struct{}, 1)}
	s.subsMu.Lock()
	s.subs[sub] = struct{}{}
	if s.listener == nil && !s.closed {
		s.listener = s.startListener()
	}
	s.subsMu.Unlock()
	var once sync.Once
	return sub.ch, func() {
		once.Do(func() {
			s.subsMu.Lock()
			delete(s.subs, sub)
			s.subsMu.Unlock()
		})
	}
}

// broadcast signals every subscriber, without blocking.
func (s *Store) broadcast() {
	s.subsMu.Lock()
	defer s.subsMu.Unlock()
	for sub := range s.subs {
		select {
		case sub.ch <- struct{}{}:
		default: // a signal is already pending; coalesce
		}
	}
}

// listener owns the LISTEN connection's goroutine.
type listener struct {
	cancel context.CancelFunc
	done   chan struct{}
	// pid is the backend process ID of the current connection, 0 while
	// disconnected (tests terminate it to exercise reconnects).
	pid atomic.Uint32
}

func (s *Store) startListener() *listener {
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		s.listen(ctx, l)
	}()
	return l
}

// stop ends the listener and waits for its goroutine.
func (l *listener) stop() {
	l.cancel()
	<-l.done
}

// listen keeps one connection LISTENing until ctx ends. The connection is
// its own, not the pool's: it stays busy for the store's life and must not
// take a slot from transactions. When it dies, listen reconnects with
// exponential backoff, and then signals every subscriber once, since
// notifications sent while it was down are lost. The backoff grows only
// while attempts keep failing to LISTEN: a connection that got that far
// resets it, so each outage starts again from ListenerRetryMin.
func (s *Store) listen(ctx context.Context, l *listener) {
	backoff := s.cfg.ListenerRetryMin
	for attempt := 0; ; attempt++ {
		listened, err := s.listenOnce(ctx, l, attempt > 0)
		if ctx.Err() != nil {
			return
		}
		if listened {
			backoff = s.cfg.ListenerRetryMin
		}
		if err != nil {
			s.cfg.Logger.Warn("postgres: listener connection lost; reconnecting",
				"channel", s.channel, "retry_in", backoff, "error", firstLine(interpretError(err).Error()))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, s.cfg.ListenerRetryMax)
	}
}

// listenOnce connects, LISTENs and relays notifications until the
// connection fails or ctx ends. listened reports whether it got as far as
// LISTENing.
func (s *Store) listenOnce(ctx context.Context, l *listener, reconnect bool) (listened bool, err error) {
	cc := s.pool.Config().ConnConfig
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	// Named apart from the pool's connections in pg_stat_activity.
	cc.RuntimeParams["application_name"] = cmp.Or(cc.RuntimeParams["application_name"], s.cfg.ApplicationName) + " listener"
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return false, err
	}
	defer func() {
		l.pid.Store(0)
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		return false, err
	}
	l.pid.Store(conn.PgConn().PID())
	if reconnect {
		s.broadcast()
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, err
		}
		// The store signalled its own subscribers when it committed.
		if origin, _, _ := strings.Cut(n.Payload, ":"); n.Channel == s.channel && origin != s.origin {
			s.broadcast()
		}
	}
}

// listenerPID returns the backend PID of the listener connection, 0 when
// there is none.
func (s *Store) listenerPID() uint32 {
	s.subsMu.Lock()
	defer s.subsMu.Unlock()
	if s.listener == nil {
		return 0
	}
	return s.listener.pid.Load()
}
