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
}

// runMessage rewrites a run-time message of expr (see runMessages).
func runMessage(msg string) string {
	for _, r := range runMessages {
		if m := r.pattern().FindStringSubmatch(msg); m != nil {
			return r.rewrite(m)
		}
	}
	if strings.Contains(msg, "json.Number") {
		// A whole number past 64 bits, kept whole (see fromNumbers).
		return strings.ReplaceAll(msg, "json.Number", "a whole number past 64 bits") +
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
	}
	return kindOfType(t)
}
