package e2e

import (
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is a minimal OTLP/HTTP trace receiver: it decodes what the
// real exporter of each dagrun process sends, and keeps the spans with the
// service.instance.id of the process that sent them.
type otlpReceiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []receivedSpan
}

type receivedSpan struct {
	process string
	span    *tracepb.Span
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "want POST /v1/traces with protobuf", http.StatusBadRequest)
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var export coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &export); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, rs := range export.ResourceSpans {
			process := ""
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.instance.id" {
					process = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					r.spans = append(r.spans, receivedSpan{process: process, span: s})
				}
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *otlpReceiver) received() []receivedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]receivedSpan(nil), r.spans...)
}

// env turns tracing on for a process named process.
func (r *otlpReceiver) env(process string) []string {
	return []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + r.srv.URL,
		"OTEL_BSP_SCHEDULE_DELAY=50",
		"OTEL_SERVICE_NAME=dagrun-e2e",
		"OTEL_RESOURCE_ATTRIBUTES=service.instance.id=" + process,
	}
}

func attrOf(s *tracepb.Span, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			if v := kv.GetValue(); v.GetStringValue() != "" {
				return v.GetStringValue()
			}
			return fmt.Sprint(kv.GetValue().GetIntValue())
		}
	}
	return ""
}

// The steps alternate between two queues, each served by its own worker
// process; the http step calls a server that records its traceparent.
const tracedYAML = `name: traced
steps:
  - {name: first, handler: echo, queue: q1}
  - name: call
    handler: http
    queue: q2
    dependsOn: [first]
    input: {url: "${{ input.url }}"}
  - {name: last, handler: echo, queue: q1, dependsOn: [call]}
`

func TestTracesAcrossWorkers(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, db string) {
		receiver := newOTLPReceiver(t)
		headers := make(chan string, 4)
		target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			headers <- req.Header.Get("Traceparent")
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"ok":true}`)
		}))
		t.Cleanup(target.Close)

		e := newEnv(t, db, map[string]string{"traced.yaml": tracedYAML})
		starter := *e
		starter.extraEnv = receiver.env("starter")
		const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
		res := starter.mustRun(t, "start", "traced", "--detach", "--input", `{"url":"`+target.URL+`/hook?key=s3cret"}`,
			"--traceparent", "00-"+callerTrace+"-"+callerSpan+"-01")
		id := strings.TrimSpace(res.stdout)

		for i, queue := range []string{"q1", "q2"} {
			w := *e
			w.extraEnv = receiver.env(fmt.Sprintf("worker-%d", i+1))
			p := w.spawn(t, "worker", "--queues", queue, "--poll", "50ms", "--no-schedules")
			t.Cleanup(func() {
				if p.running() {
					p.signal(t, 15)
					p.wait(t, 30*time.Second)
				}
			})
		}
		waitFor(t, 60*time.Second, "the instance to complete", func() bool { return e.status(t, id).Status == "completed" })

		var spans []receivedSpan
		waitFor(t, 30*time.Second, "the instance span and three attempt spans", func() bool {
			spans = receiver.received()
			return len(spans) >= 4
		})
		require.Len(t, spans, 4, "one instance span and one per attempt: %v", spans)
		var root *tracepb.Span
		for _, s := range spans {
			if s.span.Name == "workflow traced" {
				root = s.span
			}
		}
		require.NotNil(t, root, "the instance span")
		require.Equal(t, callerTrace, hex.EncodeToString(root.TraceId))
		require.Equal(t, callerSpan, hex.EncodeToString(root.ParentSpanId), "the instance span is the caller's child")
		require.Equal(t, id, attrOf(root, "workflow.instance.id"))
		require.Equal(t, "completed", attrOf(root, "workflow.status"))

		processes := map[string]string{}
		var call *tracepb.Span
		for _, s := range spans {
			if s.span == root {
				continue
			}
			require.Equal(t, callerTrace, hex.EncodeToString(s.span.TraceId), "%s in the caller's trace", s.span.Name)
			require.Equal(t, root.SpanId, s.span.ParentSpanId, "%s is a child of the instance span", s.span.Name)
			require.Equal(t, "completed", attrOf(s.span, "workflow.outcome"))
			require.GreaterOrEqual(t, s.span.StartTimeUnixNano, root.StartTimeUnixNano, "the instance span covers its attempts")
			require.LessOrEqual(t, s.span.EndTimeUnixNano, root.EndTimeUnixNano)
			processes[attrOf(s.span, "workflow.step")] = s.process
			if s.span.Name == "step call" {
				call = s.span
			}
		}
		require.Equal(t, map[string]string{"first": "worker-1", "call": "worker-2", "last": "worker-1"}, processes,
			"the attempts ran, and their spans were sent, in both worker processes")

		// The http built-in sent the attempt's traceparent.
		require.Equal(t, "00-"+callerTrace+"-"+hex.EncodeToString(call.SpanId)+"-01", <-headers)

		// Its logs say what it did, without the query's secret.
		var logs result
		waitFor(t, 10*time.Second, "the http step's logs", func() bool {
			logs = e.mustRun(t, "logs", id, "call")
			return strings.Contains(logs.stdout, "http response")
		})
		require.Regexp(t, `(?m)^\S+ INFO  call#1 http response method=GET url="`+target.URL+`/hook\?key=xxxxx" status=200 duration=[0-9.]+(ns|µs|ms|s)$`, logs.stdout)
		require.NotContains(t, logs.stdout, "s3cret")
		all := e.mustRun(t, "logs", id, "--follow")
		require.Contains(t, all.stdout, "first#1 echo bytes=")
		require.Contains(t, all.stdout, "last#1 echo bytes=")
		bad := e.run(t, "logs", id, "nope")
		require.Equal(t, 2, bad.code)
		require.Contains(t, bad.stderr, `has no step "nope"`)
	})
}

// A start that follows its instance runs it in process and exits when it
// finished: the instance's span and its attempts' are sent before it does.
func TestTracedStartFollows(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, db string) {
		receiver := newOTLPReceiver(t)
		target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
		t.Cleanup(target.Close)
		e := newEnv(t, db, map[string]string{"traced.yaml": tracedYAML})
		e.extraEnv = receiver.env("follower")
		e.mustRun(t, "start", "traced", "--input", `{"url":"`+target.URL+`"}`)

		spans := receiver.received()
		require.Len(t, spans, 4, "sent before the process exited")
		names := map[string]bool{}
		for _, s := range spans {
			names[s.span.Name] = true
			require.Equal(t, spans[0].span.TraceId, s.span.TraceId, "one trace")
		}
		require.Equal(t, map[string]bool{"workflow traced": true, "step first": true, "step call": true, "step last": true}, names)
	})
}

// TestWorkerServesItsMetrics: a worker started with --metrics-addr serves
// the counts of what it ran, which the server that started the instance
// never sees; the counts of what the database holds stay the server's.
func TestWorkerServesItsMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, filepath.Join(t.TempDir(), "dagrun.db"), map[string]string{"pair.yaml": echoNoop("pair")})
	worker := e.spawn(t, "worker", "--metrics-addr", "127.0.0.1:0", "--no-schedules")
	var metricsURL string
	waitFor(t, 30*time.Second, "the worker to serve its metrics", func() bool {
		if m := serveListening.FindStringSubmatch(worker.stderr.String()); m != nil {
			metricsURL = m[1] + "/metrics"
			return true
		}
		require.True(t, worker.running(), "dagrun worker exited:\n%s", worker.stderr.String())
		return false
	})
	id := strings.TrimSpace(e.mustRun(t, "start", "pair", "--detach").stdout)
	waitFor(t, 30*time.Second, "the instance to complete", func() bool {
		return strings.Contains(e.mustRun(t, "status", id).stdout, "completed")
	})
	waitFor(t, 30*time.Second, "the worker's metrics to count the instance", func() bool {
		resp, body := apiCall(t, http.MethodGet, metricsURL, "")
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		return strings.Contains(body, `dagrun_instances_finished_total{status="completed",workflow="pair"} 1`)
	})
	_, body := apiCall(t, http.MethodGet, metricsURL, "")
	require.Contains(t, body, `dagrun_step_attempts_total{handler="echo",outcome="completed"} 1`)
	require.Contains(t, body, `dagrun_step_attempts_total{handler="noop",outcome="completed"} 1`)
	require.NotContains(t, body, "dagrun_instances{", "the store's gauges are serve's")
}
