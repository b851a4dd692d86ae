package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app"
)

// TestSignal sends signals to a waiting refund and records every answer,
// each with its exit code, in testdata/signal.golden.
func TestSignal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.run(t, "", "start", "refund", "--detach", "--key", "order-7")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	id := maskUUID.FindString(res.stdout)
	require.NotEmpty(t, id, res.stdout)
	res = b.run(t, "", "status", id)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	golden(t, "status-waiting", mask(res.stdout))
	res = b.run(t, "", "status", id, "--json")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Contains(t, res.stdout, `"signal": "approve"`)
	require.Contains(t, res.stdout, `"deadline": "`)

	res = b.run(t, "", "stats", "--json")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Regexp(t, `"workflow": "refund",[^]]*"waitingSteps": 1,`, res.stdout)

	other := maskUUID.FindString(b.run(t, "", "start", "refund", "--detach").stdout)
	require.Equal(t, app.ExitOK, b.run(t, "", "cancel", other).code)

	cases := []struct {
		args  []string
		stdin string
		code  int
	}{
		{args: []string{"signal", id, "aprove"}, code: app.ExitUsage},
		{args: []string{"signal", id, "approve", "--data", `{"approved": "yes"}`}, code: app.ExitUsage},
		{args: []string{"signal", id, "approve", "--data", `{approved: true}`}, code: app.ExitUsage},
		{args: []string{"signal", id, "approve", "--data", "@nope.json"}, code: app.ExitUsage},
		{args: []string{"signal", "no-such-id", "approve"}, code: app.ExitUsage},
		{args: []string{"signal", "--workflow", "refund", "--key", "order-8", "approve"}, code: app.ExitUsage},
		{args: []string{"signal", "--workflow", "refnd", "--key", "order-8", "approve"}, code: app.ExitUsage},
		{args: []string{"signal", "--workflow", "refund", "approve"}, code: app.ExitUsage},
		{args: []string{"signal", id, "approve", "--workflow", "refund", "--key", "order-7"}, code: app.ExitUsage},
		{args: []string{"signal", id}, code: app.ExitUsage},
		{args: []string{"signal", id, ""}, code: app.ExitUsage},
		{args: []string{"signal", "", "approve"}, code: app.ExitUsage},
		{args: []string{"signal", id, "approve", "--id", strings.Repeat("a", 600)}, code: app.ExitUsage},
		{args: []string{"signal", other, "approve", "--data", `{"approved": true}`}, code: app.ExitFailed},
		{args: []string{"signal", "--workflow", "refund", "--key", "order-7", "approve", "--data", "-", "--id", "evt-1"},
			stdin: `{"approved": true}`, code: app.ExitOK},
		{args: []string{"signal", id, "approve", "--data", `{"approved": true}`, "--id", "evt-1"}, code: app.ExitOK},
		{args: []string{"signal", id, "approve", "--data", `{"approved": false}`, "--id", "evt-2"}, code: app.ExitFailed},
	}
	var report strings.Builder
	for _, c := range cases {
		res := b.run(t, c.stdin, c.args...)
		require.Equal(t, c.code, res.code, "dagrun %q\n%s", c.args, res.stderr)
		fmt.Fprintf(&report, "$ dagrun %s\n%s%s(exit %d)\n\n", strings.Join(quoteArgs(c.args), " "), res.stdout, res.stderr, res.code)
	}
	golden(t, "signal", strings.ReplaceAll(strings.ReplaceAll(report.String(), id, "<ID>"), other, "<CANCELLED>"))

	// The delivered signal's payload is the step's output.
	res = b.run(t, "", "status", id, "--json")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Contains(t, res.stdout, `"output": {`)

	// Who delivered it is listed by hand, and in the history, marked,
	// before what the engine did next.
	res = b.run(t, "", "status", id)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	byHand, history, ok := strings.Cut(res.stdout, "\nHistory:\n")
	require.True(t, ok, res.stdout)
	require.Regexp(t, `\nBy hand:\n  \S+  step.completed \S+: signal approve received \(by cli\)\n`, byHand)
	require.Regexp(t, `step.completed approve: signal approve received \(by cli\)\n.*step.ready payout\n`, history)
}

// TestStatusShowsWhenAPendingStepRuns shows a delayed start's first step
// with the time it runs at.
func TestStatusShowsWhenAPendingStepRuns(t *testing.T) {
	t.Parallel()
	out := delayedStatus(t, "status-delayed", "greet")
	require.Contains(t, out, `"runAfter": "`)
}

// delayedStatus starts workflow with a delay of 2h and more start args,
// compares its status with the golden file name, and returns its status
// --json.
func delayedStatus(t *testing.T, name, workflow string, args ...string) string {
	t.Helper()
	b := setup(t)
	res := b.run(t, "", append([]string{"start", workflow, "--detach", "--delay", "2h"}, args...)...)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	id := maskUUID.FindString(res.stdout)
	res = b.run(t, "", "status", id)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	golden(t, name, mask(res.stdout))
	res = b.run(t, "", "status", id, "--json")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	return res.stdout
}

// TestStatusShowsWhenADelayedInstanceStarts: a delayed instance whose
// first step is a forEach leaves it blocked until its time, so the
// instance itself says when it starts.
func TestStatusShowsWhenADelayedInstanceStarts(t *testing.T) {
	t.Parallel()
	out := delayedStatus(t, "status-delayed-instance", "fanout", "--input", `{"numbers": [1, 2]}`)
	var inst struct {
		RunAfter string `json:"runAfter"`
		Steps    []struct {
			Status   string `json:"status"`
			RunAfter string `json:"runAfter"`
		} `json:"steps"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &inst))
	require.NotEmpty(t, inst.RunAfter)
	require.Equal(t, "blocked", inst.Steps[0].Status)
	require.Empty(t, inst.Steps[0].RunAfter)
}

// TestStartFollowsAWaitUntilItsSignal follows a refund with start, which
// shows the wait and returns once a signal sent by another command
// completes it.
func TestStartFollowsAWaitUntilItsSignal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	done := make(chan runResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		done <- b.runContext(ctx, "start", "refund", "--key", "order-9")
	}()
	require.Eventually(t, func() bool {
		return b.run(t, "", "signal", "--workflow", "refund", "--key", "order-9", "approve", "--data", `{"approved": true}`).code == app.ExitOK
	}, 30*time.Second, 10*time.Millisecond)
	res := <-done
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.JSONEq(t, `{"approved": true}`, res.stdout)
	require.Contains(t, res.stderr, "approve      waiting for signal approve\n")
	require.Contains(t, res.stderr, "approve      completed: signal approve received\n")
}

// TestStatusPrintsNoTerminalControls: a key a client chose reaches the
// terminal neither as an escape sequence nor as a line of its own.
func TestStatusPrintsNoTerminalControls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.run(t, "", "start", "refund", "--detach", "--key", "A-1\x1b[31m\nStatus:    completed")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	id := maskUUID.FindString(res.stdout)
	res = b.run(t, "", "status", id)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.NotContains(t, res.stdout, "\x1b")
	require.Contains(t, res.stdout, `Key:       "A-1\x1b[31m\nStatus:    completed"`)
}
