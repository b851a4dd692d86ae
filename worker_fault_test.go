package dagrun_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/backendtest"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// A step cancelled and retried within one heartbeat is claimed again by
// the same worker while its first handler still runs. The first attempt
// must be stopped, and the second must keep its own lease: tracking
// attempts by step alone let the first one's end delete the second's
// entry, which then stopped heartbeating and was lost.
func TestReclaimBySameWorkerStopsTheOlderAttempt(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		const lease = 900 * time.Millisecond
		var calls atomic.Int32
		firstStarted := make(chan struct{})
		firstCause := make(chan error, 1)
		registry := handlers.NewRegistry()
		registry.Register("slow", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			switch calls.Add(1) {
			case 1:
				close(firstStarted)
				select {
				case <-ctx.Done():
					firstCause <- context.Cause(ctx)
				case <-time.After(2 * lease):
					firstCause <- errors.New("never cancelled")
				}
				return nil, errors.New("first attempt ended")
			default:
				// Outlive the lease: only heartbeats keep this attempt.
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(3 * lease):
				}
				return json.RawMessage(`"second"`), nil
			}
		})
		b := setup(t, open, registry, `
name: slow
steps:
  - {name: s, handler: slow}
`)
		b.runWorker(t, &dagrun.WorkerConfig{Lease: lease})
		id := b.start(t, "slow", ``)
		<-firstStarted
		// Cancel in the store, as another process would: this worker only
		// learns of it at its next heartbeat, after the retry.
		ctx := context.Background()
		require.NoError(t, b.store.CancelInstance(ctx, id, "by test", storagetest.Plan))
		require.NoError(t, b.engine.Retry(ctx, id))

		require.NotEqual(t, "never cancelled", (<-firstCause).Error(), "the older attempt's handler must see its context cancelled")
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		s := step(t, inst, "s")
		require.Equal(t, 1, s.Attempts, "the second attempt kept its lease")
		require.Empty(t, lifecycle(inst, storage.EventStepLeaseExpired))
		require.EqualValues(t, 2, calls.Load())
	})
}

// Concurrency is one count that the claim loop, a commit's eager claim and
// an eager start all draw from, so it holds under any race between them.
func TestConcurrencyHoldsUnderEveryClaimPath(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		const limit = 2
		var running, peak atomic.Int32
		registry := handlers.NewRegistry()
		registry.Register("count", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			n := running.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			time.Sleep(2 * time.Millisecond)
			running.Add(-1)
			return nil, nil
		})
		b := setup(t, open, registry, `
name: fan
steps:
  - {name: a, handler: count}
  - {name: b, handler: count}
  - {name: c, handler: count, dependsOn: [a, b]}
  - {name: d, handler: count, dependsOn: [c]}
`)
		b.runWorker(t, &dagrun.WorkerConfig{Concurrency: limit, Poll: time.Millisecond})
		var (
			wg  sync.WaitGroup
			mu  sync.Mutex
			ids []string
		)
		for range 4 {
			wg.Go(func() {
				for range 10 {
					id := b.start(t, "fan", ``)
					mu.Lock()
					ids = append(ids, id)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		for _, id := range ids {
			require.Equal(t, storage.InstanceCompleted, b.wait(t, id).Status)
		}
		require.LessOrEqual(t, peak.Load(), int32(limit), "handlers running at once")
	})
}

// refusingStore refuses every commit that carries a result marked poison,
// as PostgreSQL refuses a value it cannot store: not an outage, so
// retrying the same batch can never succeed.
type refusingStore struct {
	storage.Store
	refused atomic.Int32
	// refuseFailures refuses too the failed attempt recorded in place of
	// a refused result, so that the worker gives the result up.
	refuseFailures bool
}

const poison = "poison"

func (s *refusingStore) check(results []storage.StepResult) error {
	for _, r := range results {
		if r.Error == poison || s.refuseFailures && strings.Contains(r.Error, "could not be recorded") {
			s.refused.Add(1)
			return errors.New("invalid byte sequence for encoding")
		}
	}
	return nil
}

func (s *refusingStore) FinishSteps(ctx context.Context, rs []storage.StepResult, plan storage.PlanFunc) ([]storage.FinishResult, error) {
	if err := s.check(rs); err != nil {
		return nil, err
	}
	return s.Store.FinishSteps(ctx, rs, plan)
}

func (s *refusingStore) FinishAndClaim(ctx context.Context, rs []storage.StepResult, plan storage.PlanFunc, p storage.ClaimParams) ([]storage.FinishResult, []storage.ClaimedStep, error) {
	if err := s.check(rs); err != nil {
		return nil, nil, err
	}
	return s.Store.(storage.FinishClaimer).FinishAndClaim(ctx, rs, plan, p)
}

// A result the store refuses must not stop the worker: the rest of its
// batch is recorded, the refused attempt is recorded as failed with the
// reason, the worker keeps claiming with its one slot, and Run returns when
// asked.
func TestRefusedResultDoesNotStopTheWorker(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		registry := handlers.NewRegistry()
		registry.Register("poison", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			return nil, errors.New(poison)
		})
		store := &refusingStore{Store: open(t)}
		b := setup(t, func(*testing.T) storage.Store { return store }, registry, `
name: poisoned
steps:
  - {name: p, handler: poison, retry: {maxAttempts: 2, backoff: 1ms}}
`, `
name: healthy
steps:
  - {name: a, handler: echo, input: 1}
  - {name: b, handler: echo, dependsOn: [a], input: 2}
`)
		worker, err := b.engine.NewWorker(&dagrun.WorkerConfig{Concurrency: 1, Poll: 5 * time.Millisecond})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- worker.Run(ctx) }()

		bad := b.start(t, "poisoned", ``)
		var good []string
		for range 5 {
			good = append(good, b.start(t, "healthy", ``))
		}
		inst := b.wait(t, bad)
		require.Equal(t, storage.InstanceFailed, inst.Status)
		p := step(t, inst, "p")
		require.Equal(t, 2, p.Attempts, "each refused attempt still counts")
		require.Contains(t, p.Error, "the attempt's result could not be recorded: invalid byte sequence")
		for _, id := range good {
			require.Equal(t, storage.InstanceCompleted, b.wait(t, id).Status)
		}
		require.Positive(t, store.refused.Load())

		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
	})
}

// An error text PostgreSQL cannot store (a NUL byte, invalid UTF-8, as in
// a 5xx body) is cleaned before it is recorded, on every backend.
func TestUnstorableErrorTextIsCleaned(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		registry := handlers.NewRegistry()
		registry.Register("garbled", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			return nil, handlers.Permanent(errors.New("upstream said \x00\xff" + strings.Repeat("x", 100_000)))
		})
		b := setup(t, open, registry, `
name: garbled
steps:
  - {name: g, handler: garbled}
`)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "garbled", ``))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		g := step(t, inst, "g")
		require.True(t, strings.HasPrefix(g.Error, "upstream said \uFFFD\uFFFD"), g.Error[:40])
		require.Less(t, len(g.Error), 20_000, "long error texts are cut")
		require.Contains(t, g.Error, "bytes cut")
	})
}

// A handler that ignores its context would hold its step for ever: the
// heartbeat renewed it as long as the handler ran, and shutdown waited for
// it without end. Past its timeout plus the grace the attempt is recorded
// as failed, and Run returns after its grace all the same.
func TestHandlerIgnoringItsContext(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		started := make(chan struct{}, 10)
		registry := handlers.NewRegistry()
		registry.Register("deaf", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			started <- struct{}{}
			<-release
			return nil, nil
		})
		b := setup(t, open, registry, `
name: deaf
steps:
  - {name: timed, handler: deaf, timeout: 100ms, retry: {maxAttempts: 1}}
`, `
name: forever
steps:
  - {name: untimed, handler: deaf}
`)
		var logs syncBuffer
		logger := slog.New(slog.NewTextHandler(&logs, nil))
		engine, err := dagrun.New(b.store, registry, &dagrun.Config{Workflows: b.engine.Workflows(), Logger: logger})
		require.NoError(t, err)
		b.engine = engine
		worker, err := engine.NewWorker(&dagrun.WorkerConfig{ShutdownGrace: 200 * time.Millisecond, Poll: 5 * time.Millisecond})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- worker.Run(ctx) }()

		inst := b.wait(t, b.start(t, "deaf", ``))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Contains(t, step(t, inst, "timed").Error, "attempt timed out after 100ms and its handler did not return within 200ms")

		untimed := b.start(t, "forever", ``)
		<-started
		<-started
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Run waited for a handler that ignores its context")
		}
		got, err := engine.Get(context.Background(), untimed)
		require.NoError(t, err)
		require.Equal(t, storage.StepPending, step(t, got, "untimed").Status, "released for another worker")
		require.Contains(t, logs.String(), "handler ignored its cancelled context")
	})
}

// A handler's context ends once its attempt is over, as an HTTP request's
// does when ServeHTTP returns: what the handler left running learns it,
// and the worker keeps no context of an attempt it ran (it kept every one,
// for as long as it ran: a serve --worker grew by 10 MB in 5 minutes).
func TestHandlerContextEndsWithItsAttempt(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		contexts := make(chan context.Context, 2)
		registry := handlers.NewRegistry()
		registry.Register("keep", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			contexts <- ctx
			return json.RawMessage(`"kept"`), nil
		})
		b := setup(t, open, registry, `
name: keep
steps:
  - {name: first, handler: keep}
  - {name: second, handler: keep, dependsOn: [first]}
`)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "keep", ``))
		require.Equal(t, storage.InstanceCompleted, inst.Status)
		for range 2 {
			ctx := <-contexts
			require.ErrorIs(t, ctx.Err(), context.Canceled, "the attempt is over")
			require.EqualError(t, context.Cause(ctx), "the attempt is over: its handler returned")
		}
	})
}

// claimDelayingStore holds the first claim that takes a step until the
// test lets it return, as when the claim commits just before another
// transaction ends the step's instance, and reports the claims released.
type claimDelayingStore struct {
	storage.Store
	held     chan []storage.ClaimedStep // the held claim's steps
	proceed  chan struct{}              // closed to let it return
	released chan []storage.Claim
	once     sync.Once
}

func (s *claimDelayingStore) ClaimSteps(ctx context.Context, p storage.ClaimParams) ([]storage.ClaimedStep, error) {
	steps, err := s.Store.ClaimSteps(ctx, p)
	if err == nil && len(steps) > 0 {
		s.once.Do(func() {
			s.held <- steps
			<-s.proceed
		})
	}
	return steps, err
}

func (s *claimDelayingStore) ReleaseSteps(ctx context.Context, claims []storage.Claim) error {
	s.released <- claims
	return s.Store.ReleaseSteps(ctx, claims)
}

// A claim on its way back when its instance is cancelled and retried
// carries a stale step. Its handler must not run: the worker did not know
// the attempt yet when the cancel stopped the instance's handlers, so it
// ran until its first heartbeat, beside the retried attempt (a forEach
// step capped at two children ran three). The stale claim is released,
// which changes nothing, and the retried step runs once.
func TestClaimOnItsWayWhenItsInstanceIsCancelled(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		store := &claimDelayingStore{Store: open(t), held: make(chan []storage.ClaimedStep, 1),
			proceed: make(chan struct{}), released: make(chan []storage.Claim, 4)}
		var calls atomic.Int32
		registry := handlers.NewRegistry()
		registry.Register("count", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			calls.Add(1)
			return json.RawMessage(`"done"`), nil
		})
		b := setup(t, func(*testing.T) storage.Store { return store }, registry, `
name: counted
steps:
  - {name: s, handler: count}
`)
		b.runWorker(t, nil)
		ctx := context.Background()
		id := b.start(t, "counted", ``)
		stale := <-store.held
		require.Len(t, stale, 1)
		require.NoError(t, b.engine.Cancel(ctx, id))
		require.NoError(t, b.engine.Retry(ctx, id))
		close(store.proceed)

		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		require.EqualValues(t, 1, calls.Load(), "the handler ran for the retried claim only")
		require.Equal(t, 1, step(t, inst, "s").Attempts)
		// Released before the claim loop claimed again, so before the
		// retried step could run.
		select {
		case got := <-store.released:
			require.Equal(t, []storage.Claim{stale[0].Claim}, got)
		default:
			t.Fatal("the stale claim was not released")
		}
	})
}

// When a step's terminal failure fails the instance, its running siblings
// finish their attempt (the instance is failing meanwhile); a cancel of the
// failing instance stops them: their handlers see their context cancelled
// at once, they end cancelled, and the worker does not warn of stale
// results.
func TestCancelOfAFailingInstanceStopsRunningSiblings(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		siblingStarted := make(chan struct{})
		siblingCause := make(chan error, 1)
		registry := handlers.NewRegistry()
		registry.Register("slow", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			close(siblingStarted)
			select {
			case <-ctx.Done():
				siblingCause <- context.Cause(ctx)
				return nil, ctx.Err()
			case <-time.After(20 * time.Second):
				siblingCause <- errors.New("ran on")
				return json.RawMessage(`"late"`), nil
			}
		})
		registry.Register("fail", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			<-siblingStarted
			return nil, handlers.Permanent(errors.New("card declined"))
		})
		b := setup(t, open, registry, `
name: siblings
steps:
  - {name: slow, handler: slow}
  - {name: fail, handler: fail}
`)
		logs := b.captureLogs(t)
		b.runWorker(t, nil) // a 30s lease: only the local stop can be this quick
		id := b.start(t, "siblings", ``)
		b.awaitStatus(t, id, "fail", storage.StepFailed)
		select {
		case cause := <-siblingCause:
			t.Fatalf("the running sibling was stopped by the failure: %v", cause)
		case <-time.After(200 * time.Millisecond):
		}
		got, err := b.engine.Get(context.Background(), id)
		require.NoError(t, err)
		require.True(t, got.Failing)
		require.NoError(t, b.engine.Cancel(context.Background(), id))
		select {
		case cause := <-siblingCause:
			require.NotEqual(t, "ran on", cause.Error())
		case <-time.After(10 * time.Second):
			t.Fatal("the running sibling was not stopped")
		}
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceCancelled, inst.Status)
		require.Equal(t, storage.StepCancelled, step(t, inst, "slow").Status)
		require.NotContains(t, logs.String(), "stale result")
	})
}

// A definition snapshot this binary cannot parse (written by a newer
// version, say) fails its instance with a clear error instead of failing
// every commit and every lease-recovery batch that touches it.
func TestUnparsableSnapshotFailsTheInstance(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil)
		ctx := context.Background()
		retry := storage.RetryPolicy{MaxAttempts: 1}
		_, err := b.store.CreateInstances(ctx, nil, []storage.CreateParams{{
			ID: "future-1", Workflow: "future", DefinitionHash: "future-hash",
			Definition: []byte("name: future\nsteps:\n  - {name: a, handler: echo, fromTheFuture: true}\n"),
			Input:      json.RawMessage(`{}`),
			Steps:      []storage.StepSpec{{Name: "a", Handler: "echo", Queue: "default", Retry: retry}},
		}}, func(st *storage.InstanceState) (*storage.Plan, error) {
			return &storage.Plan{Steps: []storage.StepChange{{Name: "a", Status: storage.StepPending, Input: json.RawMessage(`1`)}}}, nil
		})
		require.NoError(t, err)
		b.runWorker(t, nil)
		inst := b.wait(t, "future-1")
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Contains(t, inst.Error, "cannot be parsed by this version of dagrun")
		require.Equal(t, storage.StepCompleted, step(t, inst, "a").Status)
	})
}

// lifecycle returns the events of one type.
func lifecycle(inst *storage.Instance, typ storage.EventType) []storage.Event {
	var out []storage.Event
	for _, e := range inst.Events {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// A result the worker gives up on (the store refuses it and the failed
// attempt recorded in its place) is reported once, as given up: not also
// as a stale result, which would say a newer attempt took the step.
func TestGivenUpResultIsNotCalledStale(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		registry := handlers.NewRegistry()
		registry.Register("doomed", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			return nil, errors.New(poison)
		})
		store := &refusingStore{Store: open(t), refuseFailures: true}
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
		require.NotContains(t, logs.String(), "stale result")
	})
}

// renewalRacingStore holds a heartbeat's first renewal until the step it
// renews has been recorded, as when a finish commits while the renewal is
// on its way, and counts the reads of whole instances made between the
// end of that renewal and the start of the next one.
type renewalRacingStore struct {
	storage.Store
	renewals      atomic.Int32
	firstRenewal  chan struct{} // closed as the first renewal starts
	recorded      chan struct{} // closed as the first finish returns
	secondRenewal chan struct{} // closed as the second renewal starts
	recordedOnce  sync.Once
	inWindow      atomic.Bool
	readsInWindow atomic.Int32
}

func (s *renewalRacingStore) ExtendLeases(ctx context.Context, claims []storage.Claim, lease time.Duration) ([]storage.Claim, error) {
	switch s.renewals.Add(1) {
	case 1:
		close(s.firstRenewal)
		select {
		case <-s.recorded:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		lost, err := s.Store.ExtendLeases(ctx, claims, lease)
		s.inWindow.Store(true)
		return lost, err
	case 2:
		s.inWindow.Store(false)
		close(s.secondRenewal)
	}
	return s.Store.ExtendLeases(ctx, claims, lease)
}

func (s *renewalRacingStore) FinishSteps(ctx context.Context, rs []storage.StepResult, plan storage.PlanFunc) ([]storage.FinishResult, error) {
	out, err := s.Store.FinishSteps(ctx, rs, plan)
	s.recordedOnce.Do(func() { close(s.recorded) })
	return out, err
}

func (s *renewalRacingStore) GetInstance(ctx context.Context, id string) (*storage.Instance, error) {
	if s.inWindow.Load() {
		s.readsInWindow.Add(1)
	}
	return s.Store.GetInstance(ctx, id)
}

// A renewal that finds a step no longer running under the worker's claim
// because the worker recorded its result meanwhile stops nothing, so it
// must not read the instance to learn why: with many workers each renewal
// raced a few finishes, and each lost claim cost a read of its instance
// with all its events.
func TestRenewalRacingAFinishReadsNoInstance(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		store := &renewalRacingStore{Store: open(t), firstRenewal: make(chan struct{}),
			recorded: make(chan struct{}), secondRenewal: make(chan struct{})}
		registry := handlers.NewRegistry()
		waitFor := func(ch chan struct{}) handlers.Handler {
			return func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
				select {
				case <-ch:
					return json.RawMessage(`{}`), nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
		}
		registry.Register("until-first-renewal", waitFor(store.firstRenewal))
		registry.Register("until-second-renewal", waitFor(store.secondRenewal))
		b := setup(t, func(*testing.T) storage.Store { return store }, registry, `
name: raced
steps:
  - {name: a, handler: until-first-renewal}
`, `
name: next
steps:
  - {name: a, handler: until-second-renewal}
`)
		b.runWorker(t, &dagrun.WorkerConfig{Concurrency: 2, Lease: 300 * time.Millisecond})
		raced := b.start(t, "raced", ``)
		<-store.recorded
		next := b.start(t, "next", ``)
		<-store.secondRenewal // the heartbeat that renewed too late is done
		require.Zero(t, store.readsInWindow.Load(), "instances read for a claim whose result was recorded")
		require.Equal(t, storage.InstanceCompleted, b.wait(t, raced).Status)
		require.Equal(t, storage.InstanceCompleted, b.wait(t, next).Status)
	})
}

// outageStore fails every claim while down, as a store whose server went
// away does.
type outageStore struct {
	storage.Store
	down atomic.Bool
}

func (s *outageStore) ClaimSteps(ctx context.Context, p storage.ClaimParams) ([]storage.ClaimedStep, error) {
	if s.down.Load() {
		return nil, fmt.Errorf("%w: the server went away", storage.ErrUnavailable)
	}
	return s.Store.ClaimSteps(ctx, p)
}

// A worker whose claims fail says so at each try, and says once that the
// store answers again when one succeeds, so that an operator reading its
// log knows the outage ended; it then runs work as before.
func TestWorkerSaysWhenItsStoreAnswersAgain(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		store := &outageStore{Store: open(t)}
		logs := &syncBuffer{}
		b := setupConfig(t, func(*testing.T) storage.Store { return store },
			dagrun.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))}, chainWorkflow)
		store.down.Store(true)
		b.runWorker(t, &dagrun.WorkerConfig{Poll: 10 * time.Millisecond})
		require.Eventually(t, func() bool { return strings.Count(logs.String(), "dagrun: claim steps") >= 2 },
			10*time.Second, 5*time.Millisecond, "the failed claims are logged")
		require.NotContains(t, logs.String(), "answers again")

		store.down.Store(false)
		require.Eventually(t, func() bool { return strings.Contains(logs.String(), "answers again") },
			10*time.Second, 5*time.Millisecond, logs.String())
		require.Equal(t, 1, strings.Count(logs.String(), "answers again"), logs.String())
		require.Equal(t, storage.InstanceCompleted, b.wait(t, b.start(t, "chain", `{"n": 1}`)).Status)
	})
}

// TestAttemptFailureLogLevels: a failed attempt that will run again is
// logged at info, one that fails its step for good at warn, so that a
// worker run with --log-level warn shows every step that failed.
func TestAttemptFailureLogLevels(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		registry := handlers.NewRegistry()
		registry.Register("flaky", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			return nil, errors.New("card declined")
		})
		b := setup(t, open, registry, `
name: flaky
steps:
  - {name: pay, handler: flaky, retry: {maxAttempts: 2, backoff: 1ms}}
`)
		logs := b.captureLogs(t)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "flaky", ``))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		var levels []string
		for line := range strings.Lines(logs.String()) {
			if strings.Contains(line, `msg="dagrun: attempt failed"`) {
				level, _, _ := strings.Cut(strings.SplitN(line, "level=", 2)[1], " ")
				levels = append(levels, level)
				require.Contains(t, line, "card declined")
			}
		}
		require.Equal(t, []string{"INFO", "WARN"}, levels, logs.String())
	})
}

// TestHandlerThatEndsItsGoroutine: a handler that calls runtime.Goexit (as
// t.FailNow does) never returns, and no recover stops it. Its attempt
// fails, and a retry runs: the step does not wait for a result until its
// worker stops.
func TestHandlerThatEndsItsGoroutine(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		registry := handlers.NewRegistry()
		var calls atomic.Int32
		registry.Register("test.goexit", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			if calls.Add(1) == 1 {
				runtime.Goexit()
			}
			return json.RawMessage(`"second"`), nil
		})
		b := setup(t, open, registry, `
name: exits
steps:
  - {name: once, handler: test.goexit, retry: {maxAttempts: 2, backoff: 1ms}}
output: ${{ steps.once.output }}
`)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "exits", `{}`))
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `"second"`, inst.Output)
		once := step(t, inst, "once")
		require.Equal(t, 2, once.Attempts)
		var failed []string
		for _, e := range inst.Events {
			if e.Type == storage.EventStepRetrying {
				failed = append(failed, e.Message)
			}
		}
		require.Len(t, failed, 1)
		require.Contains(t, failed[0], "the handler ended its goroutine without returning")
	})
}

// TestAWorkerRunsOnce: a second Run, after the first or beside it, returns
// ErrWorkerRan instead of claiming nothing without a word.
func TestAWorkerRunsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, func(t *testing.T) storage.Store { return backendtest.OpenSQLite(t) }, nil, chainWorkflow)
	worker, err := b.engine.NewWorker(&dagrun.WorkerConfig{Poll: 20 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- worker.Run(ctx) }()
	inst := b.wait(t, b.start(t, "chain", `{"n": 1}`))
	require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
	require.ErrorIs(t, worker.Run(context.Background()), dagrun.ErrWorkerRan, "beside the first")
	cancel()
	require.NoError(t, <-done)
	require.ErrorIs(t, worker.Run(context.Background()), dagrun.ErrWorkerRan, "after the first")
}
