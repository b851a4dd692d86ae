package postgres

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// quietPair dials a loopback listener through quietDial and returns the
// quiet client end and the server's end.
func quietPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	var d net.Dialer
	client, err = quietDial(d.DialContext)(context.Background(), "tcp", ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	require.IsType(t, &quietConn{}, client)
	server, ok := <-accepted
	require.True(t, ok, "accept")
	t.Cleanup(func() { server.Close() })
	return client, server
}

func TestQuietConnCarriesWhatNetDoes(t *testing.T) {
	client, server := quietPair(t)
	// More than the sockets' buffers hold, so that the write waits for
	// the reader at least once.
	sent := bytes.Repeat([]byte("0123456789abcdef"), 1<<20)
	reply := []byte("done")
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(sent))
		if _, err := io.ReadFull(server, b); err != nil {
			got <- nil
			return
		}
		got <- b
		_, _ = server.Write(reply)
		server.Close()
	}()

	n, err := client.Write(sent)
	require.NoError(t, err)
	require.Equal(t, len(sent), n)
	require.Equal(t, sent, <-got, "the server read what the quiet connection wrote")

	back, err := io.ReadAll(client)
	require.NoError(t, err, "a connection the server closed ends with io.EOF")
	require.Equal(t, reply, back)
	n, err = client.Read(make([]byte, 8))
	require.Zero(t, n)
	require.ErrorIs(t, err, io.EOF)
}

func TestQuietConnFailsLikeNet(t *testing.T) {
	t.Run("read past its deadline", func(t *testing.T) {
		client, _ := quietPair(t)
		require.NoError(t, client.SetReadDeadline(time.Now().Add(10*time.Millisecond)))
		_, err := client.Read(make([]byte, 8))
		var netErr net.Error
		require.ErrorAs(t, err, &netErr)
		require.True(t, netErr.Timeout(), "a deadline is a timeout to pgconn: %v", err)
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	})
	t.Run("read after close", func(t *testing.T) {
		client, _ := quietPair(t)
		require.NoError(t, client.Close())
		_, err := client.Read(make([]byte, 8))
		require.ErrorIs(t, err, net.ErrClosed)
	})
	t.Run("write after close", func(t *testing.T) {
		client, _ := quietPair(t)
		require.NoError(t, client.Close())
		_, err := client.Write([]byte("x"))
		require.ErrorIs(t, err, net.ErrClosed)
	})
	t.Run("write to a reset connection", func(t *testing.T) {
		client, server := quietPair(t)
		// Closing with unread data and no linger resets the connection.
		require.NoError(t, server.(*net.TCPConn).SetLinger(0))
		require.NoError(t, server.Close())
		var err error
		for i := 0; i < 100 && err == nil; i++ {
			_, err = client.Write(bytes.Repeat([]byte("x"), 64<<10))
		}
		require.Error(t, err)
		var op *net.OpError
		require.ErrorAs(t, err, &op)
		require.Equal(t, "write", op.Op)
		require.True(t, errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET), "%v", err)
	})
}

func TestQuietDialLeavesOtherConnectionsAlone(t *testing.T) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	dial := quietDial(func(context.Context, string, string) (net.Conn, error) { return a, nil })
	got, err := dial(context.Background(), "pipe", "")
	require.NoError(t, err)
	require.Same(t, a, got, "a connection without a descriptor is returned as it is")
}

// TestQuietDialCarriesSessions runs a PostgreSQL session through quietDial
// as the store's connections do: over TCP, over TLS (which pgconn starts on
// the quiet connection) and over a Unix socket, and a statement that its
// context interrupts, which pgconn does through a deadline on the socket.
func TestQuietDialCarriesSessions(t *testing.T) {
	base, err := pgx.ParseConfig(testURL(t))
	require.NoError(t, err)
	for _, tc := range []struct {
		name    string
		connStr string
		network string // of the quiet connection under any TLS
		tls     bool
	}{
		{"tcp", fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", base.Host, base.Port, base.User, base.Database), "tcp", false},
		{"tls", fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=require", base.Host, base.Port, base.User, base.Database), "tcp", true},
		{"unix socket", fmt.Sprintf("host=/var/run/postgresql user=%s dbname=%s", base.User, base.Database), "unix", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.network == "unix" {
				if _, err := os.Stat("/var/run/postgresql"); err != nil {
					t.Skipf("no socket directory: %v", err)
				}
			}
			cfg, err := pgx.ParseConfig(tc.connStr)
			require.NoError(t, err)
			cfg.DialFunc = quietDial(cfg.DialFunc)
			ctx := context.Background()
			conn, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil && tc.tls && strings.Contains(err.Error(), "refused TLS") {
				t.Skipf("the server does not offer TLS: %v", err)
			}
			require.NoError(t, err)
			t.Cleanup(func() { conn.Close(ctx) })
			under := conn.PgConn().Conn()
			if tc.tls {
				tlsConn, ok := under.(*tls.Conn)
				require.True(t, ok, "a TLS session: %T", under)
				under = tlsConn.NetConn()
			}
			require.IsType(t, &quietConn{}, under)
			require.Equal(t, tc.network, under.LocalAddr().Network())

			var got string
			require.NoError(t, conn.QueryRow(ctx, "SELECT repeat('x', 100000)").Scan(&got))
			require.Len(t, got, 100000)

			short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			_, err = conn.Exec(short, "SELECT pg_sleep(10)")
			require.ErrorIs(t, err, context.DeadlineExceeded, "an interrupted statement reports its context's error")
		})
	}
}

// TestStoreConnectionsAreQuiet: the pool of a store Open makes reads and
// writes through quietDial, for a worker's store and a one-off command's
// alike. (The listener connects with the pool's configuration, DialFunc
// included.)
func TestStoreConnectionsAreQuiet(t *testing.T) {
	for _, shortLived := range []bool{false, true} {
		t.Run(fmt.Sprintf("short-lived %v", shortLived), func(t *testing.T) {
			s := openInSchema(t, newSchema(t), &Config{ShortLived: shortLived})
			conn, err := s.Pool().Acquire(t.Context())
			require.NoError(t, err)
			defer conn.Release()
			require.IsType(t, &quietConn{}, conn.Conn().PgConn().Conn())
		})
	}
}

// BenchmarkRoundTrip runs statements that wait 2 ms on the server, one at
// a time on one connection, through net's own socket calls and through the
// quiet ones, and reports the process's context switches and CPU per round
// trip. Between two round trips every goroutine of the process waits, as a
// worker's do on a busy server: that is when the runtime's monitor sleeps
// deeply, and each system call wakes it. (With a statement that answers in
// tens of microseconds, the scheduler's spinning threads keep a processor
// busy across the wait, the monitor never sleeps deeply, and both come out
// the same.)
//
//	DAGRUN_TEST_POSTGRES=... go test ./storage/postgres -run '^$' -bench RoundTrip -benchtime 2000x
func BenchmarkRoundTrip(b *testing.B) {
	url := testURL(b)
	for _, bc := range []struct {
		name  string
		quiet bool
	}{{"net", false}, {"quiet", true}} {
		b.Run(bc.name, func(b *testing.B) {
			cfg, err := pgx.ParseConfig(url)
			require.NoError(b, err)
			if bc.quiet {
				cfg.DialFunc = quietDial(cfg.DialFunc)
			}
			ctx := context.Background()
			conn, err := pgx.ConnectConfig(ctx, cfg)
			require.NoError(b, err)
			b.Cleanup(func() { conn.Close(ctx) })
			const statement = "SELECT pg_sleep(0.002)"
			_, err = conn.Exec(ctx, statement)
			require.NoError(b, err)
			before := processUsage(b)
			b.ResetTimer()
			for b.Loop() {
				if _, err := conn.Exec(ctx, statement); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			after := processUsage(b)
			b.ReportMetric(float64(after.switches-before.switches)/float64(b.N), "switches/op")
			b.ReportMetric(float64(after.cpu-before.cpu)/float64(b.N)/1e3, "cpu-µs/op")
		})
	}
}

// usage is what the kernel counted for this process so far.
type usage struct {
	switches int64         // voluntary and involuntary context switches
	cpu      time.Duration // user and system time
}

func processUsage(tb testing.TB) usage {
	tb.Helper()
	var ru syscall.Rusage
	require.NoError(tb, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return usage{
		switches: ru.Nvcsw + ru.Nivcsw,
		cpu:      time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
	}
}
