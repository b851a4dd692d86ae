package view_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
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

	// Thousands of small outputs, up to the bound, are inlined too.
	small := "[" + strings.TrimSuffix(strings.Repeat(`{"n": 12345},`, 5000), ",") + "]"
	require.Less(t, len(small), view.MaxInlineItemsOutput)
	many := &storage.Instance{ID: "i3", Workflow: "thumbnails", Status: storage.InstanceCompleted, Steps: []storage.Step{
		{Name: "count", Status: storage.StepCompleted, Output: json.RawMessage(small),
			Items: &storage.ItemCounts{Total: 5000, Completed: 5000}},
	}}
	data, err = json.Marshal(view.NewInstance(many))
	require.NoError(t, err)
	got = view.Instance{}
	require.NoError(t, json.Unmarshal(data, &got))
	require.JSONEq(t, small, string(got.Steps[0].Output), "5,000 small outputs are inlined")
	require.False(t, got.Steps[0].OutputOmitted)
}

// TestInstanceLeavesManyChildrenOut: a forEach workflow step's children
// are inlined up to MaxInlineChildren; past that the object says they are
// left out, and stays small.
func TestInstanceLeavesManyChildrenOut(t *testing.T) {
	t.Parallel()
	ids := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("01a25137-3b42-71b1-8fdd-%012d", i)
		}
		return out
	}
	for _, n := range []int{view.MaxInlineChildren, 10000} {
		inst := &storage.Instance{ID: "i1", Workflow: "fan", Status: storage.InstanceCompleted, Steps: []storage.Step{
			{Name: "each", Status: storage.StepCompleted, Workflow: "child", Children: ids(n), Output: json.RawMessage(`[]`),
				Items: &storage.ItemCounts{Total: n, Completed: n}},
		}}
		data, err := json.Marshal(view.NewInstance(inst))
		require.NoError(t, err)
		var got view.Instance
		require.NoError(t, json.Unmarshal(data, &got))
		if n > view.MaxInlineChildren {
			require.Nil(t, got.Steps[0].Children)
			require.True(t, got.Steps[0].ChildrenOmitted)
			require.Less(t, len(data), 2048)
		} else {
			require.Len(t, got.Steps[0].Children, n)
			require.False(t, got.Steps[0].ChildrenOmitted)
		}
	}
}

// TestInstanceParentAndChildren: a child instance names its parent's step
// (and item, for a forEach step); a workflow step names its workflow and
// its children; top-level instances, other steps and other items carry
// none of these keys, so their objects are as before.
func TestInstanceParentAndChildren(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		inst *storage.Instance
		want string
	}{
		{
			name: "top-level parent",
			inst: &storage.Instance{ID: "p1", Workflow: "order-fulfilment", Status: storage.InstanceRunning, Steps: []storage.Step{
				{Name: "charge", Handler: "orders.charge", Status: storage.StepCompleted},
				{Name: "ship", Workflow: "shipping", Status: storage.StepRunning, Children: []string{"c1"}},
				{Name: "later", Workflow: "shipping", Status: storage.StepBlocked},
			}},
			want: `{"steps": [{"name": "charge"}, {"name": "ship", "workflow": "shipping", "children": ["c1"]}, {"name": "later", "workflow": "shipping"}]}`,
		},
		{
			name: "child of a step",
			inst: &storage.Instance{ID: "c1", Workflow: "shipping", Status: storage.InstanceRunning, Depth: 1,
				Parent: &storage.ParentRef{InstanceID: "p1", Step: "ship", Item: -1}},
			want: `{"parent": {"id": "p1", "step": "ship"}, "steps": []}`,
		},
		{
			name: "child of an item",
			inst: &storage.Instance{ID: "c2", Workflow: "shipping", Status: storage.InstanceRunning, Depth: 1,
				Parent: &storage.ParentRef{InstanceID: "p1", Step: "ship-each", Item: 0}},
			want: `{"parent": {"id": "p1", "step": "ship-each", "item": 0}, "steps": []}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			data, err := json.Marshal(view.NewInstance(tt.inst))
			require.NoError(t, err)
			// Compare only the keys this feature adds.
			var full map[string]any
			require.NoError(t, json.Unmarshal(data, &full))
			picked := map[string]any{"steps": []any{}}
			if p, ok := full["parent"]; ok {
				picked["parent"] = p
			}
			for _, s := range full["steps"].([]any) {
				step := s.(map[string]any)
				keep := map[string]any{"name": step["name"]}
				for _, k := range []string{"workflow", "children"} {
					if v, ok := step[k]; ok {
						keep[k] = v
					}
				}
				picked["steps"] = append(picked["steps"].([]any), keep)
			}
			got, err := json.Marshal(picked)
			require.NoError(t, err)
			require.JSONEq(t, tt.want, string(got))
		})
	}

	page := view.NewItemPage([]storage.Item{{Index: 0, Status: storage.StepRunning, Child: "c2"}, {Index: 1, Status: storage.StepPending}}, 0, 2, 2)
	data, err := json.Marshal(page)
	require.NoError(t, err)
	var items struct {
		Items []map[string]any `json:"items"`
	}
	require.NoError(t, json.Unmarshal(data, &items))
	require.Equal(t, "c2", items.Items[0]["child"])
	require.NotContains(t, items.Items[1], "child", "an item without a child has no child key")
}

// TestScheduleLastInstance: a schedule's last instance has its status, and
// null for one pruned since (the OpenAPI spec's InstanceStatus or null,
// never ""); a schedule that never fired has none.
func TestScheduleLastInstance(t *testing.T) {
	t.Parallel()
	list := view.NewSchedules([]dagrun.ScheduleInfo{
		{Workflow: "nightly", LastInstanceID: "i1", LastInstanceStatus: storage.InstanceCompleted},
		{Workflow: "nightly", Index: 1, LastInstanceID: "i0"},
		{Workflow: "weekly"},
	})
	var got []string
	for _, s := range list {
		raw, err := json.Marshal(s.LastInstance)
		require.NoError(t, err)
		got = append(got, string(raw))
	}
	require.Equal(t, []string{`{"id":"i1","status":"completed"}`, `{"id":"i0","status":null}`, `null`}, got)
}
