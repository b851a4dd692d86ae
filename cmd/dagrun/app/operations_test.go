package app_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app"
)

// TestOperations repairs a failed checkout by hand (skip, pause, resume,
// retry --from) and cancels and retries in bulk, recording every answer
// and refusal, each with its exit code, in testdata/operations.golden.
func TestOperations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.run(t, "", "start", "checkout", "--input", `{"orderId": "A-7"}`)
	require.Equal(t, app.ExitFailed, res.code, res.stderr)
	id := maskUUID.FindString(res.stderr)
	require.NotEmpty(t, id)
	for range 2 {
		require.Equal(t, app.ExitOK, b.run(t, "", "start", "greet", "--detach", "--input", `{"name": "Ada"}`).code)
	}

	cases := []struct {
		args []string
		code int
	}{
		{[]string{"retry", id, "--from", "nope"}, app.ExitUsage},
		{[]string{"skip", id, "reserve"}, app.ExitUsage},
		{[]string{"skip", id, "nope"}, app.ExitUsage},
		{[]string{"skip", "no-such-id", "charge"}, app.ExitUsage},
		{[]string{"skip", id, "charge", "--output", `{paid: true}`}, app.ExitUsage},
		{[]string{"skip", id, "charge", "--output", "@no-such-file.json"}, app.ExitUsage},
		{[]string{"pause", id}, app.ExitUsage},
		{[]string{"resume", id}, app.ExitUsage},
		{[]string{"skip", id, "charge", "--output", `{"paid": true}`}, app.ExitOK},
		{[]string{"retry", id, "--from", "charge"}, app.ExitUsage},
		{[]string{"pause", id}, app.ExitOK},
		{[]string{"pause", id}, app.ExitUsage},
		{[]string{"resume", id}, app.ExitOK},
		{[]string{"resume", id}, app.ExitUsage},
		{[]string{"cancel", "--older-than", "1d"}, app.ExitUsage},
		{[]string{"cancel", id, "--workflow", "greet"}, app.ExitUsage},
		{[]string{"cancel", "--status", "stuck"}, app.ExitUsage},
		{[]string{"cancel", "--workflow", "greet", "--older-than", "soon"}, app.ExitUsage},
		{[]string{"retry", "--from", "charge"}, app.ExitUsage},
		{[]string{"cancel", "--workflow", "gret"}, app.ExitUsage},
		{[]string{"cancel", "--workflow", "greet", "--status", "pending", "--older-than", "1d"}, app.ExitOK},
		{[]string{"cancel", "--workflow", "greet", "--status", "pending"}, app.ExitOK},
		{[]string{"retry", "--workflow", "greet", "--status", "cancelled"}, app.ExitOK},
		{[]string{"serve", "--named-token", "s3cret"}, app.ExitUsage},
		{[]string{"serve", "--named-token", "bad name=s3cret"}, app.ExitUsage},
		{[]string{"serve", "--named-token", "ops= s3cret"}, app.ExitUsage},
		{[]string{"serve", "--named-token", "api=s3cret"}, app.ExitUsage},
		{[]string{"serve", "--named-token", "cli=s3cret"}, app.ExitUsage},
		{[]string{"serve", "--token", "s3cret", "--named-token", "ops=s3cret"}, app.ExitUsage},
		{[]string{"serve", "--named-token", "ops=s3cret", "--named-token", "dev=s3cret"}, app.ExitUsage},
		{[]string{"serve", "--token", " "}, app.ExitUsage},
		{[]string{"serve", "--token", "s3cret "}, app.ExitUsage},
		{[]string{"serve", "--token", "s3c\tret"}, app.ExitUsage},
	}
	var report strings.Builder
	for _, c := range cases {
		res := b.run(t, "", c.args...)
		require.Equal(t, c.code, res.code, "dagrun %q\n%s", c.args, res.stderr)
		if c.code == app.ExitUsage {
			require.Equal(t, 1, strings.Count(res.stderr, "\n"), "one line: %s", res.stderr)
		}
		fmt.Fprintf(&report, "$ dagrun %s\n%s%s(exit %d)\n\n", strings.Join(quoteArgs(c.args), " "), res.stdout, res.stderr, res.code)
	}
	golden(t, "operations", strings.ReplaceAll(report.String(), id, "<ID>"))

	res = b.run(t, "", "pause", id)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	res = b.run(t, "", "status", id)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	golden(t, "status-operations", mask(res.stdout))
	res = b.run(t, "", "status", id, "--json")
	require.Contains(t, res.stdout, `"paused": true`)
	require.Contains(t, res.stdout, `"actor": "cli"`)
	res = b.run(t, "", "list", "--workflow", "checkout")
	require.Contains(t, res.stdout, "running (paused)")
}

// TestStatusOfALongHistory: status reads only the latest events of an
// instance, and says so above what was done by hand among them.
func TestStatusOfALongHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := strings.TrimSpace(b.run(t, "", "start", "refund", "--detach").stdout)
	require.NotEmpty(t, id)
	for range 51 {
		for _, verb := range []string{"pause", "resume"} {
			res := b.run(t, "", verb, id)
			require.Equal(t, app.ExitOK, res.code, res.stderr)
		}
	}
	out := b.run(t, "", "status", id).stdout
	require.Contains(t, out, "\nBy hand (in the latest 100 events):\n")
	byHand, history, found := strings.Cut(out, "\nHistory")
	require.True(t, found, out)
	require.Equal(t, 100, strings.Count(byHand, "(by cli)"))
	require.Equal(t, 20, strings.Count(history, "(by cli)"), "the history's latest 20 events, each marked")
}

// TestBulkOperationsKnowAWorkflowByItsInstances: a workflow whose file is
// gone is still selected by its instances, as list shows them, whatever
// the selection's status; a name that neither a file nor an instance
// knows is refused as a typo.
func TestBulkOperationsKnowAWorkflowByItsInstances(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.run(t, "", "start", "greet", "--detach", "--input", `{"name": "Ada"}`)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	b.env["DAGRUN_WORKFLOWS"] = t.TempDir() // the file is gone

	cases := []struct {
		args   []string
		code   int
		stdout string
	}{
		{[]string{"cancel", "--workflow", "greet", "--status", "running"}, app.ExitOK, "cancelled 0 instances\n"},
		{[]string{"retry", "--workflow", "greet", "--status", "failed"}, app.ExitOK, "retried 0 instances\n"},
		{[]string{"cancel", "--workflow", "greet", "--older-than", "1h"}, app.ExitOK, "cancelled 0 instances\n"},
		{[]string{"cancel", "--workflow", "greet"}, app.ExitOK, "cancelled 1 instance\n"},
		{[]string{"retry", "--workflow", "greet", "--status", "cancelled", "--json"}, app.ExitOK, "{\n  \"count\": 1\n}\n"},
		{[]string{"cancel", "--workflow", "greet"}, app.ExitOK, "cancelled 1 instance\n"},
		{[]string{"cancel", "--workflow", "greet", "--status", "pending"}, app.ExitOK, "cancelled 0 instances\n"},
		{[]string{"cancel", "--workflow", "gret"}, app.ExitUsage, ""},
		{[]string{"cancel", "--workflow", "gret", "--status", "pending"}, app.ExitUsage, ""},
	}
	for _, c := range cases {
		res := b.run(t, "", c.args...)
		require.Equal(t, c.code, res.code, "dagrun %q\n%s", c.args, res.stderr)
		require.Equal(t, c.stdout, res.stdout, "dagrun %q", c.args)
		if c.code == app.ExitUsage {
			require.Equal(t, "dagrun: unknown workflow \"gret\": no workflows are loaded (put WORKFLOW.yaml files in the workflows folder)\n", res.stderr)
		}
	}
}

// TestStatusSaysWhatAHeldInstanceWaitsFor: an instance its workflow's
// concurrency limit holds says so in status and its JSON, even when its
// first step is a wait step, which is only blocked until it may start.
func TestStatusSaysWhatAHeldInstanceWaitsFor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "one-per-customer.yaml"), []byte(`name: one-per-customer
concurrency: {key: "${{ input.customer }}", limit: 1}
steps:
  - {name: approve, wait: {}}
`), 0o644))
	b.env["DAGRUN_WORKFLOWS"] = dir
	var ids []string
	for range 2 {
		res := b.run(t, "", "start", "one-per-customer", "--input", `{"customer": "c-1"}`, "--detach")
		require.Equal(t, app.ExitOK, res.code, res.stderr)
		ids = append(ids, strings.TrimSpace(res.stdout))
	}
	res := b.run(t, "", "status", ids[1])
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Contains(t, res.stdout, `the instance waits for a slot of its workflow's concurrency limit (key "c-1"): it starts when an instance of that key finishes`)
	var held struct {
		Held           bool   `json:"held"`
		ConcurrencyKey string `json:"concurrencyKey"`
	}
	res = b.run(t, "", "status", ids[1], "--json")
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &held))
	require.True(t, held.Held)
	require.Equal(t, "c-1", held.ConcurrencyKey)

	res = b.run(t, "", "status", ids[0])
	require.NotContains(t, res.stdout, "waits for a slot", "the first one runs")
}
