package storage_test

import (
	"testing"

	"github.com/dagrun/dagrun/storage"
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
		if got := storage.LoneSurrogate([]byte(body)); got != want {
			t.Errorf("LoneSurrogate(%s) = %v, want %v", body, got, want)
		}
	}
}
