package dag

import (
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"
)

// onFailure builds the steps of the onFailure: list: steps like any
// other, run only when an instance fails.
func (p *parser) onFailure(n *yaml.Node, def defaults) []*stepBuild {
	if n == nil || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null") {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.c.at(n, `"onFailure" must be a list of steps run when an instance fails (each item starting with "- name: ..."), got %s`, describe(n))
		return nil
	}
	if len(n.Content) > MaxSteps && !p.opts.Stored {
		p.c.at(n, `"onFailure" has %d steps, over the limit of %d per workflow`, len(n.Content), MaxSteps)
		return nil
	}
	builds := p.stepList(n, "onFailure step", def)
	for _, b := range builds {
		b.step.OnFailure = true
	}
	return builds
}

// checkFailureDeps reports dependencies across the two lists: the main
// steps have ended before any onFailure step runs, so an onFailure step
// depends only on other onFailure steps (it may still read any main
// step's output), and a main step never waits for an onFailure step.
func (p *parser) checkFailureDeps(builds []*stepBuild) {
	onFailure := map[string]bool{}
	main := map[string]bool{}
	for _, b := range builds {
		if b.nameOK && !b.step.OnFailure {
			main[b.step.Name] = true
		}
	}
	for _, b := range builds {
		// A name used twice is reported as a duplicate; the main step's
		// is the one it names.
		if b.nameOK && b.step.OnFailure && !main[b.step.Name] {
			onFailure[b.step.Name] = true
		}
	}
	for _, b := range builds {
		for k, dep := range b.step.DependsOn {
			switch {
			case b.step.OnFailure && main[dep]:
				p.c.at(b.depNodes[k], `%s depends on step %q of steps: onFailure steps run after the main steps ended, so they depend only on other onFailure steps; read its output with ${{ steps.%s.output }} without the dependsOn entry`, b.label, dep, dep)
			case !b.step.OnFailure && onFailure[dep]:
				p.c.at(b.depNodes[k], `%s depends on onFailure step %q, which runs only when the instance fails: remove the entry`, b.label, dep)
			}
		}
	}
}

// mainStep returns a predicate true for the names of the steps: list.
func mainStep(builds []*stepBuild) func(string) bool {
	main := map[string]bool{}
	for _, b := range builds {
		if b.nameOK && !b.step.OnFailure {
			main[b.step.Name] = true
		}
	}
	return func(name string) bool { return main[name] }
}

// outputScope is what output: may read: any main step.
func outputScope(g *graphInfo, builds []*stepBuild) *scope {
	main := mainStep(builds)
	return &scope{where: "output", graph: g, canRead: main, unreadable: func(step string) string {
		return fmt.Sprintf("output cannot read onFailure step %q: it runs only when the instance fails, and the output is computed when it completes", step)
	}}
}

// failureFieldsHint completes the message of an unknown workflow field in
// an onFailure step, where two more fields exist.
func failureFieldsHint(sc *scope) string {
	if sc.failure {
		return " (or, in onFailure steps, workflow.error or workflow.failedStep)"
	}
	return ""
}

// OnFailureOrder returns the onFailure steps so that each comes after all
// its dependencies, as TopologicalOrder does for the steps.
func (w *Workflow) OnFailureOrder() []*Step {
	if w.failureOrder == nil {
		return topoOrder(w.OnFailure)
	}
	return append([]*Step(nil), w.failureOrder...)
}

// mermaidOnFailure draws the onFailure steps as a subgraph of their own:
// they hang off no main step, as they run when any of them fails.
func (w *Workflow) mermaidOnFailure(b *strings.Builder, ids map[string]string) {
	if len(w.OnFailure) == 0 {
		return
	}
	b.WriteString("    subgraph onFailure\n")
	for _, s := range w.OnFailure {
		fmt.Fprintf(b, "        %s[\"%s<br/>%s\"]\n", ids[s.Name], mermaidLabel.Replace(s.Name), mermaidLabel.Replace(s.runs()))
	}
	b.WriteString("    end\n")
	for _, s := range w.OnFailure {
		for _, d := range s.DependsOn {
			if dep, ok := ids[d]; ok {
				fmt.Fprintf(b, "    %s --> %s\n", dep, ids[s.Name])
			}
		}
	}
}

// dotOnFailure draws the onFailure steps as a dashed cluster.
func (w *Workflow) dotOnFailure(b *strings.Builder) {
	if len(w.OnFailure) == 0 {
		return
	}
	b.WriteString("    subgraph cluster_onFailure {\n        label=\"onFailure\";\n        style=dashed;\n")
	for _, s := range w.OnFailure {
		fmt.Fprintf(b, "        %s [label=%s];\n", dotQuote(s.Name), `"`+dotEscape.Replace(s.Name)+`\n`+dotEscape.Replace(s.runs())+`"`)
	}
	b.WriteString("    }\n")
	for _, s := range w.OnFailure {
		for _, d := range s.DependsOn {
			fmt.Fprintf(b, "    %s -> %s;\n", dotQuote(d), dotQuote(s.Name))
		}
	}
}
