package dag

import (
	"gopkg.in/yaml.v3"
)

// wait reads a step's wait: mapping. The signal defaults to the step's name.
func (p *parser) wait(n *yaml.Node, label, stepName string) *Wait {
	const example = `{signal: approve, timeout: 72h}`
	if n.Kind != yaml.MappingNode {
		p.c.at(n, `%s"wait" must be a mapping such as %s, got %s`, prefix(label), example, describe(n))
		return nil
	}
	var raw rawWait
	p.mapping(n, "in the wait of "+label, raw.fields())
	w := &Wait{Signal: stepName}
	if raw.Signal != nil {
		if name, ok := p.text(raw.Signal, label, "wait.signal"); ok {
			if isName(name) {
				w.Signal = name
			} else {
				p.c.at(raw.Signal, "%sinvalid signal name %q: %s", prefix(label), name, nameRule)
			}
		}
	}
	if raw.Timeout != nil {
		if d, ok := p.duration(raw.Timeout, label, "wait.timeout"); ok {
			w.Timeout = d
		}
	}
	if raw.Schema != nil {
		w.Schema, w.schema = p.schema(raw.Schema, label, `"wait.schema"`, "payload")
	}
	return w
}

// checkSignals reports two wait steps waiting for the same signal: an
// instance takes one signal of a name, so the second would never get one.
func (p *parser) checkSignals(builds []*stepBuild) {
	waiting := map[string]string{} // signal -> the first step waiting for it
	for _, b := range builds {
		w := b.step.Wait
		if w == nil {
			continue
		}
		if first, ok := waiting[w.Signal]; ok {
			p.c.at(b.raw.Wait, "%s: waits for signal %q, as step %q does: an instance takes one signal of a name, so give each wait step its own", b.label, w.Signal, first)
			continue
		}
		waiting[w.Signal] = b.step.Name
	}
}
