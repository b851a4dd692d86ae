package dag

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"gopkg.in/yaml.v3"
)

// isName reports whether s can name a workflow, step or queue: safe in
// file names, URLs, metrics labels and Mermaid ids without quoting. The
// length is checked apart from the pattern: a counted repetition such as
// {0,127} compiles into as many copies of its class, which took every
// dagrun process about 3 ms to build at start.
func isName(s string) bool { return len(s) <= 128 && nameSyntax().MatchString(s) }

var nameSyntax = lazyRegexp(`^[a-z0-9][a-z0-9._-]*$`)

// lazyRegexp returns a regexp compiled the first time it is asked for.
// Compiled at package init, this package's patterns and expression options
// cost every dagrun process half a millisecond before main, a worker of a
// fleet or a one-line CLI call that never reads a workflow alike
// (GODEBUG=inittrace=1, perf record of dagrun --help).
func lazyRegexp(pattern string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(pattern) })
}

const nameRule = `use at most 128 lowercase letters, digits, ".", "_" and "-", starting with a letter or digit`

// CheckName returns an error naming the rule when s cannot name a
// workflow, step, queue or signal; kind says which, for the message.
func CheckName(kind, s string) error {
	if !isName(s) {
		return fmt.Errorf("invalid %s name %q: %s", kind, s, nameRule)
	}
	return nil
}

// stepBuild is a step being built, with the nodes later checks point at.
type stepBuild struct {
	step     *Step
	label    string // `step "x"` or `step #3`, for messages
	raw      *rawStep
	nameOK   bool
	depNodes []*yaml.Node // one per DependsOn entry
}

// partialRetry holds the retry fields a step or the defaults set explicitly.
type partialRetry struct {
	maxAttempts                 *int
	backoff, maxBackoff         *time.Duration
	backoffNode, maxBackoffNode *yaml.Node
}

type defaults struct {
	retry   partialRetry
	timeout *time.Duration
	queue   string
}

// build turns the raw workflow into the model, reporting every problem.
func (p *parser) build(raw *rawWorkflow) *Workflow {
	w := &Workflow{Source: p.src, Hash: hashSource(p.src)}

	nameOK := false
	switch {
	case raw.Name == nil:
		if !raw.misspelt["name"] {
			p.c.at(raw.node, `missing required key "name": add the workflow name, e.g. name: %s`, exampleName(p.filename))
		}
	default:
		if s, ok := p.text(raw.Name, "", `"name"`); ok {
			w.Name, w.nameLine, w.nameCol = s, raw.Name.Line, raw.Name.Column
			if isName(s) {
				nameOK = true
			} else {
				p.c.at(raw.Name, "invalid workflow name %q: %s", s, nameRule)
			}
		}
	}
	if raw.Description != nil {
		if s, ok := p.optionalText(raw.Description, "", `"description"`); ok {
			w.Description = s
		}
	}
	if raw.Input != nil {
		w.InputSchema, w.schema = p.inputSchema(raw.Input)
	}
	if raw.Schedule != nil {
		p.schedules(raw.Schedule, w)
	}
	if n := raw.Steps; n != nil && n.Kind == yaml.SequenceNode && len(n.Content) > MaxSteps && !p.opts.Stored {
		p.c.at(n, `"steps" has %d steps, over the limit of %d per workflow: split it into workflows that start one another`, len(n.Content), MaxSteps)
		return w
	}
	def := p.defaults(raw.Defaults)
	builds := p.steps(raw, def)
	for _, b := range builds {
		w.Steps = append(w.Steps, b.step)
	}
	if raw.Timeout != nil {
		w.Timeout, _ = p.duration(raw.Timeout, "", "timeout")
	}
	failureBuilds := p.onFailure(raw.OnFailure, def)
	for _, b := range failureBuilds {
		w.OnFailure = append(w.OnFailure, b.step)
	}
	mainBuilds := builds
	builds = append(builds[:len(builds):len(builds)], failureBuilds...)
	w.byName = map[string]*Step{}
	for _, b := range builds {
		if b.nameOK {
			if _, dup := w.byName[b.step.Name]; !dup {
				w.byName[b.step.Name] = b.step
			}
		}
	}
	g := p.checkGraph(builds)
	p.checkFailureDeps(builds)
	p.compileExpressions(builds, g, raw)
	if raw.Concurrency != nil {
		sc := &scope{where: "concurrency.key", graph: g,
			noSteps: "the workflow's key is evaluated when the instance starts, before any step ran; use input or workflow"}
		w.Concurrency = p.concurrency(raw.Concurrency, sc, "")
	}
	if raw.Output != nil {
		sc := outputScope(g, mainBuilds)
		w.Output = p.template(raw.Output, sc)
	}
	if nameOK && p.filename != "" {
		base := filepath.Base(p.filename)
		base = strings.TrimSuffix(strings.TrimSuffix(base, ".yaml"), ".yml")
		if base != w.Name {
			if isName(base) {
				p.c.at(raw.Name, "workflow name %q does not match the file name %q: rename the file to %s.yaml or set name: %s", w.Name, filepath.Base(p.filename), w.Name, base)
			} else {
				p.c.at(raw.Name, "workflow name %q does not match the file name %q: rename the file to %s.yaml", w.Name, filepath.Base(p.filename), w.Name)
			}
		}
	}
	p.checkHandlers(builds)
	p.checkSignals(builds)
	if len(p.c.errs) == 0 {
		w.order = topoOrder(w.Steps)
		w.failureOrder = topoOrder(w.OnFailure)
	}
	return w
}

// exampleName suggests a workflow name in messages, from the file when known.
func exampleName(filename string) string {
	base := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(filename), ".yaml"), ".yml")
	if filename != "" && isName(base) {
		return base
	}
	return "order-processing"
}

// prefix joins a step or section label and a message.
func prefix(label string) string {
	if label == "" {
		return ""
	}
	return label + ": "
}

// text reads a required, non-empty scalar.
func (p *parser) text(n *yaml.Node, label, what string) (string, bool) {
	s, ok := p.optionalText(n, label, what)
	if ok && strings.TrimSpace(s) == "" {
		p.c.at(n, "%s%s is empty", prefix(label), what)
		return "", false
	}
	return s, ok
}

// optionalText reads a scalar that may be empty; null counts as empty.
func (p *parser) optionalText(n *yaml.Node, label, what string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		p.c.at(n, "%s%s must be text, got %s", prefix(label), what, describe(n))
		return "", false
	}
	if n.ShortTag() == "!!null" {
		return "", true
	}
	return n.Value, true
}

// lookup finds the value of key in a mapping without reporting anything.
func (p *parser) lookup(m *yaml.Node, key string) *yaml.Node {
	for _, kv := range p.pairs(m, 0) {
		if kv.key.Kind == yaml.ScalarNode && kv.key.Value == key {
			return kv.value
		}
	}
	return nil
}

func (p *parser) defaults(n *yaml.Node) defaults {
	var d defaults
	if n == nil {
		return d
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return d
	}
	if n.Kind != yaml.MappingNode {
		p.c.at(n, `"defaults" must be a mapping with retry, timeout or queue, got %s`, describe(n))
		return d
	}
	var raw rawDefaults
	p.mapping(n, "in defaults", raw.fields())
	const label = "defaults"
	if raw.Retry != nil {
		// Checked in each step that inherits it (see step): a step may
		// set the other bound.
		d.retry = p.retry(raw.Retry, label, "in defaults.retry")
	}
	if raw.Timeout != nil {
		if t, ok := p.duration(raw.Timeout, label, "timeout"); ok {
			d.timeout = &t
		}
	}
	if raw.Queue != nil {
		d.queue, _ = p.queue(raw.Queue, label)
	}
	return d
}

func builtinRetry() RetryPolicy {
	return RetryPolicy{MaxAttempts: DefaultMaxAttempts, Backoff: DefaultBackoff, MaxBackoff: DefaultMaxBackoff}
}

// applyRetry overrides base field by field with what pr sets.
func applyRetry(base RetryPolicy, pr partialRetry) RetryPolicy {
	if pr.maxAttempts != nil {
		base.MaxAttempts = *pr.maxAttempts
	}
	if pr.backoff != nil {
		base.Backoff = *pr.backoff
	}
	if pr.maxBackoff != nil {
		base.MaxBackoff = *pr.maxBackoff
	}
	return base
}

// backoffError reports backoff > maxBackoff. This is an error, not silently
// allowed: the cap would make every retry wait maxBackoff and the backoff the
// user wrote would never apply (Temporal rejects the same combination).
func (p *parser) backoffError(pr partialRetry, label string, eff RetryPolicy, maxIsDefault bool) {
	n := pr.backoffNode
	if n == nil {
		n = pr.maxBackoffNode
	}
	which := "retry.maxBackoff"
	if maxIsDefault {
		which = "the default retry.maxBackoff"
	}
	p.c.at(n, "%sretry.backoff (%s) is longer than %s (%s), so it would never apply: lower backoff or raise maxBackoff",
		prefix(label), FormatDuration(eff.Backoff), which, FormatDuration(eff.MaxBackoff))
}

func (p *parser) retry(n *yaml.Node, label, where string) partialRetry {
	var pr partialRetry
	if n.Kind != yaml.MappingNode {
		p.c.at(n, `%s"retry" must be a mapping such as {maxAttempts: 3, backoff: 1s, maxBackoff: 1m}, got %s`, prefix(label), describe(n))
		return pr
	}
	var raw rawRetry
	p.mapping(n, where, raw.fields())
	if raw.MaxAttempts != nil {
		n := raw.MaxAttempts
		v, err := strconv.ParseInt(n.Value, 10, 64)
		switch {
		case n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || (err != nil && !errors.Is(err, strconv.ErrRange)):
			p.c.at(n, "%sretry.maxAttempts must be a whole number from 1 to %d (it counts the first try), got %s", prefix(label), MaxAttemptsLimit, describe(n))
		case v < 1:
			p.c.at(n, "%sretry.maxAttempts must be at least 1 (it counts the first try), got %s", prefix(label), n.Value)
		case (err != nil || v > MaxAttemptsLimit) && !p.opts.Stored:
			p.c.at(n, "%sretry.maxAttempts must be at most %d, got %s", prefix(label), MaxAttemptsLimit, n.Value)
		default:
			attempts := int(v)
			pr.maxAttempts = &attempts
		}
	}
	if raw.Backoff != nil {
		if d, ok := p.duration(raw.Backoff, label, "retry.backoff"); ok {
			pr.backoff, pr.backoffNode = &d, raw.Backoff
		}
	}
	if raw.MaxBackoff != nil {
		if d, ok := p.duration(raw.MaxBackoff, label, "retry.maxBackoff"); ok {
			pr.maxBackoff, pr.maxBackoffNode = &d, raw.MaxBackoff
		}
	}
	return pr
}

// durationSyntax matches what time.ParseDuration accepts, whatever the size.
var durationSyntax = lazyRegexp(`^\+?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`)

// duration reads a Go duration (time.ParseDuration) that must be > 0.
// zeroDurationHint is what to do instead of a zero duration, where there
// is something to say.
func zeroDurationHint(what string) string {
	if what == "timeout" {
		return " (leave timeout out for no timeout)"
	}
	return ""
}

func (p *parser) duration(n *yaml.Node, label, what string) (time.Duration, bool) {
	const how = "use a Go duration such as 30s, 5m or 1h30m"
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		p.c.at(n, "%s%s must be a duration (%s), got %s", prefix(label), what, how, describe(n))
		return 0, false
	}
	if tag := n.ShortTag(); tag == "!!int" || tag == "!!float" {
		if f, err := strconv.ParseFloat(n.Value, 64); err == nil && f <= 0 {
			// "write 0s" would only be refused next.
			p.c.at(n, "%s%s must be greater than 0, got %s%s", prefix(label), what, n.Value, zeroDurationHint(what))
			return 0, false
		}
		p.c.at(n, "%s%s %s has no unit: write %ss for seconds (%s)", prefix(label), what, n.Value, n.Value, how)
		return 0, false
	}
	d, err := time.ParseDuration(n.Value)
	switch {
	case err != nil && strings.HasPrefix(strings.TrimLeft(n.Value, "+"), "-"):
		p.c.at(n, "%s%s must be greater than 0, got %q", prefix(label), what, n.Value)
		return 0, false
	case err != nil && durationSyntax().MatchString(n.Value):
		// Well formed, yet refused: time.ParseDuration says only "invalid"
		// when the value overflows.
		p.c.at(n, "%s%s %q is too long: at most %s", prefix(label), what, n.Value, FormatDuration(MaxDuration))
		return 0, false
	case err != nil:
		p.c.at(n, "%sinvalid %s %q: %s", prefix(label), what, n.Value, how)
		return 0, false
	case d <= 0:
		p.c.at(n, "%s%s must be greater than 0, got %q%s", prefix(label), what, n.Value, zeroDurationHint(what))
		return 0, false
	case p.opts.Stored:
	case d < MinDuration:
		p.c.at(n, "%s%s %q is too short: at least %s", prefix(label), what, n.Value, FormatDuration(MinDuration))
		return 0, false
	case d > MaxDuration:
		p.c.at(n, "%s%s %q is too long: at most %s", prefix(label), what, n.Value, FormatDuration(MaxDuration))
		return 0, false
	}
	return d, true
}

func (p *parser) queue(n *yaml.Node, label string) (string, bool) {
	s, ok := p.text(n, label, `"queue"`)
	if !ok {
		return "", false
	}
	if !isName(s) {
		p.c.at(n, "%sinvalid queue name %q: %s", prefix(label), s, nameRule)
		return "", false
	}
	return s, true
}

// steps builds every step, inheriting defaults field by field.
func (p *parser) steps(raw *rawWorkflow, def defaults) []*stepBuild {
	n := raw.Steps
	if n == nil {
		if raw.misspelt["steps"] {
			return nil
		}
		p.c.at(raw.node, `missing required key "steps": add a list of steps, each with at least name and handler`)
		return nil
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		p.c.at(n, `"steps" is empty: a workflow needs at least one step, each with at least name and handler`)
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.c.at(n, `"steps" must be a list of steps (each item starting with "- name: ..."), got %s`, describe(n))
		return nil
	}
	if len(n.Content) == 0 {
		p.c.at(n, `"steps" is empty: a workflow needs at least one step, each with at least name and handler`)
		return nil
	}
	return p.stepList(n, "step", def)
}

// stepList builds the steps of a list (steps: or onFailure:), labelling
// each with kind in messages.
func (p *parser) stepList(n *yaml.Node, kind string, def defaults) []*stepBuild {
	var builds []*stepBuild
	for i, item := range n.Content {
		item = resolve(item)
		if item == nil {
			continue
		}
		label := fmt.Sprintf("%s #%d", kind, i+1)
		if item.Kind != yaml.MappingNode {
			p.c.at(item, "%s must be a mapping with at least name and handler, got %s", label, describe(item))
			continue
		}
		if nn := p.lookup(item, "name"); nn != nil && nn.Kind == yaml.ScalarNode && isName(nn.Value) {
			label = fmt.Sprintf("%s %q", kind, nn.Value)
		}
		b := &stepBuild{label: label, raw: &rawStep{node: item}}
		b.step = &Step{Line: item.Line, Col: item.Column}
		b.raw.misspelt = p.extensibleMapping(item, "in "+label, b.raw.fields())
		p.step(b, def)
		builds = append(builds, b)
	}
	return builds
}

func (p *parser) step(b *stepBuild, def defaults) {
	r, s := b.raw, b.step
	// A missing key that the user misspelt was already reported with a
	// did-you-mean; saying it is missing too would be noise.
	switch {
	case r.Name == nil:
		if !r.misspelt["name"] {
			p.c.at(r.node, `%s: missing required key "name"`, b.label)
		}
	default:
		if name, ok := p.text(r.Name, b.label, `"name"`); ok {
			s.Name = name
			if isName(name) {
				b.nameOK = true
			} else {
				p.c.at(r.Name, "invalid step name %q: %s", name, nameRule)
			}
		}
	}
	switch {
	case r.Handler != nil && r.Wait != nil:
		p.c.at(r.Wait, `%s: a step has exactly one of "handler", "wait" and "workflow": remove one`, b.label)
	case r.Workflow != nil && (r.Handler != nil || r.Wait != nil):
		p.c.at(r.Workflow, `%s: a step has exactly one of "handler", "wait" and "workflow": remove one`, b.label)
	case r.Workflow != nil:
		p.workflowStep(b)
	case r.Wait != nil:
		s.Wait = p.wait(r.Wait, b.label, s.Name)
		if r.ForEach != nil {
			p.c.at(r.ForEach, `%s: a wait step waits for one signal and cannot have "forEach": remove one`, b.label)
		}
		if r.Timeout != nil {
			p.c.at(r.Timeout, `%s: "timeout" bounds a handler's attempt; a wait step's timeout is wait.timeout`, b.label)
		}
		if r.Retry != nil {
			p.c.at(r.Retry, `%s: a wait step runs no handler, so "retry" does not apply: remove it (a step waiting past wait.timeout fails for good)`, b.label)
		}
	case r.Handler == nil:
		if !r.misspelt["handler"] && !r.misspelt["wait"] && !r.misspelt["workflow"] {
			p.c.at(r.node, `%s: missing required key "handler", "wait" or "workflow" (the registered handler that runs it, e.g. handler: echo, the signal it waits for, e.g. wait: {signal: approve}, or the workflow it starts, e.g. workflow: shipping)`, b.label)
		}
	default:
		if h, ok := p.text(r.Handler, b.label, `"handler"`); ok {
			s.Handler = h
		}
	}
	if r.DependsOn != nil {
		p.dependsOn(b, r.DependsOn)
	}
	pr := partialRetry{}
	if r.Retry != nil {
		pr = p.retry(r.Retry, b.label, "in the retry of "+b.label)
	}
	s.Retry = applyRetry(applyRetry(builtinRetry(), def.retry), pr)
	// The policy is checked once the defaults apply, field by field. A
	// wait step runs no handler and retries nothing.
	switch {
	case r.Handler == nil || s.Retry.Backoff <= s.Retry.MaxBackoff:
	case pr.backoff != nil || pr.maxBackoff != nil:
		p.backoffError(pr, b.label, s.Retry, pr.maxBackoff == nil && def.retry.maxBackoff == nil)
	case !p.defaultBackoffReported:
		// The step sets neither bound: the defaults are to blame, once.
		p.defaultBackoffReported = true
		p.backoffError(def.retry, "defaults", s.Retry, def.retry.maxBackoff == nil)
	}
	if def.timeout != nil {
		s.Timeout = *def.timeout
	}
	if r.Timeout != nil {
		if t, ok := p.duration(r.Timeout, b.label, "timeout"); ok {
			s.Timeout = t
		}
	}
	s.Queue = DefaultQueue
	if def.queue != "" {
		s.Queue = def.queue
	}
	if r.Queue != nil {
		if q, ok := p.queue(r.Queue, b.label); ok {
			s.Queue = q
		}
	}
	switch n := r.Concurrency; {
	case n == nil, r.Workflow != nil && r.ForEach == nil:
		// None, or a single workflow step's, which workflowStep refuses.
	case n.Kind == yaml.MappingNode:
		// {key, limit}: compiled with the expressions, checked here.
		switch {
		case r.ForEach != nil:
			p.c.at(n, `%s: on a forEach step "concurrency" is a number (items running at once per instance), not {key, limit}`, b.label)
		case r.Wait != nil:
			p.c.at(n, `%s: a wait step runs no handler, so "concurrency" does not apply: remove it`, b.label)
		}
	default:
		switch c, err := strconv.Atoi(n.Value); {
		case r.ForEach == nil:
			p.c.at(n, `%s: "concurrency" as a number caps the items of a forEach step running at once: add forEach, or write {key, limit} to limit this step across instances`, b.label)
		case n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || err != nil || c < 1:
			p.c.at(n, `%s: "concurrency" must be a positive whole number (items of this step running at once per instance), got %s`, b.label, describe(n))
		default:
			s.Concurrency = c
		}
	}
	if n := r.ContinueOnError; n != nil {
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
			p.c.at(n, `%s: "continueOnError" must be true or false, got %s`, b.label, describe(n))
		} else {
			s.ContinueOnError = n.Value == "true" || n.Value == "True" || n.Value == "TRUE"
		}
	}
}

// dependsOn accepts a list of step names or, as a convenience, a single name.
func (p *parser) dependsOn(b *stepBuild, n *yaml.Node) {
	items := []*yaml.Node{n}
	switch {
	case n.Kind == yaml.SequenceNode:
		items = n.Content
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null":
		return
	case n.Kind != yaml.ScalarNode:
		p.c.at(n, `%s: "dependsOn" must be a list of step names, e.g. dependsOn: [validate], got %s`, b.label, describe(n))
		return
	}
	for _, it := range items {
		it = resolve(it)
		if it == nil {
			continue
		}
		name, ok := p.text(it, b.label, "each dependsOn entry")
		if !ok {
			continue
		}
		b.step.DependsOn = append(b.step.DependsOn, name)
		b.depNodes = append(b.depNodes, it)
	}
}

// graphInfo is the dependency graph of the valid part of a workflow. It is
// linear in the size of the graph: ancestors are only worked out for the
// steps whose expressions read other steps, as bitsets, memoised.
type graphInfo struct {
	names  []string        // valid step names, definition order
	set    map[string]bool // the same names
	index  map[string]int  // build index of each valid name
	deps   [][]int         // build indexes of each step's known dependencies
	anc    [][]uint64      // ancestor bitsets by build index, filled on demand
	inWork []bool          // guards ancestors against a cycle
}

// ancestors returns the bitset of step i's transitive dependencies.
func (g *graphInfo) ancestors(i int) []uint64 {
	if g.anc[i] != nil || g.inWork[i] {
		return g.anc[i] // nil inside a cycle, which is reported elsewhere
	}
	g.inWork[i] = true
	bits := make([]uint64, (len(g.deps)+63)/64)
	for _, d := range g.deps[i] {
		bits[d/64] |= 1 << (d % 64)
		for w, v := range g.ancestors(d) {
			bits[w] |= v
		}
	}
	g.inWork[i] = false
	g.anc[i] = bits
	return bits
}

// dependsOn reports whether step i depends on the step named name, directly
// or not.
func (g *graphInfo) dependsOn(i int, name string) bool {
	j, ok := g.index[name]
	if !ok {
		return false
	}
	for _, d := range g.deps[i] {
		if d == j {
			return true // the common case, without building a bitset
		}
	}
	return g.ancestors(i)[j/64]&(1<<(j%64)) != 0
}

// listNames lists the valid step names but except for a message, at most
// 20 of them.
func listNames(names []string, except string) string {
	const most = 20
	var b strings.Builder
	n, listed := 0, 0
	for _, nm := range names {
		if nm == except {
			continue
		}
		n++
		if listed < most {
			if listed > 0 {
				b.WriteString(", ")
			}
			b.WriteString(nm)
			listed++
		}
	}
	if n > listed {
		fmt.Fprintf(&b, ", and %d more", n-listed)
	}
	return b.String()
}

// checkGraph reports duplicate names, unknown or repeated dependencies and
// cycles.
func (p *parser) checkGraph(builds []*stepBuild) *graphInfo {
	g := &graphInfo{set: map[string]bool{}, index: map[string]int{}, deps: make([][]int, len(builds)),
		anc: make([][]uint64, len(builds)), inWork: make([]bool, len(builds))}
	for i, b := range builds {
		if !b.nameOK {
			continue
		}
		if first, dup := g.index[b.step.Name]; dup {
			p.c.at(b.raw.Name, "duplicate step name %q (first defined at line %d): step names must be unique", b.step.Name, builds[first].raw.Name.Line)
			continue
		}
		g.index[b.step.Name] = i
		g.set[b.step.Name] = true
		g.names = append(g.names, b.step.Name)
	}
	// edges[i] lists (dependency index, node of the entry) for step i.
	type edge struct {
		to   int
		node *yaml.Node
	}
	edges := make([][]edge, len(builds))
	// A step depends only on steps of its own list (checkFailureDeps), so
	// an unknown dependency is matched against those.
	var mainNames, failureNames []string
	for _, nm := range g.names {
		if builds[g.index[nm]].step.OnFailure {
			failureNames = append(failureNames, nm)
		} else {
			mainNames = append(mainNames, nm)
		}
	}
	for i, b := range builds {
		seen := map[string]bool{}
		names, none := mainNames, "no other step is defined"
		if b.step.OnFailure {
			names, none = failureNames, "no other onFailure step is defined (an onFailure step depends only on onFailure steps, and may read any step's output without dependsOn)"
		}
		for k, dep := range b.step.DependsOn {
			n := b.depNodes[k]
			switch j, ok := g.index[dep]; {
			case seen[dep]:
				p.c.at(n, "%s lists %q twice in dependsOn: remove one", b.label, dep)
			case dep == b.step.Name:
				p.c.at(n, "%s depends on itself: remove %q from its dependsOn", b.label, dep)
			case !ok:
				others := listNames(names, b.step.Name)
				if s := suggestExcept(dep, names, b.step.Name); s != "" {
					p.c.at(n, "%s depends on unknown step %q (did you mean %q?)", b.label, dep, s)
				} else if others != "" {
					p.c.at(n, "%s depends on unknown step %q (steps: %s)", b.label, dep, others)
				} else {
					p.c.at(n, "%s depends on unknown step %q: %s", b.label, dep, none)
				}
			default:
				edges[i] = append(edges[i], edge{j, n})
				g.deps[i] = append(g.deps[i], j)
			}
			seen[dep] = true
		}
	}

	// Cycles: a depth-first search in definition order; each back edge closes
	// one cycle. Cycles are normalised to start at their earliest-defined step
	// and printed in run order (a -> b: b waits for a), each distinct one once.
	const (
		white = iota
		grey
		black
	)
	color := make([]int, len(builds))
	var stack []int
	reported := map[string]bool{}
	var visit func(i int)
	visit = func(i int) {
		color[i] = grey
		stack = append(stack, i)
		for _, e := range edges[i] {
			switch color[e.to] {
			case white:
				visit(e.to)
			case grey:
				// stack from e.to to i is a dependsOn chain: e.to needs ... needs i needs e.to.
				start := len(stack) - 1
				for stack[start] != e.to {
					start--
				}
				chain := append([]int(nil), stack[start:]...)
				// Run order is the reverse of the dependsOn chain.
				for l, r := 0, len(chain)-1; l < r; l, r = l+1, r-1 {
					chain[l], chain[r] = chain[r], chain[l]
				}
				minAt := 0
				for k, v := range chain {
					if v < chain[minAt] {
						minAt = k
					}
				}
				chain = append(chain[minAt:], chain[:minAt]...)
				names := make([]string, 0, len(chain)+1)
				for _, v := range chain {
					names = append(names, builds[v].step.Name)
				}
				names = append(names, names[0])
				key := strings.Join(names, " -> ")
				if reported[key] {
					continue
				}
				reported[key] = true
				// Point at the entry of the first step that closes the loop:
				// it depends on the last step of the path.
				first, last := chain[0], chain[len(chain)-1]
				var at *yaml.Node
				for _, e2 := range edges[first] {
					if e2.to == last {
						at = e2.node
						break
					}
				}
				p.c.at(at, "dependency cycle %s: each step waits for the one before it, so none can start; remove one of these dependsOn entries", key)
			}
		}
		stack = stack[:len(stack)-1]
		color[i] = black
	}
	for i := range builds {
		if color[i] == white {
			visit(i)
		}
	}
	return g
}

// compileExpressions compiles every step's when and input, now that the
// ancestors are known.
func (p *parser) compileExpressions(builds []*stepBuild, g *graphInfo, raw *rawWorkflow) {
	main := mainStep(builds)
	for i, b := range builds {
		sc := &scope{where: b.label, self: b.step.Name, graph: g,
			canRead: func(name string) bool { return g.dependsOn(i, name) }}
		if b.step.OnFailure {
			// An onFailure step runs once the main steps ended, so it may
			// read any of them, as output: may.
			sc.failure = true
			sc.canRead = func(name string) bool { return g.dependsOn(i, name) || main(name) }
		}
		if !b.nameOK {
			sc.self = "" // an invalid name matches no reference
		}
		if b.raw.When != nil {
			b.step.When = p.when(b.raw.When, sc, b.label)
		}
		if b.raw.ForEach != nil {
			b.step.ForEach = p.forEach(b.raw.ForEach, sc, b.label)
		}
		if n := b.raw.Concurrency; n != nil && n.Kind == yaml.MappingNode && b.raw.ForEach == nil && b.raw.Wait == nil {
			keyScope := *sc
			keyScope.where = b.label + " concurrency.key"
			b.step.KeyConcurrency = p.concurrency(n, &keyScope, b.label)
		}
		if b.raw.Input != nil {
			itemScope := *sc
			itemScope.items = b.raw.ForEach != nil
			b.step.Input = p.template(b.raw.Input, &itemScope)
		}
	}
}

// checkHandlers reports handler names the registry does not know.
func (p *parser) checkHandlers(builds []*stepBuild) {
	if p.opts.HandlerExists == nil {
		return
	}
	var names []string
	if p.opts.HandlerNames != nil {
		names = append(names, p.opts.HandlerNames()...)
		sort.Strings(names)
	}
	for _, b := range builds {
		h := b.step.Handler
		if h == "" || p.opts.HandlerExists(h) {
			continue
		}
		switch {
		case p.opts.HandlerNames == nil:
			p.c.at(b.raw.Handler, "%s: handler %q is not registered: fix the name or register it in your binary", b.label, h)
		case len(names) == 0:
			p.c.at(b.raw.Handler, "%s: handler %q is not registered (no handlers are registered)", b.label, h)
		default:
			list := names
			more := ""
			if len(list) > 20 {
				list, more = list[:20], fmt.Sprintf(", and %d more", len(names)-20)
			}
			dym := ": fix the name or register it in your binary"
			if s := suggest(h, names); s != "" {
				dym = fmt.Sprintf("; did you mean %q?", s)
			}
			p.c.at(b.raw.Handler, "%s: handler %q is not registered%s (registered: %s%s)", b.label, h, dym, strings.Join(list, ", "), more)
		}
	}
}

// FormatDuration prints a duration the way users write one: 1m, not 1m0s.
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// forEach compiles a step's forEach: one expression giving the list, or a
// literal YAML list. item and index are not defined in it: it is what
// defines them.
func (p *parser) forEach(n *yaml.Node, sc *scope, label string) *Template {
	switch {
	case n.Kind == yaml.SequenceNode:
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str":
		segs, problem := p.splitScalar(n)
		if problem != "" {
			p.c.at(n, "%s: %s", label, problem)
			return nil
		}
		if !isWholeExpr(segs) {
			p.c.at(n, `%s: "forEach" must be a list or one expression giving a list, e.g. forEach: ${{ steps.list.output.items }}, got %s`, label, describe(n))
			return nil
		}
	default:
		p.c.at(n, `%s: "forEach" must be a list or one expression giving a list, e.g. forEach: ${{ steps.list.output.items }}, got %s`, label, describe(n))
		return nil
	}
	return p.template(n, sc)
}
