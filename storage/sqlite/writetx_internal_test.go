package sqlite

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWriteEndsItsTransactionWhateverHappens: a write whose function
// fails, whose COMMIT SQLite refuses, or whose context ends before it
// commits writes nothing and gives the writer's connection back with no
// transaction open, so that the next write begins and commits.
func TestWriteEndsItsTransactionWhateverHappens(t *testing.T) {
	t.Parallel()
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "dagrun.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, s.write(t.Context(), "setup", func(t *txn) error {
		// A deferred foreign key is checked at COMMIT, which SQLite then
		// refuses, leaving the transaction open.
		_, err := t.exec(`CREATE TABLE parents (id INTEGER PRIMARY KEY);
			CREATE TABLE children (parent INTEGER REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)`)
		return err
	}))
	errFailed := errors.New("the function failed")

	cases := []struct {
		name    string
		write   func(t *txn, stop context.CancelFunc) error
		wantErr string
	}{
		{"the function fails", func(t *txn, _ context.CancelFunc) error {
			if _, err := t.exec(`INSERT INTO parents (id) VALUES (1)`); err != nil {
				return err
			}
			return errFailed
		}, errFailed.Error()},
		{"the COMMIT is refused", func(t *txn, _ context.CancelFunc) error {
			_, err := t.exec(`INSERT INTO children (parent) VALUES (1)`)
			return err
		}, "FOREIGN KEY constraint failed"},
		{"the context ends before the COMMIT", func(t *txn, stop context.CancelFunc) error {
			_, err := t.exec(`INSERT INTO parents (id) VALUES (1)`)
			stop()
			return err
		}, context.Canceled.Error()},
		{"the transaction is gone before the ROLLBACK", func(t *txn, _ context.CancelFunc) error {
			if _, err := t.exec(`INSERT INTO parents (id) VALUES (1)`); err != nil {
				return err
			}
			// As SQLite does by itself on some errors: the write's own
			// ROLLBACK then fails, with nothing left open.
			if _, err := t.exec(`ROLLBACK`); err != nil {
				return err
			}
			return errFailed
		}, errFailed.Error()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, stop := context.WithCancel(t.Context())
			defer stop()
			err := s.write(ctx, "write", func(tx *txn) error { return c.write(tx, stop) })
			require.ErrorContains(t, err, c.wantErr)
			require.Zero(t, s.w.Stats().InUse, "the writer's connection is back in its pool")
			require.Equal(t, 1, s.w.Stats().OpenConnections, "the writer's connection, with no transaction open, is kept")

			var parents, children int
			require.NoError(t, s.write(t.Context(), "next write", func(tx *txn) error {
				if err := tx.queryRow(`SELECT count(*) FROM parents`).Scan(&parents); err != nil {
					return err
				}
				if err := tx.queryRow(`SELECT count(*) FROM children`).Scan(&children); err != nil {
					return err
				}
				_, err := tx.exec(`INSERT INTO parents (id) VALUES (100)`)
				return err
			}), "the next write begins and commits")
			require.Zero(t, parents, "rows of the failed write")
			require.Zero(t, children, "rows of the failed write")
			require.NoError(t, s.write(t.Context(), "cleanup", func(tx *txn) error {
				_, err := tx.exec(`DELETE FROM parents`)
				return err
			}))
		})
	}
}
