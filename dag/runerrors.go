package dag

import (
	"regexp"
	"strings"
)

// expr reports some run-time mistakes with the Go text of the failure
// inside it: a builtin given null reads "reflect: call of
// reflect.Value.Len on zero Value", one given a number where it wants
// text "interface conversion: interface {} is int, not string". The
// workflow's author knows values as null, text, numbers, lists and
// mappings, so such messages are said again in those words; every other
// message is left as expr wrote it.

// runMessages maps a Go-internal run-time message to the author's words;
// each rewrite gets the submatches of its pattern.
var runMessages = []struct {
	pattern func() *regexp.Regexp
	rewrite func(m []string) string
}{
	{lazyRegexp(`^reflect: call of reflect\.Value\.\w+ on zero Value`), func([]string) string {
		return "got null where a value is needed: give a default with ?? (for example x ?? [] or x ?? \"\")"
	}},
	{lazyRegexp(`^interface conversion: interface \{\} is (.+), not (.+)$`), func(m []string) string {
		return "wanted " + goKind(m[2]) + ", got " + goKind(m[1])
	}},
	{lazyRegexp(`^invalid argument for (\w+) \(type (.*)\)$`), func(m []string) string {
		return "invalid argument for " + m[1] + ": " + goKind(m[2])
	}},
	{lazyRegexp(`^cannot (reverse|get keys from) invalid$`), func(m []string) string {
		return "cannot " + m[1] + " null"
	}},
	// A field read by name from text or a list: expr takes the name for a
	// position and fails converting it.
	{lazyRegexp(`^invalid operation: int\(string\)$`), func([]string) string {
		return "cannot read a field by name from text or a list: they take a position (x[0]), a mapping takes names"
	}},
	{lazyRegexp(`^cannot fetch (.+) from (.+)$`), func(m []string) string {
		return "cannot read field " + m[1] + " of " + goKind(m[2]) + ": only a mapping has fields"
	}},
	{lazyRegexp(`^index out of range: (-?\d+) \(array length is (\d+)\)$`), func(m []string) string {
		return "no element at position " + m[1] + " of a list of " + m[2]
	}},
	// An operator given values it does not take: most often null, the
	// output of a skipped step or a field that is not there.
	{lazyRegexp(`^invalid operation: (float\d*) % (.+)$|^invalid operation: (.+) % (float\d*)$`), func([]string) string {
		return "cannot apply % to a fractional number: % takes whole numbers (round first, e.g. int(x) % 2)"
	}},
	{lazyRegexp(`^invalid operation: (.+?) (==|!=|<=|>=|<|>|\+|-|\*\*|\*|/|%) (.+)$`), func(m []string) string {
		return operandMessage(m[2], goKind(m[1]), goKind(m[3]))
	}},
	{lazyRegexp(`^invalid operation: - (.+)$`), func(m []string) string {
		return operandMessage("-", goKind(m[1]), "")
	}},
	{lazyRegexp(`^runtime error: integer divide by zero$`), func([]string) string {
		return "division by zero: the right side of / or % is 0"
	}},
	{lazyRegexp(`^invalid operation: int\((.*)\)$`), func(m []string) string {
		return "int() cannot read " + quoteText(m[1]) + " as a whole number that fits in 64 bits"
	}},
}

// operandMessage says which values an operator cannot take, and what to
// do when one of them is null.
func operandMessage(op, left, right string) string {
	msg := "cannot apply " + op + " to " + left
	if right != "" {
		msg += " and " + right
	}
	switch {
	case left == "null" || right == "null":
		msg += " (a skipped step's output, or a field that is not there, is null: give a default with ??)"
	case left == bigWhole || right == bigWhole:
		msg += " (only passing it on keeps every digit)"
	}
	return msg
}

// bigWhole is how messages name a whole number past 64 bits, which
// expressions keep as json.Number (see UnmarshalJSON).
const bigWhole = "a whole number past 64 bits"

// runMessage rewrites a run-time message of expr (see runMessages).
func runMessage(msg string) string {
	for _, r := range runMessages {
		if m := r.pattern().FindStringSubmatch(msg); m != nil {
			return r.rewrite(m)
		}
	}
	if strings.Contains(msg, "json.Number") {
		// A whole number past 64 bits, kept whole (see fromNumbers).
		return strings.ReplaceAll(msg, "json.Number", bigWhole) +
			" (only passing it on keeps every digit)"
	}
	return msg
}

// goKind names a Go type of a message as kindOfType does, and Go's
// spellings of a missing value as null.
func goKind(t string) string {
	switch t {
	case "<nil>", "%!s(<nil>)", "nil", "invalid":
		return "null"
	case "json.Number":
		return bigWhole
	}
	return kindOfType(t)
}
