package dagrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/storage"
)

// DefaultMaxDepth is Config.MaxDepth when left zero.
const DefaultMaxDepth = 10

// startChildren turns change, a ready workflow step's (with one input per
// child: the step's own, or one per forEach item), into the start of its
// children, built as a start builds an instance (childParams) from the
// child workflow as this engine knows it now. The store creates them in
// the transaction that applies the change. What can
// never succeed however often it is tried (an unknown workflow, an input
// the schema refuses, the depth limit) fails the step for good instead.
func (p *planner) startChildren(step *dag.Step, change storage.StepChange, inputs []json.RawMessage) storage.StepChange {
	fail := func(format string, args ...any) storage.StepChange {
		return storage.StepChange{Name: step.Name, Status: storage.StepFailed, Error: fmt.Sprintf(format, args...)}
	}
	e := p.engine
	w, err := e.lookupWorkflow(step.Workflow)
	if err != nil {
		return fail("workflow step: %v", err)
	}
	depth := p.state.Depth + 1
	if depth > p.config.MaxDepth {
		return fail("sub-workflow depth limit %d reached: instance %s (workflow %s) is at depth %d and cannot start workflow %s; stop the recursion, or raise the engine's depth limit (--max-depth)", p.config.MaxDepth, p.state.ID, p.state.Workflow, p.state.Depth, w.Name)
	}
	capKey := ""
	if step.ForEach != nil && step.Concurrency > 0 {
		// Checked when the folder loads too, but the child's definition
		// may have changed since; dropping either limit would break it.
		if msg := dag.CappedLimited(step, w); msg != "" {
			return fail("%s", msg)
		}
		// The cap is a workflow-level key the children share and no other
		// instance has: a user's key written to collide with it would
		// have to embed this parent's UUID. Children are created in item
		// order, with rising IDs and one priority, so the store admits
		// them in item order.
		capKey = "forEach " + p.state.ID + "/" + step.Name
	}
	change.Children = make([]storage.CreateParams, len(inputs))
	for i, in := range inputs {
		id, err := uuid.NewV7()
		if err != nil {
			// Only when the system's random source fails.
			return fail("new child instance ID: %v", err)
		}
		child, err := e.childParams(w, id.String(), in, depth)
		if err != nil {
			if len(change.Items) > 0 {
				return fail("input of item %d for workflow %s: %v", i, w.Name, err)
			}
			return fail("input for workflow %s: %v", w.Name, err)
		}
		if capKey != "" {
			child.ConcurrencyKey, child.ConcurrencyLimit = capKey, step.Concurrency
		}
		change.Children[i] = child
		if e.tracing != nil {
			change.Children[i].TraceParent, change.Children[i].TraceCaller = childTrace(p.state.TraceParent)
		}
	}
	return change
}

// childParams builds child id of workflow w at depth from its input as a
// start builds an instance: under w's timeout, counted against w's
// concurrency limit with the instances started directly. The error is why
// the input cannot start it: the schema refused it, or it gives no usable
// concurrency key.
func (e *Engine) childParams(w *dag.Workflow, id string, in json.RawMessage, depth int) (storage.CreateParams, error) {
	input, err := e.decodeInput(w, in)
	if err == nil {
		p := storage.CreateParams{
			ID:             id,
			Workflow:       w.Name,
			DefinitionHash: w.Hash,
			Definition:     w.Source,
			Input:          input,
			Timeout:        w.Timeout,
			Steps:          e.stepSpecs(w),
			Depth:          depth,
		}
		if err = limitInstance(w, &p); err == nil {
			return p, nil
		}
	}
	var ie *InputError
	if errors.As(err, &ie) {
		err = ie.Err
	}
	return storage.CreateParams{}, err
}

// descendants returns the IDs of the child instances of id, recursively.
func (e *Engine) descendants(ctx context.Context, id string) ([]string, error) {
	var out []string
	queue := []string{id}
	for len(queue) > 0 {
		parent := queue[0]
		queue = queue[1:]
		before := ""
		for {
			page, err := e.store.ListInstances(ctx, storage.ListParams{Parent: parent, BeforeID: before, Limit: MaxListLimit})
			if err != nil {
				return out, err
			}
			for _, in := range page {
				out = append(out, in.ID)
				queue = append(queue, in.ID)
			}
			if len(page) < MaxListLimit {
				break
			}
			before = page[len(page)-1].ID
		}
	}
	return out, nil
}

// stopLocalTree stops this process's handlers of an instance that ended
// and of its descendants, which ended with it: without it, theirs would
// run on until their next heartbeat.
func (e *Engine) stopLocalTree(ctx context.Context, id string) {
	e.stopLocalAttempts(id)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	ids, err := e.descendants(ctx, id)
	if err != nil {
		e.logger.Warn("dagrun: list child instances to stop their handlers", "instance", id, "error", err)
	}
	for _, child := range ids {
		e.stopLocalAttempts(child)
	}
}
