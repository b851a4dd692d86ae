package dag

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	// Zones are read from the binary, not the machine: a workflow must
	// validate, and fire at the same instants, on a minimal container
	// image without /usr/share/zoneinfo as on a laptop.
	_ "time/tzdata"

	"github.com/robfig/cron/v3"
	"gopkg.in/yaml.v3"
)

// Overlap says what a schedule does at a tick while the instance it started
// last is still unfinished.
type Overlap string

// Overlap policies.
const (
	// OverlapSkip starts nothing at such a tick (the default).
	OverlapSkip Overlap = "skip"
	// OverlapAllow starts an instance at every tick regardless.
	OverlapAllow Overlap = "allow"
)

// MinEvery is the shortest @every interval: ticks are whole seconds.
const MinEvery = time.Second

// Schedule is one entry of a workflow's schedule: list. Values returned by
// Parse are safe for concurrent use.
type Schedule struct {
	// Index is the entry's position in the list, from 0.
	Index int
	// Cron is the expression as written: five fields, or a descriptor
	// such as @daily or @every 10m.
	Cron string
	// Timezone is the IANA zone the cron's wall-clock times are in; UTC
	// when absent.
	Timezone string
	Location *time.Location
	// Input is the compact JSON every instance the schedule starts gets;
	// {} when absent. It satisfies the workflow's input schema.
	Input   json.RawMessage
	Overlap Overlap
	// Catchup is how old a tick missed while no scheduler ran may be and
	// still start an instance; 0 starts only ticks from now on.
	Catchup   time.Duration
	Line, Col int

	spec  *cron.SpecSchedule // nil for @every
	every time.Duration
}

// Fingerprint identifies what a schedule starts and when: a hash of its
// cron, zone and input (not of overlap and catchup, which change neither).
// An edit that keeps it keeps the schedule's history; one that changes it
// makes a new schedule that starts from the edit on.
func (s *Schedule) Fingerprint() string {
	sum := sha256.Sum256([]byte(s.Cron + "\x00" + s.Timezone + "\x00" + string(s.Input)))
	return hex.EncodeToString(sum[:8])
}

// Next returns the first tick strictly after t, or the zero time when the
// cron never fires again (0 0 30 2 *).
//
// @every D ticks at the multiples of D counted from a fixed origin, so
// that every process computes the same ticks whenever it started. A cron
// expression names wall-clock times in Location: each such time that
// exists fires once. On a fall-back transition a time that the clock shows
// twice fires at its first occurrence only; on a spring-forward transition
// a time the clock skips does not exist and does not fire.
//
// The cron library walks real time in the zone and adds whole hours across
// a transition, which loses a day's tick in a zone whose clocks move by
// half an hour (Australia/Lord_Howe). So the cron is matched against the
// wall clock alone, as if it were UTC, and each wall-clock time it names
// is then looked up in the zone.
func (s *Schedule) Next(t time.Time) time.Time {
	if s.spec == nil {
		return t.Truncate(s.every).Add(s.every)
	}
	naive := wallClock(t.In(s.Location))
	// The wall clock of t may lag what already fired by the hours a
	// fall-back repeats, and every skipped or repeated time costs one more
	// turn: at most a day of minutes (Samoa skipped 30 December 2011
	// whole), so the bound is never reached by a cron that fires again.
	for range 3000 {
		n := s.spec.Next(naive)
		if n.IsZero() {
			return time.Time{}
		}
		if at, ok := firstInstant(n, s.Location); ok && at.After(t) {
			return at.UTC()
		}
		naive = n
	}
	return time.Time{}
}

// wallClock returns the wall-clock time t shows in its zone, held in UTC.
func wallClock(t time.Time) time.Time {
	return time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
}

// firstInstant returns the earliest instant whose wall clock in loc reads
// the wall-clock time that naive holds in UTC, and false when the clock
// skips it.
func firstInstant(naive time.Time, loc *time.Location) (time.Time, bool) {
	// The offsets in force a few hours either side of the instant, which
	// any offset of the zone finds to within the hours a transition moves
	// the clock; two transitions are months apart.
	_, guess := naive.In(loc).Zone()
	near := naive.Add(-time.Duration(guess) * time.Second)
	var first time.Time
	for _, around := range []time.Duration{-6 * time.Hour, 6 * time.Hour} {
		_, off := near.Add(around).In(loc).Zone()
		at := naive.Add(-time.Duration(off) * time.Second)
		if wallClock(at.In(loc)).Equal(naive) && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	return first, !first.IsZero()
}

// cronParser takes the five standard fields and the descriptors
// (@hourly, @daily, @every 10m, ...); seconds are not a field.
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// parseCron returns the schedule of a cron expression, or why it is wrong.
func parseCron(expr string) (spec *cron.SpecSchedule, every time.Duration, msg string) {
	expr = strings.TrimSpace(expr)
	if strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ=") {
		return nil, 0, fmt.Sprintf("cron %q names a zone: set timezone: instead", expr)
	}
	if rest, ok := strings.CutPrefix(expr, "@every "); ok {
		d, err := time.ParseDuration(strings.TrimSpace(rest))
		switch {
		case err != nil:
			return nil, 0, fmt.Sprintf("invalid cron %q: @every takes a Go duration such as 30s, 10m or 1h", expr)
		case d < MinEvery || d%time.Second != 0:
			return nil, 0, fmt.Sprintf("invalid cron %q: @every must be a whole number of seconds, at least %s", expr, MinEvery)
		case d > MaxDuration:
			return nil, 0, fmt.Sprintf("invalid cron %q: @every is at most %s", expr, FormatDuration(MaxDuration))
		}
		return nil, d, ""
	}
	sched, err := cronParser.Parse(sundayAsSeven(expr))
	if err != nil {
		return nil, 0, fmt.Sprintf("invalid cron %q: %v; use five fields (minute hour day-of-month month day-of-week) such as \"0 3 * * *\", or @hourly, @daily, @weekly, @monthly, @every 10m", expr, err)
	}
	spec, ok := sched.(*cron.SpecSchedule)
	if !ok {
		return nil, 0, fmt.Sprintf("invalid cron %q: use five fields or a descriptor such as @daily or @every 10m", expr)
	}
	// It computes wall-clock times, which Next looks up in the zone.
	spec.Location = time.UTC
	return spec, 0, ""
}

// sundayAsSeven writes a day of the week of 7, which crontab reads as
// Sunday as it reads 0, as 0 for the parser, which takes 0 to 6: "0 12 * *
// 7" and "0 12 * * 5-7" mean what they mean to cron. Names (SUN) and other
// fields are left as they are.
func sundayAsSeven(expr string) string {
	fields := strings.Fields(expr)
	if len(fields) != 5 || !strings.Contains(fields[4], "7") {
		return expr
	}
	parts := strings.Split(fields[4], ",")
	var out []string
	for _, part := range parts {
		base, step, stepped := strings.Cut(part, "/")
		every := 1
		if stepped {
			n, err := strconv.Atoi(step)
			if err != nil || n < 1 {
				out = append(out, part) // the parser says what is wrong
				continue
			}
			every = n
		}
		first, last, isRange := strings.Cut(base, "-")
		switch {
		case base == "7":
			out = append(out, "0")
		case isRange && last == "7":
			from, err := strconv.Atoi(first)
			switch {
			case err != nil || from > 7:
				out = append(out, part)
			case from == 7:
				out = append(out, "0")
			default:
				if from <= 6 {
					rest := first + "-6"
					if stepped {
						rest += "/" + step
					}
					out = append(out, rest)
				}
				if (7-from)%every == 0 {
					out = append(out, "0")
				}
			}
		default:
			out = append(out, part)
		}
	}
	fields[4] = strings.Join(out, ",")
	return strings.Join(fields, " ")
}

type rawSchedule struct {
	Cron, Timezone, Input, Overlap, Catchup *yaml.Node
}

func (r *rawSchedule) fields() []field {
	return []field{{"cron", &r.Cron}, {"timezone", &r.Timezone}, {"input", &r.Input},
		{"overlap", &r.Overlap}, {"catchup", &r.Catchup}}
}

// schedules builds the schedule: list. It runs after the input schema is
// compiled, so that each schedule's input is checked against it.
func (p *parser) schedules(n *yaml.Node, w *Workflow) {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return
	}
	if n.Kind != yaml.SequenceNode {
		p.c.at(n, `"schedule" must be a list of schedules (each item starting with "- cron: ..."), got %s`, describe(n))
		return
	}
	seen := map[string]int{}
	for i, item := range n.Content {
		item = resolve(item)
		if item == nil {
			continue
		}
		// Numbered from 0, as `dagrun schedules` and the API number them.
		label := fmt.Sprintf("schedule %d", i)
		if item.Kind != yaml.MappingNode {
			p.c.at(item, `%s must be a mapping with at least cron (e.g. - cron: "0 3 * * *"), got %s`, label, describe(item))
			continue
		}
		s, ok, identified := p.schedule(item, label, w)
		if identified {
			// Told even when the schedule has other errors, so that one
			// run of validate lists them all.
			if first, dup := seen[s.Fingerprint()]; dup {
				p.c.at(item, "%s has the same cron, timezone and input as schedule %d: remove one", label, first)
				continue
			}
			seen[s.Fingerprint()] = i
		}
		if !ok {
			continue
		}
		s.Index = len(w.Schedules)
		w.Schedules = append(w.Schedules, s)
	}
}

// schedule parses one schedule. ok is false when it has an error;
// identified, when its cron, timezone and input (its Fingerprint) are
// valid whatever else is wrong.
func (p *parser) schedule(item *yaml.Node, label string, w *Workflow) (s *Schedule, ok, identified bool) {
	var raw rawSchedule
	misspelt := p.mapping(item, "in "+label, raw.fields())
	s = &Schedule{Timezone: "UTC", Location: time.UTC, Input: json.RawMessage("{}"), Overlap: OverlapSkip,
		Line: item.Line, Col: item.Column}
	ok = true
	if raw.Timezone != nil {
		if tz, tok := p.text(raw.Timezone, label, `"timezone"`); !tok {
			ok = false
		} else if loc, err := loadZone(tz); err != nil {
			p.c.at(raw.Timezone, "%s: %s", label, err)
			ok = false
		} else {
			s.Timezone, s.Location = tz, loc
		}
	}
	switch {
	case raw.Cron == nil:
		if !misspelt["cron"] {
			p.c.at(item, `%s: missing required key "cron" (e.g. cron: "0 3 * * *" or cron: "@every 10m")`, label)
		}
		ok = false
	default:
		expr, tok := p.text(raw.Cron, label, `"cron"`)
		if !tok {
			ok = false
			break
		}
		s.Cron = strings.TrimSpace(expr)
		var msg string
		if s.spec, s.every, msg = parseCron(s.Cron); msg != "" {
			p.c.at(raw.Cron, "%s: %s", label, msg)
			ok = false
		} else if s.spec != nil && s.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).IsZero() {
			p.c.at(raw.Cron, "%s: cron %q never fires (no such date): check the day-of-month and month fields", label, s.Cron)
			ok = false
		}
	}
	if raw.Input != nil {
		if in, iok := p.scheduleInput(raw.Input, label, w); iok {
			s.Input = in
		} else {
			ok = false
		}
	} else if err := w.ValidateInput(map[string]any{}); err != nil {
		p.c.at(item, "%s: without input it starts instances with {}, and %v: add input:", label, err)
		ok = false
	}
	identified = ok
	if raw.Overlap != nil {
		if v, tok := p.text(raw.Overlap, label, `"overlap"`); !tok {
			ok = false
		} else if o := Overlap(v); o == OverlapSkip || o == OverlapAllow {
			s.Overlap = o
		} else {
			p.c.at(raw.Overlap, "%s: invalid overlap %q: use skip (start nothing while the last instance of this schedule is unfinished) or allow", label, v)
			ok = false
		}
	}
	if raw.Catchup != nil && isZeroDuration(raw.Catchup) {
		s.Catchup = 0 // written out, the default: only ticks from now on
	} else if raw.Catchup != nil && raw.Catchup.Kind == yaml.ScalarNode && strings.HasPrefix(strings.TrimSpace(raw.Catchup.Value), "-") {
		p.c.at(raw.Catchup, "%s: catchup must be 0 (only ticks from now on) or more, got %q", label, raw.Catchup.Value)
		ok = false
	} else if raw.Catchup != nil {
		if d, dok := p.duration(raw.Catchup, label, "catchup"); dok {
			s.Catchup = d
		} else {
			ok = false
		}
	}
	return s, ok, identified
}

// isZeroDuration reports whether n is a zero duration, 0 or 0s (any unit).
func isZeroDuration(n *yaml.Node) bool {
	if n.Kind != yaml.ScalarNode {
		return false
	}
	if n.Value == "0" {
		return true
	}
	d, err := time.ParseDuration(n.Value)
	return err == nil && d == 0
}

// loadZone loads an IANA zone; "Local" is refused, since it would mean a
// different zone on every machine that runs the scheduler.
func loadZone(name string) (*time.Location, error) {
	if name == "Local" || strings.EqualFold(name, "local") {
		return nil, fmt.Errorf(`timezone "Local" depends on the machine: name an IANA zone such as Europe/Berlin or UTC`)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("unknown timezone %q: use an IANA zone name such as Europe/Berlin, America/New_York or UTC", name)
	}
	return loc, nil
}

// scheduleInput converts a schedule's input to compact JSON and checks it
// against the workflow's input schema.
func (p *parser) scheduleInput(n *yaml.Node, label string, w *Workflow) (json.RawMessage, bool) {
	nodes := map[string]*yaml.Node{}
	v, ok := p.plain(n, "", nodes, 0)
	if !ok {
		return nil, false
	}
	// Nothing evaluates a schedule's input: an expression in it would
	// reach the instance as its text.
	ptrs := make([]string, 0, len(nodes))
	for ptr := range nodes {
		ptrs = append(ptrs, ptr)
	}
	sort.Strings(ptrs)
	for _, ptr := range ptrs {
		if c := nodes[ptr]; c.Kind == yaml.ScalarNode && strings.Contains(c.Value, "${{") {
			p.c.at(c, "%s: input holds an expression, but a schedule's input is fixed data that nothing evaluates: write the value itself", label)
			ok = false
		}
	}
	if !ok {
		return nil, false
	}
	if v == nil {
		v = map[string]any{}
	}
	raw, err := json.Marshal(v)
	if err != nil {
		p.c.at(n, "%s: input cannot be represented in JSON: %v", label, err)
		return nil, false
	}
	if err := w.ValidateInput(v); err != nil {
		p.c.at(n, "%s: %v", label, err)
		return nil, false
	}
	return raw, true
}
