package app_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app"
)

// What the OpenTelemetry SDK reports on its own (here a sampler setting it
// ignores) goes through the CLI's logger, so that --log-format json keeps
// every line of stderr JSON. The SDK reads its variables from the process
// environment, hence t.Setenv and no t.Parallel.
func TestTracingReportsThroughTheLogger(t *testing.T) {
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(collector.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_TRACES_SAMPLER", "bogus")
	b := setup(t)
	b.env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.URL

	r := b.run(t, "", "--log-format", "json", "list")
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	require.Contains(t, r.stderr, "bogus", "the SDK's complaint is reported")
	for _, line := range strings.Split(strings.TrimSpace(r.stderr), "\n") {
		var record map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &record), "a line of stderr is not JSON: %s", line)
	}
}

// TestConsoleTraces: OTEL_TRACES_EXPORTER=console writes the spans as JSON
// on stderr, the attempt's and the instance's, while stdout keeps the
// command's own output. The SDK keeps a global error handler, hence no
// t.Parallel.
func TestConsoleTraces(t *testing.T) {
	b := setup(t)
	b.env["OTEL_TRACES_EXPORTER"] = "console"
	r := b.run(t, "", "start", "greet", "--input", `{"name": "Ada"}`)
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	require.JSONEq(t, `"hello, Ada"`, r.stdout, "stdout holds the output alone")
	require.Contains(t, r.stderr, `{"Name":"step hello",`)
	require.Contains(t, r.stderr, `{"Name":"workflow greet",`)

	b.env["OTEL_TRACES_EXPORTER"] = "zipkin"
	r = b.run(t, "", "list")
	require.Equal(t, app.ExitUsage, r.code)
	require.Equal(t, "dagrun: OTEL_TRACES_EXPORTER=\"zipkin\" is not supported: use otlp, console or none\n", r.stderr)
}
