package dag

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func names(steps []*Step) []string {
	out := make([]string, len(steps))
	for i, s := range steps {
		out[i] = s.Name
	}
	return out
}

func TestTopologicalOrder(t *testing.T) {
	t.Parallel()
	w := mustParse(t, `name: t
steps:
  - name: d
    handler: echo
    dependsOn: [b, c]
  - name: c
    handler: echo
    dependsOn: [a]
  - name: b
    handler: echo
    dependsOn: [a]
  - name: a
    handler: echo
  - name: lone
    handler: echo
`)
	// Among ready steps the earliest defined goes first: a (before lone),
	// then c and b in file order, then d, which is defined first but ready last.
	require.Equal(t, []string{"a", "c", "b", "d", "lone"}, names(w.TopologicalOrder()))
	// Deterministic, and a copy the caller may change.
	order := w.TopologicalOrder()
	order[0] = nil
	require.Equal(t, []string{"a", "c", "b", "d", "lone"}, names(w.TopologicalOrder()))
}

func TestAncestors(t *testing.T) {
	t.Parallel()
	w := mustParse(t, `name: t
steps:
  - name: a
    handler: echo
  - name: b
    handler: echo
    dependsOn: [a]
  - name: c
    handler: echo
    dependsOn: [b]
  - name: x
    handler: echo
  - name: d
    handler: echo
    dependsOn: [c, x]
`)
	require.Equal(t, map[string]bool{"a": true, "b": true, "c": true, "x": true}, w.Ancestors("d"))
	require.Equal(t, map[string]bool{"a": true}, w.Ancestors("b"))
	require.Empty(t, w.Ancestors("a"))
	require.Nil(t, w.Ancestors("missing"))
}

func TestGraphRendering(t *testing.T) {
	t.Parallel()
	for _, path := range append(testdataFiles(t, "graph/*.yaml"), filepath.Join("..", "workflows", "order-processing.yaml")) {
		base := strings.TrimSuffix(filepath.Base(path), ".yaml")
		t.Run(base, func(t *testing.T) {
			t.Parallel()
			w, err := ParseFile(path, nil)
			require.NoError(t, err)
			golden(t, filepath.Join("testdata", "graph", base+".mermaid.golden"), w.Mermaid())
			golden(t, filepath.Join("testdata", "graph", base+".dot.golden"), w.DOT())
		})
	}
}

func TestMermaidIDsAreUniqueAndSafe(t *testing.T) {
	t.Parallel()
	ids := mermaidIDs([]*Step{{Name: "a.b"}, {Name: "a_b"}, {Name: "a-b"}, {Name: "end"}})
	require.Equal(t, map[string]string{"a.b": "step_a_b", "a_b": "step_a_b_2", "a-b": "step_a_b_3", "end": "step_end"}, ids)
}

func TestWorkflowsFolderParses(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("..", "workflows")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.NotEmpty(t, entries)
	wfs, err := LoadDir(dir, nil)
	require.NoError(t, err)
	require.NotEmpty(t, wfs)
	for _, w := range wfs {
		require.NotEmpty(t, w.TopologicalOrder())
	}
}
