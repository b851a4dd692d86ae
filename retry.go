package dagrun

import (
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// failure decides what a failed attempt leads to: another attempt after the
// step's backoff, or a terminal failure when the error is permanent or the
// attempts are used up.
func (e *Engine) failure(step storage.ClaimedStep, err error) storage.StepResult {
	res := storage.StepResult{Claim: step.Claim, Attempt: step.Attempt, Error: storableText(err.Error())}
	if handlers.IsPermanent(err) || step.Attempt >= step.Retry.MaxAttempts {
		res.Outcome = storage.OutcomeFailed
		return res
	}
	res.Outcome = storage.OutcomeRetry
	// A delay, not a time: the store counts it from its own clock.
	res.Delay = step.Retry.Delay(step.Attempt, e.config.Jitter())
	return res
}
