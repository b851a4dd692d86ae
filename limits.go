package dagrun

import (
	"fmt"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/storage"
)

// groupKey is the key value stored for a concurrency mapping without a
// key: every instance (or step of that name) is in one group.
const groupKey = "*"

// concurrencyKey evaluates a concurrency mapping's key: "" when no limit
// applies (no mapping, or a key that gave null or an empty text).
func concurrencyKey(c *dag.Concurrency, env *dag.Env) (string, error) {
	if c == nil {
		return "", nil
	}
	if c.Key == nil {
		return groupKey, nil
	}
	key, limited, err := c.EvalKey(env)
	if err != nil || !limited {
		return "", err
	}
	if err := storage.CheckText(key, storage.MaxConcurrencyKeyBytes); err != nil {
		return "", fmt.Errorf("the key %w", err)
	}
	return key, nil
}

// limitInstance sets the workflow-level limit of a new instance: its key
// is evaluated from the input when it starts.
func limitInstance(w *dag.Workflow, p *storage.CreateParams) error {
	if w.Concurrency == nil {
		return nil
	}
	env := &dag.Env{Workflow: dag.WorkflowEnv{ID: p.ID, Name: w.Name}}
	if len(p.Input) > 0 && w.Concurrency.Key != nil {
		if err := decodeValue(p.Input, &env.Input); err != nil {
			return &InputError{Workflow: w.Name, Err: fmt.Errorf("concurrency.key: decode input: %w", err)}
		}
	}
	key, err := concurrencyKey(w.Concurrency, env)
	if err != nil {
		return &InputError{Workflow: w.Name, Err: fmt.Errorf("concurrency.key: %w", err)}
	}
	if key != "" {
		p.ConcurrencyKey, p.ConcurrencyLimit = key, w.Concurrency.Limit
	}
	return nil
}

// limitStep sets the step-level key of a step made ready. An error fails
// the step for good, as a failing input expression does.
func limitStep(step *dag.Step, env *dag.Env, change *storage.StepChange) error {
	if step.KeyConcurrency == nil {
		return nil
	}
	key, err := concurrencyKey(step.KeyConcurrency, env)
	if err != nil {
		return fmt.Errorf("concurrency.key: %w", err)
	}
	change.ConcurrencyKey = key
	return nil
}

// keyReferences lists the steps a step's concurrency key reads.
func keyReferences(step *dag.Step) []string {
	if step.KeyConcurrency == nil {
		return nil
	}
	return step.KeyConcurrency.Key.References()
}
