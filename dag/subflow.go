package dag

import "gopkg.in/yaml.v3"

// workflowStep reads the workflow: key of a step that starts a child
// instance. Such a step runs no handler of its own, so the keys that shape
// a handler's attempts are refused rather than silently ignored: the
// child's steps carry their own.
func (p *parser) workflowStep(b *stepBuild) {
	r, s := b.raw, b.step
	if name, ok := p.text(r.Workflow, b.label, `"workflow"`); ok {
		if isName(name) {
			s.Workflow = name
			s.WorkflowLine, s.WorkflowCol = r.Workflow.Line, r.Workflow.Column
		} else {
			p.c.at(r.Workflow, "%s: invalid workflow name %q: %s", b.label, name, nameRule)
		}
	}
	for _, k := range []struct {
		node *yaml.Node
		key  string
	}{{r.Retry, "retry"}, {r.Timeout, "timeout"}, {r.Queue, "queue"}} {
		if k.node != nil {
			p.c.at(k.node, `%s: a workflow step runs no handler, so it takes no %q: %s belongs in the child workflow's steps`, b.label, k.key, k.key)
		}
	}
	// On a forEach workflow step a number caps the children running at
	// once, read as any forEach step's cap is; without forEach there are
	// no items to cap.
	if r.Concurrency != nil && r.ForEach == nil {
		p.c.at(r.Concurrency, `%s: a workflow step runs no handler, so it takes no "concurrency": give the child workflow a top-level "concurrency", which its instances count against`, b.label)
	}
}
