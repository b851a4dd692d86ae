package sqlite

import "testing"

// TestPageCacheNoBulk: SQLite took the page-cache setting, which it does
// only before its first connection opens.
func TestPageCacheNoBulk(t *testing.T) {
	if !pageCacheNoBulk {
		t.Fatal("sqlite3_config(SQLITE_CONFIG_PAGECACHE) failed: a connection was opened before this package's initialisation")
	}
}
