package postgres

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// TestSilentServerTimesOut: a server that takes the connection and never
// answers fails the open after the connect timeout, as unavailable, rather
// than holding the command for the kernel's TCP timeouts. Not parallel: it
// shortens the default for its run.
func TestSilentServerTimesOut(t *testing.T) {
	before := defaultConnectTimeout
	defaultConnectTimeout = 200 * time.Millisecond
	t.Cleanup(func() { defaultConnectTimeout = before })

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	t.Cleanup(func() { _ = ln.Close(); <-done })
	go func() {
		defer close(done)
		var held []net.Conn // accepted, never answered
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, conn)
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, err = Open(ctx, fmt.Sprintf("postgres://u@%s/db?sslmode=disable", ln.Addr()), nil)
	require.ErrorIs(t, err, storage.ErrUnavailable)
	require.NoError(t, ctx.Err(), "the open waited for the context, not the connect timeout")
}
