package dag

import (
	"cmp"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Calls between workflows are checked across the files of a folder, once
// every file is parsed on its own: a workflow step names another file's
// workflow, so neither file alone can tell whether the call is sound.

// CheckCalls checks the workflow steps of a set of workflows (typically a
// folder) against each other: every called workflow must be in the set, no
// workflow may call itself directly or through others, and a literal input
// mapping must set every property the called workflow's input schema
// requires at its top level. Inputs built at run time (an expression, a
// forEach item) are left to the run-time check. Each error is positioned at
// the `workflow:` value of the step, like the errors of Parse, and a workflow that calls one with
// such an error gets one too: it could not run as written either.
//
// broken, which may be nil, names the workflows whose files did not parse
// (name -> file), so that a call to one of them says so rather than
// "unknown workflow". ws may hold what ParseFilePartial read of such files:
// their own calls are checked too (a cycle through one included), while a
// call to one says its file has errors.
func CheckCalls(ws []*Workflow, broken map[string]string) ErrorList {
	errs, _ := checkCalls(ws, broken)
	return errs
}

// checkCalls is CheckCalls returning, besides the errors, the names of
// the workflows that cannot run as written: those with a bad call, and
// those calling one of them, directly or not.
func checkCalls(ws []*Workflow, broken map[string]string) (ErrorList, map[string]bool) {
	byName := make(map[string]*Workflow, len(ws)) // the workflows a step may call
	partial := map[string]*Workflow{}             // read from files with errors
	var names []string
	for _, w := range ws {
		_, dup := byName[w.Name]
		if _, dupPartial := partial[w.Name]; dup || dupPartial {
			continue
		}
		if w.partial {
			partial[w.Name] = w
		} else {
			byName[w.Name] = w
		}
		names = append(names, w.Name)
	}
	sort.Strings(names)

	var errs ErrorList
	bad := map[string]bool{}
	edges := map[string][]callSite{} // caller -> its calls of a workflow that exists
	for _, name := range names {
		w := cmp.Or(byName[name], partial[name])
		if w.partial {
			bad[name] = true
		}
		for _, site := range callSites(w) {
			callee, ok := byName[site.step.Workflow]
			switch {
			case !ok && broken[site.step.Workflow] != "":
				errs = append(errs, site.errorf("calls workflow %q, whose file %s has errors: fix them first (dagrun validate lists them)",
					site.step.Workflow, filepath.Base(broken[site.step.Workflow])))
				bad[name] = true
				if partial[site.step.Workflow] != nil {
					edges[name] = append(edges[name], site) // for the cycles through it
				}
			case !ok:
				dym := ""
				if m := suggest(site.step.Workflow, names); m != "" {
					dym = fmt.Sprintf("; did you mean %q?", m)
				}
				errs = append(errs, site.errorf("unknown workflow %q%s (%s)", site.step.Workflow, dym, available(names)))
				bad[name] = true
			default:
				edges[name] = append(edges[name], site)
				if msg := CappedLimited(site.step, callee); msg != "" {
					errs = append(errs, site.errorf("%s", msg))
					bad[name] = true
				}
				if missing := missingInput(site.step, callee); len(missing) > 0 {
					what, them := "property", "it"
					if len(missing) > 1 {
						what, them = "properties", "them"
					}
					errs = append(errs, site.errorf("workflow %q requires the input %s %s, which this step's input does not set: add %s to its input",
						callee.Name, what, quoteList(missing), them))
					bad[name] = true
				}
			}
		}
	}

	// Each file of a cycle gets the error, the path read from its own call,
	// so that validating any one of them explains why it is refused.
	for _, cycle := range callCycles(names, edges) {
		for i, site := range cycle {
			path := make([]string, 0, len(cycle)+1)
			for j := range cycle {
				path = append(path, cycle[(i+j)%len(cycle)].caller)
			}
			path = append(path, site.caller)
			errs = append(errs, site.errorf("workflow call cycle %s: each instance would start another without end; remove one of these workflow steps",
				strings.Join(path, " -> ")))
			bad[site.caller] = true
		}
	}

	// A workflow calling one that cannot run cannot run either: say where,
	// so the user is not left wondering why it is missing from the folder.
	for changed := true; changed; {
		changed = false
		for _, name := range names {
			if bad[name] {
				continue
			}
			for _, site := range edges[name] {
				if bad[site.step.Workflow] && partial[site.step.Workflow] == nil { // a partial one's call said so
					errs = append(errs, site.errorf("calls workflow %q, which has errors of its own (in %s): fix them first",
						site.step.Workflow, filepath.Base(byName[site.step.Workflow].file)))
					bad[name] = true
					changed = true
					break
				}
			}
		}
	}
	sortErrors(errs)
	return errs, bad
}

// callSite is a workflow step, with the workflow and file calling.
type callSite struct {
	caller string
	file   string
	step   *Step
}

// errorf reports at the step's workflow: value.
func (s callSite) errorf(format string, args ...any) *Error {
	return &Error{File: s.file, Line: s.step.WorkflowLine, Col: s.step.WorkflowCol, Msg: fmt.Sprintf("step %q: ", s.step.Name) + fmt.Sprintf(format, args...)}
}

// callSites lists the workflow steps of w in definition order.
func callSites(w *Workflow) []callSite {
	var sites []callSite
	for _, s := range w.Steps {
		if s.Workflow != "" {
			sites = append(sites, callSite{caller: w.Name, file: w.file, step: s})
		}
	}
	return sites
}

// CappedLimited is why a forEach workflow step cannot cap its children
// running at once when callee limits its instances itself, "" when it
// can: the cap is a concurrency key of the children too, and an instance
// has only one.
func CappedLimited(step *Step, callee *Workflow) string {
	if step.ForEach == nil || step.Concurrency == 0 || callee.Concurrency == nil {
		return ""
	}
	return fmt.Sprintf(`workflow %q limits its instances with its own "concurrency", so a forEach step over it cannot cap its items too: remove one of them`, callee.Name)
}

// missingInput lists the top-level required properties of callee's input
// schema that the step's input cannot set: only a literal mapping (or no
// input at all, which gives the child an empty input) is known before run
// time. A forEach step without input passes each item as it is, which
// only the run can tell.
func missingInput(step *Step, callee *Workflow) []string {
	required := requiredProperties(callee.InputSchema)
	if len(required) == 0 {
		return nil
	}
	var keys []string
	switch {
	case step.Input == nil && step.ForEach != nil:
		return nil
	case step.Input == nil:
	default:
		m, ok := step.Input.root.(tMap)
		if !ok {
			return nil
		}
		keys = m.keys
	}
	var missing []string
	for _, r := range required {
		if !slices.Contains(keys, r) {
			missing = append(missing, r)
		}
	}
	return missing
}

// requiredProperties reads the "required" list at the top of a schema,
// the part of it a reader of the calling file can check by eye too.
func requiredProperties(schema json.RawMessage) []string {
	if len(schema) == 0 {
		return nil
	}
	var top struct {
		Required []string `json:"required"`
	}
	if json.Unmarshal(schema, &top) != nil {
		return nil
	}
	return top.Required
}

// callCycles finds the cycles of the call graph, one per strongly
// connected component that has one (a workflow calling itself is a
// component of one), each as the calls along it, starting at the
// alphabetically first workflow of the component, so that the same folder
// always gives the same message.
func callCycles(names []string, edges map[string][]callSite) [][]callSite {
	comps := stronglyConnected(names, edges)
	var cycles [][]callSite
	for _, comp := range comps {
		in := map[string]bool{}
		for _, n := range comp {
			in[n] = true
		}
		start := comp[0]
		if len(comp) == 1 && !callsItself(start, edges) {
			continue
		}
		if path := pathBack(start, in, edges); path != nil {
			cycles = append(cycles, path)
		}
	}
	return cycles
}

func callsItself(name string, edges map[string][]callSite) bool {
	for _, s := range edges[name] {
		if s.step.Workflow == name {
			return true
		}
	}
	return false
}

// pathBack finds, by breadth-first search inside one component, the
// shortest chain of calls from start back to start.
func pathBack(start string, in map[string]bool, edges map[string][]callSite) []callSite {
	type hop struct {
		via  callSite
		prev string
	}
	came := map[string]hop{}
	queue := []string{start}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, s := range edges[cur] {
			next := s.step.Workflow
			if !in[next] {
				continue
			}
			if next == start {
				path := []callSite{s}
				for at := cur; at != start; at = came[at].prev {
					path = append(path, came[at].via)
				}
				slices.Reverse(path)
				return path
			}
			if _, seen := came[next]; !seen {
				came[next] = hop{via: s, prev: cur}
				queue = append(queue, next)
			}
		}
	}
	return nil
}

// stronglyConnected is Tarjan's algorithm over the call graph; each
// component comes sorted by name, and the components in the order of
// their first name.
func stronglyConnected(names []string, edges map[string][]callSite) [][]string {
	index := map[string]int{}
	low := map[string]int{}
	onStack := map[string]bool{}
	var stack []string
	var comps [][]string
	var visit func(v string)
	visit = func(v string) {
		index[v] = len(index)
		low[v] = index[v]
		stack = append(stack, v)
		onStack[v] = true
		for _, s := range edges[v] {
			w := s.step.Workflow
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] == index[v] {
			var comp []string
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				onStack[w] = false
				comp = append(comp, w)
				if w == v {
					break
				}
			}
			sort.Strings(comp)
			comps = append(comps, comp)
		}
	}
	for _, n := range names {
		if _, seen := index[n]; !seen {
			visit(n)
		}
	}
	sort.Slice(comps, func(i, j int) bool { return comps[i][0] < comps[j][0] })
	return comps
}

// available lists the workflows a call may name, for the unknown-name
// message.
func available(names []string) string {
	if len(names) == 0 {
		return "no workflows in this folder"
	}
	list, more := names, ""
	if len(list) > 20 {
		list, more = list[:20], fmt.Sprintf(", and %d more", len(names)-20)
	}
	return "workflows of this folder: " + strings.Join(list, ", ") + more
}

// quoteList writes "a", "a" and "b", or "a", "b" and "c".
func quoteList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	if len(q) == 1 {
		return q[0]
	}
	return strings.Join(q[:len(q)-1], ", ") + " and " + q[len(q)-1]
}
