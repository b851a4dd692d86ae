package dag

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// evalFixture is a two-step workflow whose "use" step can read "up"; each
// test puts the template under test in use.input.
func evalTemplate(t *testing.T, input string, env *Env) (any, error) {
	t.Helper()
	w := mustParse(t, `name: t
steps:
  - name: up
    handler: echo
  - name: use
    handler: echo
    dependsOn: [up]
    input: `+input+"\n")
	return w.Step("use").Input.Eval(env)
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func decodeJSON(t *testing.T, s string) any {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal([]byte(s), &v))
	return v
}

func TestTemplateEval(t *testing.T) {
	t.Parallel()
	env := &Env{
		Input: decodeJSON(t, `{"id": "o-1", "qty": 16, "price": 2.5, "items": [{"sku": "a"}, {"sku": "b"}],
			"customer": {"name": "Ada", "tags": ["vip"]}, "none": null, "html": "<b>&</b>"}`),
		Steps: map[string]StepEnv{
			"up": {Status: "completed", Output: decodeJSON(t, `{"paymentId": "p-9", "n": 3}`)},
		},
		Workflow: WorkflowEnv{ID: "inst-1", Name: "t"},
	}
	for _, tc := range []struct {
		name, input, want string
	}{
		{"typed string", `"${{ input.id }}"`, `"o-1"`},
		{"typed number stays whole", `${{ input.qty }}`, `16`},
		{"arithmetic stays whole", `${{ input.qty * 2 }}`, `32`},
		{"float", `${{ input.price }}`, `2.5`},
		{"typed list", `${{ input.items }}`, `[{"sku":"a"},{"sku":"b"}]`},
		{"typed map", `${{ input.customer }}`, `{"name":"Ada","tags":["vip"]}`},
		{"typed bool", `${{ input.qty > 10 }}`, `true`},
		{"typed nil", `${{ input.none }}`, `null`},
		{"missing field is nil", `${{ input.nope.deeper.still }}`, `null`},
		{"whitespace around a single expression keeps the type", `"  ${{ input.qty }} "`, `16`},
		{"interpolated", `"order-${{ input.id }}-${{ input.qty }}"`, `"order-o-1-16"`},
		{"interpolated float", `"p=${{ input.price }}"`, `"p=2.5"`},
		{"interpolated nil is empty", `"[${{ input.none }}]"`, `"[]"`},
		{"interpolated map is JSON", `"c=${{ input.customer }}"`, `"c={\"name\":\"Ada\",\"tags\":[\"vip\"]}"`},
		{"interpolated list is JSON", `"i=${{ input.customer.tags }}"`, `"i=[\"vip\"]"`},
		{"interpolation keeps html as written", `"${{ input.html }}!"`, `"\u003cb\u003e\u0026\u003c/b\u003e!"`},
		{"step output", `${{ steps.up.output.paymentId }}`, `"p-9"`},
		{"step status", `${{ steps.up.status }}`, `"completed"`},
		{"workflow", `"${{ workflow.name }}/${{ workflow.id }}"`, `"t/inst-1"`},
		{"builtins", `${{ upper(input.customer.name) + string(len(input.items)) }}`, `"ADA2"`},
		{"predicates", `${{ map(input.items, .sku) }}`, `["a","b"]`},
		{"map literal with nested braces", `"${{ {'a': {'b': input.qty}} }}"`, `{"a":{"b":16}}`},
		{"closing braces inside a string", `"${{ '}}' }}"`, `"}}"`},
		{"literal dollar-brace escape", `"${{ '${{' }} x }}"`, `"${{ x }}"`},
		{"nested template", `
      orderId: ${{ input.id }}
      lines:
        - sku: ${{ input.items[0].sku }}
          qty: ${{ input.qty }}
        - literal
        - 7
        - 1.5
        - true
        - null
      meta: {source: api, count: 2}`, `{"lines":[{"qty":16,"sku":"a"},"literal",7,1.5,true,null],"meta":{"count":2,"source":"api"},"orderId":"o-1"}`},
		{"yaml timestamps stay text", `2024-01-02`, `"2024-01-02"`},
		{"time results become RFC 3339", `${{ date('2024-01-02T03:04:05Z') }}`, `"2024-01-02T03:04:05Z"`},
		{"durations become text", `${{ duration('90m') }}`, `"1h30m0s"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v, err := evalTemplate(t, tc.input, env)
			require.NoError(t, err)
			require.Equal(t, tc.want, jsonOf(t, v))
		})
	}
}

func TestTemplateSkippedStepOutputIsNil(t *testing.T) {
	t.Parallel()
	w := mustParse(t, `name: t
steps:
  - name: ship
    handler: echo
  - name: notify
    handler: echo
    dependsOn: [ship]
    input:
      trackingNo: ${{ steps.ship.output.trackingNo }}
      text: "tracking: ${{ steps.ship.output.trackingNo }}"
      status: ${{ steps.ship.status }}
`)
	for _, env := range []*Env{
		{Steps: map[string]StepEnv{"ship": {Status: "skipped"}}},
		{}, // no steps at all
		nil,
	} {
		v, err := w.Step("notify").Input.Eval(env)
		require.NoError(t, err)
		want := `{"status":"skipped","text":"tracking: ","trackingNo":null}`
		if env == nil || env.Steps == nil {
			want = `{"status":"","text":"tracking: ","trackingNo":null}`
		}
		require.Equal(t, want, jsonOf(t, v))
	}
}

func TestTemplateResultIsACopy(t *testing.T) {
	t.Parallel()
	in := decodeJSON(t, `{"items": [1, 2], "m": {"a": 1}}`)
	env := &Env{Input: in}
	v, err := evalTemplate(t, `${{ input }}`, env)
	require.NoError(t, err)
	v.(map[string]any)["items"].([]any)[0] = "changed"
	v.(map[string]any)["m"].(map[string]any)["a"] = "changed"
	require.Equal(t, `{"items":[1,2],"m":{"a":1}}`, jsonOf(t, in), "Eval must not alias the environment")
}

func TestTemplateRuntimeErrors(t *testing.T) {
	t.Parallel()
	env := &Env{Input: decodeJSON(t, `{"a": 4, "items": [], "s": "x"}`)}
	for _, tc := range []struct{ input, want string }{
		{`${{ input.a / 0 }}`, `expression "input.a / 0": the result +Inf is not a number JSON can hold (division by zero?)`},
		{`${{ input.a % 0 }}`, `expression "input.a % 0": cannot apply % to a fractional number: % takes whole numbers (round first, e.g. int(x) % 2)`},
		{`"x-${{ input.items[3] }}"`, `expression "input.items[3]": no element at position 3 of a list of 0`},
		{`${{ int(input.s) }}`, `expression "int(input.s)": int() cannot read "x" as a whole number that fits in 64 bits`},
	} {
		_, err := evalTemplate(t, tc.input, env)
		require.EqualError(t, err, tc.want)
	}
}

func TestTemplateReferences(t *testing.T) {
	t.Parallel()
	w := mustParse(t, `name: t
steps:
  - name: b
    handler: echo
  - name: a
    handler: echo
  - name: c
    handler: echo
    dependsOn: [a, b]
    input:
      x: ${{ steps.b.output.x }}
      y: "${{ steps.a.status }} ${{ steps.b.output }}"
      z: ${{ input.q }}
output:
  all: ${{ [steps.c.output, steps.a.output] }}
`)
	require.Equal(t, []string{"a", "b"}, w.Step("c").Input.References())
	require.Equal(t, []string{"a", "c"}, w.Output.References())
	require.Nil(t, w.Step("a").Input)
}

func TestWhen(t *testing.T) {
	t.Parallel()
	w := mustParse(t, `name: t
steps:
  - name: a
    handler: echo
  - name: braces
    handler: echo
    dependsOn: [a]
    when: ${{ input.email != nil && steps.a.status == "completed" }}
  - name: bare
    handler: echo
    when: input.n > 2
  - name: literal
    handler: echo
    when: false
  - name: loose
    handler: echo
    when: ${{ input.flag }}
`)
	env := &Env{Input: decodeJSON(t, `{"email": "a@b", "n": 3, "flag": "yes"}`), Steps: map[string]StepEnv{"a": {Status: "completed"}}}
	for name, want := range map[string]bool{"braces": true, "bare": true, "literal": false} {
		ok, err := w.Step(name).When.Bool(env)
		require.NoError(t, err, name)
		require.Equal(t, want, ok, name)
	}
	require.Equal(t, `input.email != nil && steps.a.status == "completed"`, w.Step("braces").When.String())
	require.Equal(t, []string{"a"}, w.Step("braces").When.References())

	ok, err := w.Step("braces").When.Bool(&Env{Input: map[string]any{}})
	require.NoError(t, err)
	require.False(t, ok)

	_, err = w.Step("loose").When.Bool(env)
	require.EqualError(t, err, `expression "input.flag": want true or false, got the text "yes"`)
	_, err = w.Step("loose").When.Bool(&Env{})
	require.EqualError(t, err, `expression "input.flag": want true or false, got null`)
}

func TestSplitTemplate(t *testing.T) {
	t.Parallel()
	segs, problem := splitTemplate(`a ${{ x }} b ${{ {"k": "}}"} }}`)
	require.Empty(t, problem)
	require.Equal(t, []segment{{text: "a "}, {text: " x ", expr: true}, {text: " b "}, {text: ` {"k": "}}"} `, expr: true}}, segs)
	require.False(t, isWholeExpr(segs))
	segs, _ = splitTemplate(" ${{ x }}\n")
	require.True(t, isWholeExpr(segs))
	_, problem = splitTemplate("${{ x")
	require.Contains(t, problem, "unterminated")
}

func TestValidateInput(t *testing.T) {
	t.Parallel()
	w := mustParse(t, `name: t
input:
  type: object
  required: [orderId, items]
  properties:
    orderId: {type: string}
    items: {type: array, minItems: 1}
    email: {type: string, format: email}
    kind: {enum: [a, b]}
  additionalProperties: false
steps:
  - name: a
    handler: echo
`)
	require.JSONEq(t, `{"type":"object","required":["orderId","items"],"properties":{"orderId":{"type":"string"},"items":{"type":"array","minItems":1},"email":{"type":"string","format":"email"},"kind":{"enum":["a","b"]}},"additionalProperties":false}`, string(w.InputSchema))
	require.NoError(t, w.ValidateInput(decodeJSON(t, `{"orderId": "o", "items": [1]}`)))

	err := w.ValidateInput(decodeJSON(t, `{"orderId": "o", "items": []}`))
	require.EqualError(t, err, `input does not match the workflow's schema: at /items: minItems: got 0, want 1`)
	require.True(t, errors.Is(err, ErrInvalidInput))

	err = w.ValidateInput(decodeJSON(t, `{"items": [1], "email": "nope", "extra": 1}`))
	require.EqualError(t, err, `input does not match the workflow's schema: missing property 'orderId'; additional properties 'extra' not allowed; at /email: 'nope' is not valid email: missing @`)

	err = w.ValidateInput(nil)
	require.EqualError(t, err, `input does not match the workflow's schema: got null, want object`)

	// Go values that are not from json.Unmarshal are validated as their JSON.
	require.NoError(t, w.ValidateInput(map[string]any{"orderId": "o", "items": []string{"x"}}))
	require.NoError(t, w.ValidateInput(json.RawMessage(`{"orderId": "o", "items": [1]}`)))

	// A workflow built by hand compiles its schema on demand; none accepts all.
	hand := &Workflow{InputSchema: json.RawMessage(`{"type": "string"}`)}
	require.NoError(t, hand.ValidateInput("x"))
	require.Error(t, hand.ValidateInput(1))
	require.NoError(t, (&Workflow{}).ValidateInput(map[string]any{"anything": true}))
}

// A step whose name holds "-" is read as steps["echo-it"]: the form the
// validation error recommends must pass the ancestor check and evaluate.
func TestBracketStepReference(t *testing.T) {
	t.Parallel()
	w := mustParse(t, `name: t
steps:
  - name: echo-it
    handler: echo
  - name: next.step
    handler: echo
    dependsOn: [echo-it]
  - name: shout
    handler: echo
    dependsOn: [next.step]
    when: ${{ steps["echo-it"].status == "completed" }}
    input:
      text: ${{ steps["echo-it"].output.text }}
      line: 'said ${{ steps["echo-it"].output.text }} then ${{ steps["next.step"].output }}'
`)
	shout := w.Step("shout")
	require.Equal(t, []string{"echo-it", "next.step"}, shout.Input.References())
	env := &Env{Steps: map[string]StepEnv{
		"echo-it":   {Status: "completed", Output: map[string]any{"text": "hi"}},
		"next.step": {Status: "completed", Output: "done"},
	}}
	ok, err := shout.When.Bool(env)
	require.NoError(t, err)
	require.True(t, ok)
	got, err := shout.Input.Eval(env)
	require.NoError(t, err)
	require.Equal(t, `{"line":"said hi then done","text":"hi"}`, jsonOf(t, got))
}

// A whole number of the file beyond int64 keeps every digit: as a float64
// it would become another number.
func TestBigWholeNumbersKeepTheirDigits(t *testing.T) {
	t.Parallel()
	got, err := evalTemplate(t, `{big: 123456789012345678901234567890, u: 18446744073709551615, neg: -99999999999999999999, max: 9223372036854775807, f: 1.5e300}`, nil)
	require.NoError(t, err)
	require.Equal(t, `{"big":123456789012345678901234567890,"f":1.5e+300,"max":9223372036854775807,"neg":-99999999999999999999,"u":18446744073709551615}`, jsonOf(t, got))
}

// TestValidateInputFalseSchemas: a value a false schema refuses (a
// property unevaluatedProperties or a false property schema forbids, an
// item past prefixItems) is named as not allowed, not as "false schema".
func TestValidateInputFalseSchemas(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		schema, input, want string
	}{
		{`{type: object, properties: {a: {type: integer}}, unevaluatedProperties: false}`, `{"a": 1, "zzz": 1}`,
			`at /zzz: property 'zzz' is not allowed`},
		{`{type: object, properties: {a: {type: integer}, secret: false}}`, `{"secret": "x"}`,
			`at /secret: property 'secret' is not allowed`},
		{`{type: object, patternProperties: {"^x-": false}}`, `{"x-debug": 1}`,
			`at /x-debug: property 'x-debug' is not allowed`},
		{`{type: array, prefixItems: [{type: string}], items: false}`, `["a", "b"]`,
			`at /1: no item is allowed at index 1`},
		{`{type: array, prefixItems: [{type: string}], unevaluatedItems: false}`, `["a", "b"]`,
			`at /1: no item is allowed at index 1`},
		{`{type: object, properties: {a: false}}`, `{"a": null}`,
			`at /a: property 'a' is not allowed`},
		{`{type: object, properties: {items: false}}`, `{"items": []}`,
			`at /items: property 'items' is not allowed`},
		{`{$defs: {closed: {type: object, unevaluatedProperties: false}}, properties: {sub: {$ref: "#/$defs/closed"}}}`, `{"sub": {"x": 1}}`,
			`at /sub/x: property 'x' is not allowed`},
		{`{type: object, properties: {a: {type: integer}}, additionalProperties: false}`, `{"b": 1}`,
			`additional properties 'b' not allowed`},
		{`{not: {}}`, `1`, `'not' failed`},
	} {
		w := mustParse(t, "name: t\ninput: "+tc.schema+"\nsteps:\n  - name: a\n    handler: echo\n")
		err := w.ValidateInput(decodeJSON(t, tc.input))
		require.EqualError(t, err, `input does not match the workflow's schema: `+tc.want, "schema %s, input %s", tc.schema, tc.input)
	}
}
