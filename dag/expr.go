package dag

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/builtin"
	"github.com/expr-lang/expr/file"
	exprparser "github.com/expr-lang/expr/parser"
	"github.com/expr-lang/expr/vm"
	"gopkg.in/yaml.v3"
)

// Env is what expressions see. The expr tags give the lower-case names used
// in workflow files (input, steps.NAME.output, workflow.id, ...).
type Env struct {
	Input    any                `expr:"input"`    // the instance input (decoded JSON)
	Steps    map[string]StepEnv `expr:"steps"`    // by step name
	Workflow WorkflowEnv        `expr:"workflow"` // the running instance
	// Item and Index are the element and its 0-based position, for the
	// input of one item of a forEach step.
	Item  any `expr:"item"`
	Index int `expr:"index"`
	// Usage, when set, receives what each evaluation with this Env cost,
	// for a caller that bounds a series of them.
	Usage *Usage `expr:"-"`
	// Now is what now() gives; zero for the machine's clock. Workflow
	// tests set their fake clock's time.
	Now time.Time `expr:"-"`
}

// Usage is what evaluations cost, in the units of EvalMemoryLimit and
// EvalStepLimit.
type Usage struct {
	Memory, Steps int64
}

// evalEnv is Env as compiled expressions see it, with the evaluation's meter.
type evalEnv struct {
	Input    any                `expr:"input"`
	Steps    map[string]StepEnv `expr:"steps"`
	Workflow WorkflowEnv        `expr:"workflow"`
	Item     any                `expr:"item"`
	Index    int                `expr:"index"`
	Meter    *meter             `expr:"$meter"`
	Now      time.Time          `expr:"$now"`
}

// StepEnv is one step as expressions see it.
type StepEnv struct {
	Status string `expr:"status"`
	Output any    `expr:"output"` // decoded JSON; nil if none or skipped
}

// WorkflowEnv identifies the running instance.
type WorkflowEnv struct {
	ID   string `expr:"id"`
	Name string `expr:"name"`
	// Error and FailedStep are the instance's failure, for onFailure
	// steps: the error it fails with, and the step whose failure failed
	// it ("" when no step did: a workflow timeout, an output error).
	Error      string `expr:"error"`
	FailedStep string `expr:"failedStep"`
}

// Expr is one compiled expression, such as a step's when:.
type Expr struct {
	src  string // the expression, without ${{ }}
	prog *vm.Program
	refs []string
}

// String returns the expression's source text, without the ${{ }} around it
// (the form error messages quote).
func (e *Expr) String() string {
	if e == nil {
		return ""
	}
	return e.src
}

// References lists the step names the expression reads (sorted, unique).
func (e *Expr) References() []string {
	if e == nil {
		return nil
	}
	return append([]string(nil), e.refs...)
}

// Bool evaluates a condition. A result that is not true or false (nil
// included) is an error naming the expression: a condition that silently
// treats a missing value as false hides typos; write "x == true" to accept nil.
// A nil *Expr (a step without when:) is true.
func (e *Expr) Bool(env *Env) (bool, error) {
	if e == nil {
		return true, nil
	}
	m := newMeter()
	defer m.report(env)
	v, err := e.run(env, m)
	if err != nil {
		return false, err
	}
	b, ok := v.(bool)
	if !ok {
		return false, fmt.Errorf("expression %q: want true or false, got %s", e.src, describeValue(v))
	}
	return b, nil
}

// eval evaluates the expression to a JSON-ready value.
func (e *Expr) eval(env *Env, m *meter) (any, error) {
	v, err := e.run(env, m)
	if err != nil {
		return nil, err
	}
	out, err := normalize(v, 0, m)
	if err != nil {
		return nil, fmt.Errorf("expression %q: %w", e.src, err)
	}
	return out, nil
}

func (e *Expr) run(env *Env, m *meter) (out any, err error) {
	if env == nil {
		env = &Env{}
	}
	steps := env.Steps
	if steps == nil {
		// A missing step then reads as the zero StepEnv whether or not the
		// map exists: status "" and output nil.
		steps = map[string]StepEnv{}
	}
	// expr's VM recovers its panics; this guards the rest.
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("expression %q: %v", e.src, r)
		}
	}()
	machine := vm.VM{MemoryBudget: m.vmBudget()}
	v, err := machine.Run(e.prog, &evalEnv{Input: env.Input, Steps: steps, Workflow: env.Workflow, Item: env.Item, Index: env.Index, Meter: m, Now: env.Now})
	if err != nil {
		var limit *limitError
		switch {
		case errors.As(err, &limit):
			return nil, fmt.Errorf("expression %q: %w", e.src, limit)
		case exprMessage(err) == "memory budget exceeded": // expr's own count of list elements
			return nil, fmt.Errorf("expression %q: %w", e.src, errMemoryLimit)
		}
		return nil, fmt.Errorf("expression %q: %s", e.src, runMessage(exprMessage(err)))
	}
	return v, nil
}

// exprMessage is the one-line message of an expr error, without the
// multi-line source snippet expr appends.
func exprMessage(err error) string {
	var fe *file.Error
	if errors.As(err, &fe) {
		return fe.Message
	}
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return msg
}

// nilSafe makes every member access optional (a.b behaves as a?.b), so that
// reading a field of a nil value — the output of a skipped step, an absent
// input field — yields nil instead of failing. expr only honours Optional
// inside a ChainNode, hence the wrapping.
type nilSafe struct{}

func (nilSafe) Visit(n *ast.Node) {
	if m, ok := (*n).(*ast.MemberNode); ok && !m.Optional && !m.Method {
		m.Optional = true
		ast.Patch(n, &ast.ChainNode{Node: m})
	}
}

// scope is what an expression may reference.
type scope struct {
	where   string                 // for messages: `step "x"`, `step #2` or "output"
	self    string                 // the referencing step; "" in output:
	canRead func(step string) bool // steps it may read; nil means any (output:)
	graph   *graphInfo             // every valid step name
	items   bool                   // item and index may be read: the input of a forEach step
	failure bool                   // workflow.error and workflow.failedStep may be read: an onFailure step
	// unreadable, when set, says why canRead refuses a step, instead of
	// the advice to depend on it.
	unreadable func(step string) string
	noSteps    string // when set, no step may be read, and this says why
}

// subject names where the expression is, for messages.
func (s *scope) subject() string {
	switch {
	case s.where != "":
		return s.where
	case s.self != "":
		return fmt.Sprintf("step %q", s.self)
	}
	return ""
}

// label prefixes expression messages with where they are.
func (s *scope) label() string {
	if sub := s.subject(); sub != "" {
		return sub + ": "
	}
	return ""
}

var rootVariables = []string{"input", "steps", "workflow"}

// compileExpr checks and compiles one expression, reporting problems at node.
func (p *parser) compileExpr(src string, node *yaml.Node, sc *scope, asBool bool) *Expr {
	src = strings.TrimSpace(src)
	report := func(format string, args ...any) {
		p.c.at(node, "%sexpression %q: %s", sc.label(), src, fmt.Sprintf(format, args...))
	}
	tree, err := parseExpr(src)
	if err != nil {
		var fe *file.Error
		if errors.As(err, &fe) {
			if fe.Line > 1 {
				report("syntax error at line %d, column %d: %s", fe.Line, fe.Column+1, fe.Message)
			} else {
				report("syntax error at column %d: %s", fe.Column+1, fe.Message)
			}
		} else {
			report("syntax error: %s", exprMessage(err))
		}
		return nil
	}
	refs, problems := checkReferences(tree, sc)
	for _, pr := range problems {
		report("%s", pr)
	}
	if len(problems) > 0 {
		return nil
	}
	// overflowPatch after meterPatch, which meters the operands of +.
	opts := append([]expr.Option{expr.Env(evalEnv{}), expr.Patch(nilSafe{}), expr.Patch(meterPatch{}), expr.Patch(overflowPatch{}), expr.Patch(clockPatch{}), expr.Patch(textPatch{})}, meterOpts()...)
	opts = append(opts, overflowOpts...)
	opts = append(opts, textOpts...)
	opts = append(opts, clockOpts...)
	if asBool {
		// Compiled once with AsBool only to reject, at load, conditions whose
		// type is known not to be bool ("1 + 1"). The program kept is the
		// one without it: AsBool's run-time cast fails with an obscure
		// "bool(string)", while Bool gives a clear message.
		if _, err := compileGuarded(src, append(opts, expr.AsBool())); err != nil {
			msg := exprMessage(err)
			if got, ok := strings.CutPrefix(msg, "expected bool, but got "); ok {
				msg = "a condition must give true or false, but this gives " + kindOfType(got)
			}
			report("%s", msg)
			return nil
		}
	}
	prog, err := compileGuarded(src, opts)
	if err != nil {
		report("%s", exprMessage(err))
		return nil
	}
	return &Expr{src: src, prog: prog, refs: refs}
}

// kindOfType names, as the workflow's author knows it, the kind of value
// of a Go type as expr names it ("int", "[]interface {}", "unknown" for
// nil); a type it does not know is named as it is.
func kindOfType(goType string) string {
	switch {
	case goType == "unknown" || goType == "nil":
		return "null"
	case goType == "string":
		return "text"
	case strings.HasPrefix(goType, "int") || strings.HasPrefix(goType, "uint") || strings.HasPrefix(goType, "float"):
		return "a number"
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	case strings.HasPrefix(goType, "map["):
		return "a mapping"
	}
	return goType
}

// parseExpr and compileGuarded turn a panic inside expr into an error:
// validation must never crash on a hostile file.
func parseExpr(src string) (tree *exprparser.Tree, err error) {
	defer func() {
		if r := recover(); r != nil {
			tree, err = nil, fmt.Errorf("%v", r)
		}
	}()
	return exprparser.Parse(src)
}

func compileGuarded(src string, opts []expr.Option) (prog *vm.Program, err error) {
	defer func() {
		if r := recover(); r != nil {
			prog, err = nil, fmt.Errorf("%v", r)
		}
	}()
	return expr.Compile(src, opts...)
}

// refCollector gathers what checkReferences needs from one walk: the
// identifiers, the member node above each node, function callees and
// let-declared names.
type refCollector struct {
	idents   []*ast.IdentifierNode
	parent   map[ast.Node]*ast.MemberNode
	callees  map[ast.Node]bool
	declared map[string]bool
	minus    []*ast.BinaryNode
}

func (r *refCollector) Visit(n *ast.Node) {
	switch x := (*n).(type) {
	case *ast.IdentifierNode:
		r.idents = append(r.idents, x)
	case *ast.MemberNode:
		r.parent[x.Node] = x
	case *ast.CallNode:
		r.callees[x.Callee] = true
	case *ast.VariableDeclaratorNode:
		r.declared[x.Name] = true
	case *ast.BinaryNode:
		if x.Operator == "-" {
			r.minus = append(r.minus, x)
		}
	}
}

// dashedRef recognises steps.echo-it.output, which expr reads as
// steps.echo minus it.output, and returns the step name meant ("echo-it"),
// what followed it (".output") and the identifiers the subtraction consumed.
func dashedRef(b *ast.BinaryNode) (name, rest string, consumed []ast.Node, ok bool) {
	var rights []ast.Node
	var cur ast.Node = b
	for {
		m, isMinus := cur.(*ast.BinaryNode)
		if !isMinus || m.Operator != "-" {
			break
		}
		rights = append([]ast.Node{m.Right}, rights...)
		cur = m.Left
	}
	left, isMember := cur.(*ast.MemberNode)
	if !isMember {
		return "", "", nil, false
	}
	root, isIdent := left.Node.(*ast.IdentifierNode)
	first, named := memberName(left)
	if !isIdent || root.Value != "steps" || !named {
		return "", "", nil, false
	}
	parts := []string{first}
	consumed = []ast.Node{root}
	for i, r := range rights {
		var path []string
		if i == len(rights)-1 {
			// The last part carries the rest of the access: it.output.x.
			for {
				m, isMember := r.(*ast.MemberNode)
				if !isMember {
					break
				}
				field, named := memberName(m)
				if !named {
					return "", "", nil, false
				}
				path = append([]string{field}, path...)
				r = m.Node
			}
		}
		switch x := r.(type) {
		case *ast.IdentifierNode:
			parts = append(parts, x.Value)
			consumed = append(consumed, x)
		case *ast.IntegerNode:
			parts = append(parts, strconv.Itoa(x.Value))
		default:
			return "", "", nil, false
		}
		for _, f := range path {
			rest += "." + f
		}
	}
	return strings.Join(parts, "-"), rest, consumed, true
}

// memberName is the property of a member access when written literally
// (a.b or a["b"]).
func memberName(m *ast.MemberNode) (string, bool) {
	if m == nil {
		return "", false
	}
	s, ok := m.Property.(*ast.StringNode)
	if !ok {
		return "", false
	}
	return s.Value, true
}

var plainIdentifier = lazyRegexp(`^[a-z_][a-z0-9_]*$`)

// stepRef is how an expression reads a step: steps.charge, but
// steps["echo-it"] for a name that is not an identifier ("-" would read as a
// subtraction, "." as a field, a leading digit as a number).
func stepRef(name string) string {
	if plainIdentifier().MatchString(name) {
		return "steps." + name
	}
	return fmt.Sprintf("steps[%q]", name)
}

// checkReferences validates the variables an expression reads: only input,
// steps.NAME.output|status of allowed steps and workflow.id|name.
func checkReferences(tree *exprparser.Tree, sc *scope) (refs []string, problems []string) {
	r := &refCollector{parent: map[ast.Node]*ast.MemberNode{}, callees: map[ast.Node]bool{}, declared: map[string]bool{}}
	ast.Walk(&tree.Node, r)
	seenRef := map[string]bool{}
	skip := map[ast.Node]bool{}
	// Post-order walk: the outermost subtraction of a name comes last.
	for i := len(r.minus) - 1; i >= 0; i-- {
		b := r.minus[i]
		if skip[b] {
			continue
		}
		name, rest, consumed, ok := dashedRef(b)
		if !ok || !sc.graph.set[name] {
			continue
		}
		for _, n := range consumed {
			skip[n] = true
		}
		for l, isMinus := b.Left.(*ast.BinaryNode); isMinus; l, isMinus = l.Left.(*ast.BinaryNode) {
			skip[l] = true // an inner part of the same name
		}
		dotted := "steps." + name + rest
		if rest == "" {
			rest = ".output"
		}
		problems = append(problems, fmt.Sprintf(`%s reads as a subtraction, because of the "-" in the step name: write %s%s`, dotted, stepRef(name), rest))
	}
	for _, id := range r.idents {
		name := id.Value
		if r.declared[name] || skip[id] {
			continue
		}
		if r.callees[id] {
			problems = append(problems, fmt.Sprintf("unknown function %q%s", name, didYouMean(name, builtin.Names)))
			continue
		}
		switch name {
		case "input":
		case "item", "index":
			if !sc.items {
				problems = append(problems, fmt.Sprintf("%q is only defined in the input of a forEach step (the element and its position in the list)", name))
			}
		case "workflow":
			m := r.parent[id]
			field, ok := memberName(m)
			switch {
			case m == nil || !ok:
				problems = append(problems, "use workflow.id or workflow.name")
			case field == "error" || field == "failedStep":
				if !sc.failure {
					problems = append(problems, fmt.Sprintf("workflow.%s is only defined in the steps of onFailure (the instance's failure)", field))
				}
			case field != "id" && field != "name":
				problems = append(problems, fmt.Sprintf("workflow has no field %q: use workflow.id or workflow.name", field)+failureFieldsHint(sc))
			}
		case "steps":
			m := r.parent[id]
			step, ok := memberName(m)
			if m == nil {
				problems = append(problems, "steps must be followed by a step name, e.g. steps.charge.output")
				continue
			}
			if !ok {
				problems = append(problems, `steps must be indexed by a step name written out, e.g. steps.charge.output or steps["charge"].output`)
				continue
			}
			switch {
			case !sc.graph.set[step]:
				switch s, others := suggestExcept(step, sc.graph.names, sc.self), listNames(sc.graph.names, sc.self); {
				case s != "":
					problems = append(problems, fmt.Sprintf("unknown step %q (did you mean %q?)", step, s))
				case others == "":
					problems = append(problems, fmt.Sprintf("unknown step %q: there is no other step", step))
				default:
					problems = append(problems, fmt.Sprintf("unknown step %q (steps: %s)", step, others))
				}
				continue
			case step == sc.self:
				problems = append(problems, fmt.Sprintf("a step cannot read its own output or status (%s)", stepRef(step)))
				continue
			case sc.canRead != nil && !sc.canRead(step) && sc.unreadable != nil:
				problems = append(problems, sc.unreadable(step))
				continue
			case sc.noSteps != "":
				problems = append(problems, fmt.Sprintf("%s cannot read %s: %s", sc.subject(), stepRef(step), sc.noSteps))
				continue
			case sc.canRead != nil && !sc.canRead(step):
				problems = append(problems, fmt.Sprintf("%s does not depend on %q, so it cannot read %s: add %q to its dependsOn (directly or through another step)", sc.subject(), step, stepRef(step), step))
				continue
			}
			m2 := r.parent[m]
			field, ok := memberName(m2)
			switch {
			case m2 == nil || !ok:
				problems = append(problems, fmt.Sprintf("%s must be followed by .output or .status, e.g. %s.output", stepRef(step), stepRef(step)))
				continue
			case field != "output" && field != "status":
				problems = append(problems, fmt.Sprintf("%s has no field %q: use %s.output or %s.status", stepRef(step), field, stepRef(step), stepRef(step)))
				continue
			}
			if !seenRef[step] {
				seenRef[step] = true
				refs = append(refs, step)
			}
		default:
			if s := suggest(name, rootVariables); s != "" {
				problems = append(problems, fmt.Sprintf("unknown variable %q (did you mean %q?)", name, s))
			} else {
				problems = append(problems, fmt.Sprintf("unknown variable %q (variables: input, steps, workflow)", name))
			}
		}
	}
	sort.Strings(refs)
	return refs, problems
}

// when compiles a step's condition. Both "when: ${{ x }}" and the bare
// "when: x" are accepted; mixing text and ${{ }} is not, as it could only
// ever be a string.
func (p *parser) when(n *yaml.Node, sc *scope, label string) *Expr {
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" || strings.TrimSpace(n.Value) == "" {
		p.c.at(n, `%s: "when" must be one expression, e.g. when: ${{ input.x != nil }}, got %s`, label, describe(n))
		return nil
	}
	segs, problem := p.splitScalar(n)
	if problem != "" {
		p.c.at(n, "%s: %s", label, problem)
		return nil
	}
	src := n.Value
	switch {
	case len(segs) == 1 && segs[0].expr:
		src = segs[0].text
	case len(segs) == 1 && !segs[0].expr:
	case isWholeExpr(segs):
		src = wholeExpr(segs)
	default:
		p.c.at(n, `%s: "when" must be one expression, e.g. when: ${{ input.x != nil }}; it mixes text and ${{ }}`, label)
		return nil
	}
	return p.compileExpr(src, n, sc, true)
}
