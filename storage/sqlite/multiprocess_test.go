package sqlite_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/sqlite"
)

// Environment of a child process of TestTwoProcesses.
const (
	envChildDB  = "DAGRUN_SQLITE_CHILD_DB"
	envChildOut = "DAGRUN_SQLITE_CHILD_OUT"
	envChildN   = "DAGRUN_SQLITE_CHILD_INSTANCES"
	envChildTag = "DAGRUN_SQLITE_CHILD_TAG"
)

const childInstances = 100 // per process, two steps each

// TestTwoProcesses runs two OS processes (this test binary, re-executed)
// against one new file: both migrate it at once, each creates instances,
// and both claim and finish every step until all instances completed. No
// step may be claimed twice, and no SQLITE_BUSY / "database is locked"
// error may surface.
func TestTwoProcesses(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	db := filepath.Join(dir, "shared.db")
	type child struct {
		cmd *exec.Cmd
		out string
		log strings.Builder
	}
	children := make([]*child, 2)
	for i := range children {
		c := &child{out: filepath.Join(dir, fmt.Sprintf("claims-%d.txt", i))}
		c.cmd = exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestTwoProcessesChild$", "-test.count=1", "-test.v")
		c.cmd.Env = append(os.Environ(),
			envChildDB+"="+db, envChildOut+"="+c.out,
			envChildN+"="+strconv.Itoa(2*childInstances), envChildTag+"="+strconv.Itoa(i))
		c.cmd.Stdout, c.cmd.Stderr = &c.log, &c.log
		require.NoError(t, c.cmd.Start())
		children[i] = c
	}
	// Every child is waited for before any is judged, and every failing
	// one's log shown: one that fails leaves its claims leased for a
	// minute, so the other then fails too, of a timeout, and its log alone
	// would hide why.
	var failed strings.Builder
	for i, c := range children {
		if err := c.cmd.Wait(); err != nil {
			fmt.Fprintf(&failed, "child %d: %v\n%s\n", i, err, c.log.String())
		}
	}
	require.Zero(t, failed.Len(), "%s", failed.String())
	claims := map[string]string{} // "step fence" -> child
	steps := map[string]int{}
	for i, c := range children {
		f, err := os.Open(c.out)
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			prev, dup := claims[line]
			require.False(t, dup, "claim %q taken by child %s and child %d", line, prev, i)
			claims[line] = strconv.Itoa(i)
			steps[strings.Fields(line)[0]]++
		}
		require.NoError(t, sc.Err())
		require.NoError(t, f.Close())
	}
	require.Len(t, steps, 2*2*childInstances, "every step claimed")
	for id, n := range steps {
		require.Equal(t, 1, n, "step %s claimed %d times", id, n)
	}
	s, err := sqlite.Open(t.Context(), db, nil)
	require.NoError(t, err)
	defer s.Close()
	st, err := s.Stats(t.Context())
	require.NoError(t, err)
	require.Len(t, st.Workflows, 1)
	require.Equal(t, 2*childInstances, st.Workflows[0].Instances[storage.InstanceCompleted])
}

// TestTwoProcessesChild is the child process of TestTwoProcesses.
func TestTwoProcessesChild(t *testing.T) {
	path := os.Getenv(envChildDB)
	if path == "" {
		t.Skip("runs only as a child of TestTwoProcesses")
	}
	total, err := strconv.Atoi(os.Getenv(envChildN))
	require.NoError(t, err)
	tag := os.Getenv(envChildTag)
	out, err := os.Create(os.Getenv(envChildOut))
	require.NoError(t, err)
	defer out.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := sqlite.Open(ctx, path, nil)
	require.NoError(t, err)
	defer s.Close()

	plan := func(st *storage.InstanceState) (*storage.Plan, error) {
		p := &storage.Plan{}
		done := 0
		for _, step := range st.Steps {
			switch {
			case step.Status == storage.StepCompleted:
				done++
			case step.Status == storage.StepBlocked && (len(step.DependsOn) == 0 || st.Steps[0].Status == storage.StepCompleted):
				p.Steps = append(p.Steps, storage.StepChange{Name: step.Name, Status: storage.StepPending, Input: json.RawMessage(`{}`)})
			}
		}
		if done == len(st.Steps) {
			p.Instance = &storage.InstanceChange{Status: storage.InstanceCompleted}
		}
		return p, nil
	}
	// Create in small batches, interleaved with the other process.
	for i := 0; i < childInstances; i += 10 {
		var ps []storage.CreateParams
		for j := i; j < i+10; j++ {
			ps = append(ps, storage.CreateParams{
				// The key makes the transaction read before it writes.
				ID: fmt.Sprintf("p%s-%04d", tag, j), Key: fmt.Sprintf("k%s-%04d", tag, j),
				Workflow: "wf", DefinitionHash: "h", Definition: []byte("x"),
				Steps: []storage.StepSpec{{Name: "a"}, {Name: "b", DependsOn: []string{"a"}}},
			})
		}
		_, err := s.CreateInstances(ctx, nil, ps, plan)
		require.NoError(t, err)
	}
	for i := 0; ; i++ {
		// Recovery reads before it writes too, and runs beside claims.
		_, err := s.RecoverExpired(ctx, 10, plan)
		require.NoError(t, err)
		got, err := s.ClaimSteps(ctx, storage.ClaimParams{WorkerID: "p" + tag, Limit: 1 + i%4, Lease: time.Minute})
		require.NoError(t, err)
		if len(got) == 0 {
			st, err := s.Stats(ctx)
			require.NoError(t, err)
			if len(st.Workflows) == 1 && st.Workflows[0].Instances[storage.InstanceCompleted] == total {
				return
			}
			// The other process holds the remaining work, or has not
			// created it yet; other processes are not signalled, so poll.
			time.Sleep(time.Millisecond)
			continue
		}
		rs := make([]storage.StepResult, len(got))
		for j, c := range got {
			_, err := fmt.Fprintf(out, "%d %d\n", c.StepID, c.Fence)
			require.NoError(t, err)
			rs[j] = storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeCompleted, Output: json.RawMessage(`"` + tag + `"`)}
		}
		res, err := s.FinishSteps(ctx, rs, plan)
		require.NoError(t, err)
		for _, r := range res {
			require.True(t, r.Accepted)
		}
	}
}
