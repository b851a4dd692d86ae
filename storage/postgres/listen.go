package postgres

import (
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// subscriber is one Subscribe call's channel, buffered so that signals
// coalesce: a subscriber that has not yet read the last one misses nothing.
type subscriber struct {
	ch chan struct{}
	// queues are the queues whose steps the subscriber waits for; nil for
	// every queue.
	queues map[string]struct{}
}

// Subscribe implements storage.Store. The first call starts the store's
// listener, which keeps one connection of its own LISTENing on the store's
// channel while the store's claimers may wait for work: every commit, in
// any process, that makes steps ready sends one NOTIFY there, naming their
// queues. Commits of this store also signal its subscribers directly,
// without the round trip, whatever their queues.
// Behind PgBouncer (Config.PgBouncer) there is no listener: a LISTEN holds
// a session, which transaction pooling does not keep, so subscribers hear
// only of this store's own commits and poll for the others.
func (s *Store) Subscribe(queues []string) (<-chan struct{}, func()) {
	sub := &subscriber{ch: make(chan struct{}, 1)}
	if len(queues) > 0 {
		sub.queues = make(map[string]struct{}, len(queues))
		for _, q := range queues {
			sub.queues[q] = struct{}{}
		}
	}
	s.subsMu.Lock()
	s.subs[sub] = struct{}{}
	if s.listener == nil && !s.closed && !s.cfg.PgBouncer {
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
func (s *Store) broadcast() { s.signal(nil) }

// signal signals, without blocking, the subscribers of any of queues, or
// every subscriber when queues is empty. Another process's NOTIFY names
// the queues of the steps its commit made ready: in a fleet whose workers
// serve queues of their own, a commit then wakes only the workers of its
// queues. Woken by every commit of the fleet, each idle worker of another
// queue made a claim that could find nothing: 36 such workers beside 4
// that did the work cost the fleet about a third of its throughput.
func (s *Store) signal(queues []string) {
	s.signals.Add(1)
	s.subsMu.Lock()
	defer s.subsMu.Unlock()
	for sub := range s.subs {
		if !sub.wants(queues) {
			continue
		}
		select {
		case sub.ch <- struct{}{}:
		default: // a signal is already pending; coalesce
		}
	}
}

// wants reports whether news of steps made ready in queues (any queue
// when empty) is for the subscriber.
func (sub *subscriber) wants(queues []string) bool {
	if sub.queues == nil || len(queues) == 0 {
		return true
	}
	for _, q := range queues {
		if _, ok := sub.queues[q]; ok {
			return true
		}
	}
	return false
}

// listener owns the LISTEN connection's goroutine.
type listener struct {
	cancel context.CancelFunc
	done   chan struct{}
	// pid is the backend process ID of the current connection once it
	// LISTENed and signalled the subscribers, 0 before, while disconnected
	// and while resting (tests terminate it to exercise reconnects).
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

// listenerRest is how long the listener keeps a connection on which it has
// not listened (every claimer of the store had work all along) before it
// closes it, to open one again when a claimer runs out of work. A fleet
// draining a backlog thus holds its pools' connections and no listener's.
const listenerRest = 30 * time.Second

// errRested ends a connection closed by the listener itself after
// listenerRest: no failure, nothing to log, no backoff.
var errRested = errors.New("postgres: listener rested")

// listen keeps a connection of its own until ctx ends while the store's
// claimers need one (see claimers), and LISTENs on the store's channel on
// it while one of them waits for work. The connection is not the pool's:
// it stays busy while it listens and must not take a slot from
// transactions. It is opened only once a claim comes back short, so that
// a worker started on a backlog does not open it, on a server that a whole
// fleet may be connecting to at that moment, until it runs out of work.
// Every LISTEN signals every subscriber once: a step made ready between
// the short claim and the LISTEN, or while the store did not listen, went
// unannounced.
//
// When the connection dies, listen reconnects with a jittered exponential
// backoff as soon as a claimer needs it. The backoff grows only while
// attempts keep failing: a connection that got as far as a LISTEN resets
// it, so each outage starts again from ListenerRetryMin.
// A server that turns connections away (too many clients) thus sees each
// listener try again at most every ListenerRetryMax, at scattered times,
// while its worker polls.
func (s *Store) listen(ctx context.Context, l *listener) {
	r := &relay{store: s, listener: l, backoff: s.cfg.ListenerRetryMin}
	for r.awaitNeed(ctx) == nil {
		conn, err := r.connect(ctx)
		if err == nil {
			err = r.serve(ctx, conn)
			l.pid.Store(0)
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_ = conn.Close(closeCtx)
			cancel()
		}
		r.retrying = !errors.Is(err, errRested)
		if r.retrying {
			r.logError(ctx, err)
		}
	}
}

// relay connects the listener and turns notifications on the store's
// channel into signals for its subscribers, from the listener's one
// goroutine.
type relay struct {
	store    *Store
	listener *listener
	backoff  time.Duration
	retrying bool // the last connection failed, or could not be made
}

// awaitNeed waits until a claimer of the store waits for work.
func (r *relay) awaitNeed(ctx context.Context) error {
	c := r.store.claimers
	for !c.needed() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.started:
		}
	}
	return ctx.Err()
}

func (r *relay) connect(ctx context.Context) (*pgx.Conn, error) {
	if r.retrying {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(jitter(r.backoff)):
		}
		r.backoff = min(r.backoff*2, r.store.cfg.ListenerRetryMax)
	}
	cc := r.store.pool.Config().ConnConfig
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	// Named apart from the pool's connections in pg_stat_activity.
	cc.RuntimeParams["application_name"] = cmp.Or(cc.RuntimeParams["application_name"], r.store.cfg.ApplicationName) + " listener"
	return pgx.ConnectConfig(ctx, cc)
}

// serve runs one connection until it fails, ctx ends, or it has not
// listened for the store's listenerRest (errRested): it LISTENs while the
// store's claimers want wake-ups and relays what arrives, and UNLISTENs
// once they have all been busy for a while. A wait for a notification is
// never cut short: the listener UNLISTENs after the next one, which a busy
// fleet sends often, and while it does not listen it waits for a claimer
// to start waiting.
func (r *relay) serve(ctx context.Context, conn *pgx.Conn) error {
	s := r.store
	channel := pgx.Identifier{s.channel}.Sanitize()
	listening := false
	rest := time.NewTimer(s.listenerRest)
	defer rest.Stop()
	for {
		if want := s.claimers.wanted(time.Now()); want != listening {
			statement := "UNLISTEN " + channel
			if want {
				statement = "LISTEN " + channel
			}
			if _, err := conn.Exec(ctx, statement); err != nil {
				return err
			}
			listening = want
			if listening {
				r.backoff = s.cfg.ListenerRetryMin
				s.broadcast()
				r.listener.pid.Store(conn.PgConn().PID())
			} else {
				rest.Reset(s.listenerRest)
			}
		}
		if !listening {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-s.claimers.started:
			case <-rest.C:
				return errRested
			}
			continue
		}
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		// The store's own notifications are skipped: it signalled its own
		// subscribers when it committed.
		if origin, queues := parsePayload(n.Payload); origin != s.origin {
			s.signal(queues)
		}
	}
}

func (r *relay) logError(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return // closing
	}
	r.store.cfg.Logger.Warn("postgres: listener connection lost; reconnecting",
		"channel", r.store.channel, "retry_in", r.backoff, "error", firstLine(interpretError(err).Error()))
}

// jitter returns a duration drawn between d/2 and d, so that processes
// that failed together do not retry together.
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d-d/2)
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
