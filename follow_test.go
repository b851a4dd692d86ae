package dagrun_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// TestFollowGivesEveryEventOnce: a follower of an instance that two
// workers run in parallel (a fan-out whose steps fail and retry) is given
// every event of its history exactly once, and the finished instance.
func TestFollowGivesEveryEventOnce(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		registry := handlers.NewRegistry()
		var attempts sync.Map // step -> *atomic.Int32
		registry.Register("flaky", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			n, _ := attempts.LoadOrStore(handlers.Info(ctx).Step, new(atomic.Int32))
			if n.(*atomic.Int32).Add(1) < 3 {
				return nil, errors.New("not yet")
			}
			return json.RawMessage(`{}`), nil
		})
		b := setup(t, open, registry, `
name: wide
defaults:
  retry: {maxAttempts: 3, backoff: 1ms, maxBackoff: 1ms}
steps:
  - {name: s0, handler: flaky}
  - {name: s1, handler: flaky}
  - {name: s2, handler: flaky}
  - {name: s3, handler: flaky}
  - {name: s4, handler: flaky}
  - {name: s5, handler: flaky}
  - {name: s6, handler: flaky}
  - {name: s7, handler: flaky}
  - {name: join, handler: echo, dependsOn: [s0, s1, s2, s3, s4, s5, s6, s7]}
`)
		b.runWorker(t, &dagrun.WorkerConfig{Concurrency: 4})
		other, err := dagrun.New(b.store, registry, &dagrun.Config{Workflows: b.engine.Workflows()})
		require.NoError(t, err)
		(&testBundle{engine: other, store: b.store, registry: registry}).runWorker(t, &dagrun.WorkerConfig{Concurrency: 4})
		id := b.start(t, "wide", `{}`)

		var given []storage.Event
		seen := map[int64]bool{}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		inst, err := b.engine.Follow(ctx, id, func(_ *storage.Instance, events []storage.Event) {
			for _, e := range events {
				require.False(t, seen[e.ID], "event %d (%s %s) given twice", e.ID, e.Type, e.Step)
				seen[e.ID] = true
			}
			given = append(given, events...)
		})
		require.NoError(t, err)
		require.Equal(t, storage.InstanceCompleted, inst.Status)
		require.ElementsMatch(t, history(t, b.engine, id), given)
	})
}

// TestFollowReadsOnlyNewEventsWhileIdle: while nothing happens to an
// instance, a follower only looks for new events; it reads the instance
// again when events came.
func TestFollowReadsOnlyNewEventsWhileIdle(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b, store, id := startGate(t, open)
		followed := make(chan *storage.Instance, 1)
		go func() {
			inst, err := b.engine.Follow(t.Context(), id, nil)
			if err != nil {
				inst = nil
			}
			followed <- inst
		}()
		// The first look reads the instance; the next ones find no events.
		require.Eventually(t, func() bool { return store.follows.Load() >= 2 }, 10*time.Second, time.Millisecond)
		gets := store.gets.Load()
		require.Eventually(t, func() bool { return store.follows.Load() >= 5 }, 10*time.Second, time.Millisecond)
		require.Equal(t, gets, store.gets.Load(), "the instance is not read again while nothing happens")

		_, err := b.engine.Signal(t.Context(), dagrun.SignalRequest{InstanceID: id, Name: "approve"})
		require.NoError(t, err)
		inst := <-followed
		require.NotNil(t, inst, "Follow failed")
		require.Equal(t, storage.InstanceCompleted, inst.Status, "read again once the signal's events came")
	})
}

// TestFollowGivesTheEventsOfTheFinish: when the instance finished between
// a follower's look for events and its read of the instance, the follower
// still gets the events of the finish before Follow returns.
func TestFollowGivesTheEventsOfTheFinish(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b, store, id := startGate(t, open)
		store.beforeGet = func() {
			_, err := b.engine.Signal(t.Context(), dagrun.SignalRequest{InstanceID: id, Name: "approve"})
			require.NoError(t, err)
		}
		var given []storage.Event
		inst, err := b.engine.Follow(t.Context(), id, func(_ *storage.Instance, events []storage.Event) {
			given = append(given, events...)
		})
		require.NoError(t, err)
		require.Equal(t, storage.InstanceCompleted, inst.Status)
		require.Equal(t, history(t, b.engine, id), given)
	})
}

// startGate starts an instance whose one step waits for the signal
// approve, on a store that counts a follower's reads.
func startGate(t *testing.T, open func(t *testing.T) storage.Store) (*testBundle, *countingStore, string) {
	t.Helper()
	store := &countingStore{Store: open(t)}
	b := setup(t, func(*testing.T) storage.Store { return store }, nil, `
name: gate
steps:
  - name: approve
    wait: {signal: approve}
`)
	return b, store, b.start(t, "gate", `{}`)
}

// countingStore counts the reads a follower makes; beforeGet, when set,
// runs once, at the first GetInstance.
type countingStore struct {
	storage.Store
	gets, follows atomic.Int32
	beforeGet     func()
	got           atomic.Bool
}

func (s *countingStore) GetInstance(ctx context.Context, id string) (*storage.Instance, error) {
	s.gets.Add(1)
	if s.beforeGet != nil && s.got.CompareAndSwap(false, true) {
		s.beforeGet()
	}
	return s.Store.GetInstance(ctx, id)
}

func (s *countingStore) FollowEvents(ctx context.Context, id string, c storage.EventCursor) ([]storage.Event, storage.EventCursor, error) {
	s.follows.Add(1)
	return s.Store.FollowEvents(ctx, id, c)
}

// history reads an instance's whole history, a page at a time.
func history(t *testing.T, engine *dagrun.Engine, id string) []storage.Event {
	t.Helper()
	var out []storage.Event
	for {
		var after int64
		if len(out) > 0 {
			after = out[len(out)-1].ID
		}
		page, err := engine.Events(t.Context(), storage.EventsParams{InstanceID: id, AfterID: after, Limit: 10})
		require.NoError(t, err)
		if len(page) == 0 {
			return out
		}
		out = append(out, page...)
	}
}
