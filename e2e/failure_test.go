package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const slowPayYAML = `name: slow-pay
timeout: 1s
steps:
  - name: charge
    handler: echo
    input: {amount: 10}
  - name: settle
    handler: sleep
    dependsOn: [charge]
    input: {duration: 1h}
output: ${{ steps.settle.output }}
onFailure:
  - name: refund
    handler: echo
    input:
      amount: ${{ steps.charge.output.amount }}
      error: ${{ workflow.error }}
      failedStep: ${{ workflow.failedStep }}
      settle: ${{ steps.settle.status }}
`

const badItemYAML = `name: bad-item
steps:
  - name: pick
    handler: echo
    input: ${{ input.items[3] }}
onFailure:
  - name: report
    handler: echo
    input: {error: "${{ workflow.error }}", step: "${{ workflow.failedStep }}"}
  - name: done
    handler: echo
    dependsOn: [report]
`

// failureInstance is the part of the instance object these tests read
// beyond instance.
type failureInstance struct {
	Status     string  `json:"status"`
	Error      *string `json:"error"`
	FailedStep *string `json:"failedStep"`
	Timeout    string  `json:"timeout"`
	Steps      []struct {
		Name      string          `json:"name"`
		Status    string          `json:"status"`
		Output    json.RawMessage `json:"output"`
		OnFailure bool            `json:"onFailure"`
	} `json:"steps"`
}

// TestWorkflowTimeoutRunsOnFailureStepsThroughTheBinary starts, through
// the binary, an instance that durably sleeps past its workflow timeout
// (no handler runs while it sleeps): it fails with the timeout after its
// onFailure step ran, which saw the failure and the main steps.
func TestWorkflowTimeoutRunsOnFailureStepsThroughTheBinary(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, db string) {
		e := newEnv(t, db, map[string]string{"slow-pay.yaml": slowPayYAML, "bad-item.yaml": badItemYAML})
		e.mustRun(t, "validate")
		res := e.run(t, "start", "slow-pay", "--json")
		require.Equal(t, 1, res.code, "a failed instance exits 1\n%s", res.stderr)
		require.Contains(t, res.stderr, "failed (workflow timed out after 1s); running its onFailure steps")
		require.Contains(t, res.stderr, "refund       completed")
		var inst failureInstance
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &inst), res.stdout)
		require.Equal(t, "failed", inst.Status)
		require.NotNil(t, inst.Error)
		require.Equal(t, "workflow timed out after 1s", *inst.Error)
		require.Nil(t, inst.FailedStep, "no step failed it")
		require.Equal(t, "1s", inst.Timeout)
		var names []string
		for _, s := range inst.Steps {
			names = append(names, s.Name+"="+s.Status)
			require.Equal(t, s.Name == "refund", s.OnFailure, s.Name)
		}
		require.Equal(t, []string{"charge=completed", "settle=cancelled", "refund=completed"}, names)
		require.JSONEq(t, `{"amount": 10, "error": "workflow timed out after 1s", "failedStep": "", "settle": "cancelled"}`,
			string(inst.Steps[2].Output))

		// An expression that fails fails its step; the onFailure steps
		// run, and the instance fails with the original error.
		res = e.run(t, "start", "bad-item", "--input", `{"items": [1]}`, "--json")
		require.Equal(t, 1, res.code, res.stderr)
		inst = failureInstance{}
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &inst), res.stdout)
		require.Equal(t, "failed", inst.Status)
		require.NotNil(t, inst.FailedStep)
		require.Equal(t, "pick", *inst.FailedStep)
		require.True(t, strings.HasPrefix(*inst.Error, "step pick failed: input: "), *inst.Error)
		var report struct{ Error, Step string }
		require.NoError(t, json.Unmarshal(inst.Steps[1].Output, &report))
		require.Equal(t, *inst.Error, report.Error)
		require.Equal(t, "pick", report.Step)
		require.Equal(t, "completed", inst.Steps[2].Status)

		// status marks the onFailure steps and names the failed step.
		var id struct{ ID string }
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &id))
		text := e.mustRun(t, "status", id.ID).stdout
		require.Contains(t, text, "Failed step:  pick")
		require.Contains(t, text, "report (onFailure)")
		require.Contains(t, text, "done (onFailure)")
	})
}
