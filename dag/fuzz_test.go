package dag

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// FuzzParse feeds arbitrary bytes to Parse: it must never panic, and its
// results must keep their promises (a workflow or a sorted, positioned
// ErrorList; templates that evaluate to JSON-ready values). The seeds are
// every workflow file of the repository; run the fuzzer with
// go test -fuzz=FuzzParse ./dag.
func FuzzParse(f *testing.F) {
	for _, pattern := range []string{"testdata/errors/*.yaml", "testdata/graph/*.yaml", "../workflows/*.yaml"} {
		files, err := filepath.Glob(pattern)
		if err != nil {
			f.Fatal(err)
		}
		for _, path := range files {
			src, err := os.ReadFile(path)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(src)
		}
	}
	f.Add([]byte("name: x\nsteps:\n  - &a {name: a, handler: echo, input: *a}\n"))
	f.Add([]byte("name: x\nsteps:\n  - {name: a, handler: echo, when: \"${{ steps.a.output?.x ?? true }}\"}\n"))
	env := fuzzEnv()
	f.Fuzz(func(t *testing.T, src []byte) {
		w, err := Parse("x.yaml", src, testOptions())
		if err != nil {
			if w != nil {
				t.Fatal("a workflow returned with an error")
			}
			var list ErrorList
			if !errors.As(err, &list) || len(list) == 0 {
				t.Fatalf("not a non-empty ErrorList: %v", err)
			}
			for i, e := range list {
				if e.Line < 1 || e.Col < 1 || e.File != "x.yaml" || strings.Contains(e.Msg, "\n") {
					t.Fatalf("bad error: %#v", e)
				}
				if i > 0 && (list[i-1].Line > e.Line || (list[i-1].Line == e.Line && list[i-1].Col > e.Col)) {
					t.Fatalf("errors out of order: %v", err)
				}
			}
			return
		}
		if len(w.TopologicalOrder()) != len(w.Steps) {
			t.Fatal("topological order lost steps")
		}
		_ = w.Mermaid()
		_ = w.DOT()
		_ = w.ValidateInput(map[string]any{"a": 1.0})
		templates := []*Template{w.Output}
		for _, s := range w.Steps {
			_ = w.Ancestors(s.Name)
			templates = append(templates, s.Input)
			if s.When != nil {
				_, _ = s.When.Bool(env)
			}
		}
		for _, tpl := range templates {
			if tpl == nil {
				continue
			}
			checkEval(t, tpl, env)
		}
	})
}

// FuzzTemplate compiles and evaluates arbitrary template strings: no panic,
// and every successful result must marshal to JSON.
func FuzzTemplate(f *testing.F) {
	for _, s := range []string{
		"${{ input.a }}", "x-${{ input.a }}-${{ steps.a.output.b }}", "${{ {'a': {'b': 1}} }}",
		"${{ '}}' }}", "${{ input.a / 0 }}", "${{ steps.a.output.missing.deeper }}", "${{ now() }}",
		"${{ map(input.list, # * 2) }}", "${{ let x = 1; x + input.a }}", "${{", "${{ }}", "${{ steps }}",
		"${{ duration('1h') }}", "${{ input.list[9] }}", "${{ toJSON(input) }}", "$${{ workflow.id }}}",
		"${{ reduce(1..40, #acc + #acc, 'x') }}", "${{ repeat(input.s, 1000000) }}", "${{ map(1..1000, 1..1000) }}",
		"${{ join(map(1..100000, input.s), ',') }}", "${{ steps.a-b.output }}", "${{ steps['a'].output }}",
	} {
		f.Add(s)
	}
	env := fuzzEnv()
	f.Fuzz(func(t *testing.T, s string) {
		p := &parser{c: &collector{}, opts: &ParseOptions{}, budget: maxNodes}
		node := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s, Line: 1, Column: 1}
		tpl := p.template(node, fuzzScope())
		if len(p.c.errs) > 0 {
			return
		}
		checkEval(t, tpl, env)
		if e := p.when(node, fuzzScope(), "step"); e != nil {
			_, _ = e.Bool(env)
		}
	})
}

// fuzzScope is step "b" of a workflow of steps a and b, b depending on a.
func fuzzScope() *scope {
	g := &graphInfo{names: []string{"a", "b"}, set: map[string]bool{"a": true, "b": true}}
	return &scope{self: "b", graph: g, canRead: func(name string) bool { return name == "a" }}
}

func fuzzEnv() *Env {
	return &Env{
		Input: map[string]any{"a": 2.0, "s": "text", "list": []any{1.0, "x", nil}, "m": map[string]any{"k": true}},
		Steps: map[string]StepEnv{
			"a": {Status: "completed", Output: map[string]any{"b": 1.5}},
			"b": {Status: "skipped"},
		},
		Workflow: WorkflowEnv{ID: "id", Name: "x"},
	}
}

func checkEval(t *testing.T, tpl *Template, env *Env) {
	t.Helper()
	v, err := tpl.Eval(env)
	if err != nil {
		if strings.Contains(err.Error(), "\n") {
			t.Fatalf("multi-line error: %q", err)
		}
		return
	}
	if _, err := json.Marshal(v); err != nil {
		t.Fatalf("result %#v does not marshal: %v", v, err)
	}
}
