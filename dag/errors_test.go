package dag

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseErrors checks the exact messages of every error kind: each
// testdata/errors/CASE.yaml is parsed and its errors compared with
// CASE.golden. These are the product's error messages: review them by eye
// after -update.
func TestParseErrors(t *testing.T) {
	t.Parallel()
	files := testdataFiles(t, "errors/*.yaml")
	require.NotEmpty(t, files)
	for _, path := range files {
		name := strings.TrimSuffix(filepath.Base(path), ".yaml")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			src, err := os.ReadFile(path)
			require.NoError(t, err)
			w, err := Parse(filepath.Base(path), src, testOptions())
			require.Error(t, err, "a bad workflow must not parse")
			require.Nil(t, w)

			var list ErrorList
			require.True(t, errors.As(err, &list))
			for _, e := range list {
				require.Equal(t, filepath.Base(path), e.File)
				require.Positive(t, e.Line)
				require.Positive(t, e.Col)
				require.NotContains(t, e.Msg, "\n", "messages are one line each")
			}
			golden(t, strings.TrimSuffix(path, ".yaml")+".golden", err.Error()+"\n")
		})
	}
}

func TestMultipleMistakesAllReportedInOrder(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("testdata/errors/multiple-mistakes.yaml")
	require.NoError(t, err)
	_, err = Parse("multiple-mistakes.yaml", src, testOptions())
	var list ErrorList
	require.True(t, errors.As(err, &list))
	require.GreaterOrEqual(t, len(list), 8, "every mistake is reported, not just the first")
	for i := 1; i < len(list); i++ {
		prev, cur := list[i-1], list[i]
		require.True(t, prev.Line < cur.Line || (prev.Line == cur.Line && prev.Col <= cur.Col), "sorted by position: %v before %v", prev, cur)
	}
	// Unwrap exposes each error to errors.As.
	var first *Error
	require.True(t, errors.As(err, &first))
	require.Equal(t, list[0], first)
}

func TestErrorFormat(t *testing.T) {
	t.Parallel()
	require.Equal(t, "a.yaml:3:5: boom", (&Error{File: "a.yaml", Line: 3, Col: 5, Msg: "boom"}).Error())
	require.Equal(t, "3:5: boom", (&Error{Line: 3, Col: 5, Msg: "boom"}).Error())
	require.Equal(t, "a.yaml: cannot read", (&Error{File: "a.yaml", Msg: "cannot read"}).Error())
	l := ErrorList{{Line: 1, Col: 1, Msg: "a"}, {Line: 2, Col: 1, Msg: "b"}}
	require.Equal(t, "1:1: a\n2:1: b", l.Error())
	require.Len(t, l.Unwrap(), 2)
}

func TestNameCheckSkippedWithoutFilename(t *testing.T) {
	t.Parallel()
	src := "name: anything\nsteps:\n  - name: a\n    handler: echo\n"
	_, err := Parse("", []byte(src), nil)
	require.NoError(t, err)
	_, err = Parse("dir/anything.yml", []byte(src), nil)
	require.NoError(t, err)
	_, err = Parse("dir/other.yaml", []byte(src), nil)
	require.EqualError(t, err, `dir/other.yaml:1:7: workflow name "anything" does not match the file name "other.yaml": rename the file to anything.yaml or set name: other`)
}

func TestHandlerCheck(t *testing.T) {
	t.Parallel()
	src := "name: h\nsteps:\n  - name: a\n    handler: nope\n"
	// Without HandlerExists, any handler name is accepted.
	_, err := Parse("", []byte(src), nil)
	require.NoError(t, err)
	// Without HandlerNames, the message cannot list alternatives.
	_, err = Parse("", []byte(src), &ParseOptions{HandlerExists: func(string) bool { return false }})
	require.EqualError(t, err, `4:14: step "a": handler "nope" is not registered: fix the name or register it in your binary`)
	_, err = Parse("", []byte(src), &ParseOptions{
		HandlerExists: func(n string) bool { return n == "a" || n == "b" || n == "c" },
		HandlerNames:  func() []string { return []string{"c", "a", "b"} },
	})
	require.EqualError(t, err, `4:14: step "a": handler "nope" is not registered: fix the name or register it in your binary (registered: a, b, c)`)
}

func TestYAMLErrorLines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ src, want string }{
		// goccy/go-yaml's position adds the column to yaml.v3's line...
		{"name: x\nsteps:\n  - name: a\n    handler: [1, 2\n", "4:14: invalid YAML: did not find expected ',' or ']'"},
		{"name: x\nsteps:\n  - name: a\n    handler: @echo\n", "4:14: invalid YAML: found character that cannot start any token"},
		{"name: \"a\"b\nsteps: []\n", "1:10: invalid YAML: did not find expected key"},
		// ...and, where yaml.v3 names the line an enclosing mapping or
		// list began on, the offending line below it.
		{"name: x\nsteps:\n  - name: a\n    handler: echo\n  - name: b\n    handler: echo\n   dependsOn: [a]\n", "7:4: invalid YAML: did not find expected '-' indicator"},
		{"name: x\nsteps:\n  - name: a\n    input:\n      x: 1\n     y: 2\n", "6:6: invalid YAML: did not find expected key"},
		// A flow list left open on one line is reported where it opens,
		// not at the next line, where goccy/go-yaml notices it.
		{"name: x\nsteps:\n  - name: a\n    input: [1, 2\n  - name: b\n", "4:1: invalid YAML: did not find expected ',' or ']'"},
		// A plain value running on into a key: yaml.v3's line is the
		// colon's, goccy/go-yaml's the value's start, the line above.
		{"name: x\nsteps:\n  - name: a\n    handler: echo\n  - name: b\n     handler: echo\n", "6:1: invalid YAML: mapping values are not allowed in this context (check the indentation, or quote a value that contains \": \")"},
		{"name: x\n- a\n", "2:1: invalid YAML: did not find expected key"},
		{"name: x\nsteps:\n\t- a\n", "3:1: invalid YAML: found character that cannot start any token (a tab: YAML indents and separates with spaces)"},
		// yaml.v3 names the mapping's line (5), or a line past the end:
		// the tab is what is pointed at.
		{"name: x\nsteps:\n  - name: a\n    handler: echo\n    input:\n\t  x: 1\n", "6:1: invalid YAML: found character that cannot start any token (a tab: YAML indents and separates with spaces)"},
		{"name: x\nsteps: *nope\n", "2:8: invalid YAML: alias *nope refers to an anchor &nope that is not defined before it"},
		{"name: 'x\n", "2:1: invalid YAML: found unexpected end of stream"},
	} {
		_, err := Parse("", []byte(tc.src), nil)
		require.EqualError(t, err, tc.want, "source:\n%s", tc.src)
	}
}
