package app_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

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

}

// TestTracingSettingsNeverStopACommand: an exporter or a protocol dagrun
// does not have is a warning, and the command does its work; the others
// of a list still get the spans.
func TestTracingSettingsNeverStopACommand(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		warning string
		console bool // console spans on stderr
	}{
		{"UnknownExporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"},
			`OTEL_TRACES_EXPORTER names \"zipkin\", which dagrun does not have`, false},
		{"UnknownExporterBesideConsole", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin, console"},
			`names \"zipkin\"`, true},
		{"UnknownProtocol", map[string]string{"OTEL_TRACES_EXPORTER": "otlp,console", "OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"},
			`OTEL_EXPORTER_OTLP_PROTOCOL=\"thrift\" is not an OTLP protocol dagrun has: use http/protobuf or grpc`, true},
		{"None", map[string]string{"OTEL_TRACES_EXPORTER": "console,none"}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t)
			for k, v := range tc.env {
				b.env[k] = v
			}
			r := b.run(t, "", "start", "greet", "--input", `{"name": "Ada"}`)
			require.Equal(t, app.ExitOK, r.code, r.stderr)
			require.JSONEq(t, `"hello, Ada"`, r.stdout)
			if tc.warning != "" {
				require.Contains(t, r.stderr, tc.warning)
			} else {
				require.NotContains(t, r.stderr, "tracing")
			}
			if tc.console {
				require.Contains(t, r.stderr, `{"Name":"step hello",`)
			} else {
				require.NotContains(t, r.stderr, `"Name":`)
			}
		})
	}
}

// spanCollector is an OTLP/gRPC receiver that keeps the names of the
// spans it is sent.
type spanCollector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	names []string
}

func (c *spanCollector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, span := range ss.GetSpans() {
				c.names = append(c.names, span.GetName())
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (c *spanCollector) spanNames() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.names)
}

// TestTracesOverGRPC: OTEL_EXPORTER_OTLP_PROTOCOL=grpc sends the spans
// to an OTLP/gRPC receiver. The exporter reads the process environment,
// hence t.Setenv and no t.Parallel.
func TestTracesOverGRPC(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	server := grpc.NewServer()
	collector := &spanCollector{}
	collectortrace.RegisterTraceServiceServer(server, collector)
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(server.Stop)

	b := setup(t)
	for k, v := range map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + listener.Addr().String(),
		"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
	} {
		t.Setenv(k, v)
		b.env[k] = v
	}
	r := b.run(t, "", "start", "greet", "--input", `{"name": "Ada"}`)
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	require.NotContains(t, r.stderr, "tracing")
	// The spans are sent before the command returns.
	require.Subset(t, collector.spanNames(), []string{"step hello", "workflow greet"})
}
