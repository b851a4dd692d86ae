package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestKeepFreedMemory: a new connection runs the pool's own AfterConnect
// first and keepFreedMemorySQL after it, and fails with the first's error
// without running the statement.
func TestKeepFreedMemory(t *testing.T) {
	t.Parallel()
	conn, err := pgx.Connect(t.Context(), testURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	lastQuery := func() string {
		t.Helper()
		var q string
		require.NoError(t, sharedPool(t).QueryRow(t.Context(), "SELECT query FROM pg_stat_activity WHERE pid = $1",
			int32(conn.PgConn().PID())).Scan(&q))
		return q
	}
	_, err = conn.Exec(t.Context(), "SELECT 1")
	require.NoError(t, err)

	refused := errors.New("refused")
	err = keepFreedMemory(func(context.Context, *pgx.Conn) error { return refused })(t.Context(), conn)
	require.ErrorIs(t, err, refused)
	require.Equal(t, "SELECT 1", lastQuery(), "the statement ran after the pool's AfterConnect failed")

	var ran []string
	next := func(context.Context, *pgx.Conn) error {
		ran = append(ran, lastQuery())
		return nil
	}
	require.NoError(t, keepFreedMemory(next)(t.Context(), conn))
	require.Equal(t, []string{"SELECT 1"}, ran, "the pool's AfterConnect ran after the statement")
	require.Equal(t, keepFreedMemorySQL, lastQuery())

	_, err = conn.Exec(t.Context(), "SELECT 2")
	require.NoError(t, err)
	require.NoError(t, keepFreedMemory(nil)(t.Context(), conn), "a pool with no AfterConnect of its own")
	require.Equal(t, keepFreedMemorySQL, lastQuery())
}

// TestKeepFreedMemoryKeepsStatementMemory: after keepFreedMemorySQL a
// server process keeps the memory its statements free, so a statement
// that allocates 256 KB, more than glibc keeps by default, faults its
// pages in once, not at every run. It
// reads the process's page faults from /proc, so it needs the server on
// this machine, readable by the test's user.
func TestKeepFreedMemoryKeepsStatementMemory(t *testing.T) {
	t.Parallel()
	const statement = `SELECT octet_length(repeat(repeat('x', 1024), 256))` // a 256 KB result
	const runs = 10
	faults := func(keep bool) int64 {
		t.Helper()
		conn, err := pgx.Connect(t.Context(), testURL(t))
		require.NoError(t, err)
		defer func() { _ = conn.Close(context.Background()) }()
		if keep {
			_, err := conn.Exec(t.Context(), keepFreedMemorySQL)
			require.NoError(t, err)
		}
		_, err = conn.Exec(t.Context(), statement) // looks up the functions once
		require.NoError(t, err)
		before := minorFaults(t, conn.PgConn().PID())
		for range runs {
			_, err := conn.Exec(t.Context(), statement)
			require.NoError(t, err)
		}
		return minorFaults(t, conn.PgConn().PID()) - before
	}
	without, with := faults(false), faults(true)
	const pages = runs * (256 << 10) / 4096
	if without < pages/2 {
		t.Skipf("the server's allocator kept the freed memory without the statement (%d page faults in %d runs)", without, runs)
	}
	require.Less(t, with, without/4, "page faults of %d runs of a 256 KB statement after keepFreedMemorySQL (without it: %d)", runs, without)
}

// minorFaults reads the minor page faults of the local process pid so
// far, or skips the test when the process is not readable here.
func minorFaults(t *testing.T, pid uint32) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Skipf("the server process is not readable on this machine: %v", err)
	}
	// The fields after the command's name, which ends with the last ')':
	// state, ppid, pgrp, session, tty, tpgid, flags, then minflt.
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	require.Greater(t, len(fields), 7, "/proc/%d/stat", pid)
	n, err := strconv.ParseInt(fields[7], 10, 64)
	require.NoError(t, err, "/proc/%d/stat", pid)
	return n
}

// TestShortLivedStoreSkipsMemoryWarmUp: the connections of a store made by
// Open run keepFreedMemory after connecting, unless the store is short
// lived or goes through PgBouncer.
func TestShortLivedStoreSkipsMemoryWarmUp(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		cfg    Config
		warmUp bool
	}{
		{"long lived", Config{}, true},
		{"short lived", Config{ShortLived: true}, false},
		{"through PgBouncer", Config{PgBouncer: true}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg := c.cfg
			cfg.Schema, cfg.MaxConns = newSchema(t), 1
			s, err := Open(t.Context(), testURL(t), &cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			require.Equal(t, c.warmUp, s.Pool().Config().AfterConnect != nil, "a hook after connecting")
		})
	}
}
