package dag

import (
	"fmt"
	"reflect"
	"time"

	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/builtin"
)

// now() reads the evaluation's clock (Env.Now) rather than the machine's,
// so that a workflow test, whose time is a fake clock's, gets the same
// time in its expressions as its sleeps and handlers get.

// clockPatch turns now() into $clock($now), of the Env's time, keeping an
// optional zone argument: now(timezone("Europe/Berlin")).
type clockPatch struct{}

func (clockPatch) Visit(n *ast.Node) {
	b, ok := (*n).(*ast.BuiltinNode)
	if !ok || b.Name != "now" || len(b.Arguments) > 1 {
		return
	}
	ast.Patch(n, callOf("$clock", append([]ast.Node{&ast.IdentifierNode{Value: "$now"}}, b.Arguments...)...))
}

// clockOpts declare the function clockPatch calls.
var clockOpts = declare(&builtin.Function{
	Name: "$clock",
	Func: func(args ...any) (any, error) {
		now, _ := args[0].(time.Time)
		if now.IsZero() {
			now = time.Now()
		}
		if len(args) == 2 {
			zone, ok := args[1].(*time.Location)
			if !ok {
				return nil, fmt.Errorf("now takes a zone made by timezone(), not %s", kindOfValue(args[1]))
			}
			now = now.In(zone)
		}
		return now, nil
	},
	Validate: func(args []reflect.Type) (reflect.Type, error) {
		if len(args) == 2 && args[1] != nil && args[1].Kind() != reflect.Interface && !args[1].AssignableTo(reflect.TypeFor[*time.Location]()) {
			return nil, fmt.Errorf("now takes a zone made by timezone(), not %s", kindOfType(args[1].String()))
		}
		return reflect.TypeFor[time.Time](), nil
	},
})
