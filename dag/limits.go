package dag

import (
	"fmt"
	"strconv"

	"gopkg.in/yaml.v3"
)

// MaxConcurrencyLimit bounds the limit of a concurrency mapping: far above
// any real need, and within PostgreSQL's 32-bit integers.
const MaxConcurrencyLimit = 1_000_000

// Concurrency is a concurrency mapping, {key, limit}: at most Limit
// instances (at the workflow level) or running steps of one name (at the
// step level) share one value of Key. A nil Key puts every instance, or
// every step of that name, in one group.
type Concurrency struct {
	Key *Template
	// KeySource is the key as the file writes it; "" without a key.
	KeySource string
	Limit     int
}

type rawConcurrency struct {
	Key, Limit *yaml.Node
}

func (r *rawConcurrency) fields() []field {
	return []field{{"key", &r.Key}, {"limit", &r.Limit}}
}

const concurrencyExample = `{key: "${{ input.customerId }}", limit: 1}`

// concurrency compiles a concurrency mapping; the key's expressions may
// read what sc allows.
func (p *parser) concurrency(n *yaml.Node, sc *scope, label string) *Concurrency {
	if n.Kind != yaml.MappingNode {
		p.c.at(n, `%s"concurrency" must be a mapping such as %s, got %s`, prefix(label), concurrencyExample, describe(n))
		return nil
	}
	var raw rawConcurrency
	p.mapping(n, "in the concurrency of "+cmpLabel(label), raw.fields())
	c := &Concurrency{}
	switch l := raw.Limit; {
	case l == nil:
		p.c.at(n, `%smissing required key "concurrency.limit" (how many may run at once per key value), e.g. %s`, prefix(label), concurrencyExample)
	default:
		v, err := strconv.Atoi(l.Value)
		if l.Kind != yaml.ScalarNode || l.ShortTag() != "!!int" || err != nil || v < 1 || v > MaxConcurrencyLimit {
			p.c.at(l, `%s"concurrency.limit" must be a whole number from 1 to %d, got %s`, prefix(label), MaxConcurrencyLimit, describe(l))
		} else {
			c.Limit = v
		}
	}
	if k := raw.Key; k != nil {
		if k.Kind != yaml.ScalarNode {
			p.c.at(k, `%s"concurrency.key" must be a text, usually an expression such as "${{ input.customerId }}", got %s`, prefix(label), describe(k))
		} else {
			c.Key, c.KeySource = p.template(k, sc), k.Value
		}
	}
	return c
}

func cmpLabel(label string) string {
	if label == "" {
		return "the workflow"
	}
	return label
}

// EvalKey evaluates the key for one instance or step: the text it gives,
// "" when it gives null or an empty text (then no limit applies). A nil
// Key gives the one group every instance shares.
func (c *Concurrency) EvalKey(env *Env) (key string, limited bool, err error) {
	if c == nil {
		return "", false, nil
	}
	if c.Key == nil {
		return "", true, nil
	}
	v, err := c.Key.Eval(env)
	if err != nil {
		return "", false, err
	}
	switch v.(type) {
	case map[string]any, []any:
		return "", false, fmt.Errorf("the key must be a text, a number or a boolean, got %s", describeValue(v))
	}
	s, err := toText(v)
	if err != nil {
		return "", false, err
	}
	return s, s != "", nil
}
