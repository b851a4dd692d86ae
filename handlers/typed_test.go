package handlers_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/handlers"
)

type greetIn struct {
	Name  string `json:"name"`
	Times int    `json:"times"`
}

type greetOut struct {
	Greeting string `json:"greeting"`
	Empty    bool   `json:"empty"`
}

func greet(_ context.Context, in greetIn) (greetOut, error) {
	if in.Times < 0 {
		return greetOut{}, errors.New("negative times")
	}
	g := ""
	for range in.Times {
		g += "hello " + in.Name + "! "
	}
	return greetOut{Greeting: g, Empty: in.Name == ""}, nil
}

func TestTyped(t *testing.T) {
	t.Parallel()
	h := handlers.Typed(greet)

	tests := []struct {
		name      string
		input     string
		want      string
		wantErr   string
		permanent bool
	}{
		{name: "RoundTrip", input: `{"name":"ada","times":2}`, want: `{"greeting":"hello ada! hello ada! ","empty":false}`},
		{name: "UnknownFieldsIgnored", input: `{"name":"ada","times":1,"extra":[1]}`, want: `{"greeting":"hello ada! ","empty":false}`},
		{name: "NullIsZero", input: `null`, want: `{"greeting":"","empty":true}`},
		{name: "AbsentIsZero", input: ``, want: `{"greeting":"","empty":true}`},
		{name: "DecodeErrorPermanent", input: `{"name":42}`, wantErr: `decode input for handler: "name": want a string, got a number`, permanent: true},
		{name: "NotAnObject", input: `[1]`, wantErr: `decode input for handler: want a JSON object, got an array`, permanent: true},
		{name: "MalformedPermanent", input: `{"name":`, wantErr: "decode input for handler: unexpected end of JSON input", permanent: true},
		{name: "HandlerErrorRetryable", input: `{"times":-1}`, wantErr: "negative times"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, err := h(t.Context(), json.RawMessage(tt.input))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				require.Equal(t, tt.permanent, handlers.IsPermanent(err))
				require.Nil(t, out)
				return
			}
			require.NoError(t, err)
			require.JSONEq(t, tt.want, string(out))
		})
	}

	t.Run("HandlerControlErrorsPassThrough", func(t *testing.T) {
		t.Parallel()
		sentinel := errors.New("nope")
		h := handlers.Typed(func(context.Context, struct{}) (any, error) {
			return nil, handlers.Permanent(sentinel)
		})
		_, err := h(t.Context(), nil)
		require.ErrorIs(t, err, sentinel)
		require.True(t, handlers.IsPermanent(err))
	})

	t.Run("UnencodableOutputPermanent", func(t *testing.T) {
		t.Parallel()
		h := handlers.Typed(func(context.Context, struct{}) (chan int, error) {
			return make(chan int), nil
		})
		_, err := h(t.Context(), nil)
		require.ErrorContains(t, err, "encode output of handler")
		require.True(t, handlers.IsPermanent(err))
	})

	t.Run("PointerInput", func(t *testing.T) {
		t.Parallel()
		h := handlers.Typed(func(_ context.Context, in *greetIn) (bool, error) {
			return in == nil, nil
		})
		out, err := h(t.Context(), json.RawMessage("null"))
		require.NoError(t, err)
		require.JSONEq(t, `true`, string(out))
		out, err = h(t.Context(), json.RawMessage(`{"name":"x"}`))
		require.NoError(t, err)
		require.JSONEq(t, `false`, string(out))
	})

	t.Run("NilFuncPanics", func(t *testing.T) {
		t.Parallel()
		require.Panics(t, func() { handlers.Typed[struct{}, struct{}](nil) })
	})
}
