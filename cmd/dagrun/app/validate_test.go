package app_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app"
)

// validateLine is the form of every line validate prints on stderr, which
// editors and CI annotations read.
var validateLine = regexp.MustCompile(`^[^:]+:\d+:\d+: \S`)

// TestValidateProblems: whatever validate cannot check (a file it cannot
// read, a folder without workflow files, a file the engine would never
// load) is reported as FILE:LINE:COL: message like a mistake inside a
// file, with exit code 2, and does not stop the check of the others.
func TestValidateProblems(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, src string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(src), 0o644))
		return path
	}
	greet := "name: %s\nsteps:\n  - {name: hello, handler: echo}\n"
	empty := write("empty.yaml", "")
	notes := write("notes.txt", fmt.Sprintf(greet, "notes.txt"))
	draft := write(".draft.yaml", fmt.Sprintf(greet, "draft"))
	noWorkflows := filepath.Join(dir, "no-workflows")
	require.NoError(t, os.Mkdir(noWorkflows, 0o755))
	write("no-workflows/README.md", "not a workflow\n")
	loop := filepath.Join(dir, "loop.yaml")
	require.NoError(t, os.Symlink(loop, loop))

	cases := []struct {
		name      string
		workflows string // DAGRUN_WORKFLOWS, when not the test workflows
		args      []string
		stdout    string
	}{
		{name: "missing file", args: []string{"validate", "nonexist.yaml"}},
		{name: "path through a file", args: []string{"validate", "testdata/workflows/greet.yaml/inner.yaml"}},
		{name: "symbolic link loop", args: []string{"validate", loop}},
		{name: "empty file", args: []string{"validate", empty}},
		{name: "not a .yaml file", args: []string{"validate", notes}},
		{name: "dot-file", args: []string{"validate", draft}},
		{name: "folder without workflow files", args: []string{"validate", noWorkflows}},
		{name: "missing folder", args: []string{"validate", filepath.Join(dir, "workflws")}},
		{name: "workflows folder missing", workflows: filepath.Join(dir, "nowhere"), args: []string{"validate"}},
		{name: "workflows folder without workflow files", workflows: noWorkflows, args: []string{"validate"}},
		{name: "workflows folder is a file", args: []string{"--workflows", "testdata/workflows/greet.yaml", "validate"}},
		{name: "one problem does not stop the others", args: []string{"validate", "nonexist.yaml", noWorkflows, "testdata/workflows/greet.yaml"}, stdout: "ok greet (1 step)\n"},
	}
	var report strings.Builder
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := setup(t)
			if c.workflows != "" {
				b.env["DAGRUN_WORKFLOWS"] = c.workflows
			}
			res := b.run(t, "", c.args...)
			require.Equal(t, app.ExitUsage, res.code, "dagrun %q\n%s", c.args, res.stderr)
			require.Equal(t, c.stdout, res.stdout)
			require.NotEmpty(t, res.stderr)
			for _, line := range strings.Split(strings.TrimSuffix(res.stderr, "\n"), "\n") {
				require.Regexp(t, validateLine, line)
			}
			fmt.Fprintf(&report, "$ dagrun %s\n%s(exit %d)\n\n", strings.Join(c.args, " "), res.stderr, res.code)
		})
	}
	golden(t, "validate-problems", strings.ReplaceAll(report.String(), dir, "<DIR>"))
}

// TestValidateUnreadableFile: a file validate may not read says so, and
// what to do, on one FILE:1:1: line.
func TestValidateUnreadableFile(t *testing.T) {
	t.Parallel()
	if os.Geteuid() == 0 {
		t.Skip("root reads every file: no permission error to report")
	}
	path := filepath.Join(t.TempDir(), "locked.yaml")
	require.NoError(t, os.WriteFile(path, []byte("name: locked\nsteps:\n  - {name: a, handler: echo}\n"), 0o000))
	res := setup(t).run(t, "", "validate", path)
	require.Equal(t, app.ExitUsage, res.code)
	require.Equal(t, path+":1:1: cannot read the workflow file: permission denied; make it readable by the user dagrun runs as\n", res.stderr)
}

// TestValidateFolderResolvesCallsWithinIt: a folder given to validate is
// checked as the engine loads a --workflows folder, so its workflow steps
// may call only its own workflows; a file named alone may also call the
// --workflows folder's, which it may be written to join.
func TestValidateFolderResolvesCallsWithinIt(t *testing.T) {
	t.Parallel()
	b := setup(t) // --workflows holds greet
	solo := t.TempDir()
	caller := filepath.Join(solo, "caller.yaml")
	require.NoError(t, os.WriteFile(caller, []byte("name: caller\nsteps:\n  - name: s\n    workflow: greet\n"), 0o644))

	res := b.run(t, "", "validate", solo)
	require.Equal(t, app.ExitUsage, res.code, res.stdout)
	require.Contains(t, res.stderr, caller+`:4:15: step "s": unknown workflow "greet"`)

	res = b.run(t, "", "--workflows", solo, "start", "caller")
	require.Equal(t, app.ExitUsage, res.code, "the folder loaded as validate checked it")

	res = b.run(t, "", "validate", caller)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Equal(t, "ok caller (1 step)\n", res.stdout)
}
