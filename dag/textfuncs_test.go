package dag

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTextFunctionsSpeakJSON: string() gives what interpolation gives,
// toJSON() compact JSON as written, fromJSON() whole numbers whole, even
// past 64 bits.
func TestTextFunctionsSpeakJSON(t *testing.T) {
	t.Parallel()
	env := &Env{Input: map[string]any{"m": map[string]any{"k": "v"}, "l": []any{1, "a"}, "f": 1.5, "n": 16}}
	for _, tc := range []struct{ input, want string }{
		{`${{ string(input.none) }}`, `""`},
		{`${{ string(input.m) }}`, `"{\"k\":\"v\"}"`},
		{`${{ string(input.l) }}`, `"[1,\"a\"]"`},
		{`${{ string(input.f) }}`, `"1.5"`},
		{`${{ string(input.n) }}`, `"16"`},
		{`${{ string(true) }}`, `"true"`},
		{`${{ string(date("2030-01-02T03:04:05Z")) }}`, `"2030-01-02T03:04:05Z"`},
		{`${{ string(duration("90m")) }}`, `"1h30m0s"`},
		{`"x-${{ input.m }}"`, `"x-{\"k\":\"v\"}"`},
		{`${{ toJSON(input.m) }}`, `"{\"k\":\"v\"}"`},
		{`${{ fromJSON("12345678901234567890") }}`, `12345678901234567890`},
		{`'${{ fromJSON("[1, 2.5, {\"a\": 3}]") }}'`, `[1,2.5,{"a":3}]`},
		{`${{ fromJSON("7") + 1 }}`, `8`},
		// Values as results write them, in toJSON too.
		{`${{ toJSON(duration("1s")) }}`, `"\"1s\""`},
		{`'${{ toJSON({"at": date("2030-01-02T03:04:05Z"), "d": duration("90m")}) }}'`, `"{\"at\":\"2030-01-02T03:04:05Z\",\"d\":\"1h30m0s\"}"`},
		{`${{ groupBy(["a", "bb", "cc"], string(len(#))) }}`, `{"1":["a"],"2":["bb","cc"]}`},
		{`${{ timezone("Europe/Berlin") }}`, `"Europe/Berlin"`},
		{`'${{ toJSON(groupBy([1, 2], # % 2 == 0 ? "even" : "odd")) }}'`, `"{\"even\":[2],\"odd\":[1]}"`},
	} {
		got, err := evalTemplate(t, tc.input, env)
		require.NoError(t, err, tc.input)
		require.Equal(t, tc.want, jsonOf(t, got), tc.input)
	}
	got, err := evalTemplate(t, `${{ toJSON("<b> & c") }}`, env)
	require.NoError(t, err)
	require.Equal(t, `"<b> & c"`, got, "as written, not escaped for HTML")
	for _, tc := range []struct{ input, want string }{
		{`${{ fromJSON("{") }}`, `fromJSON: unexpected EOF`},
		{`${{ fromJSON("1 2") }}`, `fromJSON: more than one JSON value`},
		{`${{ fromJSON(input.n) }}`, `fromJSON takes text, not a number`},
		{`${{ groupBy([7, 8], len(string(#))) }}`, `the result is a mapping with the key the number 1, which is no text: JSON keys are text (make them so with string())`},
	} {
		_, err := evalTemplate(t, tc.input, env)
		require.ErrorContains(t, err, tc.want, tc.input)
	}
}
