package web_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/storage"
)

type logPage struct {
	Records []struct {
		Seq     int64           `json:"seq"`
		Step    string          `json:"step"`
		Item    *int            `json:"item"`
		Attempt int             `json:"attempt"`
		Time    time.Time       `json:"time"`
		Level   string          `json:"level"`
		Message string          `json:"message"`
		Attrs   json.RawMessage `json:"attrs"`
	} `json:"records"`
	Next     int64 `json:"next"`
	Finished bool  `json:"finished"`
}

func (b *testBundle) logs(t *testing.T, path string) logPage {
	t.Helper()
	r := b.do(t, http.MethodGet, path, "")
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var page logPage
	require.NoError(t, json.Unmarshal(r.body, &page))
	return page
}

func TestLogsAPI(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, &setupOpts{worker: true})
		id := b.start(t, "greet", `{"input":{"name":"Ada"}}`)
		b.wait(t, id)
		base := "/api/instances/" + id

		// The echo built-in logs its input's size; the worker writes the
		// records shortly after the steps ran.
		var all logPage
		require.Eventually(t, func() bool {
			all = b.logs(t, base+"/logs")
			return len(all.Records) == 2
		}, 10*time.Second, 20*time.Millisecond)
		require.True(t, all.Finished)
		require.Equal(t, "hello", all.Records[0].Step)
		require.Equal(t, "shout", all.Records[1].Step)
		require.Equal(t, "echo", all.Records[0].Message)
		require.Equal(t, "DEBUG", all.Records[0].Level)
		require.Equal(t, 1, all.Records[0].Attempt)
		require.Nil(t, all.Records[0].Item)
		require.Contains(t, string(all.Records[0].Attrs), `"bytes":`)
		require.Equal(t, all.Records[1].Seq, all.Next)

		step := b.logs(t, base+"/steps/shout/logs")
		require.Len(t, step.Records, 1)
		require.Equal(t, "shout", step.Records[0].Step)

		// A follower passes next as after, and gets only what is new.
		after := b.logs(t, base+"/logs?after="+jsonNumber(all.Records[0].Seq))
		require.Len(t, after.Records, 1)
		empty := b.logs(t, base+"/logs?after="+jsonNumber(all.Next))
		require.Empty(t, empty.Records)
		require.NotNil(t, empty.Records, "an empty page is [], not null")
		require.Equal(t, all.Next, empty.Next, "next stays put when nothing is new")
		require.Len(t, b.logs(t, base+"/logs?limit=1").Records, 1)

		requireError(t, b.do(t, http.MethodGet, base+"/steps/nope/logs", ""), http.StatusNotFound, `has no step "nope"`)
		requireError(t, b.do(t, http.MethodGet, "/api/instances/nope/logs", ""), http.StatusNotFound, "nope")
		requireError(t, b.do(t, http.MethodGet, base+"/logs?after=x", ""), http.StatusBadRequest, "invalid after")
		requireError(t, b.do(t, http.MethodGet, base+"/logs?after=-1", ""), http.StatusBadRequest, "must not be negative")
		requireError(t, b.do(t, http.MethodGet, base+"/logs?limit=0", ""), http.StatusBadRequest, "invalid limit 0")
	})
}

func jsonNumber(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func TestStartTraceParent(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider(sdktrace.WithIDGenerator(dagrun.TraceIDGenerator()))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	b := setup(t, openSQLite, &setupOpts{tracerProvider: tp})

	r := b.do(t, http.MethodPost, "/api/workflows/greet/instances", `{"input":{"name":"Ada"}}`,
		"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	inst, err := b.engine.Get(t.Context(), r.json(t)["id"].(string))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(inst.TraceParent, "00-0af7651916cd43dd8448eb211c80319c-"), "joins the caller's trace: %s", inst.TraceParent)
	require.Equal(t, "b7ad6b7169203331", inst.TraceCaller)

	// An invalid traceparent is ignored: a trace of its own.
	r = b.do(t, http.MethodPost, "/api/workflows/greet/instances", `{"input":{"name":"Ada"}}`, "traceparent", "00-junk-01")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	inst, err = b.engine.Get(t.Context(), r.json(t)["id"].(string))
	require.NoError(t, err)
	require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, inst.TraceParent)
	require.Empty(t, inst.TraceCaller)
}
