package storagetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

var presenceTests = map[string]func(*testing.T, *Harness){
	"AnnounceRenewList": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		workers, err := b.store.ListWorkers(b.ctx)
		require.NoError(t, err)
		require.Empty(t, workers)

		require.NoError(t, b.store.AnnounceWorker(b.ctx, storage.WorkerInfo{ID: "w2", Handlers: []string{"h.b", "h.a", "h.b"}}))
		require.NoError(t, b.store.AnnounceWorker(b.ctx, storage.WorkerInfo{ID: "w1", Handlers: []string{"h.a"}, Queues: []string{"q2", "q1"}}))
		b.clock.Advance(10 * time.Second)
		require.NoError(t, b.store.AnnounceWorker(b.ctx, storage.WorkerInfo{ID: "w2", Handlers: []string{"h.c"}}))

		workers, err = b.store.ListWorkers(b.ctx)
		require.NoError(t, err)
		require.Len(t, workers, 2)
		w1, w2 := workers[0], workers[1]
		require.Equal(t, "w1", w1.ID)
		require.Equal(t, []string{"h.a"}, w1.Handlers)
		require.Equal(t, []string{"q1", "q2"}, w1.Queues)
		require.True(t, w1.StartedAt.Equal(start), "started %v", w1.StartedAt)
		require.True(t, w1.LastSeen.Equal(start), "last seen %v", w1.LastSeen)
		require.Equal(t, "w2", w2.ID)
		require.Equal(t, []string{"h.c"}, w2.Handlers, "a renewal replaces the handlers")
		require.Nil(t, w2.Queues)
		require.True(t, w2.StartedAt.Equal(start), "a renewal keeps the start: %v", w2.StartedAt)
		require.True(t, w2.LastSeen.Equal(start.Add(10*time.Second)), "last seen %v", w2.LastSeen)

		require.Error(t, b.store.AnnounceWorker(b.ctx, storage.WorkerInfo{}), "a worker needs an ID")
	},

	"LiveWhileRecent": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		require.NoError(t, b.store.AnnounceWorker(b.ctx, storage.WorkerInfo{ID: "old", Handlers: []string{"h.a"}}))
		b.clock.Advance(storage.PresenceTTL)
		require.NoError(t, b.store.AnnounceWorker(b.ctx, storage.WorkerInfo{ID: "new", Handlers: []string{"h.a"}}))
		workers, err := b.store.ListWorkers(b.ctx)
		require.NoError(t, err)
		require.Len(t, workers, 2, "a worker seen PresenceTTL ago is still live")

		b.clock.Advance(time.Second)
		workers, err = b.store.ListWorkers(b.ctx)
		require.NoError(t, err)
		require.Len(t, workers, 1)
		require.Equal(t, "new", workers[0].ID)

		// Another worker's announcement deletes the stale row: when the
		// old worker comes back, it is a new start.
		require.NoError(t, b.store.AnnounceWorker(b.ctx, storage.WorkerInfo{ID: "new", Handlers: []string{"h.a"}}))
		require.NoError(t, b.store.AnnounceWorker(b.ctx, storage.WorkerInfo{ID: "old", Handlers: []string{"h.a"}}))
		workers, err = b.store.ListWorkers(b.ctx)
		require.NoError(t, err)
		require.Len(t, workers, 2)
		require.Equal(t, "old", workers[1].ID)
		require.True(t, workers[1].StartedAt.Equal(b.now()), "the stale row was deleted: started %v", workers[1].StartedAt)
	},

	"Remove": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		require.NoError(t, b.store.AnnounceWorker(b.ctx, storage.WorkerInfo{ID: "w1", Handlers: []string{"h.a"}}))
		require.NoError(t, b.store.RemoveWorker(b.ctx, "w1"))
		require.NoError(t, b.store.RemoveWorker(b.ctx, "w1"), "removing twice is not an error")
		workers, err := b.store.ListWorkers(b.ctx)
		require.NoError(t, err)
		require.Empty(t, workers)
	},
}

// statsUnserved: Stats names the handlers of ready steps that no live
// worker can claim, with counts and the oldest age.
func statsUnserved(t *testing.T, h *Harness) {
	b := h.setup(t)
	b.createOne(spec("a"), spec("b"), spec("c", "a"))
	b.clock.Advance(time.Minute)
	b.createOne(spec("a"))
	b.clock.Advance(time.Minute)
	unserved := func() []storage.HandlerStats {
		t.Helper()
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		return st.Unserved
	}
	require.Equal(t, []storage.HandlerStats{
		{Handler: "h.a", Ready: 2, OldestReady: 2 * time.Minute},
		{Handler: "h.b", Ready: 1, OldestReady: 2 * time.Minute},
	}, unserved(), "no worker at all; blocked steps do not count")

	require.NoError(t, b.store.AnnounceWorker(b.ctx, storage.WorkerInfo{ID: "w1", Handlers: []string{"h.a"}, Queues: []string{"q.other"}}))
	require.NoError(t, b.store.AnnounceWorker(b.ctx, storage.WorkerInfo{ID: "w2", Handlers: []string{"h.b", "h.x"}}))
	require.Equal(t, []storage.HandlerStats{{Handler: "h.a", Ready: 2, OldestReady: 2 * time.Minute}}, unserved(),
		"h.a's worker serves another queue; h.b's serves every queue")

	require.NoError(t, b.store.AnnounceWorker(b.ctx, storage.WorkerInfo{ID: "w1", Handlers: []string{"h.a"}, Queues: []string{"q.other", "q.a"}}))
	require.Empty(t, unserved())

	b.clock.Advance(storage.PresenceTTL + time.Second)
	require.NoError(t, b.store.AnnounceWorker(b.ctx, storage.WorkerInfo{ID: "w2", Handlers: []string{"h.b"}}))
	require.Equal(t, []storage.HandlerStats{{Handler: "h.a", Ready: 2, OldestReady: 2*time.Minute + storage.PresenceTTL + time.Second}},
		unserved(), "w1 stopped renewing")
	require.NoError(t, b.store.RemoveWorker(b.ctx, "w2"))
	require.Len(t, unserved(), 2, "w2 stopped")
}
