package handlers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/handlers"
)

func nopHandler(context.Context, json.RawMessage) (json.RawMessage, error) { return nil, nil }

func TestRegistry(t *testing.T) {
	t.Parallel()

	t.Run("RegisterAndLookup", func(t *testing.T) {
		t.Parallel()
		r := handlers.NewRegistry()
		r.Register("a.b", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			return json.RawMessage(`"hi"`), nil
		})

		h, ok := r.Lookup("a.b")
		require.True(t, ok)
		out, err := h(t.Context(), nil)
		require.NoError(t, err)
		require.JSONEq(t, `"hi"`, string(out))
		require.True(t, r.Has("a.b"))

		h, ok = r.Lookup("missing")
		require.False(t, ok)
		require.Nil(t, h)
		require.False(t, r.Has("missing"))
	})

	t.Run("RegisterPanics", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name    string
			regName string
			h       handlers.Handler
			want    string
		}{
			{"Duplicate", "dup", nopHandler, `handlers: Register called twice for handler "dup"`},
			{"EmptyName", "", nopHandler, "handlers: Register called with an empty handler name"},
			{"NilHandler", "nil", nil, `handlers: Register called with a nil handler for "nil"`},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				r := handlers.NewRegistry()
				r.Register("dup", nopHandler)
				require.PanicsWithError(t, tt.want, func() { r.Register(tt.regName, tt.h) })
			})
		}
	})

	t.Run("RegisterSafely", func(t *testing.T) {
		t.Parallel()
		r := handlers.NewRegistry()
		require.NoError(t, r.RegisterSafely("x", nopHandler))
		require.EqualError(t, r.RegisterSafely("x", nopHandler), `handlers: Register called twice for handler "x"`)
		require.Error(t, r.RegisterSafely("", nopHandler))
		require.Error(t, r.RegisterSafely("y", nil))
		require.False(t, r.Has("y"), "a failed registration must not register anything")
		require.Equal(t, []string{"x"}, r.Names())
	})

	t.Run("NamesSorted", func(t *testing.T) {
		t.Parallel()
		r := handlers.NewRegistry()
		require.Empty(t, r.Names())
		for _, n := range []string{"orders.validate", "echo", "b", "a"} {
			r.Register(n, nopHandler)
		}
		require.Equal(t, []string{"a", "b", "echo", "orders.validate"}, r.Names())
	})

	t.Run("ConcurrentUse", func(t *testing.T) {
		t.Parallel()
		r := handlers.NewRegistry()
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				// Errors are checked after Wait: FailNow must run on the
				// test goroutine. -race is what this test is for.
				_ = r.RegisterSafely(fmt.Sprintf("h%02d", i), nopHandler)
				_, _ = r.Lookup("h00")
				_ = r.Names()
			})
		}
		wg.Wait()
		require.Len(t, r.Names(), 20)
	})

	t.Run("Builtins", func(t *testing.T) {
		t.Parallel()
		r := handlers.NewRegistry()
		handlers.RegisterBuiltins(r)
		require.Equal(t, []string{"echo", "http", "noop", "sleep"}, r.Names())
		require.Panics(t, func() { handlers.RegisterBuiltins(r) })
	})
}
