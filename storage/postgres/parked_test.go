package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// TestSweepParksPastALockedInstance: the sweep that finds a key full parks
// the key's other held instances whose time has come, but passes over one
// another transaction has locked rather than wait for it: it would wait
// holding the key's lock, out of lock order, where a transaction that
// locked the instance first may want the key next. The instance passed
// over is parked by a later sweep.
func TestSweepParksPastALockedInstance(t *testing.T) {
	t.Parallel()
	clock := storagetest.NewClock(time.Now().Truncate(time.Second))
	s := openTestStore(t, &Config{Now: clock.Now})
	ctx := t.Context()
	limited := func(p storage.CreateParams) storage.CreateParams {
		p.ConcurrencyKey, p.ConcurrencyLimit = "a", 1
		return p
	}
	wait := spec("await-go")
	wait.Handler, wait.Wait = "", &storage.WaitSpec{Signal: "go"}
	ps := []storage.CreateParams{limited(params(spec("work")))}
	for range 3 {
		p := limited(params(wait))
		p.RunAfter = clock.Now().Add(time.Hour)
		ps = append(ps, p)
	}
	_, err := s.CreateInstances(ctx, nil, ps, storagetest.Plan)
	require.NoError(t, err)
	backlog := ps[1:]
	clock.Advance(time.Hour)

	parked := func(id string) bool {
		t.Helper()
		var p bool
		require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT parked FROM {s}instances WHERE id = $1`), id).Scan(&p))
		return p
	}
	locker, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Rollback(context.Background()) })
	_, err = locker.Exec(ctx, s.q(`SELECT 1 FROM {s}instances WHERE id = $1 FOR NO KEY UPDATE`), backlog[2].ID)
	require.NoError(t, err)

	type sweep struct {
		started int
		err     error
	}
	swept := make(chan sweep, 1)
	go func() {
		n, err := s.StartDeferred(ctx, 1, storagetest.Plan)
		swept <- sweep{n, err}
	}()
	select {
	case got := <-swept:
		require.NoError(t, got.err)
		require.Zero(t, got.started, "the key is full")
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the sweep waited for the instance another transaction locked")
	}
	require.True(t, parked(backlog[0].ID))
	require.True(t, parked(backlog[1].ID), "parked with the first")
	require.False(t, parked(backlog[2].ID), "another transaction holds it")

	require.NoError(t, locker.Rollback(ctx))
	n, err := s.StartDeferred(ctx, 1, storagetest.Plan)
	require.NoError(t, err)
	require.Zero(t, n)
	require.True(t, parked(backlog[2].ID), "the next sweep parks it")
}
