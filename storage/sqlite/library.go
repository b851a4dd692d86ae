package sqlite

/*
// The SQLite library is the one github.com/mattn/go-sqlite3 compiles into
// the binary; its header is not on the include path, so the one function
// needed is declared here.
extern int sqlite3_config(int, ...);

// SQLITE_CONFIG_PAGECACHE with no buffer and N = 0: no page cache starts
// with a bulk allocation.
static int dagrun_pagecache_no_bulk(void) { return sqlite3_config(7, (void*)0, 0, 0); }

// SQLITE_CONFIG_MEMSTATUS off: no memory statistics, so no lock around
// each allocation.
static int dagrun_memstatus_off(void) { return sqlite3_config(9, 0); }

// SQLITE_CONFIG_STMTJRNL_SPILL: statement journals up to n bytes stay in
// memory.
static int dagrun_stmt_journal_spill(int n) { return sqlite3_config(26, n); }
*/
import "C"

// Settings of the SQLite library as a whole. SQLite takes them only
// before its first connection opens; this package's initialisation runs
// before any code that imports it can open one. If a connection was opened
// earlier (the calls then fail with SQLITE_MISUSE), SQLite keeps its
// defaults and only speed is lost.
var (
	// By default every SQLite page cache starts with a bulk allocation of
	// 20 pages (about 88 KB). Not only a connection's cache: every
	// ephemeral table a statement opens (an IN (subquery) list, a
	// RETURNING buffer) has one, so the claim and finish statements
	// allocated and freed ~180 KB each. glibc gives freed memory at the
	// top of the heap back to the kernel past 128 KB and faults it in
	// again on the next statement, and on a two-core VM the TLB shootdowns
	// of each give-back cost more than the statements: an empty claim took
	// ~700 µs instead of ~70 µs. Without the bulk allocation a cache takes
	// its pages one at a time, as it needs them.
	pageCacheNoBulk = C.dagrun_pagecache_no_bulk() == 0 // SQLITE_OK

	// SQLite counts the memory it allocates under a process-wide mutex at
	// every allocation, for sqlite3_memory_used and the soft heap limit,
	// which nothing here reads or sets. Together with connections opened
	// without their own mutex (dsn), locking had taken 6% of the CPU
	// samples of a chain4 run.
	memStatusOff = C.dagrun_memstatus_off() == 0

	// A statement that may fail halfway inside a transaction (an UPDATE
	// whose triggers write other rows, an INSERT that may break a
	// constraint) keeps the pages it changes in a statement journal, to
	// undo itself alone. By default a journal past 64 KiB spills to a new
	// temporary file: the group commit's UPDATEs of a hundred steps did
	// so in most commits of a chain4 bench (446 temporary files opened,
	// written and closed in 430 commits), for 3-5% of its time. Up to
	// stmtJournalInMemory bytes they stay in memory; a larger one, which
	// only bulk operations write, spills as before.
	stmtJournalInMemory = C.dagrun_stmt_journal_spill(stmtJournalSpillBytes) == 0
)

// stmtJournalSpillBytes is the statement journal size that spills to a
// file: 8 MiB, about 2,000 pages.
const stmtJournalSpillBytes = 8 << 20
