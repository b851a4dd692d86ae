package dagrun

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/storage"
)

// Bounds of the values a caller passes to Start, StartTx, StartMany and
// List. Every edge (the Go API, the CLI, the HTTP API) checks them through
// the functions of this file, so a value out of range is refused with the
// same message everywhere, before anything is written.
const (
	// MinPriority and MaxPriority bound StartOptions.Priority.
	MinPriority = storage.MinPriority
	MaxPriority = storage.MaxPriority
	// MaxDelay bounds StartOptions.Delay as it bounds every retry delay
	// (storage.MaxDelay, a year): a longer delay is almost always a unit
	// mistake.
	MaxDelay = storage.MaxDelay
	// MaxKeyBytes bounds StartOptions.Key.
	MaxKeyBytes = storage.MaxKeyBytes
	// MaxInputDepth bounds how deeply a start input nests arrays and
	// objects, as deep as a workflow file may nest: deeper input cannot be
	// evaluated by expressions or checked by a schema without deep
	// recursion, so it is refused at start rather than failing the
	// instance later.
	MaxInputDepth = 200
	// MaxListLimit bounds ListParams.Limit.
	MaxListLimit = 10_000
	// MaxConcurrency bounds WorkerConfig.Concurrency: a worker keeps a
	// result buffer per slot, so an absurd value would exhaust memory.
	MaxConcurrency = 10_000
	// MaxLease, MaxPoll and MaxShutdownGrace bound the worker's durations.
	MaxLease         = 24 * time.Hour
	MaxPoll          = time.Hour
	MaxShutdownGrace = 24 * time.Hour
)

// Smallest accepted worker durations (zero still means the default).
const (
	minLease = 10 * time.Millisecond
	minPoll  = time.Millisecond
)

// ArgumentError reports a value a caller passed in (a start option, a list
// filter) that dagrun does not accept. Nothing was written.
type ArgumentError struct {
	// Name says what the value is, e.g. "priority" or "idempotency key".
	Name string
	// Reason says what is wrong and what is accepted.
	Reason string
	// Err is the error Reason tells of, when there is one (a JSON syntax
	// error, say), for callers that add advice of their own.
	Err error
}

func (e *ArgumentError) Error() string { return "invalid " + e.Name + ": " + e.Reason }

func (e *ArgumentError) Unwrap() error { return e.Err }

// Validate checks the options against the documented bounds; Start,
// StartTx and StartMany call it, and callers may call it earlier to refuse
// bad options before doing anything else.
func (o *StartOptions) Validate() error {
	if o.Priority < MinPriority || o.Priority > MaxPriority {
		return &ArgumentError{Name: "priority", Reason: fmt.Sprintf("%d is out of range: use a whole number from %d to %d (higher runs first)", o.Priority, MinPriority, MaxPriority)}
	}
	if o.Delay < 0 || o.Delay > MaxDelay {
		return &ArgumentError{Name: "delay", Reason: fmt.Sprintf("%s is out of range: use a duration from 0s to %s", inDays(o.Delay), inDays(MaxDelay))}
	}
	if err := storage.CheckText(o.Key, MaxKeyBytes); err != nil {
		return &ArgumentError{Name: "idempotency key", Reason: "it " + err.Error()}
	}
	return nil
}

// inDays writes d in whole days when it is some (366d rather than 8784h),
// as a delay may be given, and as a Go duration otherwise.
func inDays(d time.Duration) string {
	const day = 24 * time.Hour
	if d >= day && d%day == 0 {
		return fmt.Sprintf("%dd", d/day)
	}
	return dag.FormatDuration(d)
}

// Validate checks the config against the documented bounds; zero fields
// take their defaults. NewWorker calls it, and callers may call it earlier
// to refuse a bad config before doing anything else.
func (c *WorkerConfig) Validate() error {
	if c.Concurrency < 0 || c.Concurrency > MaxConcurrency {
		return &ArgumentError{Name: "concurrency", Reason: fmt.Sprintf("%d is out of range: use a number from 1 to %d", c.Concurrency, MaxConcurrency)}
	}
	for _, d := range []struct {
		name          string
		value, lo, hi time.Duration
	}{
		{"lease", c.Lease, minLease, MaxLease},
		{"poll interval", c.Poll, minPoll, MaxPoll},
		{"shutdown grace", c.ShutdownGrace, 0, MaxShutdownGrace},
	} {
		if d.value != 0 && (d.value < d.lo || d.value > d.hi) {
			return &ArgumentError{Name: d.name, Reason: fmt.Sprintf("%s is out of range: use a duration from %s to %s", dag.FormatDuration(d.value), dag.FormatDuration(d.lo), dag.FormatDuration(d.hi))}
		}
	}
	for _, q := range c.Queues {
		if err := storage.CheckText(q, storage.MaxIDBytes); err != nil {
			return &ArgumentError{Name: "queue name", Reason: "it " + err.Error()}
		}
	}
	if err := storage.CheckText(c.InstanceID, storage.MaxIDBytes); err != nil {
		return &ArgumentError{Name: "instance ID", Reason: "it " + err.Error()}
	}
	if err := storage.CheckText(c.ID, storage.MaxIDBytes); err != nil {
		return &ArgumentError{Name: "worker ID", Reason: "it " + err.Error()}
	}
	return nil
}

// validateList checks list parameters; a status or a limit from outside
// the documented set is refused rather than passed to the store.
func validateList(p storage.ListParams) error {
	if err := storage.CheckText(p.Workflow, storage.MaxIDBytes); err != nil {
		return &ArgumentError{Name: "workflow filter", Reason: "it " + err.Error()}
	}
	if err := storage.CheckText(p.Key, storage.MaxKeyBytes); err != nil {
		return &ArgumentError{Name: "key filter", Reason: "it " + err.Error()}
	}
	if p.Key != "" && p.Workflow == "" {
		// Keys are unique per workflow, and looked up by both.
		return &ArgumentError{Name: "key filter", Reason: "it needs a workflow filter: an idempotency key names one instance of one workflow"}
	}
	if err := storage.CheckText(p.BeforeID, storage.MaxIDBytes); err != nil {
		return &ArgumentError{Name: "page cursor (before)", Reason: "it " + err.Error()}
	}
	if err := storage.CheckText(p.Parent, storage.MaxIDBytes); err != nil {
		return &ArgumentError{Name: "parent filter", Reason: "it " + err.Error()}
	}
	switch p.Status {
	case "", storage.InstancePending, storage.InstanceRunning, storage.InstanceCompleted, storage.InstanceFailed, storage.InstanceCancelled:
	default:
		return &ArgumentError{Name: "status filter", Reason: fmt.Sprintf("%q is not a status: use pending, running, completed, failed or cancelled", p.Status)}
	}
	if p.Limit < 0 || p.Limit > MaxListLimit {
		return &ArgumentError{Name: "limit", Reason: fmt.Sprintf("%d is out of range: use a number from 1 to %d", p.Limit, MaxListLimit)}
	}
	return nil
}

// checkID refuses, as not found, an instance ID that no backend can hold:
// no instance has it, and PostgreSQL would fail on it rather than say so.
func checkID(id string) error {
	if err := storage.CheckText(id, storage.MaxIDBytes); err != nil {
		return fmt.Errorf("instance ID %s: %w", err, storage.ErrNotFound)
	}
	return nil
}

// inputDepth returns how deeply raw JSON nests arrays and objects,
// stopping early once it passes limit. It reads bytes only: brackets inside
// strings do not count.
func inputDepth(raw []byte, limit int) int {
	depth, deepest := 0, 0
	inString, escaped := false, false
	for _, b := range raw {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case b == '\\':
				escaped = true
			case b == '"':
				inString = false
			}
		case b == '"':
			inString = true
		case b == '[' || b == '{':
			depth++
			if depth > deepest {
				deepest = depth
				if deepest > limit {
					return deepest
				}
			}
		case b == ']' || b == '}':
			depth--
		}
	}
	return deepest
}

// duplicateKey finds an object of raw, valid JSON, that has a key twice:
// the JSON Pointer of the object and the key. JSON readers disagree on
// which of the two counts (Go's and the schema check take the last, the
// stored text keeps both), so such a value is refused. A byte scan finds
// whether there is one (a start's input is read on every start); only
// then does a token walk say where.
func duplicateKey(raw []byte) (at, key string, found bool) {
	if !hasDuplicateKey(raw) {
		return "", "", false
	}
	return locateDuplicateKey(raw)
}

// hasDuplicateKey scans raw, valid JSON, keeping the keys of the open
// objects as written (a key with an escape is compared decoded), in one
// list: each object's are those from its first.
func hasDuplicateKey(raw []byte) bool {
	type frame struct {
		object, expectKey bool
		first             int // its first key's index in keys
	}
	var (
		frames [16]frame
		seen   [32][]byte
	)
	stack, keys := frames[:0], seen[:0]
	for i := 0; i < len(raw); i++ {
		switch raw[i] {
		case '{':
			stack = append(stack, frame{object: true, expectKey: true, first: len(keys)})
		case '[':
			stack = append(stack, frame{first: len(keys)})
		case '}', ']':
			keys = keys[:stack[len(stack)-1].first]
			stack = stack[:len(stack)-1]
		case ',':
			if top := len(stack) - 1; top >= 0 && stack[top].object {
				stack[top].expectKey = true
			}
		case '"':
			end, escaped := i+1, false
			for ; end < len(raw) && raw[end] != '"'; end++ {
				if raw[end] == '\\' {
					escaped = true
					end++
				}
			}
			if top := len(stack) - 1; top >= 0 && stack[top].expectKey {
				k := raw[i+1 : end]
				if escaped {
					var decoded string
					_ = json.Unmarshal(raw[i:end+1], &decoded)
					k = []byte(decoded)
				}
				for _, other := range keys[stack[top].first:] {
					if string(other) == string(k) {
						return true
					}
				}
				keys = append(keys, k)
				stack[top].expectKey = false
			}
			i = end
		}
	}
	return false
}

// locateDuplicateKey is duplicateKey's walk, for a value that has one.
func locateDuplicateKey(raw []byte) (at, key string, found bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var walk func(path string) bool
	walk = func(path string) bool {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return false
				}
				name, _ := k.(string)
				if seen[name] {
					at, key = path, name
					return true
				}
				seen[name] = true
				if walk(path + "/" + escapePointerToken(name)) {
					return true
				}
			}
			_, _ = dec.Token() // }
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				if walk(path + "/" + strconv.Itoa(i)) {
					return true
				}
			}
			_, _ = dec.Token() // ]
		}
		return false
	}
	found = walk("")
	return at, key, found
}

// escapePointerToken escapes a key for a JSON Pointer (RFC 6901).
func escapePointerToken(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
