package web_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app/web"
	"github.com/dagrun/dagrun/storage"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden compares got with testdata/NAME.golden, rewriting it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file; run go test ./cmd/dagrun/app/web -update")
	require.Equal(t, string(want), got)
}

// TestOperationRefusals sends each operation a request it must refuse and
// records every answer in testdata/operations-errors.golden: a 4xx with a
// JSON error, and nothing changed.
func TestOperationRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, &setupOpts{worker: true})
	failed := b.start(t, "flaky", `{}`)
	require.Eventually(t, func() bool { return b.status(t, failed) == "failed" }, 10*time.Second, 10*time.Millisecond)
	pending := b.start(t, "greet", `{"input": {"name": "Ada"}}`)
	require.Eventually(t, func() bool { return b.status(t, pending) == "completed" }, 10*time.Second, 10*time.Millisecond)

	cases := []struct {
		path, body string
		status     int
	}{
		{"/api/instances/" + failed + "/retry", `{"from": "nope"}`, http.StatusNotFound},
		{"/api/instances/" + failed + "/retry", `{"form": "first"}`, http.StatusBadRequest},
		{"/api/instances/" + failed + "/retry", `{"from": ""}`, http.StatusBadRequest},
		{"/api/instances/" + failed + "/retry", `{"from": 5}`, http.StatusBadRequest},
		{"/api/instances/" + failed + "/retry", `[1]`, http.StatusBadRequest},
		{"/api/instances/no-such-id/retry", `{"from": "first"}`, http.StatusNotFound},
		{"/api/instances/" + failed + "/steps/first/skip", ``, http.StatusConflict},
		{"/api/instances/" + failed + "/steps/nope/skip", ``, http.StatusNotFound},
		{"/api/instances/" + failed + "/steps/fragile/skip", `{"output": {oops}}`, http.StatusBadRequest},
		{"/api/instances/" + pending + "/steps/hello/skip", `{"output": 1}`, http.StatusConflict},
		{"/api/instances/" + failed + "/pause", ``, http.StatusConflict},
		{"/api/instances/" + failed + "/resume", ``, http.StatusConflict},
		{"/api/instances/no-such-id/pause", ``, http.StatusNotFound},
		{"/api/instances/" + failed + "/resume", `{"paused": false}`, http.StatusBadRequest},
		{"/api/instances/cancel", `{}`, http.StatusBadRequest},
		{"/api/instances/cancel", `{"ids": ["x"], "workflow": "greet"}`, http.StatusBadRequest},
		{"/api/instances/retry", `{"ids": [], "workflow": "flaky"}`, http.StatusBadRequest},
		{"/api/instances/retry", `{"status": "stuck"}`, http.StatusBadRequest},
		{"/api/instances/cancel", `{"workflow": "gret"}`, http.StatusNotFound},
		{"/api/instances/retry", `{"workflow": "greet", "olderThan": "soon"}`, http.StatusBadRequest},
		{"/api/instances/" + pending + "/cancel", `{"reason": "late"}`, http.StatusBadRequest},
		{"/api/instances/" + pending + "/cancel", `{bad`, http.StatusBadRequest},
		{"/api/workflows/greet/instances", "{\"key\": \"a\xff\"}", http.StatusBadRequest},
		{"/api/workflows/greet/instances", `{"key": "a\ud800"}`, http.StatusBadRequest},
	}
	var report strings.Builder
	for _, c := range cases {
		r := b.do(t, http.MethodPost, c.path, c.body)
		requireError(t, r, c.status, "")
		fmt.Fprintf(&report, "POST %s %s\n%d %s\n\n", c.path, strings.ToValidUTF8(c.body, `\xff`), r.status, r.body)
	}
	golden(t, "operations-errors", strings.NewReplacer(failed, "<FAILED>", pending, "<COMPLETED>").Replace(report.String()))
	require.Equal(t, "failed", b.status(t, failed), "refusals change nothing")

	r := b.do(t, http.MethodPost, "/api/instances/retry", `{"ids": []}`)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	require.JSONEq(t, `{"count": 0}`, string(r.body), "an empty ids list picks nothing")
	require.Equal(t, "failed", b.status(t, failed))

	// An instance listed twice is acted on once, and not refused too.
	r = b.do(t, http.MethodPost, "/api/instances/retry", `{"ids": ["`+failed+`", "`+failed+`"]}`)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	require.JSONEq(t, `{"count": 1}`, string(r.body))
}

// TestOperationsRepairAndRecordTheTokenName retries from a step, skips a
// step, pauses and resumes through the API with named tokens, and finds
// each token's name in the history.
func TestOperationsRepairAndRecordTheTokenName(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, &setupOpts{worker: true, token: "plain", tokens: map[string]string{"alice": "s3cret-a"}})
		id := b.start(t, "flaky", `{}`)
		require.Eventually(t, func() bool { return b.status(t, id) == "failed" }, 10*time.Second, 10*time.Millisecond)

		b.token = "s3cret-a"
		r := b.do(t, http.MethodPost, "/api/instances/"+id+"/steps/fragile/skip", `{"output": {"ok": "by hand"}}`)
		require.Equal(t, http.StatusOK, r.status, string(r.body))
		require.Eventually(t, func() bool { return b.status(t, id) == "completed" }, 10*time.Second, 10*time.Millisecond)

		b.token = "plain"
		b.fixed.Store(true)
		r = b.do(t, http.MethodPost, "/api/instances/"+id+"/retry", `{"from": "fragile"}`)
		require.Equal(t, http.StatusOK, r.status, string(r.body))
		require.Eventually(t, func() bool { return b.status(t, id) == "completed" }, 10*time.Second, 10*time.Millisecond)

		var inst struct {
			Steps []struct {
				Name   string          `json:"name"`
				Output json.RawMessage `json:"output"`
			} `json:"steps"`
			Events []struct {
				Type, Step, Message, Actor string
			} `json:"events"`
		}
		require.NoError(t, json.Unmarshal(b.do(t, http.MethodGet, "/api/instances/"+id, "").body, &inst))
		require.JSONEq(t, `{"ok": true}`, string(inst.Steps[1].Output), "run again from the step")
		actors := map[string]string{}
		for _, e := range inst.Events {
			if e.Actor != "" {
				actors[e.Type+" "+e.Step+" "+e.Message] = e.Actor
			}
		}
		require.Equal(t, "alice", actors["step.completed fragile "+storage.SkippedByHand])
		require.Equal(t, "api", actors["instance.retried  from fragile"], "the plain token is named api")

		pending := b.start(t, "greet", `{"input": {"name": "Bo"}}`)
		r = b.do(t, http.MethodPost, "/api/instances/"+pending+"/pause", ``)
		if r.status == http.StatusOK {
			require.Contains(t, string(r.body), `"type":"instance.paused","actor":"api"`)
			// It may have finished meanwhile: its running step was not held.
			r = b.do(t, http.MethodPost, "/api/instances/"+pending+"/resume", ``)
			require.Contains(t, []int{http.StatusOK, http.StatusConflict}, r.status, string(r.body))
		} else {
			requireError(t, r, http.StatusConflict, "only a pending or running instance can be paused")
		}
		require.Eventually(t, func() bool { return b.status(t, pending) == "completed" }, 10*time.Second, 10*time.Millisecond)
	})
}

// TestBulkOperations cancels and retries by filter and by IDs.
func TestBulkOperations(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, nil)
	var ids []string
	for range 3 {
		ids = append(ids, b.start(t, "greet", `{"input": {"name": "Ada"}}`))
	}
	r := b.do(t, http.MethodPost, "/api/instances/cancel", `{"ids": ["`+ids[0]+`", "no-such-id"]}`)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	require.JSONEq(t, `{"count": 1, "skipped": {"no-such-id": "no instance with ID \"no-such-id\""}}`, string(r.body))
	r = b.do(t, http.MethodPost, "/api/instances/cancel", `{"workflow": "greet", "status": "pending"}`)
	require.JSONEq(t, `{"count": 2}`, string(r.body))
	r = b.do(t, http.MethodPost, "/api/instances/retry", `{"workflow": "greet", "olderThan": "1d"}`)
	require.JSONEq(t, `{"count": 0}`, string(r.body), "none is a day old")
	r = b.do(t, http.MethodPost, "/api/instances/retry", `{"status": "cancelled"}`)
	require.JSONEq(t, `{"count": 3}`, string(r.body))
	for _, id := range ids {
		require.Equal(t, "pending", b.status(t, id), "no step of it was ever claimed")
	}
}

// status reads an instance's status through the API.
func (b *testBundle) status(t *testing.T, id string) string {
	t.Helper()
	r := b.do(t, http.MethodGet, "/api/instances/"+id, "")
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	s, _ := r.json(t)["status"].(string)
	return s
}

func TestCheckTokenName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"ops@example.com", true},
		{"CI-bot_2", true},
		{strings.Repeat("a", 64), true},
		{strings.Repeat("a", 65), false},
		{"", false},
		{"@leading", false},
		{"with space", false},
		{"new\nline", false},
	} {
		err := web.CheckTokenName(tc.name)
		if tc.ok {
			require.NoError(t, err, "%q", tc.name)
		} else {
			require.ErrorContains(t, err, "invalid token name", "%q", tc.name)
		}
	}
}
