package handlers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/dagrun/dagrun/handlers"
)

// capture returns a context whose handlers.Logger writes JSON lines to the
// returned buffer.
func capture(ctx context.Context) (context.Context, *bytes.Buffer) {
	var buf bytes.Buffer
	return handlers.WithLogHandler(ctx, slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), &buf
}

func logLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		out = append(out, m)
	}
	return out
}

func TestLogger(t *testing.T) {
	t.Parallel()
	// Outside an attempt it discards, without failing.
	handlers.Logger(context.Background()).Info("nobody hears this")

	ctx, buf := capture(context.Background())
	handlers.Logger(ctx).Info("hello", slog.Int("n", 1))
	lines := logLines(t, buf)
	require.Len(t, lines, 1)
	require.Equal(t, "hello", lines[0]["msg"])
	require.EqualValues(t, 1, lines[0]["n"])
}

func TestHTTPLogsAndPropagates(t *testing.T) {
	t.Parallel()
	b := setupHTTP(t, respondWith(http.StatusOK, "text/plain", "ok"))
	ctx, buf := capture(context.Background())
	traceID, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	spanID, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	ctx = trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled,
	}))
	u := strings.Replace(b.srv.URL, "http://", "http://user:secret@", 1) + "/p?token=hunter2&x=1#frag"
	_, err := b.call(ctx, t, map[string]any{"url": u, "method": "post"})
	require.NoError(t, err)
	got := <-b.got
	require.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", got.header.Get("Traceparent"),
		"the request joins the attempt's trace")

	lines := logLines(t, buf)
	require.Len(t, lines, 1)
	line := lines[0]
	require.Equal(t, "http response", line["msg"])
	require.Equal(t, "POST", line["method"])
	require.EqualValues(t, 200, line["status"])
	require.Contains(t, line, "duration")
	logged := line["url"].(string)
	require.Equal(t, b.srv.URL+"/p?token=xxxxx&x=xxxxx", logged, "no credentials, no query values")
	require.NotContains(t, buf.String(), "secret")
	require.NotContains(t, buf.String(), "hunter2")

	// A traceparent the step sets itself is left alone; without a span
	// none is sent.
	_, err = b.call(ctx, t, map[string]any{"url": b.srv.URL, "headers": map[string]string{"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"}})
	require.NoError(t, err)
	require.Equal(t, "00-11111111111111111111111111111111-2222222222222222-01", (<-b.got).header.Get("Traceparent"))
	_, err = b.call(context.Background(), t, map[string]any{"url": b.srv.URL})
	require.NoError(t, err)
	require.Empty(t, (<-b.got).header.Get("Traceparent"))

	// A failed request is logged with its error.
	buf.Reset()
	_, err = b.call(ctx, t, map[string]any{"url": "http://127.0.0.1:1/x"})
	require.Error(t, err)
	lines = logLines(t, buf)
	require.Len(t, lines, 1)
	require.Equal(t, "http request failed", lines[0]["msg"])
	require.Equal(t, "WARN", lines[0]["level"])
}
