package web

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLoneSurrogate(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]bool{
		`{"k": "plain"}`:                  false,
		`{"k": "\ud83d\ude00"}`:           false, // a pair: 😀
		`{"k": "\uD83D\uDE00"}`:           false,
		`{"k": "\u00e9\n\"\\"}`:           false,
		`{"k": "\\ud800"}`:                false, // an escaped backslash, then text
		`{"k": "\ud800"}`:                 true,
		`{"k": "\udbff"}`:                 true,
		`{"k": "\udc00"}`:                 true, // a low half alone
		`{"k": "\ud800\u0041"}`:           true,
		`{"k": "\ud800\ud800\udc00"}`:     true,
		`{"k": "\\\ud800"}`:               true, // an escaped backslash, then the escape
		`{"k": "x", "j": "\ude00\ud83d"}`: true,
	} {
		if got := loneSurrogate([]byte(body)); got != want {
			t.Errorf("loneSurrogate(%s) = %v, want %v", body, got, want)
		}
	}
}

// TestFieldNamesOfAnEmbeddedStruct: a request type's embedded struct
// lends its fields, as encoding/json promotes them.
func TestFieldNamesOfAnEmbeddedStruct(t *testing.T) {
	type inner struct {
		Key string `json:"key"`
	}
	type request struct {
		inner
		Data  string `json:"data"`
		Skip  string `json:"-"`
		Plain string
	}
	require.Equal(t, map[string]bool{"key": true, "data": true, "Plain": true}, fieldNames(reflect.TypeOf(&request{})))
	require.NoError(t, checkFieldNames([]byte(`{"key": "k", "data": "d"}`), &request{}))
	require.EqualError(t, checkFieldNames([]byte(`{"Key": "k"}`), &request{}), `unknown field "Key"`)
}
