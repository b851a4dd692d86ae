package dag

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWholeNumberArithmeticPastTheRangeFails: +, - and * on whole numbers
// whose result leaves the 64-bit range fail the expression instead of
// wrapping around to another number; within it, and on floats, text and
// lists, they compute as expr does.
func TestWholeNumberArithmeticPastTheRangeFails(t *testing.T) {
	t.Parallel()
	env := &Env{Input: map[string]any{"n": 5_000_000_000_000_000_000, "max": math.MaxInt64, "min": math.MinInt64,
		"neg": -3, "f": 1.5, "s": "ab",
		"items": []any{map[string]any{"qty": 2}, map[string]any{"qty": 3}}}}
	for _, tc := range []struct{ input, want string }{
		{`${{ input.n + 1 }}`, `5000000000000000001`},
		{`${{ input.n * -1 }}`, `-5000000000000000000`},
		{`${{ input.max - input.max }}`, `0`},
		{`${{ input.min + input.max }}`, `-1`},
		{`${{ input.neg * input.neg }}`, `9`},
		{`${{ input.f * 2 }}`, `3`},
		{`${{ input.s + "c" }}`, `"abc"`},
		{`${{ input.s + input.s }}`, `"abab"`},
		{`"x-${{ input.n * 1 }}"`, `"x-5000000000000000000"`},
		{`${{ (input.n + 1) * 1 > 0 }}`, `true`},
		{`${{ sum([input.max, input.min]) }}`, `-1`},
		{`${{ sum([input.f, input.f, 1]) }}`, `4`},
		{`${{ sum([]) }}`, `0`},
		{`${{ sum(input.items, .qty) }}`, `5`},
		{`${{ sum(input.items, .qty * 2) > 9 }}`, `true`},
		{`${{ -input.max }}`, `-9223372036854775807`},
		{`${{ -input.neg }}`, `3`},
		{`${{ -input.f }}`, `-1.5`},
		{`${{ -1 + 0 }}`, `-1`},
		{`${{ abs(input.neg) }}`, `3`},
		{`${{ abs(-input.f) }}`, `1.5`},
		{`${{ int(input.f) }}`, `1`},
		{`${{ int("42") }}`, `42`},
		{`${{ int(-9223372036854775808.0) }}`, `-9223372036854775808`},
	} {
		got, err := evalTemplate(t, tc.input, env)
		require.NoError(t, err, tc.input)
		require.Equal(t, tc.want, jsonOf(t, got), tc.input)
	}
	for _, tc := range []struct{ input, want string }{
		{`${{ input.n * 2 }}`, `expression "input.n * 2": 5000000000000000000 * 2 is past the 64-bit range`},
		{`${{ input.n + input.n }}`, `expression "input.n + input.n": 5000000000000000000 + 5000000000000000000 is past the 64-bit range`},
		{`${{ input.min - 1 }}`, `expression "input.min - 1": -9223372036854775808 - 1 is past the 64-bit range`},
		{`${{ input.min * -1 }}`, `expression "input.min * -1": -9223372036854775808 * -1 is past the 64-bit range`},
		{`${{ 9223372036854775807 + 1 }}`, `expression "9223372036854775807 + 1": 9223372036854775807 + 1 is past the 64-bit range`},
		{`${{ sum([input.n, input.n]) }}`, `expression "sum([input.n, input.n])": sum() is past the 64-bit range of whole numbers (±9223372036854775807) at element 1`},
		{`${{ sum([input.max, 1, input.min]) }}`, `sum() is past the 64-bit range`},
		{`${{ sum(input.s) }}`, `sum takes a list, not text`},
		{`${{ -input.min }}`, `-(-9223372036854775808) is past the 64-bit range`},
		{`${{ abs(input.min) }}`, `abs(-9223372036854775808) is past the 64-bit range`},
		{`${{ int(1e19) }}`, `int(1e+19) is past the 64-bit range`},
		{`${{ int(input.f * 1e30) }}`, `is past the 64-bit range`},
		{`${{ -input.s }}`, `cannot apply - to text`},
		{`${{ sum([input.s]) }}`, `cannot apply + to a number and text`},
	} {
		_, err := evalTemplate(t, tc.input, env)
		require.ErrorContains(t, err, tc.want)
	}
}

// TestRunTimeMessagesSpeakTheAuthorsWords: expr's run-time failures that
// carry Go's text (reflect, interface conversions, %!s) are said in the
// words of the language reference: null, text, a number, a list.
func TestRunTimeMessagesSpeakTheAuthorsWords(t *testing.T) {
	t.Parallel()
	env := &Env{Input: map[string]any{"n": 1, "l": []any{1, 2}, "s": "ab", "big": json.Number("18446744073709551615")}}
	for _, tc := range []struct{ input, want string }{
		{`"${{ map(input.none, # + 1) }}"`, `got null where a value is needed: give a default with ??`},
		{`${{ upper(input.none) }}`, `wanted text, got null`},
		{`${{ upper(input.n) }}`, `wanted text, got a number`},
		{`${{ join(input.none, ",") }}`, `invalid argument for join: null`},
		{`${{ reverse(input.none) }}`, `cannot reverse null`},
		{`${{ keys(input.none) }}`, `cannot get keys from null`},
		{`${{ input.big + 1 }}`, `cannot apply + to a whole number past 64 bits and a number (only passing it on keeps every digit)`},
		{`${{ input.none > 0 }}`, `cannot apply > to null and a number (a skipped step's output, or a field that is not there, is null: give a default with ??)`},
		{`${{ -input.none }}`, `cannot apply - to null`},
		{`${{ input.l + 1 }}`, `cannot apply + to a list and a number`},
		{`${{ input.n % 0 }}`, `division by zero: the right side of / or % is 0`},
		{`${{ int("9223372036854775808") }}`, `int() cannot read "9223372036854775808" as a whole number that fits in 64 bits`},
		{`${{ fromJSON("[1e400]") }}`, `fromJSON: the number 1e400 is beyond the range of a 64-bit floating-point number`},
		{`${{ input.s.id }}`, `cannot read a field by name from text or a list: they take a position (x[0]), a mapping takes names`},
		{`${{ input.l.id }}`, `cannot read a field by name from text or a list`},
		{`${{ input.n.id }}`, `cannot read field id of a number: only a mapping has fields`},
		{`${{ input.l[5] }}`, `no element at position 5 of a list of 2`},
	} {
		_, err := evalTemplate(t, tc.input, env)
		require.ErrorContains(t, err, tc.want, tc.input)
		require.NotRegexp(t, `reflect|interface \{\}|%!`, err.Error(), tc.input)
	}
}
