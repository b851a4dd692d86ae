package sqlite

import (
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// TestNextWakeReadsAWindowOfOthersSteps: a worker's next wake passes over
// at most wakeWalk delayed steps of handlers it lacks. With 150 of them
// due before its own, the wake is the time of the wakeWalk-th (none of its
// own falls due before), where reading on found its own step's time: a
// worker beside 200,000 delayed steps of another handler read all of them
// at each poll.
func TestNextWakeReadsAWindowOfOthersSteps(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "dagrun.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })

	var ps []storage.CreateParams
	for i := range 151 {
		handler := "theirs"
		if i == 150 {
			handler = "mine"
		}
		ps = append(ps, storage.CreateParams{
			ID: fmt.Sprintf("i%05d", i), Workflow: "wf", DefinitionHash: "h", Definition: []byte("x"),
			Steps: []storage.StepSpec{{Name: "a", Handler: handler, Queue: "q", Retry: storage.RetryPolicy{MaxAttempts: 1}}},
		})
	}
	_, err = s.CreateInstances(ctx, nil, ps, storagetest.Plan)
	require.NoError(t, err)
	claimed, err := s.ClaimSteps(ctx, storage.ClaimParams{WorkerID: "w", Limit: 200, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 151)

	base := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	mine := base.Add(10 * time.Hour)
	var results []storage.StepResult
	theirs := 0
	for _, c := range claimed {
		runAfter := mine
		if c.Handler == "theirs" {
			theirs++
			runAfter = base.Add(time.Duration(theirs) * time.Minute)
		}
		results = append(results, storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeSnooze, RunAfter: runAfter})
	}
	_, err = s.FinishSteps(ctx, results, storagetest.Plan)
	require.NoError(t, err)

	walk, err := strconv.Atoi(wakeWalk)
	require.NoError(t, err)
	next, err := s.NextWake(ctx, storage.ClaimParams{Handlers: []string{"mine"}})
	require.NoError(t, err)
	require.True(t, next.Equal(base.Add(time.Duration(walk)*time.Minute)), "wake %v: the %dth of the others' steps is at %v",
		next, walk, base.Add(time.Duration(walk)*time.Minute))
	next, err = s.NextWake(ctx, storage.ClaimParams{Handlers: []string{"theirs"}})
	require.NoError(t, err)
	require.True(t, next.Equal(base.Add(time.Minute)), "the others' own wake: %v", next)
}
