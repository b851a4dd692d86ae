package dag

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the .golden files in testdata from the current output")

// testHandlers is the registry the golden cases are checked against.
var testHandlers = []string{"orders.validate", "orders.charge", "orders.ship", "orders.notify", "echo", "noop", "http", "sleep"}

func testOptions() *ParseOptions {
	return &ParseOptions{
		HandlerExists: func(name string) bool { return slices.Contains(testHandlers, name) },
		HandlerNames:  func() []string { return testHandlers },
	}
}

// golden compares got with the golden file, or rewrites it with -update.
func golden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file; run go test ./dag -update")
	require.Equal(t, string(want), got)
}

// mustParse parses a workflow written inline in a test; the name is checked
// against no file.
func mustParse(t *testing.T, src string) *Workflow {
	t.Helper()
	w, err := Parse("", []byte(src), nil)
	require.NoError(t, err)
	require.NotNil(t, w)
	return w
}

// parseErrors parses src and returns the error lines.
func parseErrors(t *testing.T, filename, src string) string {
	t.Helper()
	w, err := Parse(filename, []byte(src), testOptions())
	require.Error(t, err)
	require.Nil(t, w)
	return err.Error()
}

func testdataFiles(t testing.TB, pattern string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", pattern))
	require.NoError(t, err)
	return files
}
