package dagrun

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// An attempt's log is made on its first record: an attempt that logs
// nothing hands its result no records and leaves the writer nothing to
// write, and the records of goroutines that log first at once all land in
// the one log, with the With attributes of each.
func TestLazyAttemptLog(t *testing.T) {
	step := &storage.ClaimedStep{Claim: storage.Claim{StepID: 7, InstanceID: "i", Step: "a"}, Item: -1, Attempt: 2}
	newWriter := func() *logWriter {
		return newLogWriter(nil, slog.New(slog.NewTextHandler(io.Discard, nil)), DefaultStepLogBytes)
	}

	t.Run("Silent", func(t *testing.T) {
		lw := newWriter()
		l := newLazyAttemptLog(lw, step)
		handlers.Logger(handlers.WithLogHandler(context.Background(), l)).WithGroup("")
		trim, records := l.take()
		require.Zero(t, trim)
		require.Empty(t, records)
		require.Nil(t, l.log.Load(), "a log was made for an attempt that logged nothing")
		require.Empty(t, lw.dirty)
	})

	t.Run("ConcurrentFirstRecords", func(t *testing.T) {
		const goroutines = 16
		lw := newWriter()
		l := newLazyAttemptLog(lw, step)
		log := handlers.Logger(handlers.WithLogHandler(context.Background(), l))
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range goroutines {
			wg.Go(func() {
				<-start
				if i%2 == 0 {
					log.Info("plain", slog.Int("n", i))
				} else {
					log.With(slog.String("side", "odd")).Info("with", slog.Int("n", i))
				}
			})
		}
		close(start)
		wg.Wait()
		_, records := l.take()
		require.Len(t, records, goroutines, "every record of the first ones kept")
		seen := map[string]int{}
		for _, r := range records {
			require.Equal(t, storage.LogRecord{StepID: 7, InstanceID: "i", Step: "a", Item: -1, Attempt: 2},
				storage.LogRecord{StepID: r.StepID, InstanceID: r.InstanceID, Step: r.Step, Item: r.Item, Attempt: r.Attempt})
			seen[r.Message]++
			if r.Message == "with" {
				require.Contains(t, string(r.Attrs), `"side":"odd"`)
			}
		}
		require.Equal(t, map[string]int{"plain": goroutines / 2, "with": goroutines / 2}, seen)
		require.Len(t, lw.dirty, 1, "one log queued for the writer")
	})
}

// TestCutTextKeepsWholeCharacters: a long text is cut where a character
// starts, so its kept start shows as written, with no replacement
// character where the cut fell.
func TestCutTextKeepsWholeCharacters(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want string
	}{
		{"abcd", "abcd"},
		{"abcdef", "abcd… (2 bytes cut)"},
		{"abcé", "abc… (2 bytes cut)"}, // a cut at 4 falls inside the é
		{"a\x00b", "a\uFFFDb"},
	} {
		require.Equal(t, tc.want, cutText(tc.in, 4), "%q", tc.in)
	}
}
