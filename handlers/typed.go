package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
)

// Typed adapts a typed function into a [Handler]: the step input is decoded
// into In with encoding/json and the returned Out is encoded as the step
// output.
//
// A null or absent input decodes to the zero In, so a step without input can
// use a struct type. Unknown fields in the input are ignored, as encoding/json
// does by default, so a workflow may pass a handler more than it reads.
//
// An input that does not decode into In fails the step permanently
// ("decode input for handler: ..."): the input is resolved before the step
// runs and does not change between attempts, so retrying could not help. An
// Out that cannot be encoded is permanent for the same reason. Errors from fn
// are returned unchanged, so fn decides with [Permanent] or [Snooze] what
// happens next.
func Typed[In, Out any](fn func(context.Context, In) (Out, error)) Handler {
	if fn == nil {
		panic("handlers: Typed called with a nil func")
	}
	return func(ctx context.Context, input json.RawMessage) (json.RawMessage, error) {
		var in In
		if !isNull(input) {
			if err := json.Unmarshal(input, &in); err != nil {
				return nil, Permanent(fmt.Errorf("decode input for handler: %w", err))
			}
		}
		out, err := fn(ctx, in)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(out)
		if err != nil {
			return nil, Permanent(fmt.Errorf("encode output of handler: %w", err))
		}
		return b, nil
	}
}

// isNull reports whether raw holds no value: empty, whitespace or null.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}
