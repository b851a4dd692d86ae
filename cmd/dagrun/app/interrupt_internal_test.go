package app

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWhileRunningStopsAtItsContext: a load that does not return (a
// folder on a file system that hangs) is left behind as soon as the
// command's context ends, and the command says it did nothing; a load
// that ends after the context did is interrupted too, whichever came
// first to the select.
func TestWhileRunningStopsAtItsContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	started := make(chan struct{})
	go func() {
		<-started
		cancel()
	}()
	_, err := whileRunning(ctx, func() (int, error) {
		close(started)
		<-release
		return 1, nil
	})
	var exit *exitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, ExitInterrupted, exit.code)
	require.EqualError(t, exit.err, "interrupted while reading workflows; nothing was done (context canceled)")

	for range 2000 {
		ended, end := context.WithCancel(t.Context())
		end()
		_, err = whileRunning(ended, func() (int, error) { return 0, errors.New("the load's own error") })
		require.ErrorAs(t, err, &exit, "a load done as the context ended")
	}
	_, err = whileRunning(t.Context(), func() (time.Duration, error) { return time.Second, nil })
	require.NoError(t, err)
}
