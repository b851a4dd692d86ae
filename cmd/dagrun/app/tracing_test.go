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
