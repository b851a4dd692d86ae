package app_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app"
)

// TestSubflowStatusAndList: `start` of a workflow with workflow steps runs
// its children too (no other worker runs), `status` names a child's parent
// and a parent's children, and `list` shows the parent only unless --all,
// or the children of one instance with --parent.
func TestSubflowStatusAndList(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env["DAGRUN_WORKFLOWS"] = "testdata/subflows"
	res := b.run(t, "", "start", "relay")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.JSONEq(t, `{"hand": {"n": 1, "leg": true}, "each": [{"n": 2, "leg": true}, {"n": 3, "leg": true}]}`, res.stdout)
	// The last progress line names the instance; workflow steps' lines
	// name their children before it.
	lines := strings.Split(strings.TrimSpace(res.stderr), "\n")
	parent := maskUUID.FindString(lines[len(lines)-1])
	require.NotEmpty(t, parent)
	require.Contains(t, res.stderr, "running: child instance ", "a workflow step's progress names its child")
	require.NotContains(t, res.stderr, "(attempt 0)", "a workflow step makes no attempt of its own")

	res = b.run(t, "", "status", parent, "--json")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	var inst struct {
		Steps []struct {
			Name     string   `json:"name"`
			Workflow string   `json:"workflow"`
			Children []string `json:"children"`
		} `json:"steps"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &inst))
	require.Len(t, inst.Steps, 3)
	require.Empty(t, inst.Steps[0].Workflow)
	require.Nil(t, inst.Steps[0].Children)
	require.Equal(t, "leg", inst.Steps[1].Workflow)
	require.Len(t, inst.Steps[1].Children, 1)
	require.Len(t, inst.Steps[2].Children, 2)
	child := inst.Steps[1].Children[0]
	names := strings.NewReplacer(parent, "<PARENT>", child, "<CHILD>",
		inst.Steps[2].Children[0], "<ITEM0>", inst.Steps[2].Children[1], "<ITEM1>")

	var report strings.Builder
	for _, args := range [][]string{
		{"status", parent},
		{"status", child},
		{"status", inst.Steps[2].Children[1]},
		{"status", parent, "--step", "each"},
		{"list"},
		{"list", "--parent", parent},
		{"list", "--parent", child},
		{"list", "--workflow", "leg"},
	} {
		res := b.run(t, "", args...)
		require.Equal(t, app.ExitOK, res.code, res.stderr)
		report.WriteString("$ dagrun " + names.Replace(strings.Join(args, " ")) + "\n" + mask(names.Replace(res.stdout)) + "\n")
	}
	golden(t, "status-subflow", report.String())

	res = b.run(t, "", "list", "--all", "--json")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	var all []struct {
		ID     string `json:"id"`
		Parent *struct {
			ID   string `json:"id"`
			Step string `json:"step"`
			Item *int   `json:"item"`
		} `json:"parent"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &all))
	require.Len(t, all, 4)
	byID := map[string]int{}
	for i, x := range all {
		byID[x.ID] = i
	}
	require.Nil(t, all[byID[parent]].Parent)
	require.Equal(t, "hand", all[byID[child]].Parent.Step)
	require.Nil(t, all[byID[child]].Parent.Item)
	item1 := all[byID[inst.Steps[2].Children[1]]].Parent
	require.Equal(t, parent, item1.ID)
	require.Equal(t, "each", item1.Step)
	require.Equal(t, 1, *item1.Item)
}

// TestBulkOperationsPickWhatListShows: cancel by a filter picks top-level
// instances, as list shows them; --all picks child instances too, and a
// child cancelled by itself fails its parent's step.
func TestBulkOperationsPickWhatListShows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env["DAGRUN_WORKFLOWS"] = "testdata/subflows"
	res := b.run(t, "", "start", "handoff", "--detach") // no worker: its child waits, pending
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	parent := strings.TrimSpace(res.stdout)

	res = b.run(t, "", "cancel", "--workflow", "leg", "--status", "pending")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Equal(t, "cancelled 0 instances\n", res.stdout)
	res = b.run(t, "", "cancel", "--workflow", "leg", "--status", "pending", "--all")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Equal(t, "cancelled 1 instance\n", res.stdout)
	res = b.run(t, "", "status", parent, "--json")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Contains(t, res.stdout, `"status": "failed"`)
}

// TestMaxDepth: --max-depth is the engine's depth limit: a workflow step
// whose child would be deeper fails the instance, with a message that
// names the flag; within it the same instance completes.
func TestMaxDepth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env["DAGRUN_WORKFLOWS"] = "testdata/subflows"
	res := b.run(t, "", "start", "deep", "--max-depth", "1")
	require.Equal(t, app.ExitFailed, res.code, res.stderr)
	require.Contains(t, res.stderr, "sub-workflow depth limit 1 reached")
	require.Contains(t, res.stderr, "raise the engine's depth limit (--max-depth)")

	res = b.run(t, "", "start", "deep", "--max-depth", "2")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
}
