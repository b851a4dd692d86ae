package app_test

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app"
)

// TestVersion: `version` and `--version` print the same one line, naming
// the Go version the binary was built with; --json gives it as an object.
func TestVersion(t *testing.T) {
	b := setup(t)
	res := b.run(t, "", "version")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	line := res.stdout
	require.True(t, strings.HasPrefix(line, "dagrun "), "got %q", line)
	require.Equal(t, 1, strings.Count(line, "\n"), "one line: %q", line)
	require.Contains(t, line, runtime.Version())

	flag := b.run(t, "", "--version")
	require.Equal(t, app.ExitOK, flag.code, flag.stderr)
	require.Equal(t, line, flag.stdout)

	asJSON := b.run(t, "", "version", "--json")
	require.Equal(t, app.ExitOK, asJSON.code, asJSON.stderr)
	var v struct{ Version, Go string }
	require.NoError(t, json.Unmarshal([]byte(asJSON.stdout), &v))
	require.NotEmpty(t, v.Version)
	require.Equal(t, runtime.Version(), v.Go)
	require.Contains(t, line, "dagrun "+v.Version)

	extra := b.run(t, "", "version", "now")
	require.Equal(t, app.ExitUsage, extra.code)
	require.Equal(t, "dagrun: usage: dagrun version [--json] (got 1 argument)\n", extra.stderr)
}
