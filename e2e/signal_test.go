package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const approvalRaceYAML = `name: approval-race
steps:
  - name: approve
    wait:
      schema: {type: object, required: [by], properties: {by: {type: string}}}
output: ${{ steps.approve.output }}
`

const approvalLapseYAML = `name: approval-lapse
steps:
  - name: approve
    wait: {timeout: 1s}
`

// TestTwoSignalProcessesRaceForOneWaitStep starts two dagrun signal
// processes at once for the same waiting step, with different signal IDs,
// a few times over: each time exactly one delivers and the other exits 1
// with the conflict, and the instance's output is the winner's payload.
func TestTwoSignalProcessesRaceForOneWaitStep(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, db string) {
		e := newEnv(t, db, map[string]string{"approval-race.yaml": approvalRaceYAML})
		for round := range 3 {
			res := e.mustRun(t, "start", "approval-race", "--detach")
			id := strings.TrimSpace(res.stdout)
			require.Equal(t, "waiting", e.status(t, id).Steps[0].Status)
			senders := map[string]*process{}
			for _, who := range []string{"left", "right"} {
				senders[who] = e.spawn(t, "signal", id, "approve", "--id", who, "--data", fmt.Sprintf(`{"by": %q}`, who))
			}
			winners := []string{}
			for who, p := range senders {
				switch code := p.wait(t, time.Minute); code {
				case 0:
					require.Equal(t, "delivered signal approve to instance "+id+"\n", p.stdout.String())
					winners = append(winners, who)
				case 1:
					require.Contains(t, p.stderr.String(), "signal approve was already sent to instance "+id+" and delivered")
				default:
					t.Fatalf("round %d: dagrun signal --id %s exited %d:\n%s", round, who, code, p.stderr.String())
				}
			}
			require.Len(t, winners, 1, "round %d: exactly one sender delivers", round)
			inst := e.status(t, id)
			require.Equal(t, "completed", inst.Status)
			var out struct{ By string }
			require.NoError(t, json.Unmarshal(inst.Output, &out))
			require.Equal(t, winners[0], out.By, "the winner's payload is the output")
		}
	})
}

// TestWaitTimesOutAcrossProcesses starts an instance whose wait step times
// out after a second, with a worker in another process: the step fails
// with the timeout, and the instance with it.
func TestWaitTimesOutAcrossProcesses(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, db string) {
		e := newEnv(t, db, map[string]string{"approval-lapse.yaml": approvalLapseYAML})
		id := strings.TrimSpace(e.mustRun(t, "start", "approval-lapse", "--detach").stdout)
		worker := e.spawn(t, "worker")
		waitFor(t, time.Minute, "the wait to time out", func() bool { return e.status(t, id).Status == "failed" })
		worker.stop(t)
		inst := e.status(t, id)
		approve := inst.Steps[inst.step(t, "approve")]
		require.Equal(t, "failed", approve.Status)
		require.NotNil(t, approve.Error)
		require.Equal(t, "no signal approve within 1s", *approve.Error)
		res := e.run(t, "signal", id, "approve")
		require.Equal(t, 1, res.code, res.stderr)
		require.Equal(t, "dagrun: instance "+id+" is already failed and takes no more signals\n", res.stderr)
	})
}
