package dagrun_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// ackLosingStore commits through the store it wraps, then every nth time
// a commit wrote something answers as if the connection dropped just as
// the database acknowledged it: the commit happened, the caller sees an
// error.
type ackLosingStore struct {
	storage.Store
	nth int32
	// The commits that wrote, and the answers lost, by method.
	claims, finishClaims, finishes lossCount
}

type lossCount struct{ calls, lost atomic.Int32 }

var errAckLost = fmt.Errorf("%w: connection reset as the commit was acknowledged", storage.ErrUnavailable)

// lose reports whether this commit's answer is lost, counting it in c.
func (s *ackLosingStore) lose(wrote bool, c *lossCount) bool {
	if !wrote || c.calls.Add(1)%s.nth != 0 {
		return false
	}
	c.lost.Add(1)
	return true
}

func (s *ackLosingStore) ClaimSteps(ctx context.Context, p storage.ClaimParams) ([]storage.ClaimedStep, error) {
	steps, err := s.Store.ClaimSteps(ctx, p)
	if err == nil && s.lose(len(steps) > 0, &s.claims) {
		return nil, errAckLost
	}
	return steps, err
}

func (s *ackLosingStore) FinishAndClaim(ctx context.Context, rs []storage.StepResult, plan storage.PlanFunc, p storage.ClaimParams) ([]storage.FinishResult, []storage.ClaimedStep, error) {
	out, steps, err := s.Store.(storage.FinishClaimer).FinishAndClaim(ctx, rs, plan, p)
	if err == nil && s.lose(true, &s.finishClaims) {
		return nil, nil, errAckLost
	}
	return out, steps, err
}

func (s *ackLosingStore) FinishSteps(ctx context.Context, rs []storage.StepResult, plan storage.PlanFunc) ([]storage.FinishResult, error) {
	out, err := s.Store.FinishSteps(ctx, rs, plan)
	if err == nil && s.lose(len(rs) > 0, &s.finishes) {
		return nil, errAckLost
	}
	return out, err
}

// A commit the database made while its answer was lost (a connection
// terminated as the commit was acknowledged: pg_terminate_backend, a
// failover, a pooler restart) must cost nothing: the results it recorded
// are not called stale when the worker commits them again, and the steps
// it claimed are run by their worker at once, not left to their lease,
// which failed steps with maxAttempts: 1 ("lease expired on attempt 1")
// although their worker was alive and no handler had run them.
func TestLostCommitAnswersCostNothing(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		var (
			mu   sync.Mutex
			runs = map[string]int{}
		)
		registry := handlers.NewRegistry()
		registry.Register("count", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
			info := handlers.Info(ctx)
			mu.Lock()
			runs[info.IdempotencyKey]++
			mu.Unlock()
			return in, nil
		})
		store := &ackLosingStore{Store: open(t), nth: 3}
		b := setup(t, func(*testing.T) storage.Store { return store }, registry, `
name: chain4
defaults:
  retry: {maxAttempts: 1}
steps:
  - {name: a, handler: count, input: 1}
  - {name: b, handler: count, dependsOn: [a], input: 2}
  - {name: c, handler: count, dependsOn: [b], input: 3}
  - {name: d, handler: count, dependsOn: [c], input: 4}
`)
		logs := b.captureLogs(t)
		const lease = 2 * time.Second
		b.runWorker(t, &dagrun.WorkerConfig{Concurrency: 4, Lease: lease, Poll: 10 * time.Millisecond})

		const n = 30
		ids := make([]string, n)
		for i := range ids {
			ids[i] = b.start(t, "chain4", ``)
		}
		for _, id := range ids {
			inst := b.wait(t, id)
			require.Equal(t, storage.InstanceCompleted, inst.Status, "instance %s: %s", id, inst.Error)
			require.Empty(t, lifecycle(inst, storage.EventStepLeaseExpired), "no step waited out its lease")
			for _, s := range inst.Steps {
				require.Equal(t, 1, s.Attempts, "step %s of %s", s.Name, id)
			}
		}
		for what, c := range map[string]*lossCount{"ClaimSteps": &store.claims, "FinishAndClaim": &store.finishClaims, "FinishSteps": &store.finishes} {
			require.Positive(t, c.lost.Load(), "answers of %s lost", what)
		}
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, runs, 4*n)
		for key, ran := range runs {
			require.Equal(t, 1, ran, "handler runs of %s", key)
		}
		require.Zero(t, strings.Count(logs.String(), "stale result"), "results recorded by a commit whose answer was lost are called stale")
	})
}

// ackLosingCreator loses the answer of every other eager start that
// claimed steps (storage.CreateClaimer).
type ackLosingCreator struct {
	storage.Store
	creates lossCount
}

func (s *ackLosingCreator) CreateAndClaim(ctx context.Context, ps []storage.CreateParams, plan storage.PlanFunc, p storage.ClaimParams) ([]storage.CreateResult, []storage.ClaimedStep, error) {
	out, steps, err := s.Store.(storage.CreateClaimer).CreateAndClaim(ctx, ps, plan, p)
	if err == nil && len(steps) > 0 && s.creates.calls.Add(1)%2 == 0 {
		s.creates.lost.Add(1)
		return nil, nil, errAckLost
	}
	return out, steps, err
}

// An eager start whose answer was lost created its instance and claimed
// its first step for the local worker: the caller's start fails (and is
// tried again with its key), and the worker runs that step at once.
func TestLostEagerStartAnswerCostsNothing(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		var runs atomic.Int32
		registry := handlers.NewRegistry()
		registry.Register("count", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			runs.Add(1)
			return nil, nil
		})
		store := &ackLosingCreator{Store: open(t)}
		b := setup(t, func(*testing.T) storage.Store { return store }, registry, `
name: one
steps:
  - {name: a, handler: count, retry: {maxAttempts: 1}}
`)
		b.runWorker(t, &dagrun.WorkerConfig{Lease: 2 * time.Second})
		const n = 10
		for i := range n {
			opts := &dagrun.StartOptions{Key: fmt.Sprint("k", i)}
			res, err := b.engine.Start(context.Background(), "one", nil, opts)
			if err != nil {
				require.ErrorIs(t, err, storage.ErrUnavailable)
				res, err = b.engine.Start(context.Background(), "one", nil, opts)
				require.NoError(t, err)
			}
			inst := b.wait(t, res.ID)
			require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
			require.Empty(t, lifecycle(inst, storage.EventStepLeaseExpired))
		}
		require.Positive(t, store.creates.lost.Load(), "answers lost")
		require.EqualValues(t, n, runs.Load(), "each step ran once")
	})
}

// doubtingStore fails one claim when told to, as a lost answer would,
// and reports what each adoption found.
type doubtingStore struct {
	*refusingStore
	failClaim atomic.Bool
	adopted   chan []storage.ClaimedStep
}

func (s *doubtingStore) ClaimSteps(ctx context.Context, p storage.ClaimParams) ([]storage.ClaimedStep, error) {
	if s.failClaim.CompareAndSwap(true, false) {
		return nil, errAckLost
	}
	return s.refusingStore.ClaimSteps(ctx, p)
}

func (s *doubtingStore) AdoptSteps(ctx context.Context, p storage.AdoptParams) ([]storage.ClaimedStep, error) {
	steps, err := s.refusingStore.AdoptSteps(ctx, p)
	if err == nil {
		select {
		case s.adopted <- steps:
		default:
		}
	}
	return steps, err
}

// A step whose result the worker gave up on is still leased to it, and
// its handler ran: a worker in doubt about a failed claim must not take it
// for a step a lost claim took, and run it again.
func TestAGivenUpAttemptIsNotAdopted(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		var runs atomic.Int32
		registry := handlers.NewRegistry()
		registry.Register("doomed", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			runs.Add(1)
			return nil, errors.New(poison)
		})
		store := &doubtingStore{refusingStore: &refusingStore{Store: open(t), refuseFailures: true}, adopted: make(chan []storage.ClaimedStep, 10)}
		b := setup(t, func(*testing.T) storage.Store { return store }, registry, `
name: doomed
steps:
  - {name: d, handler: doomed, retry: {maxAttempts: 1}}
`)
		logs := b.captureLogs(t)
		b.runWorker(t, nil)
		b.start(t, "doomed", ``)
		require.Eventually(t, func() bool { return strings.Contains(logs.String(), "giving up on this attempt's result") },
			10*time.Second, 10*time.Millisecond, "the worker gives the result up")

		// The refused commits made it look already, while it still
		// tracked the attempt.
		for len(store.adopted) > 0 {
			require.Empty(t, <-store.adopted)
		}
		store.failClaim.Store(true)
		select {
		case steps := <-store.adopted:
			require.Empty(t, steps, "the step given up on is not the lost claim's")
		case <-time.After(10 * time.Second):
			t.Fatal("the worker did not look for a lost claim's steps")
		}
		require.EqualValues(t, 1, runs.Load())
	})
}
