package dag

import (
	"fmt"
	"math"
	"reflect"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/builtin"
	"github.com/expr-lang/expr/vm/runtime"
)

// Whole-number arithmetic past the 64-bit range fails the expression.
// expr computes with Go's ints, which wrap around silently: an amount in
// minor units doubled past 2^63 would turn negative and be charged. The
// AST is patched so that +, - and * go through functions that check an
// int result and leave every other operand (floats, text, lists, times)
// to expr's own operators. sum() adds with the same check: its calls
// become calls of $sum, of the list or of map(list, predicate).

// checkedOps names the function each checked operator becomes.
var checkedOps = map[string]string{"+": "$add", "-": "$sub", "*": "$mul"}

// overflowPatch rewrites the arithmetic whose operands may be whole
// numbers. An operand whose type is known to be something else (text, a
// float) is left to expr, which then reports a mismatch at load as before.
type overflowPatch struct{}

func (overflowPatch) Visit(n *ast.Node) {
	if b, ok := (*n).(*ast.BuiltinNode); ok {
		switch {
		case b.Name == "sum":
			list := b.Arguments[0]
			if len(b.Arguments) == 2 {
				list = &ast.BuiltinNode{Name: "map", Arguments: b.Arguments}
			}
			ast.Patch(n, callOf("$sum", list))
		case (b.Name == "abs" || b.Name == "int") && len(b.Arguments) == 1:
			ast.Patch(n, callOf("$"+b.Name, b.Arguments...))
		}
		return
	}
	if u, ok := (*n).(*ast.UnaryNode); ok {
		if u.Operator == "-" && mayBeInt(u.Node) {
			ast.Patch(n, callOf("$neg", u.Node))
		}
		return
	}
	x, ok := (*n).(*ast.BinaryNode)
	if !ok {
		return
	}
	fn, checked := checkedOps[x.Operator]
	if !checked || !mayBeInt(x.Left) || !mayBeInt(x.Right) {
		return
	}
	ast.Patch(n, callOf(fn, x.Left, x.Right))
}

// mayBeInt reports whether a node's value may be an int: its type is int
// or not known before it runs.
func mayBeInt(n ast.Node) bool {
	t := n.Type()
	return t == nil || t.Kind() == reflect.Int || t.Kind() == reflect.Interface
}

// overflowOpts declares the functions overflowPatch calls.
var overflowOpts = func() []expr.Option {
	ops := map[string]struct {
		fn     func(x, y int) (int, bool)
		symbol string
		other  func(a, b any) any
	}{
		"$add": {addInts, "+", runtime.Add},
		"$sub": {subInts, "-", runtime.Subtract},
		"$mul": {mulInts, "*", runtime.Multiply},
	}
	anyType := reflect.TypeFor[any]()
	var opts []expr.Option
	for name, op := range ops {
		f := &builtin.Function{
			Name: name,
			Func: func(args ...any) (any, error) {
				x, xInt := args[0].(int)
				y, yInt := args[1].(int)
				if !xInt || !yInt {
					return op.other(args[0], args[1]), nil // panics as expr's operator would; the VM recovers
				}
				r, ok := op.fn(x, y)
				if !ok {
					return nil, fmt.Errorf("%d %s %d is past the 64-bit range of whole numbers (±%d): compute in a handler, or with floats", x, op.symbol, y, math.MaxInt64)
				}
				return r, nil
			},
			Validate: func(args []reflect.Type) (reflect.Type, error) {
				if len(args) != 2 {
					return nil, fmt.Errorf("internal: want 2 arguments, got %d", len(args))
				}
				if args[0] != nil && args[1] != nil && args[0].Kind() == reflect.Int && args[1].Kind() == reflect.Int {
					return args[0], nil
				}
				return anyType, nil
			},
		}
		opts = append(opts, declare(f)...)
	}
	return append(opts, declare(
		&builtin.Function{Name: "$sum", Func: checkedSum, Validate: validateSum},
		&builtin.Function{Name: "$neg", Func: checkedNeg, Validate: sameNumberType("-")},
		&builtin.Function{Name: "$abs", Func: checkedAbs, Validate: sameNumberType("abs")},
		&builtin.Function{Name: "$int", Func: checkedInt, Validate: validateInt},
	)...)
}()

// rangeError is the error of a whole number past the 64-bit range.
func rangeError(what string) error {
	return fmt.Errorf("%s is past the 64-bit range of whole numbers (±%d): compute in a handler, or with floats", what, math.MaxInt64)
}

// checkedNeg is unary minus: -(-9223372036854775808) has no int.
func checkedNeg(args ...any) (any, error) {
	if x, ok := args[0].(int); ok {
		if x == math.MinInt {
			return nil, rangeError(fmt.Sprintf("-(%d)", x))
		}
		return -x, nil
	}
	return runtime.Negate(args[0]), nil // panics as expr's operator would; the VM recovers
}

// checkedAbs is abs(): abs(-9223372036854775808) has no int either.
func checkedAbs(args ...any) (any, error) {
	if x, ok := args[0].(int); ok && x == math.MinInt {
		return nil, rangeError(fmt.Sprintf("abs(%d)", x))
	}
	return builtin.Abs(args[0]), nil
}

// checkedInt is int(): a float past the range (or NaN) has no int, where
// Go's conversion gives an arbitrary one.
func checkedInt(args ...any) (any, error) {
	var f float64
	switch x := args[0].(type) {
	case float64:
		f = x
	case float32:
		f = float64(x)
	default:
		return builtin.Int(args[0]), nil
	}
	// 2^63 is the first float past the range; -2^63 is in it.
	if math.IsNaN(f) || f >= 1<<63 || f < -(1<<63) {
		return nil, rangeError(fmt.Sprintf("int(%g)", f))
	}
	return int(f), nil
}

// sameNumberType gives $neg and $abs the type of their operand.
func sameNumberType(name string) func([]reflect.Type) (reflect.Type, error) {
	return func(args []reflect.Type) (reflect.Type, error) {
		if len(args) != 1 {
			return nil, fmt.Errorf("%s takes one argument, got %d", name, len(args))
		}
		t := args[0]
		if t == nil || t.Kind() == reflect.Interface {
			return reflect.TypeFor[any](), nil
		}
		switch t.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
			return t, nil
		}
		return nil, fmt.Errorf("%s takes a number, not %s", name, kindOfType(t.String()))
	}
}

// validateInt gives $int int()'s type and its check of the argument.
func validateInt(args []reflect.Type) (reflect.Type, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("int takes one argument, got %d", len(args))
	}
	t := args[0]
	if t != nil {
		switch t.Kind() {
		case reflect.Interface, reflect.String, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		default:
			return nil, fmt.Errorf("int takes a number or text, not %s", kindOfType(t.String()))
		}
	}
	return reflect.TypeFor[int](), nil
}

// checkedSum adds a list's elements as sum() does, failing when whole
// numbers pass the 64-bit range.
func checkedSum(args ...any) (any, error) {
	list := reflect.ValueOf(args[0])
	if k := list.Kind(); k != reflect.Slice && k != reflect.Array {
		return nil, fmt.Errorf("sum takes a list, not %s", kindOfValue(args[0]))
	}
	var total any = 0
	for i := range list.Len() {
		v := list.Index(i).Interface()
		x, xInt := total.(int)
		y, yInt := v.(int)
		if !xInt || !yInt {
			total = runtime.Add(total, v) // panics as expr's sum would; the VM recovers
			continue
		}
		s, ok := addInts(x, y)
		if !ok {
			return nil, fmt.Errorf("sum() is past the 64-bit range of whole numbers (±%d) at element %d: compute in a handler, or with floats", math.MaxInt64, i)
		}
		total = s
	}
	return total, nil
}

// validateSum gives $sum the type sum() has: the element type of a list
// of numbers, unknown otherwise.
func validateSum(args []reflect.Type) (reflect.Type, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("internal: want 1 argument, got %d", len(args))
	}
	t := args[0]
	switch {
	case t == nil || t.Kind() == reflect.Interface:
		return reflect.TypeFor[any](), nil
	case t.Kind() != reflect.Slice && t.Kind() != reflect.Array:
		return nil, fmt.Errorf("sum takes a list, not %s", kindOfType(t.String()))
	case t.Elem().Kind() == reflect.Int || t.Elem().Kind() == reflect.Float64:
		return t.Elem(), nil
	}
	return reflect.TypeFor[any](), nil
}

func addInts(x, y int) (int, bool) {
	s := x + y
	return s, (y >= 0) == (s >= x)
}

func subInts(x, y int) (int, bool) {
	d := x - y
	return d, (y >= 0) == (d <= x)
}

func mulInts(x, y int) (int, bool) {
	if x == 0 || y == 0 {
		return 0, true
	}
	p := x * y
	if p/y != x || (x == -1 && y == math.MinInt) || (y == -1 && x == math.MinInt) {
		return 0, false
	}
	return p, true
}

// kindOfValue names the kind of a value met at run time as kindOfType
// names a type.
func kindOfValue(v any) string {
	if v == nil {
		return "null"
	}
	return kindOfType(reflect.TypeOf(v).String())
}
