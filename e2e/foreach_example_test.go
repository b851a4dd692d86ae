package e2e

import (
	"encoding/json"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// instanceID finds an instance ID in text.
var instanceID = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// TestShippedForEachExample runs workflows/greet-everyone.yaml as a user
// would, on every backend: its output joins the items' outputs in index
// order, `status` shows the step's counts, and `status --step` pages its
// items.
func TestShippedForEachExample(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, db string) {
		e := newEnv(t, db, nil)
		res := e.mustRun(t, "start", "greet-everyone", "--input", `{"names": ["Ada", "Grace", "Edsger", "Barbara", "Donald"]}`)
		require.JSONEq(t, `{"count": 5, "texts": ["hello, Ada", "hello, Grace", "hello, Edsger", "hello, Barbara", "hello, Donald"]}`, res.stdout)
		id := instanceID.FindString(res.stderr)
		require.NotEmpty(t, id, res.stderr)

		res = e.mustRun(t, "status", id)
		require.Regexp(t, `(?m)^greet +echo +completed +- +\S+ +5/5 completed`, res.stdout)
		require.Contains(t, res.stdout, "dagrun status "+id+" --step greet")

		res = e.mustRun(t, "status", id, "--step", "greet", "--offset", "3", "--limit", "2", "--json")
		var page struct {
			Items []struct {
				Index  int             `json:"index"`
				Status string          `json:"status"`
				Input  json.RawMessage `json:"input"`
				Output json.RawMessage `json:"output"`
			} `json:"items"`
			Offset, Limit, Total int
		}
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &page), res.stdout)
		require.Equal(t, 5, page.Total)
		require.Len(t, page.Items, 2)
		require.Equal(t, 3, page.Items[0].Index)
		require.Equal(t, "completed", page.Items[1].Status)
		require.JSONEq(t, `{"position": 4, "text": "hello, Donald"}`, string(page.Items[1].Output))
	})
}
