package dagruntest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agnivade/levenshtein"
	"gopkg.in/yaml.v3"

	"github.com/dagrun/dagrun/dag"
)

// MaxFileBytes bounds a test file, as dag.MaxFileBytes bounds a workflow.
const MaxFileBytes = 4 << 20

// DefaultStart is the fake clock's time when a case starts, unless the case
// sets its own: a fixed time, so that outputs computed from the clock (a
// sleep's wake time) are the same on every run.
var DefaultStart = time.Date(2030, time.January, 1, 0, 0, 0, 0, time.UTC)

// File is one parsed test file: cases of one workflow.
type File struct {
	Path     string
	Workflow string
	Cases    []*Case
}

// Case is one test case: start the workflow with Input, answer its steps'
// handlers with Mocks, send Signals, and check Expect.
type Case struct {
	Name      string
	Line, Col int
	Input     json.RawMessage
	// Start is the fake clock's time when the instance starts.
	Start time.Time
	// Scheduled: the workflow's schedule starts the instance, at its first
	// tick after Start and with the schedule's input, instead of a start
	// with Input.
	Scheduled bool
	// Schedule, for a scheduled case, is the index of the schedule that
	// starts it (scheduled: 1), or -1 for whichever ticks first
	// (scheduled: true).
	Schedule int
	// RunFor, when set, stops the case that long after the start (workflow
	// time): the expectations then see the instance as it stands then,
	// a step still waiting or sleeping.
	RunFor time.Duration
	// Mocks answer handler calls, by step name ("charge") or, for a step
	// of another workflow the tested one starts, "workflow/step": the
	// case's own, then the file's steps: for the steps the case leaves out.
	Mocks   map[string]*Mock
	Signals []*Signal
	Expect  Expect
}

// Mock answers the attempts of one step: attempt N gets Replies[N-1], and
// every attempt past the last reply gets the last one again. An item of a
// forEach step counts its own attempts.
type Mock struct {
	Key       string
	Line, Col int
	Replies   []Reply
}

// reply returns the reply to attempt (1-based).
func (m *Mock) reply(attempt int) Reply {
	return m.Replies[min(max(attempt, 1), len(m.Replies))-1]
}

// Reply is what one attempt of a mocked step returns: exactly one of an
// output, a (retryable) error, a permanent error, or the real handler's
// answer.
type Reply struct {
	Output         json.RawMessage
	Error          string
	PermanentError string
	Real           bool
}

// Signal is a signal a case sends to its instance, After the start (by the
// fake clock); a signal sent before its step waits is kept by the engine
// and delivered when the step starts waiting.
type Signal struct {
	Name  string
	Data  json.RawMessage
	ID    string
	After time.Duration
	// Error, when set, expects the signal to be refused with an error
	// containing it (a payload the schema rejects, a finished instance).
	Error     *string
	Line, Col int
}

// Expect is what a case checks once its instance has settled (finished, or
// waiting with nothing due). Unset fields are not checked.
type Expect struct {
	// StartError, when set, expects the start to be refused with an error
	// containing it (an input the schema rejects).
	StartError *string
	Status     *string
	Output     *Match
	// Error is a text the instance's error must contain.
	Error *string
	// CreatedAt is when the instance must have been created, by the fake
	// clock (a scheduled case's tick).
	CreatedAt *time.Time
	// Steps are the expectations of steps by name, in file order.
	Steps []*StepExpect
	// Events must appear in the history in this order, others may come in
	// between: "STEP.KIND" (charge.retrying) or "instance.KIND".
	Events    []string
	EventsPos position
}

// StepExpect is what a case expects of one step.
type StepExpect struct {
	Name      string
	Line, Col int
	Status    *string
	Attempts  *int
	Input     *Match
	Output    *Match
	// Error is a text the step's error must contain.
	Error *string
}

// Match is an expected JSON value: equal to it, or with Partial, holding
// it (every key of an expected object, recursively; lists compare element
// by element).
type Match struct {
	Value   any
	Partial bool
}

type position struct{ Line, Col int }

// ParseFile reads and parses a test file; see Parse.
func ParseFile(path string, workflows []*dag.Workflow) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, dag.ErrorList{{File: path, Msg: fmt.Sprintf("cannot read the test file: %v", err)}}
	}
	defer f.Close()
	src, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, dag.ErrorList{{File: path, Msg: fmt.Sprintf("cannot read the test file: %v", err)}}
	}
	return Parse(path, src, workflows)
}

// Parse parses a test file against the workflows it may test. On any
// error it returns a dag.ErrorList holding every problem found, each at
// its line and column, like workflow validation: unknown keys, wrong
// types, an unknown workflow or step, a mock of a step that runs no
// handler.
func Parse(path string, src []byte, workflows []*dag.Workflow) (*File, error) {
	p := &fileParser{path: path, src: src, workflows: map[string]*dag.Workflow{}}
	for _, w := range workflows {
		p.workflows[w.Name] = w
	}
	if len(src) > MaxFileBytes {
		p.errorAt(1, 1, "the test file is larger than the limit of %d MiB: split it into several files", MaxFileBytes>>20)
		return nil, p.errs
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(src))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.errorAt(1, 1, "the test file is empty: it needs workflow: and cases:")
		} else {
			p.yamlError(err)
		}
		return nil, p.errs
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.errorAt(extra.Line, extra.Column, "a test file holds one YAML document: move the cases after this --- into the first, or into a file of their own")
	} else if !errors.Is(err, io.EOF) {
		p.yamlError(err)
	}
	f := p.file(&doc)
	if len(p.errs) > 0 {
		slices.SortStableFunc(p.errs, func(a, b *dag.Error) int {
			if a.Line != b.Line {
				return a.Line - b.Line
			}
			return a.Col - b.Col
		})
		return nil, p.errs
	}
	return f, nil
}

type fileParser struct {
	path      string
	src       []byte
	workflows map[string]*dag.Workflow
	errs      dag.ErrorList
}

func (p *fileParser) errorAt(line, col int, format string, args ...any) {
	p.errs = append(p.errs, &dag.Error{File: p.path, Line: line, Col: col, Msg: fmt.Sprintf(format, args...)})
}

func (p *fileParser) errorf(n *yaml.Node, format string, args ...any) {
	p.errorAt(n.Line, n.Column, format, args...)
}

// yamlError reports a YAML syntax error where the workflow parser would.
func (p *fileParser) yamlError(err error) {
	p.errs = append(p.errs, dag.YAMLError(p.path, p.src, err))
}

// fields returns the values of a mapping by key, reporting keys not in
// known (with a did-you-mean), keys written twice, and a node that is not
// a mapping at all (what names it in that message).
func (p *fileParser) fields(n *yaml.Node, what string, known ...string) map[string]*yaml.Node {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		p.errorf(n, "%s must be a mapping (with keys %s)", what, strings.Join(known, ", "))
		return nil
	}
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch {
		case out[k.Value] != nil:
			p.errorf(k, "%s: key %q is written twice", what, k.Value)
		case !slices.Contains(known, k.Value):
			msg := fmt.Sprintf("%s: unknown key %q", what, k.Value)
			if s := suggest(k.Value, known); s != "" {
				msg += fmt.Sprintf(" (did you mean %s?)", s)
			}
			p.errorf(k, "%s (valid keys: %s)", msg, strings.Join(known, ", "))
		default:
			out[k.Value] = v
		}
	}
	return out
}

// resolve follows an alias to the node it names.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		return resolve(n.Content[0])
	}
	return n
}

func (p *fileParser) text(n *yaml.Node, what string) (string, bool) {
	n = resolve(n)
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.errorf(n, "%s must be a text", what)
		return "", false
	}
	return n.Value, true
}

// value decodes any YAML value into what its JSON form decodes to, so that
// it compares equal to the values the engine stores.
func (p *fileParser) value(n *yaml.Node, what string) (json.RawMessage, any, bool) {
	var v any
	textTimestamps(resolve(n))
	if err := resolve(n).Decode(&v); err != nil {
		// yaml.v3 lists its problems on lines of their own: the first
		// one, at its own line, keeps the error on one line.
		var te *yaml.TypeError
		if errors.As(err, &te) && len(te.Errors) > 0 {
			e := dag.YAMLError(p.path, p.src, errors.New(te.Errors[0]))
			p.errorAt(e.Line, e.Col, "%s: %s", what, strings.TrimPrefix(e.Msg, "invalid YAML: "))
			return nil, nil, false
		}
		p.errorf(n, "%s: %v", what, err)
		return nil, nil, false
	}
	raw, err := json.Marshal(v)
	if err != nil {
		p.errorf(n, "%s cannot be JSON (keys must be texts): %v", what, err)
		return nil, nil, false
	}
	normal, _ := decodeExact(raw)
	return raw, normal, true
}

// textTimestamps makes the unquoted dates and times under n text, as a
// workflow file reads them: JSON has no timestamps, and yaml.v3 would
// decode 2030-01-03 as midnight UTC of that day.
func textTimestamps(n *yaml.Node) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!timestamp" {
		n.Tag = "!!str"
	}
	for _, c := range n.Content {
		textTimestamps(c)
	}
}

func (p *fileParser) file(doc *yaml.Node) *File {
	top := p.fields(doc, "the test file", "workflow", "steps", "cases")
	if top == nil {
		return nil
	}
	f := &File{Path: p.path}
	var w *dag.Workflow
	if n := top["workflow"]; n == nil {
		p.errorf(resolve(doc), "workflow: is required: name the workflow these cases test")
	} else if name, ok := p.text(n, "workflow"); ok {
		f.Workflow = name
		if w = p.workflows[name]; w == nil {
			p.errorf(n, "%s", p.unknownWorkflow(name))
		}
	}
	var shared map[string]*Mock
	if v := top["steps"]; v != nil {
		shared = p.mocks(v, w)
	}
	cases := top["cases"]
	if cases == nil {
		p.errorf(resolve(doc), "cases: is required: a list of test cases")
		return f
	}
	cases = resolve(cases)
	if cases.Kind != yaml.SequenceNode || len(cases.Content) == 0 {
		p.errorf(cases, "cases must be a list of at least one case")
		return f
	}
	names := map[string]bool{}
	for _, n := range cases.Content {
		c := p.testCase(n, w)
		if c == nil {
			continue
		}
		for key, m := range shared {
			if c.Mocks[key] == nil {
				if c.Mocks == nil {
					c.Mocks = map[string]*Mock{}
				}
				c.Mocks[key] = m
			}
		}
		if names[c.Name] {
			p.errorAt(c.Line, c.Col, "case %q is defined twice in this file: give each case its own name", c.Name)
		}
		names[c.Name] = true
		f.Cases = append(f.Cases, c)
	}
	return f
}

func (p *fileParser) unknownWorkflow(name string) string {
	names := make([]string, 0, len(p.workflows))
	for n := range p.workflows {
		names = append(names, n)
	}
	slices.Sort(names)
	msg := fmt.Sprintf("unknown workflow %q", name)
	if s := suggest(name, names); s != "" {
		msg += fmt.Sprintf(" (did you mean %s?)", s)
	}
	if len(names) == 0 {
		return msg + ": the workflows folder has no valid workflow"
	}
	return msg + fmt.Sprintf(" (available: %s)", strings.Join(names, ", "))
}

func (p *fileParser) testCase(n *yaml.Node, w *dag.Workflow) *Case {
	n = resolve(n)
	m := p.fields(n, "a case", "name", "input", "scheduled", "start", "runFor", "steps", "signals", "expect")
	if m == nil {
		return nil
	}
	c := &Case{Line: n.Line, Col: n.Column, Start: DefaultStart, Input: json.RawMessage("{}")}
	if v := m["name"]; v == nil {
		p.errorf(n, "a case needs a name:")
	} else if name, ok := p.text(v, "name"); ok {
		c.Name = strings.TrimSpace(name)
		if c.Name == "" {
			p.errorf(v, "a case's name must not be empty")
		}
	}
	if v := m["input"]; v != nil {
		if raw, _, ok := p.value(v, "input"); ok {
			c.Input = raw
		}
	}
	if v := m["start"]; v != nil {
		if s, ok := p.text(v, "start"); ok {
			t, err := time.Parse(time.RFC3339, s)
			if err != nil {
				p.errorf(v, "start must be an RFC 3339 time, like 2030-01-01T09:00:00Z: %v", err)
			}
			c.Start = t
		}
	}
	c.Schedule = -1
	if v := m["scheduled"]; v != nil {
		c.Scheduled, c.Schedule = p.scheduled(v, m["input"], w)
	}
	if v := m["runFor"]; v != nil {
		before := len(p.errs)
		c.RunFor = p.duration(v, "runFor", "a duration of workflow time, like 24h")
		if c.RunFor == 0 && len(p.errs) == before {
			p.errorf(v, "runFor must be more than 0s: leave it out to run the case until the instance settles")
		}
	}
	if v := m["steps"]; v != nil {
		c.Mocks = p.mocks(v, w)
	}
	if v := m["signals"]; v != nil {
		c.Signals = p.signals(v)
	}
	if v := m["expect"]; v != nil {
		c.Expect = p.expect(v)
	}
	return c
}

func (p *fileParser) mocks(n *yaml.Node, w *dag.Workflow) map[string]*Mock {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		p.errorf(n, "steps must map step names to what their handler returns")
		return nil
	}
	out := map[string]*Mock{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], resolve(n.Content[i+1])
		if out[k.Value] != nil {
			p.errorf(k, "steps: step %q is mocked twice", k.Value)
			continue
		}
		p.checkMockedStep(k, w)
		mock := &Mock{Key: k.Value, Line: k.Line, Col: k.Column}
		replies := []*yaml.Node{v}
		if v.Kind == yaml.SequenceNode {
			replies = v.Content
			if len(replies) == 0 {
				p.errorf(v, "steps.%s: a list of replies needs at least one", k.Value)
			}
		}
		for _, r := range replies {
			if reply, ok := p.reply(r, k.Value); ok {
				mock.Replies = append(mock.Replies, reply)
			}
		}
		if len(mock.Replies) == len(replies) && len(replies) > 0 {
			out[k.Value] = mock
		}
	}
	return out
}

// checkMockedStep checks that a mock's key names a step that runs a
// handler: a step of the tested workflow, or workflow/step for a step of
// another workflow of the folder (one the tested workflow starts).
func (p *fileParser) checkMockedStep(k *yaml.Node, w *dag.Workflow) {
	name := k.Value
	if other, step, ok := strings.Cut(name, "/"); ok {
		if w = p.workflows[other]; w == nil {
			p.errorf(k, "steps: %s", p.unknownWorkflow(other))
			return
		}
		name = step
	}
	if w == nil {
		return // the unknown workflow is reported already
	}
	s := w.Step(name)
	if s == nil {
		msg := fmt.Sprintf("steps: workflow %s has no step %q", w.Name, name)
		if sg := suggest(name, stepNames(w)); sg != "" {
			msg += fmt.Sprintf(" (did you mean %s?)", sg)
		}
		p.errorf(k, "%s (its steps: %s)", msg, strings.Join(stepNames(w), ", "))
		return
	}
	if s.Handler == "" {
		p.errorf(k, "steps: step %q runs no handler, so there is nothing to mock (send a wait step's signal under signals:; mock the steps of a workflow a step starts as WORKFLOW/STEP)", k.Value)
	}
}

func stepNames(w *dag.Workflow) []string {
	names := make([]string, len(w.Steps))
	for i, s := range w.Steps {
		names[i] = s.Name
	}
	return names
}

func (p *fileParser) reply(n *yaml.Node, step string) (Reply, bool) {
	what := "steps." + step
	m := p.fields(n, what, "output", "error", "permanentError", "real")
	if m == nil {
		return Reply{}, false
	}
	if len(m) != 1 {
		if len(m) > 1 || len(resolve(n).Content) == 0 {
			// (A mapping of unknown keys only is reported key by key.)
			p.errorf(resolve(n), "%s: give exactly one of output, error, permanentError or real: true", what)
		}
		return Reply{}, false
	}
	var r Reply
	ok := true
	switch {
	case m["output"] != nil:
		r.Output, _, ok = p.value(m["output"], what+".output")
	case m["error"] != nil:
		r.Error, ok = p.text(m["error"], what+".error")
	case m["permanentError"] != nil:
		r.PermanentError, ok = p.text(m["permanentError"], what+".permanentError")
	case m["real"] != nil:
		v := resolve(m["real"])
		if v.Tag != "!!bool" || v.Value != "true" {
			p.errorf(v, "%s.real must be true (leave it out to mock the step)", what)
			return r, false
		}
		r.Real = true
	}
	return r, ok
}

func (p *fileParser) signals(n *yaml.Node) []*Signal {
	n = resolve(n)
	if n.Kind != yaml.SequenceNode {
		p.errorf(n, "signals must be a list of {name, data, id, after, error}")
		return nil
	}
	var out []*Signal
	for _, item := range n.Content {
		m := p.fields(item, "a signal", "name", "data", "id", "after", "error")
		if m == nil {
			continue
		}
		s := &Signal{Line: resolve(item).Line, Col: resolve(item).Column}
		if v := m["name"]; v == nil {
			p.errorf(resolve(item), "a signal needs a name:")
		} else {
			s.Name, _ = p.text(v, "signal name")
		}
		if v := m["data"]; v != nil {
			s.Data, _, _ = p.value(v, "signal data")
		}
		if v := m["id"]; v != nil {
			s.ID, _ = p.text(v, "signal id")
		}
		s.Error = p.optText(m["error"], "signal error")
		if v := m["after"]; v != nil {
			s.After = p.duration(v, "after", "a duration from the start, like 30s or 80h")
		}
		out = append(out, s)
	}
	return out
}

func (p *fileParser) expect(n *yaml.Node) Expect {
	m := p.fields(n, "expect", "startError", "status", "output", "outputContains", "error", "createdAt", "steps", "events")
	var e Expect
	if m == nil {
		return e
	}
	e.StartError = p.optText(m["startError"], "expect.startError")
	e.Status = p.status(m["status"], "expect.status", instanceStatuses)
	e.Output = p.match(m["output"], m["outputContains"], "expect.output")
	e.Error = p.optText(m["error"], "expect.error")
	if s := p.optText(m["createdAt"], "expect.createdAt"); s != nil {
		t, err := time.Parse(time.RFC3339, *s)
		if err != nil {
			p.errorf(m["createdAt"], "expect.createdAt must be an RFC 3339 time, like 2030-01-01T03:00:00Z: %v", err)
		} else {
			e.CreatedAt = &t
		}
	}
	if v := m["steps"]; v != nil {
		e.Steps = p.stepExpects(v)
	}
	if v := m["events"]; v != nil {
		v = resolve(v)
		e.EventsPos = position{v.Line, v.Column}
		if v.Kind != yaml.SequenceNode {
			p.errorf(v, "expect.events must be a list like [charge.started, charge.completed]")
		} else {
			for _, ev := range v.Content {
				if s, ok := p.text(ev, "an event"); ok {
					if !strings.Contains(s, ".") {
						p.errorf(ev, "event %q must be STEP.KIND (charge.retrying) or instance.KIND (instance.completed)", s)
					}
					e.Events = append(e.Events, s)
				}
			}
		}
	}
	return e
}

var (
	instanceStatuses = []string{"pending", "running", "completed", "failed", "cancelled"}
	stepStatuses     = []string{"blocked", "pending", "running", "waiting", "completed", "failed", "skipped", "cancelled"}
)

func (p *fileParser) stepExpects(n *yaml.Node) []*StepExpect {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		p.errorf(n, "expect.steps must map step names to expectations")
		return nil
	}
	var out []*StepExpect
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		what := "expect.steps." + k.Value
		m := p.fields(v, what, "status", "attempts", "input", "inputContains", "output", "outputContains", "error")
		if m == nil {
			continue
		}
		se := &StepExpect{Name: k.Value, Line: k.Line, Col: k.Column}
		se.Status = p.status(m["status"], what+".status", stepStatuses)
		if a := m["attempts"]; a != nil {
			var count int
			if err := resolve(a).Decode(&count); err != nil || count < 0 {
				p.errorf(a, "%s.attempts must be a whole number, 0 or more", what)
			}
			se.Attempts = &count
		}
		se.Input = p.match(m["input"], m["inputContains"], what+".input")
		se.Output = p.match(m["output"], m["outputContains"], what+".output")
		se.Error = p.optText(m["error"], what+".error")
		out = append(out, se)
	}
	return out
}

// scheduled reads scheduled: true (whichever schedule ticks first) or
// scheduled: INDEX (that schedule, 0 for the first), which needs a
// workflow with a schedule and takes the place of input. It returns
// whether the case is scheduled and the schedule's index, -1 for any.
func (p *fileParser) scheduled(n, input *yaml.Node, w *dag.Workflow) (bool, int) {
	v := resolve(n)
	index := -1
	switch v.Tag {
	case "!!bool":
		if v.Value != "true" {
			return false, -1
		}
	case "!!int":
		i, err := strconv.Atoi(v.Value)
		if err != nil || i < 0 {
			p.errorf(v, "scheduled must be true or the index of a schedule (0 for the first)")
			return false, -1
		}
		index = i
	default:
		p.errorf(v, "scheduled must be true or the index of a schedule (0 for the first)")
		return false, -1
	}
	switch {
	case input != nil:
		p.errorf(input, "a scheduled case takes its input from the schedule: leave input out")
	case w != nil && len(w.Schedules) == 0:
		p.errorf(v, "workflow %s has no schedule: to start it, give an input instead", w.Name)
	case w != nil && index >= len(w.Schedules):
		p.errorf(v, "workflow %s has no schedule %d: its schedules are numbered 0 to %d", w.Name, index, len(w.Schedules)-1)
	default:
		return true, index
	}
	return false, -1
}

// duration reads a Go duration (30s, 80h) of 0 or more.
func (p *fileParser) duration(n *yaml.Node, what, like string) time.Duration {
	text, ok := p.text(n, what)
	if !ok {
		return 0
	}
	d, err := time.ParseDuration(text)
	if err != nil || d < 0 {
		p.errorf(n, "%s must be %s", what, like)
	}
	return d
}

func (p *fileParser) optText(n *yaml.Node, what string) *string {
	if n == nil {
		return nil
	}
	s, ok := p.text(n, what)
	if !ok {
		return nil
	}
	return &s
}

func (p *fileParser) status(n *yaml.Node, what string, valid []string) *string {
	s := p.optText(n, what)
	if s != nil && !slices.Contains(valid, *s) {
		p.errorf(n, "%s: unknown status %q (one of %s)", what, *s, strings.Join(valid, ", "))
		return nil
	}
	return s
}

// match reads an exact (KEY) or partial (KEYContains) expectation; giving
// both is an error.
func (p *fileParser) match(exact, partial *yaml.Node, what string) *Match {
	if exact != nil && partial != nil {
		p.errorf(partial, "%s: give %s or %sContains, not both", what, what[strings.LastIndex(what, ".")+1:], what[strings.LastIndex(what, ".")+1:])
		return nil
	}
	n, isPartial := exact, false
	if n == nil {
		n, isPartial = partial, true
	}
	if n == nil {
		return nil
	}
	_, v, ok := p.value(n, what)
	if !ok {
		return nil
	}
	return &Match{Value: v, Partial: isPartial}
}

// suggest returns the candidate closest to s, or "" when none is close
// enough to be a plausible typo.
func suggest(s string, candidates []string) string {
	best, bestDist := "", -1
	for _, c := range candidates {
		d := levenshtein.ComputeDistance(strings.ToLower(s), strings.ToLower(c))
		if bestDist < 0 || d < bestDist {
			best, bestDist = c, d
		}
	}
	if bestDist < 0 || bestDist > max(1, len(s)/3) {
		return ""
	}
	return best
}
