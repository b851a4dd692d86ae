// Package dagrun is the engine of dagrun, a durable declarative DAG workflow
// engine: it starts workflow instances, runs workers that claim ready steps
// and execute their handlers, and turns every finished attempt into the
// next state transitions: retries with backoff, downstream steps made ready
// with their resolved inputs, skipped branches, and finished instances.
//
// An Engine sits on a storage.Store, a handlers.Registry and the workflow
// definitions it knows. It imports dag, handlers and storage, never a
// storage backend: the caller picks one.
//
//	store, _ := sqlite.Open(ctx, "dagrun.db", nil)
//	registry := handlers.NewRegistry()
//	handlers.RegisterBuiltins(registry)
//	engine, _ := dagrun.New(store, registry, &dagrun.Config{Workflows: workflows})
//	res, _ := engine.Start(ctx, "order-processing", input, nil)
//	log.Println("started instance", res.ID)
//	worker, _ := engine.NewWorker(&dagrun.WorkerConfig{Concurrency: 8})
//	_ = worker.Run(ctx) // until ctx is cancelled
//
// A Scheduler (engine.NewScheduler) starts the instances of the workflows'
// schedule: lists; any number of them may run against one database, and
// each tick still starts one instance.
//
// # Guarantees
//
// State transitions happen exactly once: every transition is one
// transaction, and completing or failing an attempt is fenced by the claim
// that started it. Handler effects are at least once: a worker that dies
// mid-step loses its lease and the step runs again elsewhere, so handlers
// dedupe effects with handlers.Info(ctx).IdempotencyKey.
package dagrun
