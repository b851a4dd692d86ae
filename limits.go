package dagrun

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/storage"
)

// groupKey is the key value stored for a concurrency mapping without a
// key: every instance (or step of that name) is in one group.
const groupKey = "*"

// concurrencyKey evaluates a concurrency mapping's key: "" when no limit
// applies (no mapping, or a key that gave null or an empty text).
func concurrencyKey(c *dag.Concurrency, env *dag.Env) (string, error) {
	if c == nil {
		return "", nil
	}
	if c.Key == nil {
		return groupKey, nil
	}
	key, limited, err := c.EvalKey(env)
	if err != nil || !limited {
		return "", err
	}
	if err := storage.CheckText(key, storage.MaxConcurrencyKeyBytes); err != nil {
		return "", fmt.Errorf("the key %w", err)
	}
	return key, nil
}

// limitInstance sets the workflow-level limit of a new instance: its key
// is evaluated from the input when it starts.
func limitInstance(w *dag.Workflow, p *storage.CreateParams) error {
	if w.Concurrency == nil {
		return nil
	}
	env := &dag.Env{Workflow: dag.WorkflowEnv{ID: p.ID, Name: w.Name}}
	if len(p.Input) > 0 && w.Concurrency.Key != nil {
		if err := decodeValue(p.Input, &env.Input); err != nil {
			return &InputError{Workflow: w.Name, Err: fmt.Errorf("concurrency.key: decode input: %w", err)}
		}
	}
	key, err := concurrencyKey(w.Concurrency, env)
	if err != nil {
		return &InputError{Workflow: w.Name, Err: fmt.Errorf("concurrency.key: %w", err)}
	}
	if key != "" {
		p.ConcurrencyKey, p.ConcurrencyLimit = key, w.Concurrency.Limit
	}
	return nil
}

// limitStep sets the step-level key of a step made ready. An error fails
// the step for good, as a failing input expression does.
func limitStep(step *dag.Step, env *dag.Env, change *storage.StepChange) error {
	if step.KeyConcurrency == nil {
		return nil
	}
	key, err := concurrencyKey(step.KeyConcurrency, env)
	if err != nil {
		return fmt.Errorf("concurrency.key: %w", err)
	}
	change.ConcurrencyKey = key
	return nil
}

// keyReferences lists the steps a step's concurrency key reads.
func keyReferences(step *dag.Step) []string {
	if step.KeyConcurrency == nil {
		return nil
	}
	return step.KeyConcurrency.Key.References()
}

// QueueLimit is a queue's limits, global to every worker of the database:
// at most Concurrency of its steps running at once, at most Rate started
// per Per; zero means no limit.
type QueueLimit = storage.QueueLimit

// QueueInfo is a queue's limits and load, as Queues reports them.
type QueueInfo = storage.QueueInfo

// QueueLimitChange changes some of a queue's limits, keeping the others.
type QueueLimitChange = storage.QueueLimitChange

// QueueRate is a queue's rate: at most Rate steps started per Per.
type QueueRate = storage.QueueRate

// SetQueueLimit sets every limit of a queue (both zero clears them). See
// ChangeQueueLimit.
func (e *Engine) SetQueueLimit(ctx context.Context, l QueueLimit) error {
	_, err := e.ChangeQueueLimit(ctx, storage.SetAll(l))
	return err
}

// ChangeQueueLimit changes the limits a change names and keeps the others,
// in one transaction, and returns the queue's limits. They are stored in
// the database, apply to every worker at once, and to the queue's steps
// already waiting. A bad value, or a queue name no step could use, is an
// *ArgumentError and changes nothing; clearing takes any name, so that a
// limit stored under one can go.
func (e *Engine) ChangeQueueLimit(ctx context.Context, c QueueLimitChange) (QueueLimit, error) {
	// The values given are checked here, where the caller learns which
	// was wrong; the store checks what they make with the stored ones.
	given := c.Apply(QueueLimit{})
	if given.Concurrency != 0 || given.Rate != 0 {
		// A name no step could use, before the store's longer bound of
		// any name (which clearing takes), so that the error gives the
		// bound that holds.
		if err := dag.CheckName("queue", c.Queue); err != nil {
			return QueueLimit{}, &ArgumentError{Name: "queue limit", Reason: err.Error()}
		}
	}
	if err := given.Check(); err != nil {
		return QueueLimit{}, &ArgumentError{Name: "queue limit", Reason: err.Error()}
	}
	return e.store.SetQueueLimit(ctx, c)
}

// Queues lists every queue with a limit or with ready, held, running or
// scheduled steps: depth, held, running, scheduled, oldest wait and limits.
func (e *Engine) Queues(ctx context.Context) ([]QueueInfo, error) {
	return e.store.Queues(ctx)
}

// ParseRate reads a queue rate written N/DUR: N starts per DUR, a
// duration such as 1s, 500ms, 1m or a day (1d; a queue's period is at
// most a day, which QueueLimit.Check says), or a
// bare unit (s, m, h, d) meaning one of it. "0" or "none" clears the rate
// (0, 0).
func ParseRate(s string) (n int, per time.Duration, err error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" || s == "none" {
		return 0, 0, nil
	}
	count, unit, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, &ArgumentError{Name: "rate", Reason: fmt.Sprintf("%q is not N/DUR: write e.g. 10/s, 100/1m or none", s)}
	}
	n, err = strconv.Atoi(strings.TrimSpace(count))
	if err != nil || n < 0 {
		return 0, 0, &ArgumentError{Name: "rate", Reason: fmt.Sprintf("%q does not start with a whole number of steps: write e.g. 10/s", s)}
	}
	unit = strings.TrimSpace(unit)
	switch unit {
	case "s", "m", "h", "d":
		unit = "1" + unit
	}
	if days, ok := strings.CutSuffix(unit, "d"); ok {
		// time.ParseDuration knows no days; a quota per day is common.
		if d, err := strconv.Atoi(days); err == nil && d > 0 && d <= 365 {
			unit = strconv.Itoa(24*d) + "h"
		}
	}
	per, err = time.ParseDuration(unit)
	if err != nil {
		return 0, 0, &ArgumentError{Name: "rate", Reason: fmt.Sprintf("%q does not end with a duration: write e.g. 10/s, 10/1s, 100/1m or 1000/1d", s)}
	}
	if per <= 0 {
		return 0, 0, &ArgumentError{Name: "rate", Reason: fmt.Sprintf("%q has a period of %s: it must be positive, e.g. 10/s or 100/1m", s, per)}
	}
	if n == 0 {
		return 0, 0, nil
	}
	return n, per, nil
}

// QueueLimit returns the limits of queue name; zero limits when it has
// none.
func (e *Engine) QueueLimit(ctx context.Context, name string) (QueueLimit, error) {
	list, err := e.store.Queues(ctx)
	if err != nil {
		return QueueLimit{}, err
	}
	for _, q := range list {
		if q.Queue == name {
			return q.QueueLimit, nil
		}
	}
	return QueueLimit{Queue: name}, nil
}
