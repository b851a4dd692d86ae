package dag

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

var wholeNumber = lazyRegexp(`^[-+]?[0-9]+$`)

// Template is a YAML value (scalar, list or mapping, nested at will) whose
// strings may hold ${{ }} expressions. It is compiled once at load and
// evaluated by the engine for each instance.
type Template struct {
	root tnode
	refs []string
}

// Eval builds the value for one instance: maps are map[string]any, lists
// []any, numbers int, float64 or (a whole number of the file beyond int64)
// json.Number, plus string, bool and nil; the result can be
// passed to json.Marshal as is and is never shared with env or other calls.
// A failing expression gives an error naming it.
func (t *Template) Eval(env *Env) (any, error) {
	if t == nil || t.root == nil {
		return nil, nil // an absent template is null
	}
	if env == nil {
		env = &Env{}
	}
	m := newMeter()
	defer m.report(env)
	return t.root.eval(env, m)
}

// References lists the step names referenced via steps.NAME (sorted, unique),
// so the engine knows which outputs to load.
func (t *Template) References() []string {
	if t == nil {
		return nil
	}
	return append([]string(nil), t.refs...)
}

type tnode interface {
	eval(env *Env, m *meter) (any, error)
}

// tLiteral is a scalar without expressions.
type tLiteral struct{ v any }

func (l tLiteral) eval(*Env, *meter) (any, error) { return l.v, nil }

// tExpr is a string that is exactly one ${{ }}: it keeps the value's type.
type tExpr struct{ e *Expr }

func (x tExpr) eval(env *Env, m *meter) (any, error) { return x.e.eval(env, m) }

// tInterp is text with ${{ }} inside: the values are formatted as text.
type tInterp struct{ parts []tpart }

type tpart struct {
	text string
	e    *Expr // nil for literal text
}

func (x tInterp) eval(env *Env, m *meter) (any, error) {
	var b strings.Builder
	for _, part := range x.parts {
		if part.e == nil {
			b.WriteString(part.text)
			continue
		}
		v, err := part.e.eval(env, m)
		if err != nil {
			return nil, err
		}
		s, err := toText(v)
		if err != nil {
			return nil, fmt.Errorf("expression %q: %w", part.e.src, err)
		}
		if err := m.alloc(int64(len(s))); err != nil {
			return nil, fmt.Errorf("expression %q: %w", part.e.src, err)
		}
		b.WriteString(s)
	}
	return b.String(), nil
}

type tList []tnode

func (l tList) eval(env *Env, m *meter) (any, error) {
	out := make([]any, len(l))
	for i, n := range l {
		v, err := n.eval(env, m)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

type tMap struct {
	keys []string
	vals []tnode
}

func (t tMap) eval(env *Env, m *meter) (any, error) {
	out := make(map[string]any, len(t.keys))
	for i, k := range t.keys {
		v, err := t.vals[i].eval(env, m)
		if err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

// template compiles a YAML value into a Template, reporting problems at the
// nodes that hold them.
func (p *parser) template(n *yaml.Node, sc *scope) *Template {
	refs := map[string]bool{}
	root := p.tnode(n, sc, refs, 0)
	t := &Template{root: root}
	if t.root == nil {
		t.root = tLiteral{}
	}
	for r := range refs {
		t.refs = append(t.refs, r)
	}
	sort.Strings(t.refs)
	return t
}

func (p *parser) tnode(n *yaml.Node, sc *scope, refs map[string]bool, depth int) tnode {
	n = resolve(n)
	if n == nil {
		return tLiteral{}
	}
	if !p.spend(n, 1, depth) {
		return nil
	}
	switch n.Kind {
	case yaml.SequenceNode:
		out := make(tList, 0, len(n.Content))
		for _, c := range n.Content {
			out = append(out, p.tnode(c, sc, refs, depth+1))
		}
		return out
	case yaml.MappingNode:
		var out tMap
		seen := map[string]bool{}
		for _, kv := range p.pairs(n, 0) {
			if kv.key.Kind != yaml.ScalarNode {
				p.c.at(kv.key, "mapping keys must be text, got %s", describe(kv.key))
				continue
			}
			k := kv.key.Value
			if strings.Contains(k, "${{") {
				p.c.at(kv.key, "%sexpressions are not allowed in keys (%q): only values may hold ${{ }}", sc.label(), k)
				continue
			}
			if seen[k] {
				p.c.at(kv.key, "key %q is set twice: keep one", k)
				continue
			}
			seen[k] = true
			out.keys = append(out.keys, k)
			out.vals = append(out.vals, p.tnode(kv.value, sc, refs, depth+1))
		}
		return out
	case yaml.ScalarNode:
		return p.tscalar(n, sc, refs)
	}
	return tLiteral{}
}

func (p *parser) tscalar(n *yaml.Node, sc *scope, refs map[string]bool) tnode {
	switch n.ShortTag() {
	case "!!null":
		return tLiteral{}
	case "!!bool", "!!int", "!!float":
		var v any
		if err := n.Decode(&v); err != nil {
			return tLiteral{v: n.Value}
		}
		if f, ok := v.(float64); ok && (math.IsInf(f, 0) || math.IsNaN(f)) {
			p.c.at(n, "%s%s cannot be represented in JSON: quote it to pass it as text", sc.label(), n.Value)
			return nil
		}
		// A whole number past 64 bits (YAML makes it a float) or past int64
		// keeps every digit, as the JSON number it is; as a float64 it would
		// silently become another number.
		_, isUint := v.(uint64)
		if _, isFloat := v.(float64); (isFloat || isUint) && wholeNumber().MatchString(n.Value) {
			v = json.Number(strings.TrimPrefix(n.Value, "+"))
		}
		return tLiteral{v: v}
	}
	// Strings, and tags such as !!timestamp or !!binary, stay the text as
	// written: JSON has no timestamps, and silently reformatting a date
	// would surprise.
	if !strings.Contains(n.Value, "${{") {
		return tLiteral{v: n.Value}
	}
	segs, problem := p.splitScalar(n)
	if problem != "" {
		p.c.at(n, "%s%s", sc.label(), problem)
		return nil
	}
	addRefs := func(e *Expr) {
		for _, r := range e.refs {
			refs[r] = true
		}
	}
	if isWholeExpr(segs) {
		e := p.compileExpr(wholeExpr(segs), n, sc, false)
		if e == nil {
			return nil
		}
		addRefs(e)
		return tExpr{e}
	}
	var out tInterp
	ok := true
	for _, s := range segs {
		if !s.expr {
			out.parts = append(out.parts, tpart{text: s.text})
			continue
		}
		e := p.compileExpr(s.text, n, sc, false)
		if e == nil {
			ok = false
			continue
		}
		addRefs(e)
		out.parts = append(out.parts, tpart{e: e})
	}
	if !ok {
		return nil
	}
	return out
}

// splitScalar is splitTemplate for a YAML scalar. An unterminated ${{ in an
// unquoted value is most often cut by YAML itself, which reads " #" (as in
// ${{ any(xs, # > 1) }}) as the start of a comment: the message says so.
func (p *parser) splitScalar(n *yaml.Node) ([]segment, string) {
	segs, problem := splitTemplate(n.Value)
	if problem == "" || n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
		return segs, problem
	}
	line := p.sourceLine(n.Line)
	if at := max(0, n.Column-1); at < len(line) && strings.Contains(line[at:], " #") {
		problem += `; YAML reads " #" as the start of a comment: put the whole value in quotes, e.g. "${{ any(input.xs, # > 1) }}"`
	}
	return segs, problem
}

// sourceLine returns line n (from 1) of the file, "" past its end. The
// line starts are found once per file, as a file may have many errors.
func (p *parser) sourceLine(n int) string {
	if p.lineStarts == nil {
		p.lineStarts = []int{0}
		for i, c := range p.src {
			if c == '\n' {
				p.lineStarts = append(p.lineStarts, i+1)
			}
		}
	}
	if n < 1 || n > len(p.lineStarts) {
		return ""
	}
	line := p.src[p.lineStarts[n-1]:]
	if end := bytes.IndexByte(line, '\n'); end >= 0 {
		line = line[:end]
	}
	return string(line)
}

// segment is literal text or the inside of one ${{ }}.
type segment struct {
	text string
	expr bool
}

// splitTemplate cuts a string into text and ${{ }} segments. The closing }}
// is searched outside string literals and outside braces opened inside the
// expression, so ${{ {"a": {"b": 1}} }} and ${{ "}}" }} work. A literal "${{"
// is written ${{ "${{" }}.
func splitTemplate(s string) ([]segment, string) {
	var segs []segment
	for {
		i := strings.Index(s, "${{")
		if i < 0 {
			if s != "" {
				segs = append(segs, segment{text: s})
			}
			return segs, ""
		}
		if i > 0 {
			segs = append(segs, segment{text: s[:i]})
		}
		body := s[i+3:]
		end := closeIndex(body)
		if end < 0 {
			return nil, fmt.Sprintf("unterminated ${{ in %q: add the closing }}", s)
		}
		inner := body[:end]
		if strings.TrimSpace(inner) == "" {
			return nil, fmt.Sprintf("empty ${{ }} in %q: put an expression inside, e.g. ${{ input.id }}", s)
		}
		segs = append(segs, segment{text: inner, expr: true})
		s = body[end+2:]
	}
}

// closeIndex finds the "}}" closing an expression, or -1.
func closeIndex(s string) int {
	depth := 0
	var quote byte
	for j := 0; j < len(s); j++ {
		c := s[j]
		if quote != 0 {
			switch {
			case c == '\\' && quote != '`':
				j++
			case c == quote:
				quote = 0
			}
			continue
		}
		switch c {
		case '"', '\'', '`':
			quote = c
		case '{':
			depth++
		case '}':
			if depth == 0 && j+1 < len(s) && s[j+1] == '}' {
				return j
			}
			if depth > 0 {
				depth--
			}
		}
	}
	return -1
}

// isWholeExpr reports whether the segments are one ${{ }} with at most
// whitespace around it: such a string evaluates to the typed value.
func isWholeExpr(segs []segment) bool {
	n := 0
	for _, s := range segs {
		if s.expr {
			n++
		} else if strings.TrimSpace(s.text) != "" {
			return false
		}
	}
	return n == 1
}

func wholeExpr(segs []segment) string {
	for _, s := range segs {
		if s.expr {
			return s.text
		}
	}
	return ""
}

// toText formats an interpolated value: nil is empty, strings are as is,
// everything else is its JSON form (so 16.0 prints 16 and maps print as JSON).
func toText(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "", nil
	case string:
		return x, nil
	case bool:
		return strconv.FormatBool(x), nil
	case int:
		return strconv.Itoa(x), nil
	}
	b, err := MarshalJSON(v)
	return string(b), err
}

// MarshalJSON encodes a value of the language as JSON as written: <, >
// and & stay one byte each, where encoding/json's escapes for HTML would
// store six (and count them so against the size limits).
func MarshalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

const maxValueDepth = 1000

// normalize turns whatever an expression returned into JSON-ready values
// (map[string]any, []any, string, int/float64, bool, nil), copying
// containers so the result never aliases the environment.
func normalize(v any, depth int, m *meter) (any, error) {
	if depth > maxValueDepth {
		return nil, fmt.Errorf("the result is nested more than %d levels deep", maxValueDepth)
	}
	// The copy is charged as it is made: a result such as map(1..1000,
	// input) shares one value a thousand times and would copy it as often.
	if err := m.built(v, false); err != nil {
		return nil, err
	}
	switch x := v.(type) {
	case nil, bool, string, int, int64:
		return x, nil
	case json.Number:
		return x, nil
	case float64:
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return nil, fmt.Errorf("the result %v is not a number JSON can hold (division by zero?)", x)
		}
		return x, nil
	case float32:
		return normalize(float64(x), depth, m)
	case int8:
		return int(x), nil
	case int16:
		return int(x), nil
	case int32:
		return int(x), nil
	case uint8:
		return int(x), nil
	case uint16:
		return int(x), nil
	case uint32:
		return int64(x), nil
	case uint:
		return normalizeUint(uint64(x)), nil
	case uint64:
		return normalizeUint(x), nil
	case time.Time:
		return x.Format(time.RFC3339Nano), nil
	case time.Duration:
		return x.String(), nil
	case *time.Location:
		return x.String(), nil // timezone("Europe/Berlin") is its name, not {}
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			n, err := normalize(e, depth+1, m)
			if err != nil {
				return nil, err
			}
			out[i] = n
		}
		return out, nil
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			n, err := normalize(e, depth+1, m)
			if err != nil {
				return nil, err
			}
			out[k] = n
		}
		return out, nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			return nil, nil
		}
		return normalize(rv.Elem().Interface(), depth+1, m)
	case reflect.Slice, reflect.Array:
		if rv.Kind() == reflect.Slice && rv.IsNil() {
			return nil, nil
		}
		out := make([]any, rv.Len())
		for i := range out {
			n, err := normalize(rv.Index(i).Interface(), depth+1, m)
			if err != nil {
				return nil, err
			}
			out[i] = n
		}
		return out, nil
	case reflect.Map:
		// groupBy's map[any][]any has text keys as often as not; JSON
		// keys can only be text.
		keyKind := rv.Type().Key().Kind()
		if keyKind != reflect.String && keyKind != reflect.Interface {
			break
		}
		out := make(map[string]any, rv.Len())
		iter := rv.MapRange()
		for iter.Next() {
			key := iter.Key()
			if key.Kind() == reflect.Interface {
				key = key.Elem()
			}
			if key.Kind() != reflect.String {
				return nil, fmt.Errorf("the result is a mapping with the key %s, which is no text: JSON keys are text (make them so with string())", describeValue(iter.Key().Interface()))
			}
			n, err := normalize(iter.Value().Interface(), depth+1, m)
			if err != nil {
				return nil, err
			}
			out[key.String()] = n
		}
		return out, nil
	case reflect.String:
		return rv.String(), nil
	case reflect.Bool:
		return rv.Bool(), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), nil
	case reflect.Float32, reflect.Float64:
		return normalize(rv.Float(), depth, m)
	case reflect.Func, reflect.Chan, reflect.UnsafePointer, reflect.Complex64, reflect.Complex128:
		return nil, fmt.Errorf("the result is a %T, which JSON cannot hold", v)
	}
	// Anything else (structs...): through its JSON form.
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("the result (%T) cannot be converted to JSON: %v", v, err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("the result (%T) cannot be converted to JSON: %v", v, err)
	}
	return out, nil
}

func normalizeUint(u uint64) any {
	if u <= math.MaxInt64 {
		return int64(u)
	}
	return json.Number(strconv.FormatUint(u, 10)) // every digit, as an input's
}

// describeValue names a value's JSON type for messages.
func describeValue(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return "the text " + quoteText(x)
	case bool:
		return strconv.FormatBool(x)
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	if s, err := toText(v); err == nil {
		return "the number " + s
	}
	return fmt.Sprintf("a %T", v)
}
