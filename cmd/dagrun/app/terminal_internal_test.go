package app

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestControlEscaperKeepsTheTerminalsState(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"plain text\n\tindented é 😀\n", "plain text\n\tindented é 😀\n"},
		{"\x1b]0;pwned\x07\x1b[2K\rFAKE\x1b[31m", `\u001b]0;pwned\u0007\u001b[2K\u000dFAKE\u001b[31m`},
		{"a\u009bb\x7fc", `a\u009bb\u007fc`},
		{"left\u202eright\u2066", `left\u202eright\u2066`},
		{"bad \xff byte", "bad \xff byte"},
	} {
		var out bytes.Buffer
		n, err := controlEscaper{&out}.Write([]byte(tc.in))
		require.NoError(t, err)
		require.Equal(t, len(tc.in), n, "the caller's bytes are all written")
		require.Equal(t, tc.want, out.String())
	}
}

// TestEscapedJSONMeansTheSame: JSON output through the escaper decodes to
// the same value: encoding/json writes C0 controls escaped already, and
// an escape of what is left is valid in a string.
func TestEscapedJSONMeansTheSame(t *testing.T) {
	t.Parallel()
	value := map[string]string{"error": "a\x1b[31m\u0085b\u202ec\x7f"}
	raw, err := json.Marshal(value)
	require.NoError(t, err)
	var out bytes.Buffer
	_, err = controlEscaper{&out}.Write(raw)
	require.NoError(t, err)
	require.NotContains(t, out.String(), "\u0085")
	var back map[string]string
	require.NoError(t, json.Unmarshal(out.Bytes(), &back))
	require.Equal(t, value, back)
}

func TestOneLineTextQuotesWhatWouldBreakTheLine(t *testing.T) {
	t.Parallel()
	require.Equal(t, "order-7", oneLineText("order-7"))
	require.Equal(t, `"A-1\nStatus:    completed"`, oneLineText("A-1\nStatus:    completed"))
}
