package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/internal/migrate"
	"github.com/dagrun/dagrun/storage/sqlite"
	"github.com/dagrun/dagrun/storage/storagetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// harness opens a fresh file per test; BeginTx opens a second pool on the
// same file, as an application with its own *sql.DB would.
func harness() storagetest.Harness {
	var paths sync.Map // storage.Store -> file path
	return storagetest.Harness{
		NewStore: func(t *testing.T, now func() time.Time) storage.Store {
			path := filepath.Join(t.TempDir(), "dagrun.db")
			s, err := sqlite.Open(t.Context(), path, &sqlite.Config{Now: now})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, s.Close()) })
			paths.Store(s, path)
			return s
		},
		BeginTx: func(t *testing.T, s storage.Store) (any, func() error, func() error) {
			path, ok := paths.Load(s)
			require.True(t, ok)
			db, err := sql.Open("sqlite3", sqlite.DSN(path.(string)))
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, db.Close()) })
			tx, err := db.BeginTx(t.Context(), nil)
			require.NoError(t, err)
			return tx, tx.Commit, tx.Rollback
		},
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	storagetest.Run(t, harness())
}

// TestConformanceNew runs the suite on a Store built by New on one
// caller-owned pool, reads and writes alike.
func TestConformanceNew(t *testing.T) {
	t.Parallel()
	h := harness()
	h.NewStore = func(t *testing.T, now func() time.Time) storage.Store {
		db, err := sql.Open("sqlite3", sqlite.DSN(filepath.Join(t.TempDir(), "dagrun.db")))
		require.NoError(t, err)
		db.SetMaxOpenConns(1)
		t.Cleanup(func() { require.NoError(t, db.Close()) })
		s, err := sqlite.New(db, &sqlite.Config{Now: now})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, s.Close()) })
		return s
	}
	h.BeginTx = nil // covered by TestConformance
	storagetest.Run(t, h)
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	t.Run("MissingFolder", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "no", "such", "dir", "dagrun.db")
		_, err := sqlite.Open(ctx, path, nil)
		require.ErrorIs(t, err, storage.ErrUnavailable)
		require.Contains(t, err.Error(), path)
		require.NotContains(t, err.Error(), "\n")
	})

	t.Run("NotADatabase", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "notes.txt")
		require.NoError(t, os.WriteFile(path, []byte(strings.Repeat("not a database\n", 100)), 0o600))
		_, err := sqlite.Open(ctx, path, nil)
		require.ErrorIs(t, err, storage.ErrUnavailable)
		require.Contains(t, err.Error(), "is not a SQLite database")
	})

	t.Run("Folder", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		_, err := sqlite.Open(ctx, dir, nil)
		require.ErrorIs(t, err, storage.ErrUnavailable)
		require.ErrorContains(t, err, "is a folder: name a file, such as "+filepath.Join(dir, "dagrun.db"))
	})

	t.Run("Device", func(t *testing.T) {
		t.Parallel()
		_, err := sqlite.Open(ctx, os.DevNull, nil)
		require.ErrorIs(t, err, storage.ErrUnavailable)
		require.ErrorContains(t, err, "is not a regular file (a character device): name a file")
	})

	t.Run("HardLinked", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		first := filepath.Join(dir, "a.db")
		store, err := sqlite.Open(ctx, first, nil)
		require.NoError(t, err)
		require.NoError(t, store.Close())
		second := filepath.Join(dir, "b.db")
		require.NoError(t, os.Link(first, second))
		for _, path := range []string{first, second} {
			_, err = sqlite.Open(ctx, path, nil)
			require.ErrorIs(t, err, storage.ErrUnavailable)
			require.ErrorContains(t, err, "has 2 hard links, and processes that open it by different names corrupt it: keep one name (a symbolic link is safe)")
		}
		require.NoError(t, os.Remove(second))
		store, err = sqlite.Open(ctx, first, nil)
		require.NoError(t, err, "one name again")
		require.NoError(t, store.Close())
	})

	t.Run("BadConfig", func(t *testing.T) {
		t.Parallel()
		_, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "x.db"), &sqlite.Config{ReadConns: -1})
		require.Error(t, err)
		_, err = sqlite.New(nil, nil)
		require.Error(t, err)
	})
}

// TestOpenWaitsForANewFileHeldByAnother: a process that opens a new file
// while another holds its write lock (two workers started at once on a new
// database, the other switching it to WAL or migrating it) waits for the
// lock, as any write does, rather than failing at once: SQLite refuses the
// switch to WAL without calling its busy handler then. So does a store on
// a pool of the caller's (New).
func TestOpenWaitsForANewFileHeldByAnother(t *testing.T) {
	t.Parallel()
	for name, open := range map[string]func(t *testing.T, path string) (*sqlite.Store, error){
		"Open": func(t *testing.T, path string) (*sqlite.Store, error) { return sqlite.Open(t.Context(), path, nil) },
		"New": func(t *testing.T, path string) (*sqlite.Store, error) {
			db, err := sql.Open("sqlite3", sqlite.DSN(path))
			require.NoError(t, err)
			t.Cleanup(func() { _ = db.Close() })
			return sqlite.New(db, nil)
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "new.db")
			other, err := sql.Open("sqlite3", path) // a process that has not switched it to WAL yet
			require.NoError(t, err)
			t.Cleanup(func() { _ = other.Close() })
			conn, err := other.Conn(t.Context())
			require.NoError(t, err)
			_, err = conn.ExecContext(t.Context(), `BEGIN IMMEDIATE`)
			require.NoError(t, err)
			time.AfterFunc(100*time.Millisecond, func() { _, _ = conn.ExecContext(context.Background(), `ROLLBACK`); _ = conn.Close() })

			s, err := open(t, path)
			require.NoError(t, err)
			require.NoError(t, s.Close())
		})
	}
}

// TestNewRefusesPoolWithoutDSNSettings: New refuses a pool that lacks
// what the store relies on, each with a message that names the setting and
// DSN: foreign keys (prune deletes an instance's steps and events through
// them), WAL (readers that do not wait for the writer), a busy timeout (a
// write that waits for another process's rather than failing) and
// transactions that take the write lock as they begin.
func TestNewRefusesPoolWithoutDSNSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, params, want string
	}{
		{"NoParameters", "", "foreign keys off"},
		{"ForeignKeysOff", "?_foreign_keys=off&_journal_mode=WAL", "foreign keys off"},
		{"RollbackJournal", "?_foreign_keys=on", "journal mode is delete, not WAL"},
		{"NoBusyTimeout", "?_foreign_keys=on&_journal_mode=WAL&_busy_timeout=0", "no busy timeout"},
		{"DeferredTransactions", "?_foreign_keys=on&_journal_mode=WAL&_busy_timeout=5000", "transactions begin DEFERRED"},
		{"DeferredTransactionsNamed", "?_foreign_keys=on&_journal_mode=WAL&_busy_timeout=5000&_txlock=deferred", "_txlock=immediate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, err := sql.Open("sqlite3", filepath.Join(t.TempDir(), "dagrun.db")+tc.params)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, db.Close()) })
			_, err = sqlite.New(db, nil)
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, "sqlite.DSN")
			require.NotContains(t, err.Error(), "\n")
			var tables int
			require.NoError(t, db.QueryRow(`SELECT count(*) FROM sqlite_master`).Scan(&tables))
			require.Zero(t, tables, "a refused pool's database is left as it was")
		})
	}
	db, err := sql.Open("sqlite3", sqlite.DSN(filepath.Join(t.TempDir(), "dagrun.db")))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	s, err := sqlite.New(db, nil)
	require.NoError(t, err)
	require.NoError(t, s.Close())
}

// TestNewReadsWhileTheCallerWrites: a store on the caller's pool reads
// while a transaction of that pool holds the write lock (one the caller
// passes to StartTx, still open), as readers of WAL do, instead of waiting
// for the lock as the pool's IMMEDIATE transactions would, and failing
// after the busy timeout.
func TestNewReadsWhileTheCallerWrites(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, err := sql.Open("sqlite3", sqlite.DSN(filepath.Join(t.TempDir(), "app.db")))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	s, err := sqlite.New(db, &sqlite.Config{BusyTimeout: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	_, err = tx.ExecContext(ctx, `CREATE TABLE orders (id TEXT)`)
	require.NoError(t, err, "the caller's transaction holds the write lock")
	// Bounded well below the busy timeout: a read that waits for the lock
	// fails with its context instead of after a minute.
	readCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	got, err := s.ListInstances(readCtx, storage.ListParams{Limit: 1})
	require.NoError(t, err)
	require.Empty(t, got)
	require.NoError(t, tx.Commit())
}

func TestMigrate(t *testing.T) {
	t.Parallel()

	t.Run("Idempotent", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "dagrun.db")
		for range 3 {
			s, err := sqlite.Open(t.Context(), path, nil)
			require.NoError(t, err)
			require.NoError(t, s.Close())
		}
		db, err := sql.Open("sqlite3", sqlite.DSN(path))
		require.NoError(t, err)
		defer db.Close()
		var n, max int
		require.NoError(t, db.QueryRow(`SELECT count(*), max(version) FROM schema_migrations`).Scan(&n, &max))
		require.Equal(t, max, n, "each version applied once")
	})

	t.Run("ConcurrentOpenOfNewFile", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "dagrun.db")
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []error
		)
		for range 6 {
			wg.Go(func() {
				s, err := sqlite.Open(context.Background(), path, nil)
				if err == nil {
					err = s.Close()
				}
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			})
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
	})

	t.Run("NewerSchema", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "dagrun.db")
		s, err := sqlite.Open(t.Context(), path, nil)
		require.NoError(t, err)
		require.NoError(t, s.Close())
		db, err := sql.Open("sqlite3", sqlite.DSN(path))
		require.NoError(t, err)
		defer db.Close()
		_, err = db.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, '0999_future.sql', 0)`)
		require.NoError(t, err)
		_, err = sqlite.Open(t.Context(), path, nil)
		require.ErrorIs(t, err, storage.ErrUnavailable)
		require.ErrorContains(t, err, "upgrade dagrun")
	})

	// A file another program uses: what it holds is not dagrun's, and the
	// error says so instead of failing on a migration.
	t.Run("AnotherProgramsFile", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct{ name, schema, want string }{
			{"golang-migrate", `CREATE TABLE schema_migrations (version uint64, dirty bool); INSERT INTO schema_migrations VALUES (3, 0)`,
				"holds a schema_migrations table that is not dagrun's (columns version, dirty)"},
			{"Rails", `CREATE TABLE schema_migrations (version varchar PRIMARY KEY); INSERT INTO schema_migrations VALUES ('20230101120000')`,
				"holds a schema_migrations table that is not dagrun's (columns version)"},
			{"a table named as one of dagrun's", `CREATE TABLE events (id integer)`,
				"holds another program's tables under dagrun's names (table events already exists)"},
			{"golang-migrate at dagrun's own latest version", `CREATE TABLE schema_migrations (version uint64, dirty bool); INSERT INTO schema_migrations VALUES (` + strconv.Itoa(latestMigration(t)) + `, 0)`,
				"holds a schema_migrations table that is not dagrun's (columns version, dirty)"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				path := filepath.Join(t.TempDir(), "app.db")
				db, err := sql.Open("sqlite3", path)
				require.NoError(t, err)
				_, err = db.Exec(tc.schema)
				require.NoError(t, err)
				require.NoError(t, db.Close())
				_, err = sqlite.Open(t.Context(), path, nil)
				require.ErrorIs(t, err, storage.ErrUnavailable)
				require.ErrorContains(t, err, tc.want)
				require.ErrorContains(t, err, "give dagrun a database file of its own")
			})
		}
	})

	// Version 23 frees the slots workflow steps held: a file that an
	// earlier version left with a running workflow step in the only slot
	// of its queue and a step held behind it (a child's, waiting for ever
	// on its parent) comes out of it with the step released.
	t.Run("WorkflowStepsFreeTheirSlots", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "dagrun.db")
		s, err := sqlite.Open(t.Context(), path, nil)
		require.NoError(t, err)
		_, err = s.CreateInstances(t.Context(), nil, []storage.CreateParams{{ID: "i-1", Workflow: "wf", DefinitionHash: "h1",
			Definition: []byte("name: wf\n"), Steps: []storage.StepSpec{
				{Name: "call", Handler: "h", Queue: "default"},
				{Name: "work", Handler: "h", Queue: "default"},
			}}}, storagetest.Plan)
		require.NoError(t, err)
		_, err = s.SetQueueLimit(t.Context(), storage.SetAll(storage.QueueLimit{Queue: "default", Concurrency: 1}))
		require.NoError(t, err)
		require.NoError(t, s.Close())

		db, err := sql.Open("sqlite3", sqlite.DSN(path))
		require.NoError(t, err)
		defer db.Close()
		execAll(t, db, append([]string{
			`UPDATE steps SET child_workflow = 'child', status = 'running', started_at = 1, lease_until = NULL,
				run_after = 1, queue_limited = 1 WHERE name = 'call'`,
			`UPDATE steps SET run_after = 253370764800000000, queue_limited = 1 WHERE name = 'work'`,
		}, slices.Concat(undoVersion27, undoVersion26, undoVersion25, undoVersion24, undoVersion23)...))

		s, err = sqlite.Open(t.Context(), path, nil)
		require.NoError(t, err)
		defer s.Close()
		got, err := s.ClaimSteps(t.Context(), storage.ClaimParams{WorkerID: "w", Limit: 10, Lease: time.Minute})
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, "work", got[0].Step)
	})

	// Version 14 keys step logs by their step's row: what a file of
	// version 13 holds is kept, in its order, an item's under its step.
	t.Run("StepLogsByStepRow", func(t *testing.T) {
		t.Parallel()
		path, db := fileWithInstance(t, "a", "b")
		execAll(t, db, append([]string{
			`DROP TABLE step_logs`,
			`CREATE TABLE step_logs (seq INTEGER PRIMARY KEY, instance_id TEXT NOT NULL REFERENCES instances (id) ON DELETE CASCADE,
				step TEXT NOT NULL, item INTEGER NOT NULL, attempt INTEGER NOT NULL, at INTEGER NOT NULL,
				level TEXT NOT NULL, message TEXT NOT NULL, attrs TEXT)`,
			`CREATE INDEX step_logs_attempt ON step_logs (instance_id, step, attempt, item, seq)`,
			`INSERT INTO step_logs (seq, instance_id, step, item, attempt, at, level, message, attrs) VALUES
				(7, 'i-1', 'b', -1, 1, 1, 'INFO', 'first', NULL),
				(9, 'i-1', 'a', 2, 1, 2, 'WARN', 'an item', '{"k":1}'),
				(12, 'i-1', 'b', -1, 2, 3, 'INFO', 'last', NULL)`,
			`DELETE FROM schema_migrations WHERE version = 14`,
		}, slices.Concat(undoVersion27, undoVersion26, undoVersion25, undoVersion24, undoVersion23, undoVersion22, undoVersion21, undoVersion20, undoVersion19, undoVersion18, undoVersion17, undoVersion16, undoVersion15)...))

		s, err := sqlite.Open(t.Context(), path, nil)
		require.NoError(t, err)
		defer s.Close()
		got, err := s.ListLogs(t.Context(), storage.LogsParams{InstanceID: "i-1"})
		require.NoError(t, err)
		type kept struct {
			Seq           int64
			Step          string
			Item, Attempt int
			Message       string
		}
		var keptLogs []kept
		for _, r := range got {
			keptLogs = append(keptLogs, kept{r.Seq, r.Step, r.Item, r.Attempt, r.Message})
		}
		require.Equal(t, []kept{{7, "b", -1, 1, "first"}, {9, "a", 2, 1, "an item"}, {12, "b", -1, 2, "last"}}, keptLogs)
		require.JSONEq(t, `{"k":1}`, string(got[1].Attrs))
		require.NoError(t, s.AppendLogs(t.Context(), nil, []storage.LogRecord{{InstanceID: "i-1", Step: "a", Item: -1, Attempt: 1, Level: "INFO", Message: "new"}}))
		got, err = s.ListLogs(t.Context(), storage.LogsParams{InstanceID: "i-1", AfterSeq: 12})
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Greater(t, got[0].Seq, int64(12), "seqs go on growing")
	})

	// Version 16 lets completion events carry their attempt's logs, under
	// seqs drawn with step_logs' own: those of a file of version 15 are
	// kept, and new ones of either kind come after them.
	t.Run("StepLogsWithCompletions", func(t *testing.T) {
		t.Parallel()
		path, db := fileWithInstance(t, "a")
		execAll(t, db, append(slices.Concat(undoVersion27, undoVersion26, undoVersion25, undoVersion24, undoVersion23, undoVersion22, undoVersion21, undoVersion20, undoVersion19, undoVersion18, undoVersion17, undoVersion16),
			`INSERT INTO step_logs (seq, step_id, item, attempt, at, level, message, attrs)
				SELECT 40, id, -1, 1, 1, 'INFO', 'kept', NULL FROM steps WHERE instance_id = 'i-1' AND name = 'a'`))

		s, err := sqlite.Open(t.Context(), path, nil)
		require.NoError(t, err)
		defer s.Close()
		record := func(msg string) storage.LogRecord {
			return storage.LogRecord{InstanceID: "i-1", Step: "a", Item: -1, Attempt: 1, Level: "INFO", Message: msg, Time: time.UnixMicro(2)}
		}
		require.NoError(t, s.AppendLogs(t.Context(), nil, []storage.LogRecord{record("appended")}))
		claimed, err := s.ClaimSteps(t.Context(), storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute})
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		_, err = s.FinishSteps(t.Context(), []storage.StepResult{{Claim: claimed[0].Claim, Outcome: storage.OutcomeCompleted,
			Output: []byte(`1`), Logs: []storage.LogRecord{record("completed")}}}, storagetest.Plan)
		require.NoError(t, err)
		var carried int
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM events WHERE logs IS NOT NULL`).Scan(&carried))
		require.Equal(t, 1, carried, "the completion event carries its records")

		got, err := s.ListLogs(t.Context(), storage.LogsParams{InstanceID: "i-1"})
		require.NoError(t, err)
		var seqs []int64
		var msgs []string
		for _, r := range got {
			seqs, msgs = append(seqs, r.Seq), append(msgs, r.Message)
		}
		require.Equal(t, []string{"kept", "appended", "completed"}, msgs)
		require.Equal(t, []int64{40, 41, 42}, seqs)
	})

	// Version 15 indexes events by their instance's integer key: the
	// history a file of version 14 holds is kept, in its order, and goes
	// with its instance.
	// Version 24 parks held instances: one that an earlier version held
	// behind a full key is parked by the next sweep, and admitted by the
	// next finish of its key.
	t.Run("HeldInstancesParked", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "dagrun.db")
		s, err := sqlite.Open(t.Context(), path, nil)
		require.NoError(t, err)
		limited := func(id string, first storage.StepSpec) storage.CreateParams {
			return storage.CreateParams{ID: id, Workflow: "wf", DefinitionHash: "h1", Definition: []byte("name: wf\n"),
				ConcurrencyKey: "a", ConcurrencyLimit: 1, Steps: []storage.StepSpec{first}}
		}
		_, err = s.CreateInstances(t.Context(), nil, []storage.CreateParams{
			limited("i-1", storage.StepSpec{Name: "work", Handler: "h", Queue: "default"}),
			limited("i-2", storage.StepSpec{Name: "await-go", Wait: &storage.WaitSpec{Signal: "go"}}),
		}, storagetest.Plan)
		require.NoError(t, err)
		require.NoError(t, s.Close())

		db, err := sql.Open("sqlite3", sqlite.DSN(path))
		require.NoError(t, err)
		defer db.Close()
		execAll(t, db, slices.Concat(undoVersion27, undoVersion26, undoVersion25, undoVersion24))

		s, err = sqlite.Open(t.Context(), path, nil)
		require.NoError(t, err)
		defer s.Close()
		parked := func() bool {
			t.Helper()
			var p bool
			require.NoError(t, db.QueryRow(`SELECT parked FROM instances WHERE id = 'i-2'`).Scan(&p))
			return p
		}
		require.False(t, parked(), "the upgrade parks nothing")
		n, err := s.StartDeferred(t.Context(), 100, storagetest.Plan)
		require.NoError(t, err)
		require.Zero(t, n, "the key is full")
		require.True(t, parked(), "the sweep parks the held instance")

		require.NoError(t, s.CancelInstance(t.Context(), "i-1", "make room", storagetest.Plan))
		require.False(t, parked(), "the finish admitted the instance")
		n, err = s.StartDeferred(t.Context(), 100, storagetest.Plan)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		in, err := s.GetInstance(t.Context(), "i-2")
		require.NoError(t, err)
		require.Equal(t, storage.InstanceRunning, in.Status)
	})

	t.Run("EventsByInstanceKey", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "dagrun.db")
		s, err := sqlite.Open(t.Context(), path, nil)
		require.NoError(t, err)
		var ps []storage.CreateParams
		for _, id := range []string{"i-1", "i-2"} {
			ps = append(ps, storage.CreateParams{ID: id, Workflow: "wf", DefinitionHash: "h1", Definition: []byte("name: wf\n"),
				Steps: []storage.StepSpec{{Name: "a", Handler: "h", Queue: "default"}, {Name: "b", Handler: "h", Queue: "default", DependsOn: []string{"a"}}}})
		}
		_, err = s.CreateInstances(t.Context(), nil, ps, storagetest.Plan)
		require.NoError(t, err)
		before, err := s.ListEvents(t.Context(), storage.EventsParams{InstanceID: "i-1"})
		require.NoError(t, err)
		require.NotEmpty(t, before)
		require.NoError(t, s.Close())

		db, err := sql.Open("sqlite3", sqlite.DSN(path))
		require.NoError(t, err)
		defer db.Close()
		execAll(t, db, slices.Concat(undoVersion27, undoVersion26, undoVersion25, undoVersion24, undoVersion23, undoVersion22, undoVersion21, undoVersion20, undoVersion19, undoVersion18, undoVersion17, undoVersion16, undoVersion15))

		s, err = sqlite.Open(t.Context(), path, nil)
		require.NoError(t, err)
		defer s.Close()
		after, err := s.ListEvents(t.Context(), storage.EventsParams{InstanceID: "i-1"})
		require.NoError(t, err)
		require.Equal(t, before, after)

		// New events go on after the kept ones, under the right instance.
		_, err = s.CreateInstances(t.Context(), nil, []storage.CreateParams{{ID: "i-3", Workflow: "wf", DefinitionHash: "h1",
			Definition: []byte("name: wf\n"), Steps: []storage.StepSpec{{Name: "a", Handler: "h", Queue: "default"}}}}, storagetest.Plan)
		require.NoError(t, err)
		third, err := s.ListEvents(t.Context(), storage.EventsParams{InstanceID: "i-3"})
		require.NoError(t, err)
		require.NotEmpty(t, third)
		require.Greater(t, third[0].ID, before[len(before)-1].ID)
		for _, e := range third {
			require.Equal(t, "i-3", e.InstanceID)
		}

		// An instance's history goes with it.
		var left int
		_, err = db.Exec(`DELETE FROM instances WHERE id = 'i-1'`)
		require.NoError(t, err)
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM events WHERE instance_id = 'i-1'`).Scan(&left))
		require.Zero(t, left, "events of a deleted instance")
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM events WHERE instance_id = 'i-2'`).Scan(&left))
		require.NotZero(t, left, "events of the other instances")
	})
}

// fileWithInstance makes a database file holding instance i-1 with steps
// of those names, and opens it as a plain database for a test to turn
// back to an earlier version.
func fileWithInstance(t *testing.T, steps ...string) (string, *sql.DB) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dagrun.db")
	s, err := sqlite.Open(t.Context(), path, nil)
	require.NoError(t, err)
	p := storage.CreateParams{ID: "i-1", Workflow: "wf", DefinitionHash: "h1", Definition: []byte("name: wf\n")}
	for _, name := range steps {
		p.Steps = append(p.Steps, storage.StepSpec{Name: name, Handler: "h", Queue: "default"})
	}
	_, err = s.CreateInstances(t.Context(), nil, []storage.CreateParams{p}, storagetest.Plan)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	db, err := sql.Open("sqlite3", sqlite.DSN(path))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return path, db
}

// execAll runs the statements in turn on db.
func execAll(t *testing.T, db *sql.DB, statements []string) {
	t.Helper()
	for _, q := range statements {
		_, err := db.Exec(q)
		require.NoError(t, err, q)
	}
}

// undoVersion27 forgets migration 27, which only replaces a trigger.
var undoVersion27 = []string{
	`DELETE FROM schema_migrations WHERE version = 27`,
}

// undoVersion26 drops the column migration 26 added.
var undoVersion26 = []string{
	`ALTER TABLE queue_limits DROP COLUMN respaced_at`,
	`DELETE FROM schema_migrations WHERE version = 26`,
}

// undoVersion25 drops the index migration 25 made.
var undoVersion25 = []string{
	`DROP INDEX steps_ready_handler`,
	`DELETE FROM schema_migrations WHERE version = 25`,
}

// undoVersion24 drops what migration 24 made and puts back the trigger
// it replaced.
var undoVersion24 = []string{
	`DROP TRIGGER instances_unpark`,
	string(must(os.ReadFile("migrations/0022_held_instances_due.sql"))),
	`DROP INDEX instances_deferred`,
	`CREATE INDEX instances_deferred ON instances (run_after) WHERE deferred = 1 AND finished_at IS NULL`,
	`ALTER TABLE instances DROP COLUMN parked`,
	`DELETE FROM schema_migrations WHERE version = 24`,
}

// undoVersion23 forgets migration 23, which replaces a trigger and
// amends rows in a way a second run leaves as it is.
var undoVersion23 = []string{
	`DELETE FROM schema_migrations WHERE version = 23`,
}

// undoVersion22 forgets migration 22, which only replaces a trigger, so
// that opening the file runs it again after the trigger an earlier undo
// rewrote.
var undoVersion22 = []string{
	`DELETE FROM schema_migrations WHERE version = 22`,
}

// undoVersion21 drops what migration 21 made.
var undoVersion21 = []string{
	`DROP INDEX steps_capped_pending`,
	`DELETE FROM schema_migrations WHERE version = 21`,
}

// undoVersion20 drops what migration 20 made.
var undoVersion20 = []string{
	`DROP INDEX steps_rate_starts`,
	`DELETE FROM schema_migrations WHERE version = 20`,
}

// undoVersion19 forgets migration 19, which only replaces indexes and
// triggers, so that opening the file runs it again after the triggers an
// earlier undo rewrote.
var undoVersion19 = []string{
	`DELETE FROM schema_migrations WHERE version = 19`,
}

// undoVersion18 drops what migration 18 made.
var undoVersion18 = []string{
	`DROP INDEX instances_deferred`,
	`ALTER TABLE instances DROP COLUMN deferred`,
	`DELETE FROM schema_migrations WHERE version = 18`,
}

// undoVersion17 drops what migration 17 made and the triggers it
// rewrote, so that opening the file runs it again.
var undoVersion17 = []string{
	`DROP TRIGGER steps_limits_due`,
	`DROP TRIGGER steps_limits_insert`,
	`DROP TRIGGER steps_limits_ready`,
	`DROP TRIGGER steps_limits_requeue`,
	`DROP TRIGGER steps_limits_release`,
	`DROP TRIGGER steps_limits_admitted`,
	`DROP TRIGGER instances_limits_release`,
	`ALTER TABLE steps DROP COLUMN slots_due`,
	`ALTER TABLE steps DROP COLUMN rate_slot_due`,
	`DELETE FROM schema_migrations WHERE version = 17`,
}

// undoVersion16 turns a file's events and log seqs back into those of
// version 15 (see migration 16).
var undoVersion16 = []string{
	`DROP TABLE log_seqs`,
	`ALTER TABLE events DROP COLUMN logs`,
	`ALTER TABLE events DROP COLUMN log_seq`,
	`DELETE FROM schema_migrations WHERE version = 16`,
}

// undoVersion15 turns a file's events back into those of version 14 (see
// migration 15), so that opening it migrates them again.
var undoVersion15 = []string{
	`DROP TRIGGER instances_key`,
	`CREATE TABLE events_v14 (id INTEGER PRIMARY KEY, instance_id TEXT NOT NULL REFERENCES instances (id) ON DELETE CASCADE,
		step TEXT NOT NULL DEFAULT '', type TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0, message TEXT NOT NULL DEFAULT '',
		at INTEGER NOT NULL, actor TEXT NOT NULL DEFAULT '')`,
	`INSERT INTO events_v14 SELECT id, instance_id, step, type, attempt, message, at, actor FROM events`,
	`DROP TABLE events`,
	`ALTER TABLE events_v14 RENAME TO events`,
	`CREATE INDEX events_instance ON events (instance_id, id)`,
	`DROP TABLE instance_keys`,
	`DELETE FROM schema_migrations WHERE version = 15`,
}

// TestOpenTakesThePathWhole: a path with characters a DSN gives meaning to
// (? # %) opens the file of that name, not one cut at the first "?".
func TestOpenTakesThePathWhole(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"a?b.db", "c#d.db", "100%.db", "with space.db"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			s, err := sqlite.Open(t.Context(), filepath.Join(dir, name), nil)
			require.NoError(t, err)
			require.NoError(t, s.Close())
			_, err = os.Stat(filepath.Join(dir, name))
			require.NoError(t, err, "the file of that name holds the database")
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			for _, e := range entries {
				require.True(t, strings.HasPrefix(e.Name(), name), "no other file: %s", e.Name())
			}
		})
	}
}

// latestMigration is the version of this build's last SQLite migration.
func latestMigration(t *testing.T) int {
	t.Helper()
	ms, err := migrate.Read(os.DirFS("."), "migrations")
	require.NoError(t, err)
	return ms[len(ms)-1].Version
}

// TestInMemory: an in-memory database is one per connection, so a store
// on one reads and writes through one connection, and New refuses a pool
// of several.
func TestInMemory(t *testing.T) {
	t.Parallel()
	s, err := sqlite.Open(t.Context(), ":memory:", nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	_, err = s.ListInstances(t.Context(), storage.ListParams{Limit: 1})
	require.NoError(t, err, "reads see the schema the writer made")

	db, err := sql.Open("sqlite3", sqlite.DSN(":memory:"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	_, err = sqlite.New(db, nil)
	require.ErrorContains(t, err, "SetMaxOpenConns(1)")
	db.SetMaxOpenConns(1)
	onPool, err := sqlite.New(db, nil)
	require.NoError(t, err)
	require.NoError(t, onPool.Close())
}

// must returns v, or panics with err: for what a test reads at its start.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestCallerTxOnAnotherFileIsRefused: a caller's transaction on another
// database file than the store's, one with dagrun's tables too, is refused
// instead of taking an instance that none of the engine's workers sees.
func TestCallerTxOnAnotherFileIsRefused(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := func(name string) *sql.DB {
		db, err := sql.Open("sqlite3", sqlite.DSN(filepath.Join(t.TempDir(), name)))
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, db.Close()) })
		return db
	}
	app, other := pool("app.db"), pool("other.db")
	s, err := sqlite.New(app, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	o, err := sqlite.New(other, nil) // other.db gets dagrun's tables
	require.NoError(t, err)
	require.NoError(t, o.Close())

	create := func(tx *sql.Tx) error {
		_, err := s.CreateInstances(ctx, tx, []storage.CreateParams{{ID: uuid.NewString(), Workflow: "wf", DefinitionHash: "h1", Definition: []byte("name: wf\n"),
			Steps: []storage.StepSpec{{Name: "a", Handler: "h", Queue: "default"}}}}, storagetest.Plan)
		return err
	}
	tx, err := other.BeginTx(ctx, nil)
	require.NoError(t, err)
	err = create(tx)
	require.ErrorContains(t, err, "the caller's transaction is on database")
	require.ErrorContains(t, err, "not on the store's")
	require.NoError(t, tx.Rollback())

	tx, err = app.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, create(tx), "the store's own file")
	require.NoError(t, tx.Commit())
}
