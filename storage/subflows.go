package storage

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"
)

// What a store writes for child instances, the same on every backend.

// ChildCreatedMessage is the message of a child's instance.created event:
// whose child it is.
func ChildCreatedMessage(p *ParentRef) string {
	if p.Item >= 0 {
		return fmt.Sprintf("child of instance %s, step %s, item %d", p.InstanceID, p.Step, p.Item)
	}
	return fmt.Sprintf("child of instance %s, step %s", p.InstanceID, p.Step)
}

// ChildrenStartedMessage is the message of the step.started event of a
// workflow step whose children were created.
func ChildrenStartedMessage(children []CreateParams) string {
	if len(children) == 1 {
		return "child instance " + children[0].ID
	}
	return fmt.Sprintf("%d child instances", len(children))
}

// ChildError is the error of a workflow step (or item) whose child ended
// with status (failed or cancelled) and error msg.
//
// A child that failed at one of its steps ("step boom failed: ...") is
// named with that step: "child instance C failed in step boom: ...". A
// step of its own that failed with a child of its own gives the path of
// steps down to the first error instead of nesting every level's text:
// "child instance C failed in step call2 > call3 > boom: ...", so that ten
// levels of children still give one readable line, naming the child to
// look at next.
func ChildError(childID string, status InstanceStatus, msg string) string {
	if status == InstanceCancelled {
		return fmt.Sprintf("child instance %s was cancelled", childID)
	}
	step, cause, ok := strings.Cut(strings.TrimPrefix(msg, "step "), " failed")
	if !strings.HasPrefix(msg, "step ") || !ok || strings.ContainsAny(step, " :") {
		return fmt.Sprintf("child instance %s failed: %s", childID, msg)
	}
	cause = strings.TrimPrefix(cause, ": ")
	if m := nestedChildError().FindStringSubmatch(cause); m != nil {
		step, cause = step+" > "+m[1], m[2]
	}
	if cause == "" {
		return fmt.Sprintf("child instance %s failed in step %s", childID, step)
	}
	return fmt.Sprintf("child instance %s failed in step %s: %s", childID, step, cause)
}

// nestedChildError matches the error of a step whose own child failed in
// a step: the path of steps, and the first error. It is compiled at first
// use, not at init, which every dagrun process would pay for.
var nestedChildError = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?s)^child instance \S+ failed in step ([^:]+?)(?:: (.*))?$`)
})

// ParentFinishedMessage is why an unfinished child is cancelled when its
// parent instance finishes first: cancelled, or failed (by another step,
// or by another item of the same forEach workflow step).
func ParentFinishedMessage(parentID string, status InstanceStatus) string {
	if status == InstanceCancelled {
		return fmt.Sprintf("parent instance %s was cancelled", parentID)
	}
	return fmt.Sprintf("parent instance %s failed", parentID)
}

// RetryChildError is why an operation that would run a child instance
// again by itself is refused: only its parent step runs it, so only the
// parent's retry brings the two back together. Its parent step may have
// failed with it (a plain retry of the parent retries the child) or been
// passed by hand or by continueOnError (only a retry from that step, with
// a new child, runs it again), so the message names both.
func RetryChildError(id string, p *ParentRef) error {
	return Refuse(ErrConflict, "instance %s is a child of instance %s (step %s) and runs again only with it: "+
		"dagrun retry %s retries this child if the step failed with it; dagrun retry %s --from %s runs the step again with a new child",
		id, p.InstanceID, p.Step, p.InstanceID, p.InstanceID, p.Step)
}

// CheckChildren checks a StepChange that starts a workflow step: the step
// must be one (when spec is known), have a child per item for a forEach
// step or exactly one otherwise, and each child must be new and keyless.
func CheckChildren(instanceID string, spec *StepSpec, c StepChange) error {
	if spec != nil && spec.Workflow == "" {
		return fmt.Errorf("plan for instance %s starts children of step %q, which is not a workflow step", instanceID, c.Name)
	}
	want := 1
	if len(c.Items) > 0 || (spec != nil && spec.ForEach) {
		want = len(c.Items)
		if err := CheckExpansion(instanceID, spec, c); err != nil {
			return err
		}
	}
	if len(c.Children) != want {
		return fmt.Errorf("plan for instance %s starts %d children of step %q, want %d (one per item of a forEach step, else one)", instanceID, len(c.Children), c.Name, want)
	}
	for i := range c.Children {
		ch := &c.Children[i]
		switch {
		case ch.ID == "":
			return fmt.Errorf("plan for instance %s starts a child of step %q without an ID", instanceID, c.Name)
		case ch.Key != "":
			return fmt.Errorf("plan for instance %s starts child %s of step %q with an idempotency key: children take none", instanceID, ch.ID, c.Name)
		}
	}
	return nil
}

// ChildParams returns the CreateParams of the children of step name of
// instance parentID (at depth parentDepth, with priority), with the
// Parent, Depth and Priority the store sets, and a RunAfter no earlier
// than the parent's runAfter: a delayed parent's children wait with it.
func ChildParams(parentID string, parentDepth, priority int, name string, c StepChange, runAfter time.Time) []CreateParams {
	out := make([]CreateParams, len(c.Children))
	for i, ch := range c.Children {
		item := -1
		if len(c.Items) > 0 {
			item = i
		}
		ch.Parent = &ParentRef{InstanceID: parentID, Step: name, Item: item}
		ch.Depth = parentDepth + 1
		ch.Priority = priority
		if runAfter.After(ch.RunAfter) {
			ch.RunAfter = runAfter
		}
		out[i] = ch
	}
	return out
}
