package dagrun

import (
	"encoding/json"
	"fmt"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/storage"
)

// DefaultMaxItems is Config.MaxItems when left zero.
const DefaultMaxItems = 10_000

// expand resolves a ready forEach step whose when held: its list, then one
// input per element, with item and index in the environment. The store
// creates the items in the transaction that applies the change. A list
// that is not one, or is too long, or an item input that cannot be
// resolved, fails the step for good: retrying cannot change the data the
// expressions read.
func (p *planner) expand(step *dag.Step, env *dag.Env) storage.StepChange {
	fail := func(format string, args ...any) storage.StepChange {
		return storage.StepChange{Name: step.Name, Status: storage.StepFailed, Error: fmt.Sprintf(format, args...)}
	}
	value, err := step.ForEach.Eval(env)
	if err != nil {
		return fail("forEach: %v", err)
	}
	list, ok := value.([]any)
	if !ok {
		return fail("forEach: expected a list, got %s", jsonType(value))
	}
	if len(list) > p.config.MaxItems {
		return fail("forEach: %d items, over the limit of %d: split the list across instances, or raise the engine's item limit (--max-items)", len(list), p.config.MaxItems)
	}
	if len(list) == 0 {
		return storage.StepChange{Name: step.Name, Status: storage.StepCompleted, Output: json.RawMessage("[]")}
	}
	items := make([]json.RawMessage, len(list))
	total := 0
	for i, elem := range list {
		env.Item, env.Index = elem, i
		input := elem // without an input, an item's input is its element
		if step.Input != nil {
			if input, err = step.Input.Eval(env); err != nil {
				return fail("input of item %d: %v", i, err)
			}
		}
		raw, err := dag.MarshalJSON(input)
		if err != nil {
			return fail("input of item %d: encode resolved value: %v", i, err)
		}
		if len(raw) > p.config.MaxInputBytes {
			return fail("input of item %d: the resolved input is %d bytes, over the limit of %d bytes; pass a reference to large data instead", i, len(raw), p.config.MaxInputBytes)
		}
		// The items of one step are created in one transaction: their
		// inputs together, and the work of their expressions, are bounded
		// like everything one transition resolves.
		if total += len(raw); total > p.config.MaxPlanInputBytes {
			return fail("forEach: the inputs of the items are over %d bytes in all, the limit of one transition; pass references to large data instead", p.config.MaxPlanInputBytes)
		}
		if p.usage.Steps > int64(p.config.MaxPlanExprSteps) {
			return fail("forEach: resolving the inputs of the items takes over %d expression steps in all, the limit of one transition; simplify the input expression or split the list", p.config.MaxPlanExprSteps)
		}
		items[i] = raw
	}
	env.Item, env.Index = nil, 0
	change := storage.StepChange{Name: step.Name, Status: storage.StepRunning, Items: items}
	if step.Workflow != "" {
		return p.startChildren(step, change, items)
	}
	return change
}

// jsonType names the JSON type of a decoded value, for messages.
func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	}
	return "a number"
}
