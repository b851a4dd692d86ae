package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
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
				return nil, Permanent(&inputError{err: err})
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

// inputError is an input that did not decode, told in the input's terms.
type inputError struct{ err error }

func (e *inputError) Error() string { return "decode input for handler: " + DecodeProblem(e.err) }
func (e *inputError) Unwrap() error { return e.err }

// DecodeProblem says what is wrong with JSON that encoding/json could not
// decode, in the terms of the JSON rather than of the Go type it did not
// fit (json: cannot unmarshal number into Go struct field
// HTTPInput.headers of type string becomes "headers": want a string, got
// a number), for a message its author can act on.
func DecodeProblem(err error) string {
	var typeErr *json.UnmarshalTypeError
	if !errors.As(err, &typeErr) {
		return strings.TrimPrefix(err.Error(), "json: ")
	}
	want := "a JSON object"
	switch typeErr.Type.Kind() {
	case reflect.String:
		want = "a string"
	case reflect.Bool:
		want = "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want = "a whole number"
	case reflect.Float32, reflect.Float64:
		want = "a number"
	case reflect.Slice, reflect.Array:
		want = "a list"
	}
	if typeErr.Field == "" {
		return fmt.Sprintf("want %s, got %s", want, withArticle(typeErr.Value))
	}
	return fmt.Sprintf("%q: want %s, got %s", typeErr.Field, want, withArticle(typeErr.Value))
}

// withArticle names a JSON kind as encoding/json reports it ("array",
// "number 5") with its article.
func withArticle(value string) string {
	if value == "" {
		return "something else"
	}
	if strings.IndexByte("aeiou", value[0]) >= 0 {
		return "an " + value
	}
	return "a " + value
}
