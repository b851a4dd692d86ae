package sqlite

import (
	"strings"
	"testing"
)

// TestLibrarySettings: SQLite took the library-wide settings, which it
// does only before its first connection opens.
func TestLibrarySettings(t *testing.T) {
	if !pageCacheNoBulk {
		t.Error("sqlite3_config(SQLITE_CONFIG_PAGECACHE) failed: a connection was opened before this package's initialisation")
	}
	if !memStatusOff {
		t.Error("sqlite3_config(SQLITE_CONFIG_MEMSTATUS) failed: a connection was opened before this package's initialisation")
	}
	if !stmtJournalInMemory {
		t.Error("sqlite3_config(SQLITE_CONFIG_STMTJRNL_SPILL) failed: a connection was opened before this package's initialisation")
	}
}

// TestDSNWithoutConnectionMutex: the store's pools, and a caller's opened
// with DSN, open connections in SQLite's multi-thread mode.
func TestDSNWithoutConnectionMutex(t *testing.T) {
	for _, readOnly := range []bool{false, true} {
		if got := dsn("/tmp/x.db", BusyTimeoutDefault, openMode{readOnly: readOnly}); !strings.Contains(got, "_mutex=no") {
			t.Errorf("dsn(readOnly=%v) = %q: want _mutex=no", readOnly, got)
		}
	}
}
