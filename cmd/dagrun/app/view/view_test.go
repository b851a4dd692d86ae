package view_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
	"github.com/dagrun/dagrun/storage"
)

// TestInstanceLeavesItemsOut: the instance object of a forEach step of
// 10,000 items holds their counts, not their outputs, so it stays small;
// other steps, and a forEach step of a few items, keep their outputs.
func TestInstanceLeavesItemsOut(t *testing.T) {
	t.Parallel()
	outputs := "[" + strings.TrimSuffix(strings.Repeat(`{"thumbnail": "https://images.example.com/t/0123456789.png"},`, 10000), ",") + "]"
	inst := &storage.Instance{ID: "i1", Workflow: "thumbnails", Status: storage.InstanceCompleted, Steps: []storage.Step{
		{Name: "list", Status: storage.StepCompleted, Output: json.RawMessage(`{"images": ["a.png"]}`)},
		{Name: "resize", Status: storage.StepCompleted, Output: json.RawMessage(outputs),
			Items: &storage.ItemCounts{Total: 10000, Completed: 9990, Failed: 10}},
	}}
	data, err := json.Marshal(view.NewInstance(inst))
	require.NoError(t, err)
	require.Less(t, len(data), 2048, "the instance object inlines the items")

	var got view.Instance
	require.NoError(t, json.Unmarshal(data, &got))
	require.JSONEq(t, `{"images": ["a.png"]}`, string(got.Steps[0].Output))
	require.Nil(t, got.Steps[0].Items)
	require.JSONEq(t, `null`, string(got.Steps[1].Output))
	require.True(t, got.Steps[1].OutputOmitted)
	require.Equal(t, &view.ItemCounts{Total: 10000, Completed: 9990, Failed: 10}, got.Steps[1].Items)

	few := &storage.Instance{ID: "i2", Workflow: "thumbnails", Status: storage.InstanceCompleted, Steps: []storage.Step{
		{Name: "resize", Status: storage.StepCompleted, Output: json.RawMessage(`[{"t": 1}, null]`),
			Items: &storage.ItemCounts{Total: 2, Completed: 1, Failed: 1}},
	}}
	data, err = json.Marshal(view.NewInstance(few))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &got))
	require.JSONEq(t, `[{"t": 1}, null]`, string(got.Steps[0].Output), "a few items' outputs are inlined")
	require.False(t, got.Steps[0].OutputOmitted)
}
