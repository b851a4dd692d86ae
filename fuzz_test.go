package dagrun_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/sqlite"
)

// typedWorkflow has an input schema with most kinds of constraint, and a
// root step whose input expressions read the input, so a start resolves
// them in the same transaction.
const typedWorkflow = `
name: typed
input:
  type: object
  required: [id, items]
  additionalProperties: false
  properties:
    id: {type: string, minLength: 1, maxLength: 64, pattern: "^[A-Za-z0-9-]+$"}
    items:
      type: array
      maxItems: 8
      items:
        type: object
        required: [sku]
        properties:
          sku: {type: string}
          qty: {type: integer, minimum: 1, maximum: 1000}
    note: {type: [string, "null"]}
    amount: {type: number, exclusiveMinimum: 0}
    tags: {type: array, uniqueItems: true, items: {enum: [a, b, c]}}
steps:
  - name: first
    handler: echo
    input:
      id: ${{ input.id }}
      sku: ${{ input.items[0].sku }}
      label: "order ${{ input.id }} (${{ len(input.items) }} items)"
  - name: second
    handler: noop
    dependsOn: [first]
`

// anyWorkflow has no input schema: any single JSON value is an input.
const anyWorkflow = `
name: any
steps:
  - name: only
    handler: echo
    input: ${{ input }}
`

// fuzzStartSeeds are the seed corpus of FuzzStartInput. They run as
// ordinary tests with go test; the top level of the repository holds only
// the folders the README's Layout section lists, so they live here rather
// than under testdata/fuzz.
var fuzzStartSeeds = []string{
	``, ` `, `null`, `{}`, `[]`, `0`, `"x"`, `true`,
	`{"id":"A-1","items":[{"sku":"b","qty":1}]}`,
	`{"id":"A-1","items":[{"sku":"b","qty":1}],"note":null,"amount":0.5,"tags":["a","b"]}`,
	`{"id":"A-1","items":[]}`, // valid, but input.items[0] fails at run time
	`{"id":"","items":[{"sku":"b"}]}`,
	`{"id":"A-1","items":[{"sku":"b","qty":0}]}`,
	`{"id":"A-1","items":[{"sku":"b"}],"extra":1}`,
	`{"id":"A-1","items":[{"sku":"b"}],"tags":["a","a"]}`,
	`{"id":"A-1","items":[{"sku":"b"}]} {}`,
	`{"id":"A-1","items":[{"sku":"b"}]`,
	`{"id":"A-1","id":"B-2","items":[{"sku":"b"}]}`,
	`{"id":"A-1","items":[{"sku":"\u0000"}]}`,
	`{"id":"A-1","items":[{"sku":"\ud800"}]}`,
	"{\"id\":\"A-1\",\"items\":[{\"sku\":\"\xff\"}]}",         // invalid UTF-8
	"{\"id\":\"A-1\",\"items\":[{\"sku\":\"\xed\xa0\x80\"}]}", // UTF-8-encoded surrogate
	"\xef\xbb\xbf{}",        // byte order mark
	"\v0", "\u00a0{}\u2028", // Unicode white space around the value
	`{"id":"A-1","items":[{"sku":"b","qty":1e400}]}`,
	`{"id":"A-1","items":[{"sku":"b","qty":1.0}]}`,
	`{"id":"A-1","items":[{"sku":"b","qty":-0}]}`,
	`{"id":"A-1","items":[{"sku":"b"}],"amount":123456789012345678901234567890}`,
	strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
	`"` + strings.Repeat("x", 2000) + `"`,
}

// FuzzStartInput feeds arbitrary bytes as the start input of a workflow
// with a schema and of one without, on SQLite. Every start must either
// create a whole instance (its row, every step row, the root steps'
// resolved input) holding the input as valid, compact, UTF-8 JSON with the
// same value, or fail with a *dagrun.InputError having written nothing. It
// must never panic. Run it with
//
//	go test -run '^$' -fuzz '^FuzzStartInput$' -fuzztime 60s .
func FuzzStartInput(f *testing.F) {
	for _, s := range fuzzStartSeeds {
		f.Add([]byte(s))
	}
	ctx := context.Background()
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	var workflows []*dag.Workflow
	for _, src := range []string{typedWorkflow, anyWorkflow} {
		w, err := dag.Parse("", []byte(src), &dag.ParseOptions{HandlerExists: registry.Has})
		require.NoError(f, err)
		workflows = append(workflows, w)
	}
	path := filepath.Join(f.TempDir(), "fuzz.db")
	store, err := sqlite.Open(ctx, path, nil)
	require.NoError(f, err)
	f.Cleanup(func() { _ = store.Close() })
	// A small limit, so that the fuzzer reaches the size check too.
	engine, err := dagrun.New(store, registry, &dagrun.Config{Workflows: workflows, MaxInputBytes: 4096})
	require.NoError(f, err)
	db, err := sql.Open("sqlite3", path+"?_query_only=on")
	require.NoError(f, err)
	f.Cleanup(func() { _ = db.Close() })
	// rows returns the highest rowid of the instances, steps and events
	// tables: rows are never deleted here, so any insert raises them, and
	// reading them costs the same however many rows the fuzzer created.
	rows := func(t *testing.T) [3]int {
		var n [3]int
		require.NoError(t, db.QueryRow(`SELECT (SELECT coalesce(max(rowid), 0) FROM instances),
			(SELECT coalesce(max(id), 0) FROM steps), (SELECT coalesce(max(id), 0) FROM events)`).Scan(&n[0], &n[1], &n[2]))
		return n
	}
	var mu sync.Mutex // the store is shared by every call in this process
	f.Fuzz(func(t *testing.T, input []byte) {
		mu.Lock()
		defer mu.Unlock()
		for _, w := range workflows {
			before := rows(t)
			res, err := engine.Start(ctx, w.Name, bytes.Clone(input), nil)
			after := rows(t)
			if err != nil {
				var inputErr *dagrun.InputError
				require.ErrorAs(t, err, &inputErr, "workflow %s: a rejected input must be an InputError", w.Name)
				require.NotContains(t, err.Error(), "\n", "input errors are one line")
				require.Equal(t, before, after, "a rejected start wrote rows")
				continue
			}
			require.Equal(t, before[0]+1, after[0], "one instance row")
			require.Equal(t, before[1]+len(w.Steps), after[1], "one row per step")
			require.Greater(t, after[2], before[2], "the start is in the history")
			inst, err := engine.Get(ctx, res.ID)
			require.NoError(t, err)
			require.Len(t, inst.Steps, len(w.Steps))
			require.True(t, utf8.Valid(inst.Input), "stored input is not UTF-8: %q", inst.Input)
			require.True(t, json.Valid(inst.Input), "stored input is not JSON: %q", inst.Input)
			var compact bytes.Buffer
			require.NoError(t, json.Compact(&compact, inst.Input))
			require.Equal(t, compact.String(), string(inst.Input), "stored input is compact")
			requireSameJSON(t, input, inst.Input)
			root := inst.Steps[0]
			require.Contains(t, []storage.StepStatus{storage.StepPending, storage.StepFailed}, root.Status)
			if root.Status == storage.StepPending {
				require.True(t, json.Valid(root.Input), "resolved input %q", root.Input)
			} else {
				// An expression that fails at run time fails the step and
				// the instance, in the start's own transaction.
				require.Equal(t, storage.InstanceFailed, inst.Status)
			}
		}
	})
}

// requireSameJSON checks that stored holds the same JSON value as input
// (an empty or null input means {}). Start ignores white space around the
// value, Unicode white space included.
func requireSameJSON(t *testing.T, input, stored []byte) {
	t.Helper()
	input = bytes.TrimSpace(input)
	if len(input) == 0 || string(input) == "null" {
		input = []byte("{}")
	}
	var want, got any
	dec := json.NewDecoder(bytes.NewReader(input))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&want))
	dec = json.NewDecoder(bytes.NewReader(stored))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&got))
	require.True(t, reflect.DeepEqual(want, got), "stored %s, started with %q", stored, input)
}

// TestInvalidUTF8IsRejected: JSON text must be UTF-8 (RFC 8259 §8.1).
// An input that is not is a bad input on every backend (PostgreSQL's json
// type refuses it, so it used to surface there as a raw storage error and
// exit code 1), and a handler output that is not fails its attempt instead
// of making the worker retry a commit PostgreSQL can never accept, which
// used to hold every other result of the same group commit hostage.
func TestInvalidUTF8IsRejected(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		registry := handlers.NewRegistry()
		registry.Register("latin1", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			return json.RawMessage("\"caf\xe9\""), nil
		})
		b := setup(t, open, registry, anyWorkflow, `
name: outputs
steps:
  - {name: bad, handler: latin1, retry: {maxAttempts: 3, backoff: 1ms}}
  - {name: good, handler: echo, input: {ok: true}}
`)
		ctx := context.Background()
		for _, input := range []string{"\"\xff\"", "{\"a\":\"caf\xe9\"}", "[\"\xed\xa0\x80\"]"} {
			_, err := b.engine.Start(ctx, "any", json.RawMessage(input), nil)
			var inputErr *dagrun.InputError
			require.ErrorAs(t, err, &inputErr, "input %q", input)
			require.Contains(t, err.Error(), "UTF-8")
		}
		list, err := b.engine.List(ctx, storage.ListParams{})
		require.NoError(t, err)
		require.Empty(t, list, "a rejected start wrote nothing")

		b.runWorker(t, &dagrun.WorkerConfig{Lease: 2 * time.Second})
		inst := b.wait(t, b.start(t, "outputs", `{}`))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		bad := step(t, inst, "bad")
		require.Equal(t, storage.StepFailed, bad.Status)
		require.Equal(t, 1, bad.Attempts, "an output that can never be stored is not retried")
		require.Contains(t, bad.Error, "not valid UTF-8")
		require.Contains(t, []storage.StepStatus{storage.StepCompleted, storage.StepCancelled}, step(t, inst, "good").Status,
			"the sibling completed, or was cancelled when bad failed the instance first")
	})
}

// TestStartInputSeedsOnEveryBackend runs the FuzzStartInput seeds on every
// backend (the fuzzer itself runs on SQLite): a start is accepted or
// rejected the same way whatever the database.
func TestStartInputSeedsOnEveryBackend(t *testing.T) {
	t.Parallel()
	outcomes := map[string][]bool{}
	var mu sync.Mutex
	t.Run("backends", func(t *testing.T) {
		forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
			b := setup(t, open, nil, typedWorkflow, anyWorkflow)
			var got []bool
			for _, seed := range fuzzStartSeeds {
				for _, wf := range []string{"typed", "any"} {
					_, err := b.engine.Start(context.Background(), wf, json.RawMessage(seed), nil)
					var inputErr *dagrun.InputError
					require.True(t, err == nil || errors.As(err, &inputErr), "workflow %s, input %q: %v", wf, seed, err)
					got = append(got, err == nil)
				}
			}
			mu.Lock()
			outcomes[t.Name()] = got
			mu.Unlock()
		})
	})
	var first []bool
	for name, got := range outcomes {
		if first == nil {
			first = got
			continue
		}
		require.Equal(t, first, got, "backend %s accepts different inputs", name)
	}
}
