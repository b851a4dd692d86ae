package dag

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"gopkg.in/yaml.v3"
)

// schemaURL names the input schema inside the compiler. It is never fetched.
const schemaURL = "dagrun:///input-schema.json"

// ErrInvalidInput is matched (errors.Is) by the error of ValidateInput, so
// callers can map it to a usage error without parsing the message.
var ErrInvalidInput = errors.New("input does not match the workflow's schema")

// ErrInvalidPayload is matched (errors.Is) by the error of
// Wait.ValidatePayload.
var ErrInvalidPayload = errors.New("payload does not match the wait step's schema")

type inputError struct {
	kind     error // ErrInvalidInput or ErrInvalidPayload
	problems []string
}

func (e *inputError) Error() string {
	return e.kind.Error() + ": " + strings.Join(e.problems, "; ")
}

func (e *inputError) Is(target error) bool { return target == e.kind }

// noLoader refuses every external $ref: validating a workflow must never read
// files or the network, and a schema must mean the same on every machine.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, errors.New("external references are not supported")
}

// compileSchema compiles JSON Schema text. Schemas without $schema are
// 2020-12; format is asserted (format: email rejects non-emails), which is
// what users writing it expect.
func compileSchema(raw []byte) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noLoader{})
	c.AssertFormat()
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, err
	}
	return c.Compile(schemaURL)
}

// inputSchema converts the input: node to JSON and compiles it, reporting
// schema mistakes at the YAML node they are about.
func (p *parser) inputSchema(n *yaml.Node) (json.RawMessage, *jsonschema.Schema) {
	return p.schema(n, "", `"input"`, "input")
}

// schema converts a JSON Schema node (label: the step it belongs to, ""
// for the workflow's; what: how messages name the key; kind: which schema
// it is) to JSON and compiles it.
func (p *parser) schema(n *yaml.Node, label, what, kind string) (json.RawMessage, *jsonschema.Schema) {
	what = prefix(label) + what
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode && !(n.Kind == yaml.ScalarNode && n.ShortTag() == "!!bool") {
		p.c.at(n, `%s must be a JSON Schema mapping (e.g. type: object with properties), got %s`, what, describe(n))
		return nil, nil
	}
	nodes := map[string]*yaml.Node{}
	v, ok := p.plain(n, "", nodes, 0)
	if !ok {
		return nil, nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		p.c.at(n, "%sinvalid %s schema: %v", prefix(label), kind, err)
		return nil, nil
	}
	invalid := prefix(label) + "invalid " + kind + " schema"
	keywordsOK := p.checkKeywords(v, "", nodes, invalid)
	refsOK := p.checkRefs(nodes, invalid)
	sch, err := compileSchema(raw)
	if err != nil {
		var (
			lue *jsonschema.LoadURLError
			pnf *jsonschema.JSONPointerNotFoundError
		)
		if refsOK || !errors.As(err, &lue) && !errors.As(err, &pnf) {
			p.schemaError(n, nodes, err, invalid)
		}
		return nil, nil
	}
	if !refsOK || !keywordsOK {
		return nil, nil
	}
	return raw, sch
}

// checkRefs reports every $ref of a schema that points outside it or to
// nothing in it, all at once: the compiler stops at the first, and not
// before the schema's other errors. A schema with an $id, whose refs may
// resolve against a base of their own, is left to the compiler, and so
// is a $ref to an anchor ("#name"). Values that are data, not schemas
// (const, default, enum, examples), are not looked into.
func (p *parser) checkRefs(nodes map[string]*yaml.Node, what string) bool {
	for ptr := range nodes {
		if ptr == "/$id" || strings.HasSuffix(ptr, "/$id") {
			return true
		}
	}
	ok := true
	for ptr, n := range nodes {
		if !strings.HasSuffix(ptr, "/$ref") || n.Kind != yaml.ScalarNode || isDataPointer(ptr) {
			continue
		}
		switch v := n.Value; {
		case !strings.HasPrefix(v, "#"):
			p.c.at(n, "%s: $ref %q points outside this schema; only local references such as \"#/$defs/item\" are supported", what, v)
			ok = false
		case v == "#" || strings.HasPrefix(v, "#/"):
			if target, err := url.PathUnescape(v[1:]); err == nil && nodes[target] == nil {
				p.c.at(n, "%s: $ref %q points to nothing in this schema", what, v)
				ok = false
			}
		}
	}
	return ok
}

// isDataPointer reports whether a pointer into a schema goes through a
// keyword whose value is data rather than a schema.
func isDataPointer(ptr string) bool {
	for _, kw := range []string{"/const/", "/default/", "/enum/", "/examples/"} {
		if strings.Contains(ptr, kw) {
			return true
		}
	}
	return false
}

// plain converts a YAML value without expressions into JSON values, recording
// the node of each JSON pointer for error positions.
func (p *parser) plain(n *yaml.Node, ptr string, nodes map[string]*yaml.Node, depth int) (any, bool) {
	n = resolve(n)
	if n == nil {
		return nil, true
	}
	if !p.spend(n, 1, depth) {
		return nil, false
	}
	nodes[ptr] = n
	switch n.Kind {
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		ok := true
		for i, c := range n.Content {
			v, cok := p.plain(c, fmt.Sprintf("%s/%d", ptr, i), nodes, depth+1)
			ok = ok && cok
			out = append(out, v)
		}
		return out, ok
	case yaml.MappingNode:
		out := map[string]any{}
		ok := true
		for _, kv := range p.pairs(n, 0) {
			if kv.key.Kind != yaml.ScalarNode {
				p.c.at(kv.key, "mapping keys must be text, got %s", describe(kv.key))
				ok = false
				continue
			}
			k := kv.key.Value
			if _, dup := out[k]; dup {
				p.c.at(kv.key, "key %q is set twice: keep one", k)
				ok = false
				continue
			}
			v, cok := p.plain(kv.value, ptr+"/"+escapePointer(k), nodes, depth+1)
			ok = ok && cok
			out[k] = v
		}
		return out, ok
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return nil, true
		case "!!bool", "!!int", "!!float":
			var v any
			if err := n.Decode(&v); err != nil {
				return n.Value, true
			}
			if f, isF := v.(float64); isF && (math.IsInf(f, 0) || math.IsNaN(f)) {
				p.c.at(n, "%s cannot be represented in JSON", n.Value)
				return nil, false
			}
			return v, true
		}
		return n.Value, true
	}
	return nil, true
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

func jsonPointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteString("/")
		b.WriteString(escapePointer(t))
	}
	return b.String()
}

// nodeAt finds the node of a pointer, or of its nearest ancestor.
func nodeAt(nodes map[string]*yaml.Node, ptr string, fallback *yaml.Node) *yaml.Node {
	for {
		if n, ok := nodes[ptr]; ok {
			return n
		}
		i := strings.LastIndex(ptr, "/")
		if i < 0 {
			return fallback
		}
		ptr = ptr[:i]
	}
}

// schemaError reports why a schema did not compile, at the YAML node each
// problem is about; what leads each message ("invalid input schema").
func (p *parser) schemaError(n *yaml.Node, nodes map[string]*yaml.Node, err error, what string) {
	var (
		sve *jsonschema.SchemaValidationError
		lue *jsonschema.LoadURLError
		pnf *jsonschema.JSONPointerNotFoundError
	)
	switch {
	case errors.As(err, &sve):
		var ve *jsonschema.ValidationError
		if errors.As(sve.Err, &ve) {
			for _, l := range leaves(ve) {
				ptr := jsonPointer(l.InstanceLocation)
				p.c.at(nodeAt(nodes, ptr, n), "%s at %s: %s", what, displayPointer(ptr), leafMessage(l))
			}
			return
		}
	case errors.As(err, &lue):
		ref := findRef(nodes, func(v string) bool { return !strings.HasPrefix(v, "#") })
		p.c.at(nodeOr(ref, n), "%s: $ref %q points outside this schema; only local references such as \"#/$defs/item\" are supported", what, refValue(ref, lue.URL))
		return
	case errors.As(err, &pnf):
		_, frag, _ := strings.Cut(pnf.URL, "#")
		ref := findRef(nodes, func(v string) bool { return v == "#"+frag })
		p.c.at(nodeOr(ref, n), "%s: $ref %q points to nothing in this schema", what, "#"+frag)
		return
	}
	msg, _, _ := strings.Cut(err.Error(), "\n")
	p.c.at(n, "%s: %s", what, msg)
}

func findRef(nodes map[string]*yaml.Node, match func(string) bool) *yaml.Node {
	var best *yaml.Node
	for ptr, node := range nodes {
		if strings.HasSuffix(ptr, "/$ref") && node.Kind == yaml.ScalarNode && match(node.Value) {
			if best == nil || node.Line < best.Line || (node.Line == best.Line && node.Column < best.Column) {
				best = node
			}
		}
	}
	return best
}

func nodeOr(n, fallback *yaml.Node) *yaml.Node {
	if n != nil {
		return n
	}
	return fallback
}

func refValue(ref *yaml.Node, fallback string) string {
	if ref != nil {
		return ref.Value
	}
	return fallback
}

func displayPointer(ptr string) string {
	if ptr == "" {
		return "the top level"
	}
	return ptr
}

// leaves returns the most specific causes of a validation error. Of the
// alternatives of anyOf/oneOf only the first branch is kept: listing why every
// alternative failed buries the useful line.
func leaves(e *jsonschema.ValidationError) []*jsonschema.ValidationError {
	if len(e.Causes) == 0 {
		return []*jsonschema.ValidationError{e}
	}
	causes := e.Causes
	switch e.ErrorKind.(type) {
	case *kind.AnyOf, *kind.OneOf:
		causes = causes[:1]
	}
	var out []*jsonschema.ValidationError
	for _, c := range causes {
		out = append(out, leaves(c)...)
	}
	return out
}

// leafMessage is the reason of a leaf without its "at '/x': " prefix.
func leafMessage(e *jsonschema.ValidationError) string {
	switch k := e.ErrorKind.(type) {
	case *kind.FalseSchema:
		return falseSchemaMessage(e)
	// The library prints these bounds as floats, in a locale's digits
	// ("9.007199254740992×10¹⁵"): a whole number is written as given.
	case *kind.Minimum:
		return boundMessage("minimum", k.Got, k.Want)
	case *kind.Maximum:
		return boundMessage("maximum", k.Got, k.Want)
	case *kind.ExclusiveMinimum:
		return boundMessage("exclusiveMinimum", k.Got, k.Want)
	case *kind.ExclusiveMaximum:
		return boundMessage("exclusiveMaximum", k.Got, k.Want)
	case *kind.MultipleOf:
		return boundMessage("multipleOf", k.Got, k.Want)
	}
	s := e.Error()
	return strings.TrimPrefix(s, "at "+quotePointer(jsonPointer(e.InstanceLocation))+": ")
}

// boundMessage is a numeric keyword's failure, as "maximum: got 11, want 10".
func boundMessage(keyword string, got, want *big.Rat) string {
	return fmt.Sprintf("%s: got %s, want %s", keyword, ratText(got), ratText(want))
}

// ratText writes a whole number with every digit, any other as the
// shortest decimal of its float64.
func ratText(r *big.Rat) string {
	if r.IsInt() {
		return r.Num().String()
	}
	f, _ := r.Float64()
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// falseSchemaMessage says what a value that met a false schema is: a
// property or an item the schema does not allow there, which the library
// words only as "false schema". Where the false schema sits says which.
func falseSchemaMessage(e *jsonschema.ValidationError) string {
	name := ""
	if n := len(e.InstanceLocation); n > 0 {
		name = e.InstanceLocation[n-1]
	}
	// The false schema is the value of a keyword (.../unevaluatedProperties)
	// or of one entry of it (.../properties/NAME, .../prefixItems/0).
	_, at, _ := strings.Cut(e.SchemaURL, "#")
	parts := strings.Split(at, "/")
	last, entryOf := parts[len(parts)-1], ""
	if len(parts) > 1 {
		entryOf = parts[len(parts)-2]
	}
	switch {
	case last == "additionalProperties" || last == "unevaluatedProperties" ||
		entryOf == "properties" || entryOf == "patternProperties":
		return fmt.Sprintf("property %s is not allowed", quoteName(name))
	case last == "items" || last == "additionalItems" || last == "unevaluatedItems" ||
		entryOf == "prefixItems" || entryOf == "items":
		return "no item is allowed at index " + name
	}
	return "no value is allowed here (its schema is false)"
}

// quoteName quotes a property name as the library quotes them ('name').
func quoteName(name string) string {
	return "'" + strings.ReplaceAll(name, "'", `\'`) + "'"
}

// quotePointer mirrors how jsonschema quotes locations in its messages.
func quotePointer(s string) string {
	s = fmt.Sprintf("%q", s)
	s = strings.ReplaceAll(s, `\"`, `"`)
	s = strings.ReplaceAll(s, `'`, `\'`)
	return "'" + s[1:len(s)-1] + "'"
}

// ValidateInput checks a JSON value against the input schema: a
// json.RawMessage, or any value encoding/json marshals (a float64 from
// json.Unmarshal into any has rounded a whole number past 2^53 already;
// pass the text to compare such numbers exactly). A workflow without a
// schema accepts anything.
// The error is one line listing the most specific failures, e.g.
// "input does not match the workflow's schema: at /items: minItems: got 0,
// want 1", and matches ErrInvalidInput with errors.Is.
func (w *Workflow) ValidateInput(input any) error {
	return validate(w.schema, w.InputSchema, "input", ErrInvalidInput, input)
}

// ValidatePayload checks a signal's payload (JSON) against the wait's
// schema; a wait without a schema accepts anything. The error matches
// ErrInvalidPayload with errors.Is.
func (wt *Wait) ValidatePayload(payload json.RawMessage) error {
	return validate(wt.schema, wt.Schema, "payload", ErrInvalidPayload, payload)
}

func validate(sch *jsonschema.Schema, raw json.RawMessage, what string, kind error, input any) error {
	if sch == nil {
		if len(raw) == 0 {
			return nil
		}
		// A Workflow built by hand rather than by Parse.
		var err error
		if sch, err = compileSchema(raw); err != nil {
			msg, _, _ := strings.Cut(err.Error(), "\n")
			return fmt.Errorf("invalid %s schema: %s", what, msg)
		}
	}
	// Round-trip through JSON so any Go value (json.RawMessage, structs,
	// map[string]string...) is validated as the JSON it stands for.
	doc, err := json.Marshal(input)
	if err != nil {
		return fmt.Errorf("%s is not valid JSON: %w", what, err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return fmt.Errorf("%s is not valid JSON: %w", what, err)
	}
	err = sch.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return fmt.Errorf("%w: %v", kind, err)
	}
	var problems []string
	seen := map[string]bool{}
	ls := leaves(ve)
	// Top-level problems first, then by location: stable whatever order
	// the validator visited properties in.
	sort.SliceStable(ls, func(i, j int) bool {
		return jsonPointer(ls[i].InstanceLocation) < jsonPointer(ls[j].InstanceLocation)
	})
	for _, l := range ls {
		msg := leafMessage(l)
		if ptr := jsonPointer(l.InstanceLocation); ptr != "" {
			msg = "at " + ptr + ": " + msg
		}
		if !seen[msg] {
			seen[msg] = true
			problems = append(problems, msg)
		}
	}
	const maxProblems = 10
	if len(problems) > maxProblems {
		problems = append(problems[:maxProblems], fmt.Sprintf("and %d more", len(problems)-maxProblems))
	}
	return &inputError{kind: kind, problems: problems}
}
