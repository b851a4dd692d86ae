package dag

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	goccyyaml "github.com/goccy/go-yaml"
	goccyparser "github.com/goccy/go-yaml/parser"
	"gopkg.in/yaml.v3"
)

// Error is one problem in a workflow file, at the position of the YAML node it
// is about. Line and Col are 1-based; both are 0 when the problem concerns the
// whole file (for example when it cannot be read).
type Error struct {
	File      string
	Line, Col int
	Msg       string
}

// Error formats the problem as FILE:LINE:COL: msg, the form editors and CI
// annotations understand. Empty parts are left out.
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(":")
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, "%d:%d:", e.Line, e.Col)
	}
	if b.Len() > 0 {
		b.WriteString(" ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ErrorList is every problem found in one or more workflow files, sorted by
// file, line and column.
type ErrorList []*Error

// Error joins the errors, one per line.
func (l ErrorList) Error() string {
	parts := make([]string, len(l))
	for i, e := range l {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "\n")
}

// Unwrap lets errors.As find each *Error.
func (l ErrorList) Unwrap() []error {
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errs
}

// Summary puts a file's errors on one line: the first, and how many more
// there are ("FILE:LINE:COL: message (and 2 more)"). An error that is no
// ErrorList gives its first line.
func Summary(err error) string {
	first, more := err.Error(), 0
	var list ErrorList
	if errors.As(err, &list) && len(list) > 0 {
		first, more = list[0].Error(), len(list)-1
	}
	if i := strings.IndexByte(first, '\n'); i >= 0 {
		first = first[:i]
	}
	if more > 0 {
		first += fmt.Sprintf(" (and %d more)", more)
	}
	return first
}

// Sort orders the errors by file, line and column, as Parse and LoadDir
// return them, for a list that joins errors of both.
func (l ErrorList) Sort() { sortErrors(l) }

// sortErrors orders by position; a stable sort keeps the order in which
// problems at the same node were found, which is the order a reader fixes them.
func sortErrors(l ErrorList) {
	sort.SliceStable(l, func(i, j int) bool {
		a, b := l[i], l[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Col < b.Col
	})
}

// collector gathers the errors of one file.
type collector struct {
	file string
	errs ErrorList
}

// at records a problem at a node; a nil node means the start of the file.
func (c *collector) at(n *yaml.Node, format string, args ...any) {
	line, col := 1, 1
	if n != nil && n.Line > 0 {
		line, col = n.Line, n.Column
	}
	c.errs = append(c.errs, &Error{File: c.file, Line: line, Col: col, Msg: fmt.Sprintf(format, args...)})
}

// atPos records a problem at an explicit position.
func (c *collector) atPos(line, col int, format string, args ...any) {
	c.errs = append(c.errs, &Error{File: c.file, Line: line, Col: col, Msg: fmt.Sprintf(format, args...)})
}

var yamlLineRE = lazyRegexp(`^yaml: line (\d+): (.*)$`)

// yamlParserProblems are the problems yaml.v3 raises from its parser (not its
// scanner). For those it prints the 0-based line of the construct being
// parsed, so the line must be shifted by one to point at the right place.
var yamlParserProblems = []string{
	"did not find expected <document start>",
	"did not find expected node content",
	"did not find expected '-' indicator",
	"did not find expected key",
	"did not find expected ',' or ']'",
	"did not find expected ',' or '}'",
	"found undefined tag handle",
	"found duplicate %YAML directive",
	"found incompatible YAML document",
	"found duplicate %TAG directive",
	"did not find expected <stream-start>",
}

// YAMLError positions the error yaml.v3 returned for src, the contents of
// file, as the workflow parser does: any other YAML file dagrun reads
// reports its syntax errors through it too.
func YAMLError(file string, src []byte, err error) *Error {
	c := collector{file: file}
	c.yamlError(src, err)
	return c.errs[0]
}

// yamlError turns a yaml.v3 syntax error ("yaml: line N: problem") into a
// positioned error, with the column and the offending line found by
// locateSyntaxError where it can.
func (c *collector) yamlError(src []byte, err error) {
	msg := err.Error()
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg = te.Errors[0]
	}
	line := 1
	problem := strings.TrimPrefix(msg, "yaml: ")
	m := yamlLineRE().FindStringSubmatch(msg)
	hasLine := m != nil
	if hasLine {
		line, _ = strconv.Atoi(m[1])
		problem = m[2]
		for _, p := range yamlParserProblems {
			if problem == p {
				line++
				break
			}
		}
	} else if fields := strings.Fields(problem); len(fields) == 4 && fields[0] == "unknown" && fields[1] == "anchor" {
		// "unknown anchor 'x' referenced" carries no line: find the alias.
		name := strings.Trim(fields[2], "'")
		if l, col, ok := findInSource(src, "*"+name); ok {
			c.atPos(l, col, "invalid YAML: alias *%s refers to an anchor &%s that is not defined before it", name, name)
			return
		}
	}
	lines := strings.Split(string(src), "\n")
	if strings.Contains(problem, "tab character") || problem == "found character that cannot start any token" {
		// yaml.v3 names the line of the construct around the tab, or a
		// line past the end: point at the tab itself.
		if l, col, ok := findTab(lines, line); ok {
			c.atPos(l, col, "invalid YAML: %s (a tab: YAML indents and separates with spaces)", problem)
			return
		}
	}
	line = min(max(line, 1), len(lines))
	col := 1
	if l, c, ok := locateSyntaxError(src); ok && l <= len(lines) && (!hasLine || l == line || (l > line && slices.Contains(blockContextProblems, problem))) {
		line, col = l, c
	}
	hint := ""
	if text := lines[line-1]; strings.Contains(text, "${{") && strings.ContainsAny(withoutExpressions(text), "{[") && !strings.Contains(text, `"${{`) && !strings.Contains(text, `'${{`) {
		hint = ` (an unquoted ${{ }} inside a flow mapping or list clashes with YAML's braces: quote it, e.g. "${{ input.x }}", or use block style)`
	}
	if hint == "" && problem == "mapping values are not allowed in this context" {
		hint = ` (check the indentation, or quote a value that contains ": ")`
	}
	c.atPos(line, col, "invalid YAML: %s%s", problem, hint)
}

// blockContextProblems are the problems for which yaml.v3 names the line
// where the enclosing mapping or list began, however far below it the
// offending line is: a misindented key can be reported many lines above.
var blockContextProblems = []string{
	"did not find expected key",
	"did not find expected '-' indicator",
	"did not find expected node content",
}

// locateSyntaxError returns where goccy/go-yaml, whose errors carry the
// offending token, finds a document invalid. yaml.v3 gives no column, and
// for some problems not the offending line either, so yamlError takes
// this position where it refines yaml.v3's rather than contradicts it.
func locateSyntaxError(src []byte) (line, col int, ok bool) {
	_, err := goccyparser.ParseBytes(src, 0)
	var located goccyyaml.Error
	if !errors.As(err, &located) || located.GetToken() == nil {
		return 0, 0, false
	}
	pos := located.GetToken().Position
	return pos.Line, pos.Column, pos.Line > 0 && pos.Column > 0
}

// findTab returns the 1-based position of the first tab at or after line
// from, or else of the file's first tab.
func findTab(lines []string, from int) (line, col int, ok bool) {
	from = min(max(from, 1), len(lines)+1)
	for _, span := range [][]string{lines[from-1:], lines} {
		for i, text := range span {
			if j := strings.IndexByte(text, '\t'); j >= 0 {
				return len(lines) - len(span) + i + 1, utf8.RuneCountInString(text[:j]) + 1, true
			}
		}
	}
	return 0, 0, false
}

// withoutExpressions is a line with its ${{ }} cut out, whose own braces
// say nothing of YAML's flow style.
func withoutExpressions(line string) string {
	var b strings.Builder
	for {
		start := strings.Index(line, "${{")
		if start < 0 {
			b.WriteString(line)
			return b.String()
		}
		b.WriteString(line[:start])
		end := strings.Index(line[start:], "}}")
		if end < 0 {
			return b.String()
		}
		line = line[start+end+2:]
	}
}

// findInSource returns the 1-based line and column of the first occurrence of s.
func findInSource(src []byte, s string) (int, int, bool) {
	i := strings.Index(string(src), s)
	if i < 0 {
		return 0, 0, false
	}
	before := string(src[:i])
	line := strings.Count(before, "\n") + 1
	col := i - strings.LastIndex(before, "\n")
	return line, col, true
}
