package dagrun_test

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
)

// referencePath is the workflow language reference.
var referencePath = filepath.Join("workflows", "README.md")

// TestWorkflowReferenceIsComplete keeps the workflow language reference in
// step with the code, both ways: every key the parser accepts has a row in
// its section's table and every row names a key the parser accepts; every
// built-in handler has its own heading under "Built-in handlers" and every
// heading there is a built-in; and every complete workflow shown in it
// (a yaml block starting with name:) is valid.
func TestWorkflowReferenceIsComplete(t *testing.T) {
	t.Parallel()
	doc := readReference(t)
	keys := dag.AcceptedKeys()
	builtins := handlers.NewRegistry()
	handlers.RegisterBuiltins(builtins)

	tables := []struct {
		heading string
		want    []string
	}{
		{"Top-level fields", keys.Workflow},
		{"Defaults", keys.Defaults},
		{"Step fields", keys.Step},
		{"retry", keys.Retry},
		{"schedule", keys.Schedule},
		{"wait", keys.Wait},
		{"concurrency", keys.Concurrency},
	}
	for _, tt := range tables {
		t.Run("Keys/"+tt.heading, func(t *testing.T) {
			t.Parallel()
			body := doc.section(t, tt.heading)
			require.ElementsMatch(t, tt.want, tableKeys(body),
				"the table under %q in %s must have one row per key the parser accepts there", tt.heading, referencePath)
		})
	}

	t.Run("BuiltinHandlers", func(t *testing.T) {
		t.Parallel()
		require.ElementsMatch(t, builtins.Names(), doc.subheadings(t, "Built-in handlers"),
			"%s must have one ### heading per built-in handler under \"Built-in handlers\"", referencePath)
		for _, name := range builtins.Names() {
			require.NotEmpty(t, strings.TrimSpace(doc.section(t, name)), "the section of built-in %q is empty", name)
		}
	})

	t.Run("ExamplesAreValid", func(t *testing.T) {
		t.Parallel()
		examples := workflowExamples(doc.text)
		require.NotEmpty(t, examples)
		for _, src := range examples {
			_, err := dag.Parse("", []byte(src), &dag.ParseOptions{HandlerExists: builtins.Has, HandlerNames: builtins.Names})
			require.NoError(t, err, "an example in %s is not a valid workflow:\n%s", referencePath, src)
		}
	})
}

// reference is the reference's text cut at its headings.
type reference struct {
	text     string
	headings []heading
}

type heading struct {
	level int
	title string
	body  string // up to the next heading of any level
}

func readReference(t *testing.T) *reference {
	t.Helper()
	raw, err := os.ReadFile(referencePath)
	require.NoError(t, err)
	doc := &reference{text: string(raw)}
	var cur *heading
	inFence := false
	sc := bufio.NewScanner(strings.NewReader(doc.text))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if !inFence && strings.HasPrefix(line, "#") {
			level := len(line) - len(strings.TrimLeft(line, "#"))
			doc.headings = append(doc.headings, heading{level: level, title: strings.TrimSpace(line[level:])})
			cur = &doc.headings[len(doc.headings)-1]
			continue
		}
		if cur != nil {
			cur.body += line + "\n"
		}
	}
	require.NoError(t, sc.Err())
	return doc
}

// section returns the text under the one heading titled title.
func (r *reference) section(t *testing.T, title string) string {
	t.Helper()
	var found []string
	for _, h := range r.headings {
		if h.title == title {
			found = append(found, h.body)
		}
	}
	require.Len(t, found, 1, "%s must have exactly one heading %q", referencePath, title)
	return found[0]
}

// subheadings returns the titles of the headings one level below title,
// up to the next heading at title's level or above.
func (r *reference) subheadings(t *testing.T, title string) []string {
	t.Helper()
	var titles []string
	parent := -1
	for i, h := range r.headings {
		switch {
		case parent < 0 && h.title == title:
			parent = i
		case parent >= 0 && h.level <= r.headings[parent].level:
			return titles
		case parent >= 0 && h.level == r.headings[parent].level+1:
			titles = append(titles, h.title)
		}
	}
	require.GreaterOrEqual(t, parent, 0, "%s has no heading %q", referencePath, title)
	return titles
}

// tableRow matches a table row whose first cell is one `key`.
var tableRow = regexp.MustCompile("^\\| `([^`]+)` \\|")

func tableKeys(body string) []string {
	var keys []string
	for line := range strings.Lines(body) {
		if m := tableRow.FindStringSubmatch(line); m != nil {
			keys = append(keys, m[1])
		}
	}
	return keys
}

// yamlBlock matches a fenced yaml block and captures its text.
var yamlBlock = regexp.MustCompile("(?s)```yaml\n(.*?)```")

// workflowExamples returns the yaml blocks that are whole workflows.
func workflowExamples(text string) []string {
	var out []string
	for _, m := range yamlBlock.FindAllStringSubmatch(text, -1) {
		if strings.HasPrefix(m[1], "name:") {
			out = append(out, m[1])
		}
	}
	return out
}
