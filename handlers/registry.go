package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
)

// Handler runs one attempt of a step. input is the step's resolved input
// (JSON; "null" or empty when the step has none) and the returned output is
// stored as the step's output, so it must be valid JSON or nil (stored as
// null).
type Handler func(ctx context.Context, input json.RawMessage) (json.RawMessage, error)

// Registry maps handler names to handlers. A binary builds one, registers the
// handlers its workflows use and passes it to the engine; there is
// deliberately no package-level registry, so two engines in one process (or
// two parallel tests) never share or overwrite each other's handlers.
//
// The zero value is not usable; create one with [NewRegistry]. A Registry is
// safe for concurrent use.
type Registry struct {
	mu       sync.RWMutex
	handlers map[string]Handler
}

// NewRegistry returns an empty registry. Call [RegisterBuiltins] to add the
// built-in handlers.
func NewRegistry() *Registry {
	return &Registry{handlers: make(map[string]Handler)}
}

// Register adds h under name. It panics if name is empty, h is nil or name is
// already registered, as database/sql.Register does: registration happens at
// startup from code, so any of these is a programming error that should stop
// the binary rather than let one handler silently replace another. Use
// [Registry.RegisterSafely] to get an error instead.
func (r *Registry) Register(name string, h Handler) {
	if err := r.RegisterSafely(name, h); err != nil {
		panic(err)
	}
}

// RegisterSafely is [Registry.Register] that returns an error instead of
// panicking, for names that come from configuration or plugins.
func (r *Registry) RegisterSafely(name string, h Handler) error {
	if name == "" {
		return errors.New("handlers: Register called with an empty handler name")
	}
	if h == nil {
		return fmt.Errorf("handlers: Register called with a nil handler for %q", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.handlers[name]; dup {
		return fmt.Errorf("handlers: Register called twice for handler %q", name)
	}
	r.handlers[name] = h
	return nil
}

// Lookup returns the handler registered under name.
func (r *Registry) Lookup(name string) (Handler, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	h, ok := r.handlers[name]
	return h, ok
}

// Has reports whether a handler is registered under name. It fits where a
// workflow validator takes a func(string) bool, so the dag package can check
// handler names without importing this one.
func (r *Registry) Has(name string) bool {
	_, ok := r.Lookup(name)
	return ok
}

// Names returns the registered handler names, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Sorted(maps.Keys(r.handlers))
}
