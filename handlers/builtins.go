package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
)

// RegisterBuiltins registers the built-in handlers on r:
//
//   - echo returns its input unchanged (null when there is none); handy for
//     shaping data with input expressions and for trying workflows out.
//   - noop ignores its input and returns null; a join point in a DAG.
//   - http makes one HTTP request; see [HTTPInput] and [HTTPOutput].
//   - sleep waits durably; see [SleepInput].
//
// Like [Registry.Register] it panics if any of these names is taken.
func RegisterBuiltins(r *Registry) {
	r.Register("echo", echo)
	r.Register("noop", noop)
	// Each registry gets its own client and transport (a clone of the
	// default one, so proxy settings from the environment still apply):
	// nothing another package does to http.DefaultClient or its pool can
	// change how steps make requests.
	transport := http.DefaultTransport.(*http.Transport).Clone()
	r.Register("http", newHTTPHandler(&http.Client{Transport: transport}))
	r.Register("sleep", Typed(sleep))
}

func echo(ctx context.Context, input json.RawMessage) (json.RawMessage, error) {
	Logger(ctx).Debug("echo", slog.Int("bytes", len(input)))
	if isNull(input) {
		return json.RawMessage("null"), nil
	}
	// A copy, so the output never aliases a buffer the caller may reuse.
	return bytes.Clone(input), nil
}

func noop(context.Context, json.RawMessage) (json.RawMessage, error) {
	return json.RawMessage("null"), nil
}
