package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestFencingStaleWorker pauses a worker (SIGSTOP) in the middle of a step
// for longer than its lease, so that another worker takes the step over
// and runs it again. When the paused worker resumes (SIGCONT) its handler
// returns too, but its claim is stale: its result is rejected and logged,
// and the output of the newer attempt stands.
func TestFencingStaleWorker(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, db string) {
		probe := newRelProbe(t, 0)
		release := make(chan struct{})
		// The first execution is held until the stale worker is about to
		// resume; later ones answer at once.
		probe.setHold(func(r relRequest) <-chan struct{} {
			if r.N == 1 {
				return release
			}
			return nil
		})
		e := newEnv(t, db, map[string]string{"fence.yaml": probeWorkflow("fence", probeStep{name: "a"})})
		stale := e.spawnPlain(t, "worker", "--concurrency", "1", "--lease", "1s", "--poll", "100ms")
		id := strings.TrimSpace(e.mustRun(t, "start", "fence", "--input", probe.input(), "--detach").stdout)
		first := probe.next(t, 30*time.Second, "the first worker to run the step")
		require.Equal(t, id+"/a", first.Key)

		stale.signal(t, syscall.SIGSTOP)
		fresh := e.spawnPlain(t, "worker", "--lease", "1s", "--poll", "100ms")
		second := probe.next(t, 30*time.Second, "the second worker to take the step over")
		require.Equal(t, 2, second.N)
		waitFor(t, 30*time.Second, "the newer attempt to complete the instance", func() bool {
			return e.status(t, id).Status == "completed"
		})

		// The first execution answers while its worker is still stopped,
		// so its result is ready the moment the worker resumes. The
		// database is kept busy for the first half second after the
		// resume, so that the result reaches the store's fence: otherwise
		// the worker's first heartbeat may learn of the takeover first and
		// drop the result itself ("stopping handler"), which is as safe
		// but leaves the store's fence unexercised.
		close(release)
		waitFor(t, 10*time.Second, "the held request to be answered", func() bool { return probe.inFlight() == 0 })
		unlock := lockSteps(t, db)
		stale.signal(t, syscall.SIGCONT)
		time.Sleep(500 * time.Millisecond)
		unlock()
		waitFor(t, 30*time.Second, "the resumed worker's result to be rejected", func() bool {
			return strings.Contains(stale.stderr.String(), "stale result rejected")
		})

		inst, expired := requireExactlyOnce(t, e, id, nil)
		require.Equal(t, 1, expired)
		a := inst.Steps[inst.step(t, "a")]
		require.Equal(t, 2, a.Attempts)
		var out struct {
			Body struct{ Seq, N int } `json:"body"`
		}
		require.NoError(t, json.Unmarshal(a.Output, &out))
		require.Equal(t, 2, out.Body.N, "the output is the second execution's")
		require.Equal(t, second.Seq, out.Body.Seq)
		require.JSONEq(t, fmt.Sprintf(`{"seq": %d}`, second.Seq), string(inst.Output))
		require.Regexp(t, `stale result rejected.* instance=`+id+` step=a attempt=1`, stale.stderr.String())
		requests, _ := probe.snapshot()
		require.Equal(t, 2, requests[id+"/a"])
		stale.stop(t)
		fresh.stop(t)
	})
}

// lockSteps blocks every write to the steps table (reads go on) until the
// returned func is called: a database that is briefly slow.
func lockSteps(t *testing.T, db string) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	if strings.HasPrefix(db, "postgres") {
		conn, err := pgx.Connect(ctx, db)
		require.NoError(t, err)
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "LOCK TABLE dagrun.steps IN EXCLUSIVE MODE")
		require.NoError(t, err)
		return func() {
			require.NoError(t, tx.Rollback(ctx))
			require.NoError(t, conn.Close(ctx))
		}
	}
	sqlDB := openSQLite(t, db)
	conn, err := sqlDB.Conn(ctx)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE")
	require.NoError(t, err)
	return func() {
		_, err := conn.ExecContext(ctx, "ROLLBACK")
		require.NoError(t, err)
		require.NoError(t, conn.Close())
	}
}
