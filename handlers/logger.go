package handlers

import (
	"context"
	"log/slog"
)

// logKey is the context key of the attempt's log handler.
type logKey struct{}

// discardLogger is what Logger returns outside an attempt.
var discardLogger = slog.New(slog.DiscardHandler)

// WithLogHandler returns a copy of ctx whose [Logger] writes to h. The
// engine calls it before running a handler, with a handler that keeps the
// records with the attempt; tests call it to see what a handler logs.
func WithLogHandler(ctx context.Context, h slog.Handler) context.Context {
	return context.WithValue(ctx, logKey{}, h)
}

// Logger returns the logger of the step attempt ctx runs. Its records are
// stored with the attempt (its last 64 KiB by default), and shown by
// `dagrun logs`, the API and the UI's step panel, live while the step
// runs. Outside an attempt it discards what it is given.
func Logger(ctx context.Context) *slog.Logger {
	if h, ok := ctx.Value(logKey{}).(slog.Handler); ok {
		return slog.New(h)
	}
	return discardLogger
}
