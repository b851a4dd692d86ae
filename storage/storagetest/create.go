package storagetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

var createTests = map[string]func(*testing.T, *Harness){
	"RootsPendingOthersBlocked": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		p := params(spec("a"), spec("b", "a"), spec("c"))
		p.Key, p.Priority = "order-42", 7
		var sawDefinition []byte
		res, err := b.store.CreateInstances(b.ctx, nil, []storage.CreateParams{p}, func(st *storage.InstanceState) (*storage.Plan, error) {
			require.Equal(t, storage.InstancePending, st.Status)
			require.Equal(t, "wf", st.Workflow)
			require.Equal(t, "hash-wf-1", st.DefinitionHash)
			require.JSONEq(t, `{"order":42}`, string(st.Input))
			require.Len(t, st.Steps, 3)
			for i, want := range []storage.StepState{
				{Name: "a", Status: storage.StepBlocked},
				{Name: "b", DependsOn: []string{"a"}, Status: storage.StepBlocked},
				{Name: "c", Status: storage.StepBlocked},
			} {
				got := st.Steps[i]
				require.Equal(t, want.Name, got.Name)
				require.Equal(t, want.Status, got.Status)
				require.ElementsMatch(t, want.DependsOn, got.DependsOn)
				require.Zero(t, got.Attempts)
				require.Empty(t, got.Output)
			}
			var err error
			sawDefinition, err = st.LoadDefinition()
			if err != nil {
				return nil, err
			}
			return Plan(st)
		})
		require.NoError(t, err)
		require.Equal(t, []storage.CreateResult{{ID: p.ID}}, res)
		require.Equal(t, "name: wf\n", string(sawDefinition))

		in := b.get(p.ID)
		require.Equal(t, p.ID, in.ID)
		require.Equal(t, "wf", in.Workflow)
		require.Equal(t, "hash-wf-1", in.DefinitionHash)
		require.Equal(t, storage.InstancePending, in.Status)
		require.JSONEq(t, `{"order":42}`, string(in.Input))
		require.Empty(t, in.Output)
		require.Equal(t, "order-42", in.Key)
		require.Equal(t, 7, in.Priority)
		require.True(t, in.CreatedAt.Equal(start), "created at %v", in.CreatedAt)
		require.Nil(t, in.StartedAt)
		require.Nil(t, in.FinishedAt)
		require.Equal(t, "name: wf\n", string(in.Definition))

		require.Len(t, in.Steps, 3)
		a := step(t, in, "a")
		require.Equal(t, storage.StepPending, a.Status)
		require.Equal(t, "h.a", a.Handler)
		require.Equal(t, "q.a", a.Queue)
		require.Empty(t, a.DependsOn)
		require.Equal(t, storage.RetryPolicy{MaxAttempts: 3, Backoff: time.Second, MaxBackoff: time.Minute}, a.Retry)
		require.Equal(t, 10*time.Second, a.Timeout)
		require.JSONEq(t, string(stepInput(t, "a", nil)), string(a.Input))
		require.Zero(t, a.Attempts)
		require.True(t, a.RunAfter.Equal(start))
		require.NotNil(t, a.ReadyAt)
		require.True(t, a.ReadyAt.Equal(start))
		require.Nil(t, a.StartedAt)
		require.Nil(t, a.LeaseUntil)

		bs := step(t, in, "b")
		require.Equal(t, storage.StepBlocked, bs.Status)
		require.Equal(t, []string{"a"}, bs.DependsOn)
		require.Empty(t, bs.Input)
		require.Nil(t, bs.ReadyAt)
		require.Equal(t, storage.StepPending, step(t, in, "c").Status)

		require.Len(t, events(in, "", storage.EventInstanceCreated), 1)
		require.Len(t, events(in, "a", storage.EventStepReady), 1)
		require.Len(t, events(in, "c", storage.EventStepReady), 1)
		require.Empty(t, events(in, "b", storage.EventStepReady))
	},

	"DefinitionStoredOncePerHash": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		first := params(spec("a"))
		second := params(spec("a"))
		second.Definition = []byte("name: wf\n# edited, but the same hash\n")
		other := params(spec("a"))
		other.DefinitionHash, other.Definition = "hash-wf-2", []byte("name: wf\nversion: 2\n")
		b.create(first)
		b.create(second, other)
		require.Equal(t, "name: wf\n", string(b.get(first.ID).Definition))
		require.Equal(t, "name: wf\n", string(b.get(second.ID).Definition), "a hash is stored once; the first snapshot wins")
		require.Equal(t, "name: wf\nversion: 2\n", string(b.get(other.ID).Definition))
	},

	"IdempotencyKey": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		first := params(spec("a"))
		first.Key = "k1"
		require.Equal(t, []storage.CreateResult{{ID: first.ID}}, b.create(first))

		again := params(spec("a"))
		again.Key = "k1"
		again.Input = json.RawMessage(`{"order":43}`)
		sameBatch := params(spec("a"))
		sameBatch.Key = "k2"
		dupInBatch := params(spec("a"))
		dupInBatch.Key = "k2"
		otherWorkflow := params(spec("a"))
		otherWorkflow.Workflow, otherWorkflow.Key = "wf2", "k1"
		res := b.create(again, sameBatch, dupInBatch, otherWorkflow)
		require.Equal(t, []storage.CreateResult{
			{ID: first.ID, Existed: true},
			{ID: sameBatch.ID},
			{ID: sameBatch.ID, Existed: true},
			{ID: otherWorkflow.ID},
		}, res)

		for _, id := range []string{again.ID, dupInBatch.ID} {
			_, err := b.store.GetInstance(b.ctx, id)
			require.ErrorIs(t, err, storage.ErrNotFound, "a duplicate start writes nothing")
		}
		in := b.get(first.ID)
		require.JSONEq(t, `{"order":42}`, string(in.Input))
		require.Len(t, events(in, "", storage.EventInstanceCreated), 1)
		list, err := b.store.ListInstances(b.ctx, storage.ListParams{})
		require.NoError(t, err)
		require.Len(t, list, 3)
	},

	"IdempotencyKeyConcurrent": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		const n = 8
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			results []storage.CreateResult
			errs    []error
		)
		for range n {
			wg.Go(func() {
				p := params(spec("a"))
				p.Key = "same"
				res, err := b.store.CreateInstances(b.ctx, nil, []storage.CreateParams{p}, Plan)
				mu.Lock()
				defer mu.Unlock()
				errs = append(errs, err)
				results = append(results, res...)
			})
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
		require.Len(t, results, n)
		created := 0
		for _, r := range results {
			require.Equal(t, results[0].ID, r.ID)
			if !r.Existed {
				created++
			}
		}
		require.Equal(t, 1, created)
	},

	"RunAfterDelays": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		p := params(spec("a"))
		p.RunAfter = start.Add(time.Minute)
		b.create(p)
		in := b.get(p.ID)
		require.True(t, in.RunAfter.Equal(start.Add(time.Minute)))
		a := step(t, in, "a")
		require.Equal(t, storage.StepPending, a.Status)
		require.True(t, a.RunAfter.Equal(start.Add(time.Minute)), "run after %v", a.RunAfter)

		require.Empty(t, b.claim(storage.ClaimParams{}))
		b.clock.Advance(time.Minute - time.Millisecond)
		require.Empty(t, b.claim(storage.ClaimParams{}))
		b.clock.Advance(time.Millisecond)
		require.Len(t, b.claim(storage.ClaimParams{}), 1)
	},

	"PlanErrorRollsBack": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		good, bad := params(spec("a")), params(spec("a"))
		good.Key = "good"
		boom := errors.New("boom")
		_, err := b.store.CreateInstances(b.ctx, nil, []storage.CreateParams{good, bad}, func(st *storage.InstanceState) (*storage.Plan, error) {
			if st.ID == bad.ID {
				return nil, boom
			}
			return Plan(st)
		})
		require.ErrorIs(t, err, boom)

		// A plan the store cannot apply rolls back the same way.
		_, err = b.store.CreateInstances(b.ctx, nil, []storage.CreateParams{params(spec("a"))}, func(*storage.InstanceState) (*storage.Plan, error) {
			return &storage.Plan{Steps: []storage.StepChange{{Name: "nope", Status: storage.StepPending}}}, nil
		})
		require.Error(t, err)

		for _, id := range []string{good.ID, bad.ID} {
			_, err := b.store.GetInstance(b.ctx, id)
			require.ErrorIs(t, err, storage.ErrNotFound)
		}
		list, err := b.store.ListInstances(b.ctx, storage.ListParams{})
		require.NoError(t, err)
		require.Empty(t, list)
		require.Empty(t, b.claim(storage.ClaimParams{}))
		// The key was not taken either.
		require.Equal(t, []storage.CreateResult{{ID: good.ID}}, b.create(good))
	},

	"Batch": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		const n = 100
		ps := make([]storage.CreateParams, n)
		for i := range ps {
			ps[i] = params(spec("a"), spec("b", "a"))
			ps[i].Input = json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))
		}
		res := b.create(ps...)
		for i, r := range res {
			require.Equal(t, storage.CreateResult{ID: ps[i].ID}, r)
		}
		list, err := b.store.ListInstances(b.ctx, storage.ListParams{Limit: 2 * n})
		require.NoError(t, err)
		require.Len(t, list, n)
		require.Len(t, b.claim(storage.ClaimParams{Limit: 2 * n}), n, "one root per instance")
	},

	"InstanceWithoutSteps": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne()
		in := b.get(id)
		require.Equal(t, storage.InstanceCompleted, in.Status, "the plan completes an instance with nothing to do")
		require.JSONEq(t, `{"steps":0}`, string(in.Output))
		require.NotNil(t, in.FinishedAt)
	},
}
