package dag

import (
	"container/heap"
	"fmt"
	"strings"
)

// topoOrder is Kahn's algorithm that always takes the earliest-defined ready
// step, so the order is deterministic and as close to the file as possible.
// Steps caught in a cycle (impossible after Parse) are appended at the end.
func topoOrder(steps []*Step) []*Step {
	index := make(map[string]int, len(steps))
	for i, s := range steps {
		if _, dup := index[s.Name]; !dup {
			index[s.Name] = i
		}
	}
	waiting := make([]int, len(steps))
	dependents := make([][]int, len(steps))
	for i, s := range steps {
		for _, d := range s.DependsOn {
			if j, ok := index[d]; ok && j != i {
				waiting[i]++
				dependents[j] = append(dependents[j], i)
			}
		}
	}
	ready := &indexHeap{}
	for i := range steps {
		if waiting[i] == 0 {
			heap.Push(ready, i)
		}
	}
	done := make([]bool, len(steps))
	out := make([]*Step, 0, len(steps))
	for ready.Len() > 0 {
		next := heap.Pop(ready).(int)
		done[next] = true
		out = append(out, steps[next])
		for _, d := range dependents[next] {
			if waiting[d]--; waiting[d] == 0 {
				heap.Push(ready, d)
			}
		}
	}
	for i := range steps {
		if !done[i] {
			out = append(out, steps[i])
		}
	}
	return out
}

// indexHeap is a min-heap of step indexes: the earliest-defined ready step
// comes out first.
type indexHeap []int

func (h indexHeap) Len() int           { return len(h) }
func (h indexHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h indexHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *indexHeap) Push(x any)        { *h = append(*h, x.(int)) }
func (h *indexHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// TopologicalOrder returns the steps so that each comes after all its
// dependencies; among steps that could go next, the one defined first wins.
func (w *Workflow) TopologicalOrder() []*Step {
	if w.order == nil {
		return topoOrder(w.Steps)
	}
	return append([]*Step(nil), w.order...)
}

// Ancestors returns the transitive dependencies of step (not step itself),
// or nil when there is no such step. The map is the caller's to keep.
func (w *Workflow) Ancestors(step string) map[string]bool {
	s := w.Step(step)
	if s == nil {
		return nil
	}
	out := map[string]bool{}
	todo := append([]string(nil), s.DependsOn...)
	for len(todo) > 0 {
		name := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if out[name] {
			continue
		}
		out[name] = true
		if d := w.Step(name); d != nil {
			todo = append(todo, d.DependsOn...)
		}
	}
	return out
}

var mermaidUnsafe = lazyRegexp(`[^A-Za-z0-9_]`)

// mermaidIDs gives each step a Mermaid node id: "step_" plus the name with
// characters Mermaid treats specially replaced. The prefix keeps names such as
// "end" (a Mermaid keyword) or "o..."/"x..." (edge markers) harmless.
func mermaidIDs(steps []*Step) map[string]string {
	ids := map[string]string{}
	used := map[string]bool{}
	for _, s := range steps {
		if _, ok := ids[s.Name]; ok {
			continue
		}
		id := "step_" + mermaidUnsafe().ReplaceAllString(s.Name, "_")
		for base, n := id, 2; used[id]; n++ {
			id = fmt.Sprintf("%s_%d", base, n)
		}
		used[id] = true
		ids[s.Name] = id
	}
	return ids
}

var mermaidLabel = strings.NewReplacer(`"`, "#quot;", "<", "#lt;", ">", "#gt;")

// runs says what a step runs, under its name in a graph's node: its
// handler, the signal it waits for, or the workflow it starts; "for
// each: " before it for a forEach step, which runs it once per item.
func (s *Step) runs() string {
	what := s.Handler
	switch {
	case s.Wait != nil:
		what = "wait: " + s.Wait.Signal
	case s.Workflow != "":
		what = "workflow: " + s.Workflow
	}
	if s.ForEach != nil {
		what = "for each: " + what
	}
	return what
}

// Mermaid renders the DAG as a Mermaid flowchart, top to bottom: one node per
// step labelled with its name and what it runs (see Step.runs), one edge dep --> step per
// dependency, in definition order.
func (w *Workflow) Mermaid() string {
	ids := mermaidIDs(w.AllSteps())
	var b strings.Builder
	b.WriteString("flowchart TD\n")
	for _, s := range w.Steps {
		fmt.Fprintf(&b, "    %s[\"%s<br/>%s\"]\n", ids[s.Name], mermaidLabel.Replace(s.Name), mermaidLabel.Replace(s.runs()))
	}
	for _, s := range w.Steps {
		for _, d := range s.DependsOn {
			if dep, ok := ids[d]; ok {
				fmt.Fprintf(&b, "    %s --> %s\n", dep, ids[s.Name])
			}
		}
	}
	w.mermaidOnFailure(&b, ids)
	return b.String()
}

var dotEscape = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func dotQuote(s string) string { return `"` + dotEscape.Replace(s) + `"` }

// DOT renders the DAG as a Graphviz digraph: nodes labelled with name and
// handler, edges dep -> step.
func (w *Workflow) DOT() string {
	var b strings.Builder
	fmt.Fprintf(&b, "digraph %s {\n", dotQuote(w.Name))
	b.WriteString("    rankdir=TB;\n")
	b.WriteString("    node [shape=box, style=rounded];\n")
	for _, s := range w.Steps {
		fmt.Fprintf(&b, "    %s [label=%s];\n", dotQuote(s.Name), `"`+dotEscape.Replace(s.Name)+`\n`+dotEscape.Replace(s.runs())+`"`)
	}
	for _, s := range w.Steps {
		for _, d := range s.DependsOn {
			fmt.Fprintf(&b, "    %s -> %s;\n", dotQuote(d), dotQuote(s.Name))
		}
	}
	w.dotOnFailure(&b)
	b.WriteString("}\n")
	return b.String()
}
