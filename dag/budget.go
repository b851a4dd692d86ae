package dag

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"sync"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/builtin"
	"github.com/expr-lang/expr/conf"
	"github.com/expr-lang/expr/vm/runtime"
)

// Bounds on one evaluation: a step's when, its whole input template, or the
// workflow's output template. Expressions run inside the store's write
// transaction, so an expression that could build gigabytes or loop for
// minutes would take the process down or stall every worker. expr's own
// memory budget counts list elements only, not text, so dagrun meters the
// work itself: the AST is patched at compile time so that every loop step,
// every operand that is compared, scanned or concatenated, and every
// builtin's arguments and result are charged before or as they are built.
// The charge is deterministic (no clock): a plan retried by the store fails
// the same way.
const (
	// EvalMemoryLimit bounds the values one evaluation builds: text in
	// bytes, each list element and map entry as 16 bytes.
	EvalMemoryLimit = 16 << 20
	// EvalStepLimit bounds the work of one evaluation: a step per loop
	// iteration, per list element or map entry compared or scanned, and per
	// 64 bytes of text compared or scanned.
	EvalStepLimit = 2_000_000
)

const (
	elementBytes = 16 // what one list element or map entry costs in memory
	textPerStep  = 64 // bytes of text scanned per step
)

// ErrEvalLimit is matched (errors.Is) by the error of an evaluation stopped
// at EvalMemoryLimit or EvalStepLimit.
var ErrEvalLimit = errors.New("evaluation limit reached")

type limitError struct{ msg string }

func (e *limitError) Error() string        { return e.msg }
func (e *limitError) Is(target error) bool { return target == ErrEvalLimit }

const doInHandler = "simplify the expression or do this work in a handler"

var (
	errMemoryLimit = &limitError{fmt.Sprintf("it builds more than %s of values, the limit for one evaluation: %s", fmtBytes(EvalMemoryLimit), doInHandler)}
	errStepLimit   = &limitError{fmt.Sprintf("it takes more than %d steps (loop iterations and values compared or scanned), the limit for one evaluation: %s", EvalStepLimit, doInHandler)}
)

// meter counts what one evaluation has built and done. It is shared by
// every expression of a template, so a template of many expressions is
// bounded as a whole.
type meter struct {
	memory, steps int64
}

func newMeter() *meter { return &meter{} }

// report adds the evaluation's cost to env.Usage.
func (m *meter) report(env *Env) {
	if env != nil && env.Usage != nil {
		env.Usage.Memory += m.memory
		env.Usage.Steps += m.steps
	}
}

func (m *meter) alloc(bytes int64) error {
	m.memory += bytes
	if m.memory > EvalMemoryLimit {
		return errMemoryLimit
	}
	return nil
}

func (m *meter) work(steps int64) error {
	m.steps += steps
	if m.steps > EvalStepLimit {
		return errStepLimit
	}
	return nil
}

// vmBudget is what is left for expr's own count of list elements, which it
// keeps apart from the meter.
func (m *meter) vmBudget() uint {
	return uint(max(1, (EvalMemoryLimit-m.memory)/elementBytes))
}

// measure walks v and returns its elements (list elements, map entries and
// scalars) and its text bytes; deep follows nested lists and maps. It stops
// once elements+bytes pass limit, so measuring costs no more than it charges.
func measure(v any, deep bool, limit int64) (elements, bytes int64) {
	elements = 1
	var walk func(v any)
	walk = func(v any) {
		if elements+bytes > limit {
			return
		}
		switch x := v.(type) {
		case string:
			bytes += int64(len(x))
		case []any:
			elements += int64(len(x))
			for i := 0; deep && i < len(x) && elements+bytes <= limit; i++ {
				walk(x[i])
			}
		case map[string]any:
			elements += int64(len(x))
			for k, e := range x {
				if elements+bytes > limit {
					break
				}
				bytes += int64(len(k))
				if deep {
					walk(e)
				}
			}
		case StepEnv:
			walk(x.Output)
		default:
			rv := reflect.ValueOf(v)
			switch rv.Kind() {
			case reflect.Slice, reflect.Array, reflect.Map:
				elements += int64(rv.Len())
				if deep && rv.Kind() != reflect.Map {
					for i := 0; i < rv.Len() && elements+bytes <= limit; i++ {
						walk(rv.Index(i).Interface())
					}
				}
			case reflect.String:
				bytes += int64(rv.Len())
			}
		}
	}
	walk(v)
	return elements, bytes
}

// scan charges the work of reading v in full (a comparison, a search).
func (m *meter) scan(v any, deep bool) error {
	elements, bytes := measure(v, deep, EvalStepLimit-m.steps+1)
	return m.work(elements + bytes/textPerStep)
}

// built charges the memory of v, a value just built.
func (m *meter) built(v any, deep bool) error {
	elements, bytes := measure(v, deep, EvalMemoryLimit-m.memory+1)
	if err := m.work(elements + bytes/textPerStep); err != nil {
		return err
	}
	return m.alloc(elements*elementBytes + bytes)
}

// Names of the functions the patch calls; "$" keeps them out of reach of
// workflow authors (checkReferences only lets input, steps and workflow
// through).
const (
	meterVar   = "$meter"
	fnTick     = "$tick"     // one loop step, returns its argument
	fnScan     = "$scan"     // charges reading its argument in full
	fnIterate  = "$iterate"  // charges walking a collection's top level
	fnOperand  = "$operand"  // charges an operand of + (the result is built from it)
	fnBuilt    = "$built"    // charges a builtin's fresh result
	fnScanN    = "$scanN"    // charges reading text once per instruction of a literal pattern
	fnMatches  = "$matches"  // text matches a pattern known only when run
	overridden = "$builtin_" // prefix of the builtins replaced by checked versions
)

// cheapBuiltins take constant time on their arguments.
var cheapBuiltins = map[string]bool{
	"len": true, "type": true, "abs": true, "ceil": true, "floor": true, "round": true,
	"int": true, "float": true, "now": true, "timezone": true, "first": true, "last": true,
	"get": true, "bitnot": true,
}

// meterPatch rewrites a checked AST so that its work is charged to the
// evaluation's meter (see EvalMemoryLimit).
type meterPatch struct{}

func meterIdent() ast.Node { return &ast.IdentifierNode{Value: meterVar} }

func meterCall(fn string, args ...ast.Node) *ast.CallNode {
	return callOf(fn, append([]ast.Node{meterIdent()}, args...)...)
}

// callOf is a call of the function fn, one of those the patches declare.
func callOf(fn string, args ...ast.Node) *ast.CallNode {
	return &ast.CallNode{Callee: &ast.IdentifierNode{Value: fn}, Arguments: args}
}

// declare makes functions known to expressions, as the patches call them.
func declare(fs ...*builtin.Function) []expr.Option {
	opts := make([]expr.Option, len(fs))
	for i, f := range fs {
		opts[i] = func(c *conf.Config) { c.Functions[f.Name] = f }
	}
	return opts
}

// scalar reports whether a node's type is known to be a number or a bool,
// or is a literal or a range: operators on those take constant time, or
// time bounded by the expression's own size, or are counted by expr (a
// range, which its optimizer also turns "x in 1..n" into two comparisons).
func scalar(n ast.Node) bool {
	switch x := n.(type) {
	case *ast.NilNode, *ast.StringNode, *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode, *ast.ConstantNode:
		return true
	case *ast.BinaryNode:
		if x.Operator == ".." {
			return true
		}
	}
	t := n.Type()
	if t == nil {
		return false
	}
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return true
	}
	return false
}

func (meterPatch) Visit(n *ast.Node) {
	switch x := (*n).(type) {
	case *ast.PredicateNode:
		x.Node = meterCall(fnTick, x.Node)
	case *ast.BinaryNode:
		wrap := fnScan
		switch x.Operator {
		case "&&", "||", "and", "or", "??", "..":
			return // constant time; .. is counted by expr itself
		case "+":
			wrap = fnOperand
		case "matches":
			// Go's regexp reads the text once per instruction of the pattern
			// in the worst case.
			if pattern, literal := x.Right.(*ast.StringNode); literal {
				if !scalar(x.Left) {
					x.Left = meterCall(fnScanN, x.Left, &ast.IntegerNode{Value: len(pattern.Value) + 1})
				}
			} else {
				ast.Patch(n, meterCall(fnMatches, x.Left, x.Right))
			}
			return
		}
		if !scalar(x.Left) {
			x.Left = meterCall(wrap, x.Left)
		}
		if !scalar(x.Right) {
			x.Right = meterCall(wrap, x.Right)
		}
	case *ast.BuiltinNode:
		_, replaced := meteredBuiltins[x.Name]
		if _, checked := checkedBuiltins[x.Name]; checked || replaced {
			ast.Patch(n, meterCall(overridden+x.Name, x.Arguments...))
			return
		}
		if cheapBuiltins[x.Name] || len(x.Arguments) == 0 {
			return
		}
		if f := builtin.Builtins[builtin.Index[x.Name]]; f.Predicate {
			x.Arguments[0] = meterCall(fnIterate, x.Arguments[0])
			return
		}
		// A builtin's result is about as large as its arguments (toJSON,
		// string, flatten, upper...), so they are charged as memory before
		// the call builds it.
		for i, a := range x.Arguments {
			if !scalar(a) {
				x.Arguments[i] = meterCall(fnBuilt, a)
			}
		}
		ast.Patch(n, meterCall(fnBuilt, x))
	}
}

// checkedBuiltins replace builtins whose result can be far larger than
// their arguments: the size is checked before anything is built.
var checkedBuiltins = map[string]func(m *meter, args []any) error{
	"repeat": func(m *meter, args []any) error {
		s, _ := args[0].(string)
		n := runtime.ToInt(args[1])
		if n > 0 && int64(len(s)) > (EvalMemoryLimit-m.memory)/int64(n) {
			size := float64(len(s)) * float64(n)
			if size <= EvalMemoryLimit {
				// Small enough alone: what came before fills the budget.
				return &limitError{fmt.Sprintf("repeat would build %s of text, which with the %s built before is more than the %s one evaluation may build: %s",
					fmtBytes(size), fmtBytes(float64(m.memory)), fmtBytes(EvalMemoryLimit), doInHandler)}
			}
			return &limitError{fmt.Sprintf("repeat would build %s of text, more than the %s one evaluation may build: %s",
				fmtBytes(size), fmtBytes(EvalMemoryLimit), doInHandler)}
		}
		return m.alloc(int64(len(s)) * int64(max(n, 0)))
	},
	"join": func(m *meter, args []any) error {
		// The result is every element and the glue between them.
		if err := m.scan(args[0], true); err != nil {
			return err
		}
		elements, bytes := measure(args[0], true, EvalMemoryLimit-m.memory+1)
		if len(args) > 1 {
			glue, _ := args[1].(string)
			bytes += elements * int64(len(glue))
		}
		return m.alloc(bytes)
	},
	"replace": func(m *meter, args []any) error {
		s, _ := args[0].(string)
		old, _ := args[1].(string)
		repl, _ := args[2].(string)
		if err := m.work(int64(len(s)) / textPerStep); err != nil {
			return err
		}
		count := int64(strings.Count(s, old))
		if len(args) > 3 {
			if limit, ok := args[3].(int); ok && limit >= 0 {
				count = min(count, int64(limit))
			}
		}
		growth := max(0, int64(len(repl))-int64(len(old)))
		if count > 0 && growth > (EvalMemoryLimit-m.memory)/count {
			return errMemoryLimit
		}
		return m.alloc(int64(len(s)) + count*growth)
	},
}

// meteredBuiltins replace builtins whose work is not proportional to their
// arguments, with the same result and a charge for each step.
var meteredBuiltins = map[string]func(m *meter, args []any) (any, error){
	// expr's uniq compares each element with every one kept so far: 10^5
	// distinct numbers are 5·10^9 comparisons. Text, the common case, goes
	// through a set instead (a string only ever equals a string).
	"uniq": func(m *meter, args []any) (any, error) {
		if len(args) != 1 {
			return nil, fmt.Errorf("invalid number of arguments (expected 1, got %d)", len(args))
		}
		v := reflect.ValueOf(args[0])
		if v.Kind() != reflect.Array && v.Kind() != reflect.Slice {
			return nil, fmt.Errorf("cannot uniq %s", v.Kind())
		}
		kept := []any{}
		texts := map[string]bool{}
	items:
		for i := 0; i < v.Len(); i++ {
			item := v.Index(i).Interface()
			if err := m.work(1); err != nil {
				return nil, err
			}
			if s, isText := item.(string); isText {
				if !texts[s] {
					texts[s] = true
					kept = append(kept, item)
				}
				continue
			}
			for _, k := range kept {
				if err := m.work(1); err != nil {
					return nil, err
				}
				if runtime.Equal(item, k) {
					continue items
				}
			}
			kept = append(kept, item)
		}
		return kept, nil
	},
}

var meterType = reflect.TypeOf((*meter)(nil))

// meterOpts declares the functions meterPatch calls.
var meterOpts = sync.OnceValue(meterOptions)

func meterOptions() []expr.Option {
	identity := func(charge func(m *meter, v any) error) func(args ...any) (any, error) {
		return func(args ...any) (any, error) {
			if err := charge(args[0].(*meter), args[1]); err != nil {
				return nil, err
			}
			return args[1], nil
		}
	}
	sameType := func(args []reflect.Type) (reflect.Type, error) {
		if len(args) < 2 {
			return nil, fmt.Errorf("internal: want at least 2 arguments, got %d", len(args))
		}
		return args[1], nil
	}
	fns := map[string]func(m *meter, v any) error{
		fnTick:    func(m *meter, _ any) error { return m.work(1) },
		fnScan:    func(m *meter, v any) error { return m.scan(v, true) },
		fnIterate: func(m *meter, v any) error { return m.scan(v, false) },
		fnOperand: func(m *meter, v any) error { return m.built(v, false) },
		fnBuilt:   func(m *meter, v any) error { return m.built(v, true) },
	}
	var opts []expr.Option
	scanN := &builtin.Function{Name: fnScanN, Validate: sameType, Func: func(args ...any) (any, error) {
		m, times := args[0].(*meter), int64(args[2].(int))
		elements, bytes := measure(args[1], true, EvalStepLimit-m.steps+1)
		if err := m.work(elements + bytes*times/textPerStep); err != nil {
			return nil, err
		}
		return args[1], nil
	}}
	matches := &builtin.Function{Name: fnMatches, Types: []reflect.Type{reflect.TypeOf(func(*meter, string, string) bool { return false })},
		Func: func(args ...any) (any, error) {
			m, text, pattern := args[0].(*meter), args[1].(string), args[2].(string)
			if err := m.alloc(int64(len(pattern)) * elementBytes); err != nil { // the compiled program
				return nil, err
			}
			if err := m.work(1 + int64(len(text))*int64(len(pattern)+1)/textPerStep); err != nil {
				return nil, err
			}
			return regexp.MatchString(pattern, text)
		}}
	opts = append(opts, func(c *conf.Config) { c.Functions[fnScanN], c.Functions[fnMatches] = scanN, matches })
	for name, charge := range fns {
		opts = append(opts, declare(&builtin.Function{Name: name, Func: identity(charge), Validate: sameType})...)
	}
	for name, check := range checkedBuiltins {
		orig := builtin.Builtins[builtin.Index[name]]
		call := orig.Func
		if name == "repeat" {
			// expr's own refuses more than a million repeats, whatever
			// their size, as "memory budget exceeded": the check above
			// bounds the bytes instead.
			call = repeatText
		}
		if call == nil {
			safe := orig.Safe
			call = func(args ...any) (any, error) {
				out, _, err := safe(args...)
				return out, err
			}
		}
		opts = append(opts, overrideBuiltin(orig, func(m *meter, args []any) (any, error) {
			if err := check(m, args); err != nil {
				return nil, err
			}
			return call(args...)
		}))
	}
	for name, call := range meteredBuiltins {
		opts = append(opts, overrideBuiltin(builtin.Builtins[builtin.Index[name]], call))
	}
	return opts
}

// repeatText is expr's repeat without its count limit.
func repeatText(args ...any) (any, error) {
	s, _ := args[0].(string)
	n := runtime.ToInt(args[1])
	if n < 0 {
		return nil, fmt.Errorf("invalid argument for repeat (expected positive integer, got %d)", n)
	}
	return strings.Repeat(s, n), nil
}

// overrideBuiltin declares the function meterPatch calls instead of orig:
// orig's signatures with the meter first.
func overrideBuiltin(orig *builtin.Function, call func(m *meter, args []any) (any, error)) expr.Option {
	f := &builtin.Function{Name: overridden + orig.Name, Func: func(args ...any) (any, error) {
		return call(args[0].(*meter), args[1:])
	}}
	if validate := orig.Validate; validate != nil {
		f.Validate = func(args []reflect.Type) (reflect.Type, error) { return validate(args[1:]) }
	}
	for _, t := range orig.Types {
		in := []reflect.Type{meterType}
		for j := 0; j < t.NumIn(); j++ {
			in = append(in, t.In(j))
		}
		f.Types = append(f.Types, reflect.FuncOf(in, []reflect.Type{t.Out(0)}, t.IsVariadic()))
	}
	return declare(f)[0]
}

// fmtBytes prints a size the way limits are written: 16 MiB, 95.4 MiB.
func fmtBytes[N int | int64 | float64](n N) string {
	f := float64(n)
	switch {
	case f >= 1<<40:
		return trimZero(fmt.Sprintf("%.1f", f/(1<<40))) + " TiB"
	case f >= 1<<30:
		return trimZero(fmt.Sprintf("%.1f", f/(1<<30))) + " GiB"
	case f >= 1<<20:
		return trimZero(fmt.Sprintf("%.1f", f/(1<<20))) + " MiB"
	case f >= 1<<10:
		return trimZero(fmt.Sprintf("%.1f", f/(1<<10))) + " KiB"
	}
	return fmt.Sprintf("%.0f bytes", f)
}

func trimZero(s string) string { return strings.TrimSuffix(s, ".0") }
