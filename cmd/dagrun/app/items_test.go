package app_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app"
	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
)

// TestStatusItems: `status` shows a forEach step's counts in an ITEMS
// column, and `status --step` pages its items as a table or as JSON.
func TestStatusItems(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.run(t, "", "start", "fanout", "--input", `{"numbers": [1, 2, 3, 4, 5]}`)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.JSONEq(t, `[{"n": 1, "at": 0}, {"n": 4, "at": 1}, {"n": 9, "at": 2}, {"n": 16, "at": 3}, {"n": 25, "at": 4}]`, res.stdout)
	id := maskUUID.FindString(res.stderr)
	require.NotEmpty(t, id)

	var out []byte
	for _, c := range []struct {
		name string
		args []string
	}{
		{"status", nil},
		{"first page", []string{"--step", "square", "--limit", "2"}},
		{"last page", []string{"--step", "square", "--limit", "2", "--offset", "4"}},
		{"past the end", []string{"--step", "square", "--offset", "9"}},
		{"failed items", []string{"--step", "wait", "--status", "failed"}},
	} {
		res := b.run(t, "", append([]string{"status", id}, c.args...)...)
		require.Equal(t, app.ExitOK, res.code, res.stderr)
		require.Empty(t, res.stderr)
		out = append(out, "# "+c.name+"\n"+mask(res.stdout)+"\n"...)
	}
	golden(t, "status-items", string(out))

	res = b.run(t, "", "status", id, "--step", "square", "--offset", "1", "--limit", "2", "--json")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	var page view.ItemPage
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &page), res.stdout)
	require.Equal(t, 1, page.Offset)
	require.Equal(t, 2, page.Limit)
	require.Equal(t, 5, page.Total)
	require.Len(t, page.Items, 2)
	require.Equal(t, 1, page.Items[0].Index)
	require.JSONEq(t, `{"n": 4, "at": 1}`, string(page.Items[0].Output))
	require.JSONEq(t, `{"n": 4, "at": 1}`, string(page.Items[0].Input))

	res = b.run(t, "", "status", id, "--json")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	var inst view.Instance
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &inst), res.stdout)
	require.Equal(t, &view.ItemCounts{Total: 5, Completed: 4, Failed: 1}, inst.Steps[1].Items)
	var outputs []json.RawMessage
	require.NoError(t, json.Unmarshal(inst.Steps[0].Output, &outputs), "a short forEach output list is inlined: %s", inst.Steps[0].Output)
	require.Len(t, outputs, 5)
	require.False(t, inst.Steps[0].OutputOmitted)

	res = b.run(t, "", "status", id, "--step", "nope")
	require.Equal(t, app.ExitUsage, res.code)
	require.Equal(t, "dagrun: instance "+id+` has no step "nope" (its steps: square, wait)`+"\n", res.stderr)
}

// TestMaxItems: --max-items is the engine's item limit, so a longer list
// fails its step for good with a message naming both numbers.
func TestMaxItems(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.run(t, "", "start", "fanout", "--input", `{"numbers": [1, 2, 3]}`, "--max-items", "2")
	require.Equal(t, app.ExitFailed, res.code, res.stderr)
	require.Contains(t, res.stderr, "forEach: 3 items, over the limit of 2")

	res = b.run(t, "", "start", "fanout", "--input", `{"numbers": [1, 2, 3]}`, "--max-items", "3")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
}

// TestStatusStepOfAStepWithoutItems: status --step of a step that is no
// forEach step says so, exit 2, rather than print an empty page.
func TestStatusStepOfAStepWithoutItems(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.startDetached(t)
	res := b.run(t, "", "status", id, "--step", "hello")
	require.Equal(t, app.ExitUsage, res.code, res.stdout)
	require.Empty(t, res.stdout)
	require.Equal(t, `dagrun: step "hello" of instance `+id+` is not a forEach step: it has no items (its output is in dagrun status `+id+")\n", res.stderr)
}
