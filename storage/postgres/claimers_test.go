package postgres

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// TestListenerRestsWhileClaimersAreBusy: a store whose claimers all have
// work stops listening, so other processes' commits no longer wake it;
// once one of its claims comes back short it listens again, signals its
// subscribers for what it may have missed, and relays notifications again,
// also when its connection died while it rested (it finds out at the
// LISTEN and reconnects).
func TestListenerRestsWhileClaimersAreBusy(t *testing.T) {
	t.Parallel()
	for _, killed := range []bool{false, true} {
		name := "ConnectionAlive"
		if killed {
			name = "ConnectionKilledWhileResting"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			listenerRests(t, killed)
		})
	}
}

func listenerRests(t *testing.T, killWhileResting bool) {
	w := newWorker(t, "rests", &Config{ListenerRetryMin: 10 * time.Millisecond, ListenerRetryMax: 100 * time.Millisecond})
	s, create, claim := w.s, w.create, w.claim
	ch, cancel := s.Subscribe(nil)
	t.Cleanup(cancel)
	var pid uint32 // the listener's backend
	lastStatement := func() string {
		t.Helper()
		var query string
		require.NoError(t, sharedPool(t).QueryRow(t.Context(), "SELECT query FROM pg_stat_activity WHERE pid = $1", int32(pid)).Scan(&query))
		return query
	}

	require.Zero(t, claim(1), "a claim of an empty queue: the worker waits")
	pid = awaitListener(t, s, 0)
	create()
	create()
	require.Equal(t, 1, claim(1), "a claim that takes all it asked for: the worker is busy")
	// The listener stops after the next notification once the claimer has
	// been busy for listenSettle.
	require.Eventually(t, func() bool {
		create()
		return lastStatement() == `UNLISTEN "`+s.channel+`"`
	}, 10*time.Second, 50*time.Millisecond, "the listener kept listening while every claimer was busy")
	drain(ch)
	create()
	select {
	case <-ch:
		require.FailNow(t, "a busy store was woken by another process's commit")
	case <-time.After(300 * time.Millisecond):
	}
	if killWhileResting {
		var done bool
		require.NoError(t, sharedPool(t).QueryRow(t.Context(), "SELECT pg_terminate_backend($1)", int32(pid)).Scan(&done))
		require.True(t, done)
	}

	// The steps made ready meanwhile are waiting: a short claim takes them
	// and makes the store listen again, with a signal for the next claim.
	require.Less(t, claim(100), 100)
	awaitSignal(t, ch, 10*time.Second, "the listener listened again")
	if killWhileResting {
		pid = awaitListener(t, s, pid)
	}
	require.Equal(t, `LISTEN "`+s.channel+`"`, lastStatement())
	drain(ch)
	create()
	awaitSignal(t, ch, 10*time.Second, "another process's commit, listening again")
}

// TestClaimersWanted: the listener is wanted while a claimer's last claim
// came back short (not before any claim), and for listenSettle after the
// last such claimer got work; a full claim of a worker's recorder does not
// hide a short one of its claim loop, which may have left a slot free.
func TestClaimersWanted(t *testing.T) {
	type claim struct {
		worker string
		finish bool
		limit  int
		got    int
	}
	cases := []struct {
		name   string
		claims []claim
		want   bool
	}{
		{"no claim yet: no claimer waits", nil, false},
		{"full claim", []claim{{"w", false, 2, 2}}, false},
		{"short claim", []claim{{"w", false, 2, 1}}, true},
		{"a finish that claims nothing tells nothing", []claim{{"w", false, 2, 2}, {"w", true, 0, 0}}, false},
		{"short, then full", []claim{{"w", false, 2, 1}, {"w", false, 2, 2}}, false},
		{"claim loop short, recorder full", []claim{{"w", false, 2, 1}, {"w", true, 3, 3}}, true},
		{"recorder short, claim loop full", []claim{{"w", true, 3, 1}, {"w", false, 2, 2}}, true},
		{"one worker busy, another waiting", []claim{{"a", false, 2, 2}, {"b", false, 2, 0}}, true},
		{"both busy", []claim{{"a", false, 2, 2}, {"b", true, 1, 1}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newClaimers()
			for _, cl := range tc.claims {
				c.claimed(storage.ClaimParams{WorkerID: cl.worker, Limit: cl.limit}, cl.finish, cl.got)
			}
			require.Equal(t, tc.want, c.wanted(time.Now().Add(listenSettle)))
		})
	}

	t.Run("settle", func(t *testing.T) {
		c := newClaimers()
		c.claimed(storage.ClaimParams{WorkerID: "w", Limit: 2}, false, 1)
		c.claimed(storage.ClaimParams{WorkerID: "w", Limit: 2}, false, 2)
		require.True(t, c.wanted(time.Now()), "stopped listening the moment the last waiting claimer got work")
		require.False(t, c.wanted(time.Now().Add(listenSettle)))
	})
	t.Run("a claimer starting to wait is told", func(t *testing.T) {
		c := newClaimers()
		c.claimed(storage.ClaimParams{WorkerID: "w", Limit: 2}, false, 2)
		require.Empty(t, c.started)
		c.claimed(storage.ClaimParams{WorkerID: "w", Limit: 2}, false, 0)
		require.Len(t, c.started, 1)
	})
}

// worker is a store s whose listener's connections go by the name app,
// with another store on its schema, as a second process would be.
type worker struct {
	t     *testing.T
	s     *Store
	other *Store
	app   string
}

// newWorker opens the stores, s with cfg (nil for the defaults).
func newWorker(t *testing.T, app string, cfg *Config) *worker {
	other := openTestStore(t, nil)
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c.ApplicationName = app + "-" + other.cfg.Schema
	return &worker{t: t, s: openInSchema(t, other.cfg.Schema, &c), other: other, app: c.ApplicationName}
}

// create starts an instance of one step from the other process.
func (w *worker) create() {
	w.t.Helper()
	_, err := w.other.CreateInstances(w.t.Context(), nil, []storage.CreateParams{params(spec("a"))}, storagetest.Plan)
	require.NoError(w.t, err)
}

// claim claims up to limit steps and returns how many it got.
func (w *worker) claim(limit int) int {
	w.t.Helper()
	claimed, err := w.s.ClaimSteps(w.t.Context(), storage.ClaimParams{WorkerID: "w", Limit: limit, Lease: time.Minute})
	require.NoError(w.t, err)
	return len(claimed)
}

// listenerConns counts the server connections of the worker's listener.
func (w *worker) listenerConns() int {
	w.t.Helper()
	var n int
	require.NoError(w.t, sharedPool(w.t).QueryRow(w.t.Context(),
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", w.app+" listener").Scan(&n))
	return n
}

// TestListenerConnectsWhenAClaimerWaits: a worker whose first claim takes
// all it asked for, as every worker of a fleet started on a backlog does,
// opens no listener connection; its first short claim opens one, which
// signals its subscribers once it LISTENs (a step made ready between the
// claim and the LISTEN went unannounced) and then relays other processes'
// commits.
func TestListenerConnectsWhenAClaimerWaits(t *testing.T) {
	t.Parallel()
	w := newWorker(t, "lazy", nil)
	w.create()
	w.create()
	ch, cancel := w.s.Subscribe(nil)
	t.Cleanup(cancel)
	require.Equal(t, 1, w.claim(1), "a claim that takes all it asked for: the worker is busy")
	// The absence of a connection cannot be awaited: it is checked 400 ms
	// on, many times what a listener takes to connect and LISTEN here
	// (TestFaultListenerBackoffResets logs reconnects of 9-20 ms).
	time.Sleep(2 * listenSettle)
	require.Zero(t, w.listenerConns(), "a busy worker opened a listener connection")
	require.Zero(t, w.s.listenerPID())

	require.Less(t, w.claim(100), 100)
	awaitSignal(t, ch, 10*time.Second, "the listener's first LISTEN after a short claim")
	awaitListener(t, w.s, 0)
	require.Equal(t, 1, w.listenerConns())
	drain(ch)
	w.create()
	awaitSignal(t, ch, 10*time.Second, "another process's commit")
}

// TestListenerClosesItsConnectionAtRest: a listener that has not listened
// for listenerRest, every claimer having had work all along, closes its
// connection, and opens one again when a claim comes back short.
func TestListenerClosesItsConnectionAtRest(t *testing.T) {
	t.Parallel()
	w := newWorker(t, "rest", nil)
	w.s.listenerRest = 100 * time.Millisecond
	ch, cancel := w.s.Subscribe(nil)
	t.Cleanup(cancel)
	require.Zero(t, w.claim(1), "a claim of an empty queue: the worker waits")
	pid := awaitListener(t, w.s, 0)

	w.create()
	w.create()
	require.Equal(t, 1, w.claim(1), "a claim that takes all it asked for: the worker is busy")
	// The listener UNLISTENs at the next notification after listenSettle,
	// and closes the connection listenerRest later.
	require.Eventually(t, func() bool {
		w.create()
		return w.listenerConns() == 0
	}, 10*time.Second, 50*time.Millisecond, "the listener kept its connection while every claimer was busy")
	require.Zero(t, w.s.listenerPID())

	drain(ch)
	require.Less(t, w.claim(100), 100)
	awaitSignal(t, ch, 10*time.Second, "the listener's LISTEN on its new connection")
	awaitListener(t, w.s, pid)
	drain(ch)
	w.create()
	awaitSignal(t, ch, 10*time.Second, "another process's commit, listening again")
}
