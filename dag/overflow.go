package dag

import (
	"fmt"
	"math"
	"reflect"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/builtin"
	"github.com/expr-lang/expr/conf"
	"github.com/expr-lang/expr/vm/runtime"
)

// Whole-number arithmetic past the 64-bit range fails the expression.
// expr computes with Go's ints, which wrap around silently: an amount in
// minor units doubled past 2^63 would turn negative and be charged. The
// AST is patched so that +, - and * go through functions that check an
// int result and leave every other operand (floats, text, lists, times)
// to expr's own operators.

// checkedOps names the function each checked operator becomes.
var checkedOps = map[string]string{"+": "$add", "-": "$sub", "*": "$mul"}

// overflowPatch rewrites the arithmetic whose operands may be whole
// numbers. An operand whose type is known to be something else (text, a
// float) is left to expr, which then reports a mismatch at load as before.
type overflowPatch struct{}

func (overflowPatch) Visit(n *ast.Node) {
	x, ok := (*n).(*ast.BinaryNode)
	if !ok {
		return
	}
	fn, checked := checkedOps[x.Operator]
	if !checked || !mayBeInt(x.Left) || !mayBeInt(x.Right) {
		return
	}
	ast.Patch(n, &ast.CallNode{Callee: &ast.IdentifierNode{Value: fn}, Arguments: []ast.Node{x.Left, x.Right}})
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
		opts = append(opts, func(c *conf.Config) { c.Functions[f.Name] = f })
	}
	return opts
}()

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
