package dagruntest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dagrun/dagrun/storage"
)

// checkStartError judges a case whose instance did not run to the end: a
// refused start the case expects passes, anything else fails.
func checkStartError(c *Case, err error) []string {
	var start *startError
	if !errors.As(err, &start) {
		return []string{err.Error()}
	}
	want := c.Expect.StartError
	switch {
	case want == nil:
		return []string{"the start was refused: " + err.Error()}
	case !strings.Contains(err.Error(), *want):
		return []string{fmt.Sprintf("startError: want an error containing %q, got %q", *want, err.Error())}
	}
	return nil
}

// check compares a settled instance with the case's expectations and
// returns one message per difference.
func check(f *File, c *Case, inst *storage.Instance) []string {
	var out []string
	e := c.Expect
	if e.StartError != nil {
		out = append(out, fmt.Sprintf("startError: want the start refused with %q, but the instance started", *e.StartError))
	}
	if e.Status != nil && string(inst.Status) != *e.Status {
		msg := fmt.Sprintf("status: want %s, got %s", *e.Status, inst.Status)
		if inst.Error != "" {
			msg += fmt.Sprintf(" (error: %s)", inst.Error)
		}
		out = append(out, msg)
	}
	out = append(out, checkValue("output", e.Output, inst.Output)...)
	out = append(out, checkError("error", e.Error, inst.Error)...)
	if e.CreatedAt != nil && !inst.CreatedAt.Equal(*e.CreatedAt) {
		out = append(out, fmt.Sprintf("createdAt: want %s, got %s", e.CreatedAt.Format(time.RFC3339), inst.CreatedAt.UTC().Format(time.RFC3339Nano)))
	}
	for _, se := range e.Steps {
		i := slices.IndexFunc(inst.Steps, func(s storage.Step) bool { return s.Name == se.Name })
		if i < 0 {
			names := make([]string, len(inst.Steps))
			for j, s := range inst.Steps {
				names[j] = s.Name
			}
			msg := fmt.Sprintf("%s:%d:%d: expect.steps: the instance has no step %q", f.Path, se.Line, se.Col, se.Name)
			if s := suggest(se.Name, names); s != "" {
				msg += fmt.Sprintf(" (did you mean %s?)", s)
			}
			out = append(out, msg+fmt.Sprintf(" (its steps: %s)", strings.Join(names, ", ")))
			continue
		}
		out = append(out, checkStep(se, &inst.Steps[i])...)
	}
	if len(e.Events) > 0 {
		out = append(out, checkEvents(e.Events, inst.Events)...)
	}
	return out
}

func checkStep(se *StepExpect, s *storage.Step) []string {
	var out []string
	what := "steps." + se.Name
	if se.Status != nil && string(s.Status) != *se.Status {
		msg := fmt.Sprintf("%s.status: want %s, got %s", what, *se.Status, s.Status)
		if s.Error != "" {
			msg += fmt.Sprintf(" (error: %s)", s.Error)
		}
		out = append(out, msg)
	}
	if se.Attempts != nil && s.Attempts != *se.Attempts {
		out = append(out, fmt.Sprintf("%s.attempts: want %d, got %d", what, *se.Attempts, s.Attempts))
	}
	out = append(out, checkValue(what+".input", se.Input, s.Input)...)
	out = append(out, checkValue(what+".output", se.Output, s.Output)...)
	out = append(out, checkError(what+".error", se.Error, s.Error)...)
	return out
}

func checkError(what string, want *string, got string) []string {
	if want == nil || strings.Contains(got, *want) {
		return nil
	}
	if got == "" {
		return []string{fmt.Sprintf("%s: want an error containing %q, got none", what, *want)}
	}
	return []string{fmt.Sprintf("%s: want an error containing %q, got %q", what, *want, got)}
}

// checkValue compares a stored JSON value with an expectation, and shows
// the difference as a diff (- want, + got).
func checkValue(what string, want *Match, got []byte) []string {
	if want == nil {
		return nil
	}
	var value any
	if len(got) > 0 {
		var err error
		if value, err = decodeExact(got); err != nil {
			return []string{fmt.Sprintf("%s: stored value is not JSON: %v", what, err)}
		}
	}
	expected := want.Value
	label := what
	if want.Partial {
		value = project(want.Value, value)
		label = what + "Contains"
	}
	diff := cmp.Diff(expected, value, sameNumber)
	if diff == "" {
		return nil
	}
	// go-cmp puts a non-breaking space in its output at random, to keep
	// programs from parsing it; people copy it, and CI logs compare it.
	diff = strings.ReplaceAll(diff, "\u00a0", " ")
	return []string{fmt.Sprintf("%s differs (- want, + got):\n%s", label, strings.TrimRight(diff, "\n"))}
}

// decodeExact decodes JSON as encoding/json does, but for a whole number
// no float64 holds (9007199254740993), kept as written (json.Number): as
// a float64 it would equal its neighbour. Fractions are float64s, as
// encoding/json reads them.
func decodeExact(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return floatsWhereExact(v), nil
}

func floatsWhereExact(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = floatsWhereExact(e)
		}
	case []any:
		for i, e := range v {
			v[i] = floatsWhereExact(e)
		}
	case json.Number:
		if r, ok := new(big.Rat).SetString(string(v)); ok {
			if f, exact := r.Float64(); exact || !r.IsInt() {
				return f
			}
		}
	}
	return v
}

// sameNumber compares the whole numbers decodeExact keeps as written by
// value: 9007199254740993 equals 9007199254740993.0.
var sameNumber = cmp.Comparer(func(a, b json.Number) bool {
	x, okX := new(big.Rat).SetString(string(a))
	y, okY := new(big.Rat).SetString(string(b))
	if !okX || !okY {
		return a == b
	}
	return x.Cmp(y) == 0
})

// project returns got cut down to the shape of want: only the keys want's
// objects have, recursively, so that a diff of want against it shows only
// what a partial expectation is about. Lists of equal length are projected
// element by element; anything else is got itself.
func project(want, got any) any {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return got
		}
		out := make(map[string]any, len(w))
		for k, wv := range w {
			if gv, ok := g[k]; ok {
				out[k] = project(wv, gv)
			}
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return got
		}
		out := make([]any, len(g))
		for i := range g {
			out[i] = project(w[i], g[i])
		}
		return out
	}
	return got
}

// eventName is an event as test files name it: STEP.KIND for a step's
// (charge.retrying), instance.KIND for the instance's.
func eventName(ev storage.Event) string {
	if ev.Step == "" {
		return string(ev.Type)
	}
	return ev.Step + "." + strings.TrimPrefix(string(ev.Type), "step.")
}

// checkEvents checks that want appears in the history in order (other
// events may come in between).
func checkEvents(want []string, events []storage.Event) []string {
	got := make([]string, len(events))
	for i, ev := range events {
		got[i] = eventName(ev)
	}
	next := 0
	for _, name := range got {
		if next < len(want) && name == want[next] {
			next++
		}
	}
	if next == len(want) {
		return nil
	}
	after := "the start"
	if next > 0 {
		after = want[next-1]
	}
	return []string{fmt.Sprintf("events: no %s after %s\n  want (in order): %s\n  got:             %s",
		want[next], after, strings.Join(want, ", "), strings.Join(got, ", "))}
}
