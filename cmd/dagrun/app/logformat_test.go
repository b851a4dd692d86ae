package app_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app"
)

// TestJSONLogFormatKeepsStderrJSON: with --log-format json, a following
// start's progress lines and a command's error are records too, so that
// every line of stderr is JSON.
func TestJSONLogFormatKeepsStderrJSON(t *testing.T) {
	t.Parallel()
	b := setup(t)
	records := func(stderr string) []map[string]any {
		var out []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
			var record map[string]any
			require.NoError(t, json.Unmarshal([]byte(line), &record), "a line of stderr is not JSON: %s", line)
			out = append(out, record)
		}
		return out
	}
	r := b.run(t, "", "--log-format", "json", "start", "greet", "--input", `{"name": "Ada"}`)
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	got := records(r.stderr)
	require.Equal(t, "hello", got[0]["step"])
	require.Equal(t, "step.ready", got[0]["event"])
	require.Equal(t, "ready", got[0]["msg"])
	require.Equal(t, "instance.completed", got[len(got)-1]["event"])

	r = b.run(t, "", "--log-format", "json", "start", "nope")
	require.Equal(t, app.ExitUsage, r.code)
	got = records(r.stderr)
	require.Len(t, got, 1)
	require.Equal(t, "ERROR", got[0]["level"])
	require.EqualValues(t, app.ExitUsage, got[0]["exit"])
	require.Contains(t, got[0]["msg"], `unknown workflow "nope"`)

	r = b.run(t, "", "start", "nope")
	require.Equal(t, app.ExitUsage, r.code)
	require.True(t, strings.HasPrefix(r.stderr, `dagrun: unknown workflow "nope"`), "text as before: %s", r.stderr)
}
