package dagrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"
	"unicode/utf8"

	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// runAttempt runs one claimed step's handler and turns what it returned
// into a StepResult. ok is false when the result must not be recorded
// (the claim was lost or the worker is shutting down).
func (e *Engine) runAttempt(ctx context.Context, logger *slog.Logger, step storage.ClaimedStep) (storage.StepResult, bool) {
	logger = logger.With(slog.String("instance", step.InstanceID), slog.String("step", step.Step),
		slog.String("handler", step.Handler), slog.Int("attempt", step.Attempt))
	handler, found := e.registry.Lookup(step.Handler)
	if !found {
		// Another binary with this handler may share the database, so this
		// is an ordinary failed attempt rather than a permanent failure.
		err := fmt.Errorf("handler %q is not registered in this worker (registered: %v)", step.Handler, e.registry.Names())
		logger.Error("dagrun: unknown handler", slog.Any("error", err))
		return e.failure(step, err, time.Now()), true
	}

	attemptCtx := handlers.WithInfo(ctx, handlers.StepInfo{
		InstanceID:     step.InstanceID,
		Workflow:       step.Workflow,
		Step:           step.Step,
		Attempt:        step.Attempt,
		IdempotencyKey: step.InstanceID + "/" + step.Step,
		FirstStartedAt: step.FirstStartedAt,
	})
	if step.Timeout > 0 {
		var cancel context.CancelFunc
		attemptCtx, cancel = context.WithTimeout(attemptCtx, step.Timeout)
		defer cancel()
	}

	output, err := callHandler(attemptCtx, handler, step.Input)
	if ctx.Err() != nil {
		// The worker cancelled the attempt; whoever holds the step now
		// decides its fate.
		return storage.StepResult{}, false
	}
	now := time.Now()
	if err == nil {
		output, err = e.checkOutput(output)
		if err != nil {
			logger.Warn("dagrun: bad handler output", slog.Any("error", err))
			return storage.StepResult{Claim: step.Claim, Outcome: storage.OutcomeFailed, Error: err.Error()}, true
		}
		return storage.StepResult{Claim: step.Claim, Outcome: storage.OutcomeCompleted, Output: output}, true
	}
	if errors.Is(err, context.DeadlineExceeded) && attemptCtx.Err() != nil {
		err = fmt.Errorf("attempt timed out after %s: %w", step.Timeout, err)
	}
	var snooze *handlers.SnoozeError
	if errors.As(err, &snooze) {
		return storage.StepResult{Claim: step.Claim, Outcome: storage.OutcomeSnooze, RunAfter: snooze.Until}, true
	}
	logger.Info("dagrun: attempt failed", slog.Any("error", err))
	return e.failure(step, err, now), true
}

// callHandler runs a handler, turning a panic into an error that carries the
// panic value and stack, so one bad handler never takes the worker down.
func callHandler(ctx context.Context, h handlers.Handler, input json.RawMessage) (out json.RawMessage, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v\n%s", r, debug.Stack())
		}
	}()
	return h(ctx, input)
}

// checkOutput makes sure a handler's output can be stored: valid JSON and
// within the size limit. An empty output is JSON null.
func (e *Engine) checkOutput(out json.RawMessage) (json.RawMessage, error) {
	if len(out) == 0 {
		return json.RawMessage("null"), nil
	}
	if len(out) > e.config.MaxOutputBytes {
		return nil, fmt.Errorf("handler output is %d bytes, over the limit of %d bytes; store large data elsewhere and return a reference", len(out), e.config.MaxOutputBytes)
	}
	if !json.Valid(out) {
		return nil, errors.New("handler output is not valid JSON")
	}
	if !utf8.Valid(out) {
		// PostgreSQL refuses it, and a commit that can never succeed would
		// be retried for as long as the lease holds.
		return nil, errors.New("handler output is not valid JSON: it is not valid UTF-8")
	}
	return out, nil
}
