package dagrun

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/storage"
)

// StartOptions tune one start. The zero value starts at once, at priority 0,
// with no idempotency key.
type StartOptions struct {
	// Key makes the start idempotent: a second start of the same workflow
	// with the same key returns the first instance instead of a new one.
	// Valid UTF-8 without NUL bytes, at most MaxKeyBytes (512) bytes.
	Key string
	// Priority orders ready steps across instances: higher runs first.
	// From MinPriority to MaxPriority (-1,000,000 to 1,000,000).
	Priority int
	// Delay postpones the instance's first steps. From 0 to MaxDelay
	// (a year).
	Delay time.Duration
}

// StartRequest is one instance to start through StartMany.
type StartRequest struct {
	Workflow string
	Input    json.RawMessage
	Options  StartOptions
}

// StartResult tells which instance a start refers to.
type StartResult struct {
	ID string
	// Existed is true when the idempotency key matched an instance that was
	// already there; nothing new was created.
	Existed bool
}

// InputError reports a start input that is malformed, too large, or does not
// satisfy the workflow's input schema. Nothing was written.
type InputError struct {
	Workflow string
	Err      error
}

func (e *InputError) Error() string { return fmt.Sprintf("workflow %s: %v", e.Workflow, e.Err) }
func (e *InputError) Unwrap() error { return e.Err }

// Start validates input against the workflow's schema and creates an
// instance in one transaction. An empty input means {}.
func (e *Engine) Start(ctx context.Context, workflow string, input json.RawMessage, opts *StartOptions) (StartResult, error) {
	return e.startOne(ctx, nil, workflow, input, opts)
}

// StartTx is Start inside the caller's own transaction (a *sql.Tx for the
// SQLite store, a pgx.Tx for the Postgres store): the instance exists if and
// only if the caller commits. This is the transactional outbox: a business
// write and the workflow start succeed or fail together. Workers are woken
// by polling (or, on Postgres, by the NOTIFY sent on commit).
func (e *Engine) StartTx(ctx context.Context, tx any, workflow string, input json.RawMessage, opts *StartOptions) (StartResult, error) {
	if tx == nil {
		return StartResult{}, fmt.Errorf("StartTx: nil transaction (use Start to start outside a transaction)")
	}
	return e.startOne(ctx, tx, workflow, input, opts)
}

func (e *Engine) startOne(ctx context.Context, tx any, workflow string, input json.RawMessage, opts *StartOptions) (StartResult, error) {
	if opts == nil {
		opts = &StartOptions{}
	}
	res, err := e.start(ctx, tx, []StartRequest{{Workflow: workflow, Input: input, Options: *opts}})
	if err != nil {
		return StartResult{}, err
	}
	return res[0], nil
}

// StartMany starts many instances in one transaction: all or none. It is
// the fast path for bulk enqueueing.
func (e *Engine) StartMany(ctx context.Context, reqs []StartRequest) ([]StartResult, error) {
	return e.start(ctx, nil, reqs)
}

// delayClock returns the time a delayed start counts its delay from: the
// database's clock when the store keeps one (storage.Clock), so that a
// start from a machine whose clock is off still runs when the workers,
// whose leases and claims go by the database's clock, expect it. Starts
// without a delay read no clock.
func (e *Engine) delayClock(ctx context.Context, reqs []StartRequest) (time.Time, error) {
	clock, ok := e.store.(storage.Clock)
	if !ok || !slices.ContainsFunc(reqs, func(r StartRequest) bool { return r.Options.Delay > 0 }) {
		return time.Now(), nil
	}
	now, err := clock.Now(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("start: read the database's clock for --delay: %w", err)
	}
	return now, nil
}

func (e *Engine) start(ctx context.Context, tx any, reqs []StartRequest) ([]StartResult, error) {
	params := make([]storage.CreateParams, len(reqs))
	now, err := e.delayClock(ctx, reqs)
	if err != nil {
		return nil, err
	}
	for i, req := range reqs {
		if err := req.Options.Validate(); err != nil {
			return nil, err
		}
		w, err := e.lookupWorkflow(req.Workflow)
		if err != nil {
			return nil, err
		}
		input, err := e.decodeInput(w, req.Input)
		if err != nil {
			return nil, err
		}
		id, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("start %s: new instance id: %w", w.Name, err)
		}
		p := storage.CreateParams{
			ID:             id.String(),
			Workflow:       w.Name,
			DefinitionHash: w.Hash,
			Definition:     w.Source,
			Input:          input,
			Key:            req.Options.Key,
			Priority:       req.Options.Priority,
			Timeout:        w.Timeout,
			Steps:          e.stepSpecs(w),
		}
		if req.Options.Delay > 0 {
			p.RunAfter = now.Add(req.Options.Delay)
		}
		if err := limitInstance(w, &p); err != nil {
			return nil, err
		}
		if e.tracing != nil {
			p.TraceParent, p.TraceCaller = instanceTrace(ctx)
		}
		params[i] = p
	}
	rec := e.newFinishRecorder()
	var created []storage.CreateResult
	if tx == nil {
		created, err = e.createEagerly(rec.attach(ctx), params, rec.plan)
	} else {
		created, err = e.store.CreateInstances(rec.attach(ctx), tx, params, rec.plan)
	}
	if err != nil {
		return nil, err
	}
	out := make([]StartResult, len(created))
	for i, c := range created {
		out[i] = StartResult{ID: c.ID, Existed: c.Existed}
		if !c.Existed {
			// In a caller's transaction this counts a start that may still
			// roll back; metrics tolerate that, state does not depend on it.
			e.observer.InstanceStarted(params[i].Workflow)
		}
	}
	rec.report()
	return out, nil
}

// decodeInput checks that raw is one JSON value within the size limit that
// satisfies the workflow's schema, and returns it compacted.
func (e *Engine) decodeInput(w *dag.Workflow, raw json.RawMessage) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		// No input and a null one are the same start, whichever door
		// it came through: the API's {"input": null} reads as absent.
		raw = json.RawMessage("{}")
	}
	if string(raw) == "{}" && len(w.InputSchema) == 0 && len(raw) <= e.config.MaxInputBytes {
		return raw, nil // the common empty input with nothing to check it against
	}
	compact, err := checkJSON(raw, "input", e.config.MaxInputBytes)
	if err == nil {
		// The text, not the decoded value: a float64 would round a whole
		// number past 2^53 before the schema compares it.
		err = w.ValidateInput(compact)
	}
	if err != nil {
		return nil, &InputError{Workflow: w.Name, Err: err}
	}
	return compact, nil
}

// checkJSON checks one JSON value from outside (what names it in
// errors): at most limit bytes, UTF-8, not nested too deep, one value,
// every number a float64 holds, no key twice in an object. It returns it
// compacted.
func checkJSON(raw json.RawMessage, what string, limit int) (json.RawMessage, error) {
	if len(raw) > limit {
		return nil, fmt.Errorf("%s is %d bytes, over the limit of %d bytes; store large data elsewhere and pass a reference", what, len(raw), limit)
	}
	if !utf8.Valid(raw) {
		// JSON text is UTF-8 (RFC 8259 §8.1); encoding/json would accept
		// it, but PostgreSQL's json type refuses it.
		return nil, fmt.Errorf("%s is not valid JSON: it is not valid UTF-8", what)
	}
	if storage.LoneSurrogate(raw) {
		return nil, fmt.Errorf("%s is not valid JSON: it escapes half of a UTF-16 surrogate pair (\\uD800-\\uDFFF), which is no character", what)
	}
	if depth := inputDepth(raw, MaxInputDepth); depth > MaxInputDepth {
		return nil, fmt.Errorf("%s nests arrays and objects more than %d levels deep; flatten it", what, MaxInputDepth)
	}
	// Decoded for its errors alone: a number past float64's range (which
	// json.Valid takes), a second value.
	var value any
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&value); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && strings.HasPrefix(typeErr.Value, "number ") {
			// Valid JSON, but no float64 holds it (1e400).
			return nil, fmt.Errorf("%s holds the %s, beyond the range of a 64-bit floating-point number: pass it as a string", what, typeErr.Value)
		}
		return nil, fmt.Errorf("%s is not valid JSON: %w", what, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s is not valid JSON: more than one value", what)
	}
	if at, key, found := duplicateKey(raw); found {
		return nil, fmt.Errorf("%s has the key %q twice in the object at %q: keep one (JSON readers disagree on which counts)", what, key, cmp.Or(at, "/"))
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, fmt.Errorf("%s is not valid JSON: %v", what, err)
	}
	return compact.Bytes(), nil
}

// stepSpecs returns the storage form of w's steps, built once per
// definition and shared by every instance started from it (stores only
// read CreateParams).
func (e *Engine) stepSpecs(w *dag.Workflow) []storage.StepSpec {
	if specs, ok := e.specs.Load(w.Hash); ok {
		return specs.([]storage.StepSpec)
	}
	specs, _ := e.specs.LoadOrStore(w.Hash, buildStepSpecs(w))
	return specs.([]storage.StepSpec)
}

func buildStepSpecs(w *dag.Workflow) []storage.StepSpec {
	// The onFailure steps' rows come after the main steps'.
	steps := w.AllSteps()
	specs := make([]storage.StepSpec, len(steps))
	for i, s := range steps {
		specs[i] = storage.StepSpec{
			Name:      s.Name,
			Handler:   s.Handler,
			Queue:     s.Queue,
			DependsOn: s.DependsOn,
			Retry: storage.RetryPolicy{
				MaxAttempts: s.Retry.MaxAttempts,
				Backoff:     s.Retry.Backoff,
				MaxBackoff:  s.Retry.MaxBackoff,
			},
			Timeout:         s.Timeout,
			ForEach:         s.ForEach != nil,
			ItemConcurrency: s.Concurrency,
			ContinueOnError: s.ContinueOnError,
			OnFailure:       s.OnFailure,
			Workflow:        s.Workflow,
		}
		if s.KeyConcurrency != nil {
			specs[i].ConcurrencyLimit = s.KeyConcurrency.Limit
		}
		if s.Wait != nil {
			specs[i].Wait = &storage.WaitSpec{Signal: s.Wait.Signal, Timeout: s.Wait.Timeout}
		}
	}
	return specs
}
