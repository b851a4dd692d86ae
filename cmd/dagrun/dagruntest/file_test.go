package dagruntest_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/dagruntest"
	"github.com/dagrun/dagrun/dag"
)

const parseWorkflow = `
name: pay
steps:
  - name: charge
    handler: billing.charge
  - name: approval
    dependsOn: [charge]
    wait: {signal: approve}
`

// nightlyWorkflow has two schedules.
const nightlyWorkflow = `
name: nightly
schedule:
  - {cron: "0 3 * * *"}
  - {cron: "0 12 * * 0"}
steps:
  - {name: report, handler: noop}
`

func parseWorkflows(t *testing.T) []*dag.Workflow {
	t.Helper()
	var out []*dag.Workflow
	for _, src := range []string{parseWorkflow, nightlyWorkflow} {
		w, err := dag.Parse("", []byte(src), nil)
		require.NoError(t, err)
		out = append(out, w)
	}
	return out
}

func TestParseReadsEveryPart(t *testing.T) {
	t.Parallel()
	f, err := dagruntest.Parse("pay_test.yaml", []byte(`
workflow: pay
steps:
  charge: {output: shared}
cases:
  - name: own mocks win
    input: {amount: 3, day: 2030-01-03}
    start: 2031-02-03T04:05:06Z
    runFor: 1h
    steps:
      charge: [{error: busy}, {permanentError: declined}, {real: true}, {output: {id: 1}}]
    signals:
      - {name: approve, data: {ok: true}, id: s-1, after: 30m, error: finished}
    expect:
      status: completed
      outputContains: {id: 1}
      steps:
        charge: {status: completed, attempts: 4, input: {amount: 3}, error: x}
      events: [charge.retrying, instance.completed]
  - name: shared mocks
`), parseWorkflows(t))
	require.NoError(t, err)
	require.Equal(t, "pay", f.Workflow)
	require.Len(t, f.Cases, 2)

	c := f.Cases[0]
	require.Equal(t, "own mocks win", c.Name)
	require.JSONEq(t, `{"amount": 3, "day": "2030-01-03"}`, string(c.Input), "an unquoted date is text, as in a workflow file")
	require.Equal(t, time.Date(2031, 2, 3, 4, 5, 6, 0, time.UTC), c.Start)
	require.Equal(t, time.Hour, c.RunFor)
	require.Equal(t, []dagruntest.Reply{
		{Error: "busy"}, {PermanentError: "declined"}, {Real: true}, {Output: json.RawMessage(`{"id":1}`)},
	}, c.Mocks["charge"].Replies)
	require.Len(t, c.Signals, 1)
	s := c.Signals[0]
	require.Equal(t, "approve", s.Name)
	require.JSONEq(t, `{"ok": true}`, string(s.Data))
	require.Equal(t, "s-1", s.ID)
	require.Equal(t, 30*time.Minute, s.After)
	require.Equal(t, "finished", *s.Error)
	require.Equal(t, "completed", *c.Expect.Status)
	require.Equal(t, &dagruntest.Match{Value: map[string]any{"id": 1.0}, Partial: true}, c.Expect.Output)
	require.Len(t, c.Expect.Steps, 1)
	require.Equal(t, 4, *c.Expect.Steps[0].Attempts)
	require.Equal(t, []string{"charge.retrying", "instance.completed"}, c.Expect.Events)

	shared := f.Cases[1]
	require.Equal(t, dagruntest.DefaultStart, shared.Start)
	require.JSONEq(t, `{}`, string(shared.Input))
	require.Equal(t, []dagruntest.Reply{{Output: json.RawMessage(`"shared"`)}}, shared.Mocks["charge"].Replies)
}

func TestParseRejectsWhatCannotRun(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, src, want string }{
		{name: "Empty", src: ``, want: "t.yaml:1:1: the test file is empty: it needs workflow: and cases:"},
		{name: "BadYAML", src: "workflow: [", want: "t.yaml:1:11: invalid YAML"},
		{name: "MisindentedKey", src: "workflow: pay\ncases:\n  - name: x\n    input: {}\n   runFor: 1h\n",
			want: "t.yaml:5:4: invalid YAML: did not find expected '-' indicator"},
		{name: "NoCases", src: "workflow: pay\n", want: "t.yaml:1:1: cases: is required: a list of test cases"},
		{name: "MockOfAWaitStep", src: "workflow: pay\ncases:\n  - name: x\n    steps: {approval: {output: 1}}\n",
			want: `t.yaml:4:13: steps: step "approval" runs no handler, so there is nothing to mock (send a wait step's signal under signals:;`},
		{name: "MockOfAStepOfAnUnknownWorkflow", src: "workflow: pay\ncases:\n  - name: x\n    steps: {ship/label: {output: 1}}\n",
			want: `t.yaml:4:13: steps: unknown workflow "ship" (available: nightly, pay)`},
		{name: "EmptyReplyList", src: "workflow: pay\ncases:\n  - name: x\n    steps: {charge: []}\n",
			want: "t.yaml:4:21: steps.charge: a list of replies needs at least one"},
		{name: "NegativeRunFor", src: "workflow: pay\ncases:\n  - name: x\n    runFor: -1h\n",
			want: "t.yaml:4:13: runFor must be a duration of workflow time, like 24h"},
		{name: "ZeroRunFor", src: "workflow: pay\ncases:\n  - name: x\n    runFor: 0s\n",
			want: "t.yaml:4:13: runFor must be more than 0s"},
		{name: "SecondDocument", src: "workflow: pay\ncases:\n  - name: x\n---\nworkflow: pay\n",
			want: "t.yaml:4:1: a test file holds one YAML document"},
		{name: "BadStart", src: "workflow: pay\ncases:\n  - name: x\n    start: tomorrow\n",
			want: "t.yaml:4:12: start must be an RFC 3339 time"},
		{name: "CaseWithoutName", src: "workflow: pay\ncases:\n  - input: {}\n", want: "t.yaml:3:5: a case needs a name:"},
		{name: "ScheduledByName", src: "workflow: nightly\ncases:\n  - name: x\n    scheduled: first\n",
			want: "t.yaml:4:16: scheduled must be true or the index of a schedule (0 for the first)"},
		{name: "ScheduledNegative", src: "workflow: nightly\ncases:\n  - name: x\n    scheduled: -1\n",
			want: "t.yaml:4:16: scheduled must be true or the index of a schedule (0 for the first)"},
		{name: "ScheduledPastTheLast", src: "workflow: nightly\ncases:\n  - name: x\n    scheduled: 2\n",
			want: "t.yaml:4:16: workflow nightly has no schedule 2: its schedules are numbered 0 to 1"},
		{name: "ScheduledWithoutASchedule", src: "workflow: pay\ncases:\n  - name: x\n    scheduled: 0\n",
			want: "t.yaml:4:16: workflow pay has no schedule: to start it, give an input instead"},
	}
	t.Run("EveryError", func(t *testing.T) {
		t.Parallel()
		_, err := dagruntest.Parse("t.yaml", []byte("workflow: pay\ncases:\n  - name: x\n    bogus: 1\n  - name: y\n    runFor: 0s\n"), parseWorkflows(t))
		require.ErrorContains(t, err, `unknown key "bogus"`)
		require.ErrorContains(t, err, "t.yaml:6:13: runFor must be more than 0s", "an earlier case's error hides no other")
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := dagruntest.Parse("t.yaml", []byte(tt.src), parseWorkflows(t))
			var list dag.ErrorList
			require.ErrorAs(t, err, &list)
			require.Contains(t, list[0].Error(), tt.want)
		})
	}
}
