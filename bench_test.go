package dagrun_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/examples/orders"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/backendtest"
)

// recordingStore captures the PlanFunc the engine hands to CreateInstances,
// so the benchmark can call the engine's planner directly.
type recordingStore struct {
	storage.Store
	plan storage.PlanFunc
}

func (s *recordingStore) CreateInstances(_ context.Context, _ any, p []storage.CreateParams, plan storage.PlanFunc) ([]storage.CreateResult, error) {
	s.plan = plan
	return []storage.CreateResult{{ID: p[0].ID}}, nil
}

// BenchmarkPlanAfterCharge measures the engine's planner as a finish calls
// it: order-processing after charge completed, resolving ship's input
// expressions against the stored outputs.
//
//	go test -run '^$' -bench PlanAfterCharge -benchmem .
func BenchmarkPlanAfterCharge(b *testing.B) {
	registry := handlers.NewRegistry()
	orders.Register(registry)
	src, err := os.ReadFile("workflows/order-processing.yaml")
	require.NoError(b, err)
	w, err := dag.Parse("order-processing.yaml", src, nil)
	require.NoError(b, err)
	rec := &recordingStore{}
	engine, err := dagrun.New(rec, registry, &dagrun.Config{Workflows: []*dag.Workflow{w}})
	require.NoError(b, err)
	_, err = engine.Start(context.Background(), "order-processing",
		json.RawMessage(`{"orderId":"A-1","items":[{"sku":"b","qty":1}],"totalAmount":4,"customerEmail":"a@example.com"}`), nil)
	require.NoError(b, err)
	state := storage.InstanceState{
		ID: "bench", Workflow: w.Name, DefinitionHash: w.Hash, Status: storage.InstanceRunning,
		Input: json.RawMessage(`{"orderId":"A-1","items":[{"sku":"b","qty":1}],"totalAmount":4,"customerEmail":"a@example.com"}`),
		Steps: []storage.StepState{
			{Name: "validate", Status: storage.StepCompleted, Output: json.RawMessage(`{"orderId":"A-1","itemCount":1}`)},
			{Name: "charge", Status: storage.StepCompleted, Output: json.RawMessage(`{"paymentId":"pay_1","amount":4}`)},
			{Name: "ship", Status: storage.StepBlocked},
			{Name: "notify", Status: storage.StepBlocked},
		},
	}
	b.ReportAllocs()
	for b.Loop() {
		st := state
		st.Steps = append([]storage.StepState(nil), state.Steps...)
		p, err := rec.plan(&st)
		if err != nil || len(p.Steps) != 1 {
			b.Fatalf("plan: %v %+v", err, p)
		}
	}
}

// BenchmarkStartMany measures the batch start API on every backend:
// batches of 1,000 four-step chains, reported per instance.
//
//	go test -run '^$' -bench StartMany -benchmem .
func BenchmarkStartMany(b *testing.B) {
	const batch = 1000
	w, err := dag.Parse("", []byte(`name: chain4
steps:
  - {name: a, handler: noop}
  - {name: b, handler: noop, dependsOn: [a]}
  - {name: c, handler: noop, dependsOn: [b]}
  - {name: d, handler: noop, dependsOn: [c]}
`), nil)
	require.NoError(b, err)
	for _, backend := range backendtest.All(b) {
		b.Run(backend.Name, func(b *testing.B) {
			engine, err := dagrun.New(backend.Open(b), handlers.NewRegistry(), &dagrun.Config{Workflows: []*dag.Workflow{w}})
			require.NoError(b, err)
			reqs := make([]dagrun.StartRequest, batch)
			for i := range reqs {
				reqs[i] = dagrun.StartRequest{Workflow: "chain4"}
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := engine.StartMany(ctx, reqs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "instances/s")
		})
	}
}
