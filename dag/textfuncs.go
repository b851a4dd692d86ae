package dag

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/builtin"
)

// string(), toJSON() and fromJSON() speak JSON, as the rest of the
// language does. expr's own give Go's text (string(null) is "<nil>", a
// mapping "map[k:v]"), indented JSON, and floats for every number (an ID
// of 20 digits loses its last ones), so their calls are patched to
// versions that give what interpolation gives, compact JSON, and whole
// numbers as whole numbers.

// textFuncs are the replaced builtins and their replacements.
var textFuncs = map[string]string{"string": "$string", "toJSON": "$toJSON", "fromJSON": "$fromJSON"}

// textPatch sends the one-argument calls of textFuncs to their
// replacements.
type textPatch struct{}

func (textPatch) Visit(n *ast.Node) {
	b, ok := (*n).(*ast.BuiltinNode)
	if !ok || len(b.Arguments) != 1 {
		return
	}
	if fn, ok := textFuncs[b.Name]; ok {
		ast.Patch(n, callOf(fn, b.Arguments...))
	}
}

// textOpts declares the replacements.
var textOpts = func() []expr.Option {
	stringType, anyType := reflect.TypeFor[string](), reflect.TypeFor[any]()
	one := func(name string, out reflect.Type) func([]reflect.Type) (reflect.Type, error) {
		return func(args []reflect.Type) (reflect.Type, error) {
			if len(args) != 1 {
				return nil, fmt.Errorf("%s takes one argument, got %d", name, len(args))
			}
			return out, nil
		}
	}
	return declare(
		&builtin.Function{Name: "$string", Func: stringOf, Validate: one("string", stringType)},
		&builtin.Function{Name: "$toJSON", Func: toJSONOf, Validate: one("toJSON", stringType)},
		&builtin.Function{Name: "$fromJSON", Func: fromJSONOf, Validate: func(args []reflect.Type) (reflect.Type, error) {
			if len(args) == 1 && args[0] != nil && args[0].Kind() != reflect.String && args[0].Kind() != reflect.Interface {
				return nil, fmt.Errorf("fromJSON takes text, not %s", kindOfType(args[0].String()))
			}
			return one("fromJSON", anyType)(args)
		}},
	)
}()

// stringOf is string(): the text interpolation gives, so that
// "${{ x }}" and ${{ string(x) }} agree: null is empty, text is as is,
// a time is RFC 3339, a duration as 1h30m0s, anything else its JSON.
func stringOf(args ...any) (any, error) {
	switch x := args[0].(type) {
	case time.Time:
		return x.Format(time.RFC3339Nano), nil
	case time.Duration:
		return x.String(), nil
	case json.Number:
		return x.String(), nil
	}
	return toText(args[0])
}

// toJSONOf is toJSON(): compact JSON, keeping <, > and & as written, of
// the value as a result is written: a duration as 1h30m0s, not Go's count
// of nanoseconds.
func toJSONOf(args ...any) (any, error) {
	// The value was charged as it was built; this copy is as large.
	v, err := normalize(args[0], 0, newMeter())
	if err != nil {
		return nil, fmt.Errorf("toJSON: %w", err)
	}
	b, err := MarshalJSON(v)
	if err != nil {
		return nil, fmt.Errorf("toJSON: %v", err)
	}
	return string(b), nil
}

// fromJSONOf is fromJSON(): whole numbers decode as whole numbers, past
// 64 bits as json.Number (passed on with every digit, as an input's are),
// the others as floats.
func fromJSONOf(args ...any) (any, error) {
	text, ok := args[0].(string)
	if !ok {
		return nil, fmt.Errorf("fromJSON takes text, not %s", kindOfValue(args[0]))
	}
	v, err := UnmarshalJSON([]byte(text))
	if err != nil {
		return nil, fmt.Errorf("fromJSON: %v", err)
	}
	return v, nil
}

// UnmarshalJSON decodes one JSON value for expressions. Whole numbers
// that fit in an int become int, so a value passed through a step keeps
// every digit: a plain json.Unmarshal makes every number a float64, which
// silently rounds integers past 2^53 (IDs, amounts in minor units). A
// whole number past int64 (an unsigned 64-bit ID) stays the json.Number it
// is, as a YAML literal does: passed on or interpolated, it keeps every
// digit, and arithmetic on it is an error rather than a float's other
// number. Other numbers are float64.
func UnmarshalJSON(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("more than one JSON value in the text")
	}
	return wholeNumbers(v)
}

// wholeNumbers turns the json.Numbers of a decoded value into ints where
// they fit, and into floats where they are not whole; a number no float64
// holds (1e400) is an error, as it is in a start's input.
func wholeNumbers(v any) (any, error) {
	switch x := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(x), 10, 0); err == nil {
			return int(i), nil
		}
		if !strings.ContainsAny(string(x), ".eE") {
			return x, nil // whole, past int64
		}
		f, err := x.Float64() // the decoder accepted it as a number
		if err != nil {
			return nil, fmt.Errorf("the number %s is beyond the range of a 64-bit floating-point number", x)
		}
		return f, nil
	case map[string]any:
		for k, e := range x {
			n, err := wholeNumbers(e)
			if err != nil {
				return nil, err
			}
			x[k] = n
		}
	case []any:
		for i, e := range x {
			n, err := wholeNumbers(e)
			if err != nil {
				return nil, err
			}
			x[i] = n
		}
	}
	return v, nil
}
