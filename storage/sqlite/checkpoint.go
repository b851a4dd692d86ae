package sqlite

import (
	"context"
	"database/sql"
	"sync"
	"time"
)

// Checkpoints off the writer. In WAL mode SQLite copies the log back into
// the database file (a checkpoint, with its fsyncs) in the connection whose
// commit took the log past wal_autocheckpoint pages: the writer, so every
// transaction queued behind it waited. A store from Open runs PASSIVE
// checkpoints on a connection of their own instead, soon after its
// commits. A passive checkpoint never blocks the writer nor readers, so
// while the writer keeps committing it cannot finish the log and the log
// cannot start over; the writer therefore keeps a checkpoint of its own
// as a safety net, at writerCheckpointPages, by when the background one
// has already copied nearly everything and the writer's is short.
//
// chain4, 8,000 instances, four rounds alternating: 13,484 / 13,569 /
// 13,689 / 14,258 steps/s with the writer checkpointing every 1,000
// pages, 14,843 / 14,852 / 14,810 / 14,843 with this.

const (
	// checkpointEvery bounds how often the background checkpoint runs
	// while commits keep coming.
	checkpointEvery = 50 * time.Millisecond
	// writerCheckpointPages is the writer's wal_autocheckpoint.
	writerCheckpointPages = 4000
)

// checkpointer runs passive checkpoints on its own connection after the
// store's commits, at most one per checkpointEvery; it runs none while
// nothing is committed, so an idle store does not wake.
type checkpointer struct {
	conn *sql.DB
	// fileOK runs before each checkpoint; a checkpoint after an error
	// would hide it (see openCheckpointer).
	fileOK func() error
	kicked chan struct{}
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

// openCheckpointer starts a checkpointer on a connection of its own to the
// database file at path. It checkpoints only while fileOK returns nil: a
// checkpoint copies the log's pages back into a file truncated under the
// store and grows it to its full size again, with zeros for every page not
// in the log, and the truncation the store would have seen is gone.
func openCheckpointer(path string, busy time.Duration, fileOK func() error) (*checkpointer, error) {
	conn, err := sql.Open("sqlite3", dsn(path, busy, openMode{existing: true}))
	if err != nil {
		return nil, err
	}
	conn.SetMaxOpenConns(1)
	// Opened now, on the file the store opened: a connection opened later
	// would open whatever file the path names then, and a file replaced
	// under the store would get the lost one's log replayed into it.
	if err := conn.Ping(); err != nil {
		_ = conn.Close()
		return nil, err
	}
	c := &checkpointer{conn: conn, fileOK: fileOK, kicked: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go c.run()
	return c, nil
}

// kick tells the checkpointer a commit added to the log.
func (c *checkpointer) kick() {
	select {
	case c.kicked <- struct{}{}:
	default:
	}
}

func (c *checkpointer) run() {
	defer close(c.done)
	for {
		select {
		case <-c.kicked:
		case <-c.stop:
			return
		}
		if c.fileOK() != nil {
			return // the file is lost; the store says so from now on
		}
		c.checkpoint()
		select {
		case <-time.After(checkpointEvery):
		case <-c.stop:
			return
		}
	}
}

// checkpoint copies what it can of the log into the database file. A busy
// checkpoint (another process's running) or any other failure only leaves
// the copying to the writer's own.
func (c *checkpointer) checkpoint() {
	_, _ = c.conn.ExecContext(context.Background(), "PRAGMA wal_checkpoint(PASSIVE)")
}

// close stops the checkpointer and closes its connection.
func (c *checkpointer) close() error {
	c.once.Do(func() { close(c.stop) })
	<-c.done
	return c.conn.Close()
}
