package dag

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCheckCalls checks the exact messages of the checks across files:
// each folder testdata/calls/CASE is loaded as a workflows folder, and the
// workflows it keeps and its errors are compared with CASE.golden. Review
// the messages by eye after -update.
func TestCheckCalls(t *testing.T) {
	t.Parallel()
	dirs, err := filepath.Glob(filepath.Join("testdata", "calls", "*"))
	require.NoError(t, err)
	var cases []string
	for _, d := range dirs {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			cases = append(cases, d)
		}
	}
	require.NotEmpty(t, cases)
	for _, dir := range cases {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			t.Parallel()
			wfs, err := LoadDir(dir, testOptions())
			var b strings.Builder
			b.WriteString("kept:")
			for _, w := range wfs {
				b.WriteString(" " + w.Name)
			}
			b.WriteString("\n")
			if err != nil {
				var list ErrorList
				require.True(t, errors.As(err, &list), "only errors of files: %v", err)
				for _, e := range list {
					require.Positive(t, e.Line)
					require.Positive(t, e.Col)
					require.NotContains(t, e.Msg, "\n", "messages are one line each")
				}
				b.WriteString(strings.ReplaceAll(err.Error(), dir+string(filepath.Separator), ""))
				b.WriteString("\n")
			}
			golden(t, dir+".golden", b.String())
		})
	}
}

// TestCheckCallsAlone checks the exported check on workflows parsed one by
// one, as validate does with the files it is given: the same calls are
// refused whatever the order of the set.
func TestCheckCallsAlone(t *testing.T) {
	t.Parallel()
	parse := func(name, src string) *Workflow {
		w, err := Parse(name+".yaml", []byte(src), testOptions())
		require.NoError(t, err)
		return w
	}
	a := parse("a", "name: a\nsteps:\n  - name: s\n    workflow: b\n")
	b := parse("b", "name: b\nsteps:\n  - name: t\n    workflow: a\n")
	c := parse("c", "name: c\nsteps:\n  - name: u\n    handler: noop\n")
	want := "a.yaml:4:15: step \"s\": workflow call cycle a -> b -> a: each instance would start another without end; remove one of these workflow steps\n" +
		"b.yaml:4:15: step \"t\": workflow call cycle b -> a -> b: each instance would start another without end; remove one of these workflow steps"
	require.Equal(t, want, CheckCalls([]*Workflow{a, b, c}, nil).Error())
	require.Equal(t, want, CheckCalls([]*Workflow{c, b, a}, nil).Error())
	require.Empty(t, CheckCalls([]*Workflow{c}, nil))
	require.Equal(t, `a.yaml:4:15: step "s": calls workflow "b", whose file b.yaml has errors: fix them first (dagrun validate lists them)`,
		CheckCalls([]*Workflow{a}, map[string]string{"b": "dir/b.yaml"}).Error())
}
