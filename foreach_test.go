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

// mapWorkflow lists input.n numbers, squares each in a forEach step, and
// sums the squares downstream from the step's output.
const mapWorkflow = `
name: map
steps:
  - name: list
    handler: echo
    input: {items: "${{ input.items }}"}
  - name: square
    dependsOn: [list]
    forEach: ${{ steps.list.output.items }}
    handler: square
    input: {n: "${{ item }}", at: "${{ index }}"}
  - name: total
    dependsOn: [square]
    handler: echo
    input: ${{ steps.square.output }}
output: ${{ steps.total.output }}
`

func squareRegistry(t *testing.T) *handlers.Registry {
	t.Helper()
	r := handlers.NewRegistry()
	r.Register("square", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
		var v struct{ N, At int }
		if err := json.Unmarshal(in, &v); err != nil {
			return nil, err
		}
		if info := handlers.Info(ctx); info.Item != v.At {
			return nil, fmt.Errorf("handler told item %d, input says %d", info.Item, v.At)
		}
		return json.Marshal(v.N * v.N)
	})
	return r
}

func numbers(n int) string {
	items := make([]int, n)
	for i := range items {
		items[i] = i
	}
	b, _ := json.Marshal(map[string]any{"items": items})
	return string(b)
}

func TestForEachRunsEveryItemAndCollectsOutputsInIndexOrder(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, squareRegistry(t), mapWorkflow)
		b.runWorker(t, &dagrun.WorkerConfig{Concurrency: 4})
		id := b.start(t, "map", numbers(7))
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `[0,1,4,9,16,25,36]`, inst.Output)
		sq := step(t, inst, "square")
		require.Equal(t, &storage.ItemCounts{Total: 7, Completed: 7}, sq.Items)
		require.Len(t, inst.Steps, 3, "items are not steps")
		items, err := b.store.ListItems(context.Background(), storage.ItemsParams{InstanceID: id, Step: "square", Offset: 5})
		require.NoError(t, err)
		require.Len(t, items, 2)
		require.Equal(t, 5, items[0].Index)
		requireJSON(t, `25`, items[0].Output)
		requireJSON(t, `{"n":5,"at":5}`, items[0].Input)
	})
}

func TestForEachOverAnEmptyListCompletesAtOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, squareRegistry(t), mapWorkflow)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "map", `{"items": []}`))
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `[]`, inst.Output)
		requireJSON(t, `[]`, step(t, inst, "square").Output)
	})
}

// echoEachWorkflow runs echo once per element of input.items.
const echoEachWorkflow = `
name: each
steps:
  - name: each
    forEach: ${{ input.items }}
    handler: echo
    input: {n: "${{ item }}", at: "${{ index }}"}
`

func TestForEachFailsPermanentlyOverItsLimits(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		for _, tt := range []struct {
			name   string
			config dagrun.Config
			input  string
			want   string
		}{
			{"an object", dagrun.Config{}, `{"items": {"a": 1}}`, "forEach: expected a list, got an object"},
			{"a string", dagrun.Config{}, `{"items": "abc"}`, "forEach: expected a list, got a string"},
			{"null", dagrun.Config{}, `{}`, "forEach: expected a list, got null"},
			{"too many items", dagrun.Config{MaxItems: 3}, numbers(4),
				"forEach: 4 items, over the limit of 3: split the list across instances, or raise the engine's item limit (--max-items)"},
			{"too many input bytes", dagrun.Config{MaxPlanInputBytes: 100}, numbers(20),
				"forEach: the inputs of the items are over 100 bytes in all, the limit of one transition; pass references to large data instead"},
			{"too much expression work", dagrun.Config{MaxPlanExprSteps: 50}, numbers(100),
				"forEach: resolving the inputs of the items takes over 50 expression steps in all, the limit of one transition; simplify the input expression or split the list"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				b := setupConfig(t, open, tt.config, echoEachWorkflow)
				b.runWorker(t, nil)
				inst := b.wait(t, b.start(t, "each", tt.input))
				require.Equal(t, storage.InstanceFailed, inst.Status)
				require.Equal(t, "step each failed: "+tt.want, inst.Error)
				each := step(t, inst, "each")
				require.Equal(t, storage.StepFailed, each.Status)
				require.Zero(t, each.Attempts, "a permanent failure is not retried")
			})
		}
		b := setupConfig(t, open, dagrun.Config{MaxItems: 3}, echoEachWorkflow)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "each", numbers(3)))
		require.Equal(t, storage.InstanceCompleted, inst.Status, "the limit itself is allowed")
	})
}

const cappedWorkflow = `
name: capped
steps:
  - name: each
    forEach: ${{ input.items }}
    concurrency: 2
    handler: gate
`

func TestForEachConcurrencyCapsRunningItemsPerInstance(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		var (
			mu      sync.Mutex
			running = map[string]int{}
			peak    = map[string]int{}
		)
		registry := handlers.NewRegistry()
		registry.Register("gate", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
			id := handlers.Info(ctx).InstanceID
			mu.Lock()
			running[id]++
			peak[id] = max(peak[id], running[id])
			mu.Unlock()
			time.Sleep(5 * time.Millisecond) // overlap with any sibling the cap let through
			mu.Lock()
			running[id]--
			mu.Unlock()
			return in, nil
		})
		b := setup(t, open, registry, cappedWorkflow)
		// Two workers of 8 slots: far more room than the cap.
		b.runWorker(t, &dagrun.WorkerConfig{Concurrency: 8})
		b.runWorker(t, &dagrun.WorkerConfig{Concurrency: 8})
		ids := []string{b.start(t, "capped", numbers(12)), b.start(t, "capped", numbers(12))}
		for _, id := range ids {
			inst := b.wait(t, id)
			require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
			requireJSON(t, `[0,1,2,3,4,5,6,7,8,9,10,11]`, step(t, inst, "each").Output)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			require.LessOrEqual(t, peak[id], 2, "instance %s ran more items at once than its cap", id)
			require.Positive(t, peak[id])
		}
	})
}

// TestCappedItemsStartWithoutAPoll: the eager claim of the transaction that
// expands a forEach step never takes items under a concurrency cap, so that
// transaction must wake a claim loop for them (on PostgreSQL it did not, and
// they waited for the poll), and so must each item's finish for the
// sibling that takes its slot; whether the step expands as its instance is
// created or in a finish.
func TestCappedItemsStartWithoutAPoll(t *testing.T) {
	t.Parallel()
	for name, steps := range map[string]string{
		"at creation": `
  - {name: each, forEach: "${{ input.items }}", concurrency: 1, handler: echo}`,
		"after a step": `
  - {name: first, handler: echo, input: {}}
  - {name: each, dependsOn: [first], forEach: "${{ input.items }}", concurrency: 1, handler: echo}`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
				b := setup(t, open, nil, "name: one-by-one\nsteps:"+steps+"\n", chainWorkflow)
				b.runWorker(t, &dagrun.WorkerConfig{Poll: time.Hour})
				b.wait(t, b.start(t, "chain", `{"n": 1}`)) // an idle worker
				b.requireCompleteSoon(t, "an item waited for a poll", b.start(t, "one-by-one", numbers(4)))
			})
		})
	}
}

const failingWorkflow = `
name: failing
defaults:
  retry: {maxAttempts: 2, backoff: 1ms}
steps:
  - name: each
    forEach: ${{ input.items }}
    handler: flaky
    continueOnError: CONTINUE
  - name: after
    dependsOn: [each]
    handler: echo
    input: ${{ steps.each.output }}
`

// flakyItems fails item 3 until healed, and blocks items above 3 until
// released (or their context ends), counting every run per item.
type flakyItems struct {
	healed  atomic.Bool
	release chan struct{}
	mu      sync.Mutex
	runs    map[int]int
}

func (f *flakyItems) register(r *handlers.Registry) {
	f.release = make(chan struct{})
	f.runs = map[int]int{}
	r.Register("flaky", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
		i := handlers.Info(ctx).Item
		f.mu.Lock()
		f.runs[i]++
		f.mu.Unlock()
		switch {
		case i == 3 && !f.healed.Load():
			// Fail only once items 0..2 have returned, so that their
			// results are recorded before item 3's last attempt fails the
			// step, however the machine schedules the items.
			for f.runCount(0) == 0 || f.runCount(1) == 0 || f.runCount(2) == 0 {
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(time.Millisecond):
				}
			}
			return nil, errors.New("item three is broken")
		case i > 3:
			select {
			case <-f.release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return in, nil
	})
}

func (f *flakyItems) runCount(i int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.runs[i]
}

func TestForEachItemFailureCancelsSiblingsAndFailsTheInstance(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		var f flakyItems
		registry := handlers.NewRegistry()
		f.register(registry)
		b := setup(t, open, registry, strings.ReplaceAll(failingWorkflow, "CONTINUE", "false"))
		// Room for every item: those after item 3 hold their slots until
		// they are cancelled.
		b.runWorker(t, &dagrun.WorkerConfig{Concurrency: 16})
		id := b.start(t, "failing", numbers(10))
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, "step each failed: item 3 failed: item three is broken", inst.Error)
		each := step(t, inst, "each")
		require.Equal(t, storage.StepFailed, each.Status)
		require.Equal(t, 1, each.Items.Failed)
		require.Equal(t, 3, each.Items.Completed)
		require.Equal(t, 6, each.Items.Cancelled, "items 4..9 were cancelled, running or not")
		require.Equal(t, storage.StepCancelled, step(t, inst, "after").Status)

		// Retry re-runs only the failed and cancelled items.
		f.healed.Store(true)
		close(f.release)
		require.NoError(t, b.engine.Retry(context.Background(), id))
		inst = b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `[0,1,2,3,4,5,6,7,8,9]`, step(t, inst, "after").Output)
		for i := range 3 {
			require.Equal(t, 1, f.runCount(i), "completed item %d ran again", i)
		}
		require.Equal(t, 3, f.runCount(3), "item 3: two failed attempts, one after the retry")
	})
}

func TestForEachContinueOnErrorWaitsForAllAndKeepsNull(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		var f flakyItems
		registry := handlers.NewRegistry()
		f.register(registry)
		close(f.release)
		b := setup(t, open, registry, strings.ReplaceAll(failingWorkflow, "CONTINUE", "true"))
		b.runWorker(t, &dagrun.WorkerConfig{Concurrency: 4})
		inst := b.wait(t, b.start(t, "failing", numbers(6)))
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		each := step(t, inst, "each")
		require.Equal(t, storage.StepFailed, each.Status)
		require.Equal(t, "item 3 failed: item three is broken", each.Error)
		require.Equal(t, &storage.ItemCounts{Total: 6, Completed: 5, Failed: 1}, each.Items)
		requireJSON(t, `[0,1,2,null,4,5]`, each.Output)
		requireJSON(t, `[0,1,2,null,4,5]`, step(t, inst, "after").Output)
	})
}

func TestForEachWorkerDyingMidItemReRunsOnlyItsItems(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		var runs sync.Map // item index -> *atomic.Int32
		registry := handlers.NewRegistry()
		registry.Register("count", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
			n, _ := runs.LoadOrStore(handlers.Info(ctx).Item, new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
			return in, nil
		})
		b := setup(t, open, registry, `
name: dying
defaults:
  retry: {backoff: 1ms}
steps:
  - name: each
    forEach: ${{ input.items }}
    handler: count
`)
		id := b.start(t, "dying", numbers(6))
		// A worker claims two items with a short lease and dies.
		lost, err := b.store.ClaimSteps(context.Background(), storage.ClaimParams{WorkerID: "doomed", Limit: 2, Lease: time.Millisecond, Handlers: []string{"count"}})
		require.NoError(t, err)
		require.Len(t, lost, 2)
		require.Equal(t, []int{0, 1}, []int{lost[0].Item, lost[1].Item})
		b.runWorker(t, &dagrun.WorkerConfig{Lease: time.Second}) // recovers every 500ms
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `[0,1,2,3,4,5]`, step(t, inst, "each").Output)
		for i := range 6 {
			n, ok := runs.Load(i)
			require.True(t, ok, "item %d never ran", i)
			require.EqualValues(t, 1, n.(*atomic.Int32).Load(), "item %d ran more than once", i)
		}
		items, err := b.store.ListItems(context.Background(), storage.ItemsParams{InstanceID: id, Step: "each", Limit: 2})
		require.NoError(t, err)
		require.Equal(t, 2, items[0].Attempts, "the lost attempt counts")
		require.Equal(t, 2, items[1].Attempts)
	})
}

func TestForEachThousandItemsComplete(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, squareRegistry(t), mapWorkflow)
		b.runWorker(t, &dagrun.WorkerConfig{Concurrency: 32})
		inst := b.wait(t, b.start(t, "map", numbers(1000)))
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		var out []int
		require.NoError(t, json.Unmarshal(inst.Output, &out))
		require.Len(t, out, 1000)
		for i, v := range out {
			require.Equal(t, i*i, v)
		}
		// The history does not grow with the items: they have no events of
		// their own.
		require.Less(t, len(inst.Events), 20)
		require.Len(t, inst.Steps, 3)
	})
}
