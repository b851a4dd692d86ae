package view

import (
	"context"
	"fmt"
	"strings"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/storage"
)

// Paging bounds of a step's items, the same for the CLI and the API.
const (
	DefaultItemLimit = 100
	MaxItemLimit     = 1000
)

// ItemStatuses are the statuses an item can be in, the values of a status
// filter.
var ItemStatuses = []storage.StepStatus{storage.StepPending, storage.StepRunning, storage.StepCompleted, storage.StepFailed, storage.StepCancelled}

// ParseItemStatus checks a status filter; "" means every item.
func ParseItemStatus(s string) (storage.StepStatus, error) {
	if s == "" {
		return "", nil
	}
	for _, st := range ItemStatuses {
		if string(st) == s {
			return st, nil
		}
	}
	return "", fmt.Errorf("invalid item status %q: use pending, running, completed, failed or cancelled", s)
}

// CheckItemPaging checks an offset and a limit from outside; prefix goes
// before their names in an error ("--" for flags).
func CheckItemPaging(offset, limit int, prefix string) error {
	if offset < 0 {
		return fmt.Errorf("invalid %soffset %d: must be 0 or more", prefix, offset)
	}
	if limit < 1 || limit > MaxItemLimit {
		return fmt.Errorf("invalid %slimit %d: use a number from 1 to %d", prefix, limit, MaxItemLimit)
	}
	return nil
}

// StepNotFoundError reports a step name an instance does not have.
type StepNotFoundError struct {
	Instance string
	Step     string
	Steps    []string // the steps it has
}

func (e *StepNotFoundError) Error() string {
	return fmt.Sprintf("instance %s has no step %q (its steps: %s)", e.Instance, e.Step, strings.Join(e.Steps, ", "))
}

// Is makes a StepNotFoundError a storage.ErrNotFound, so it maps to the
// same exit code and HTTP status.
func (e *StepNotFoundError) Is(target error) bool { return target == storage.ErrNotFound }

// ForEachOf returns what LoadItems asks: whether a step of an instance is
// a forEach step, by the definition it runs under.
func ForEachOf(engine *dagrun.Engine) func(inst *storage.Instance, step string) (bool, error) {
	return func(inst *storage.Instance, step string) (bool, error) {
		w, err := engine.Definition(inst)
		if err != nil {
			return false, err
		}
		s := w.Step(step)
		return s != nil && s.ForEach != nil, nil
	}
}

// NotForEachError reports a step asked for its items that is no forEach
// step: it has none, and never will.
type NotForEachError struct {
	Instance string
	Step     string
}

func (e *NotForEachError) Error() string {
	return fmt.Sprintf("step %q of instance %s is not a forEach step: it has no items (its output is in dagrun status %s)", e.Step, e.Instance, e.Instance)
}

// Is makes a NotForEachError a storage.ErrNotFound, as a missing step is.
func (e *NotForEachError) Is(target error) bool { return target == storage.ErrNotFound }

// StepItems is one page of a forEach step's items, as read from a store.
type StepItems struct {
	Step  *storage.Step
	Items []storage.Item
	// Offset and Limit are the page's, Limit with its default applied.
	Offset, Limit int
	// Total is the number of items the page is taken from: all of the
	// step's, or those in the asked status.
	Total int
}

// Page is the page's public JSON shape.
func (s *StepItems) Page() ItemPage { return NewItemPage(s.Items, s.Offset, s.Limit, s.Total) }

// LoadItems reads one page of a step's items, with the step. Total comes
// from the step's counts, so it costs no count query. A forEach step not
// expanded yet gives an empty page. storage.ErrNotFound when the instance
// does not exist, a *StepNotFoundError when it has no such step, a
// *NotForEachError when forEach (which reads the instance's definition)
// says the step is none; a nil forEach takes every step without items for
// one not expanded yet.
func LoadItems(ctx context.Context, store storage.Store, p storage.ItemsParams, forEach func(inst *storage.Instance, step string) (bool, error)) (*StepItems, error) {
	if p.Limit == 0 {
		p.Limit = DefaultItemLimit
	}
	inst, err := store.GetInstance(ctx, p.InstanceID)
	if err != nil {
		return nil, err
	}
	out := &StepItems{Offset: p.Offset, Limit: p.Limit}
	names := make([]string, len(inst.Steps))
	for i := range inst.Steps {
		names[i] = inst.Steps[i].Name
		if inst.Steps[i].Name == p.Step {
			out.Step = &inst.Steps[i]
		}
	}
	if out.Step == nil {
		return nil, &StepNotFoundError{Instance: p.InstanceID, Step: p.Step, Steps: names}
	}
	if out.Step.Items == nil {
		if forEach != nil {
			if ok, err := forEach(inst, p.Step); err == nil && !ok {
				return nil, &NotForEachError{Instance: p.InstanceID, Step: p.Step}
			}
		}
		return out, nil
	}
	if out.Items, err = store.ListItems(ctx, p); err != nil {
		return nil, err
	}
	out.Total = NewItemCounts(out.Step.Items).Of(p.Status)
	return out, nil
}
