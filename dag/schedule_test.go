package dag

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func parseSchedule(t *testing.T, cronExpr, zone string) *Schedule {
	t.Helper()
	src := fmt.Sprintf("name: s\nschedule:\n  - cron: %q\n    timezone: %s\nsteps:\n  - name: a\n    handler: echo\n", cronExpr, zone)
	w, err := Parse("", []byte(src), nil)
	require.NoError(t, err)
	require.Len(t, w.Schedules, 1)
	return w.Schedules[0]
}

// wallTicks is the oracle Next is checked against, written without any
// arithmetic on zones: it walks every minute of [from, to) in real time,
// and keeps each one whose wall-clock time in loc the cron names (asked of
// the same cron evaluated in UTC, which has no transitions), the first
// time that wall-clock time is shown.
func wallTicks(t *testing.T, cronExpr string, loc *time.Location, from, to time.Time) []time.Time {
	t.Helper()
	utc, _, msg := parseCron(cronExpr)
	require.Empty(t, msg)
	var out []time.Time
	seen := map[string]bool{}
	for m := from; m.Before(to); m = m.Add(time.Minute) {
		wall := m.In(loc)
		key := wall.Format(time.DateTime)
		naive := time.Date(wall.Year(), wall.Month(), wall.Day(), wall.Hour(), wall.Minute(), 0, 0, time.UTC)
		if utc.Next(naive.Add(-time.Second)).Equal(naive) && !seen[key] {
			out = append(out, m)
		}
		seen[key] = true
	}
	return out
}

// TestScheduleNextAcrossDST walks both 2027 transitions of five zones,
// and the day Samoa skipped in 2011, with crons that fall in, before and
// after the time that is skipped or shown twice: every wall-clock time the
// cron names that exists fires exactly once, and nothing else fires.
func TestScheduleNextAcrossDST(t *testing.T) {
	t.Parallel()
	transitions := []struct {
		zone string
		day  time.Time // a UTC midnight on the transition's local date
	}{
		{"Europe/Berlin", time.Date(2027, 3, 28, 0, 0, 0, 0, time.UTC)},
		{"Europe/Berlin", time.Date(2027, 10, 31, 0, 0, 0, 0, time.UTC)},
		{"America/New_York", time.Date(2027, 3, 14, 0, 0, 0, 0, time.UTC)},
		{"America/New_York", time.Date(2027, 11, 7, 0, 0, 0, 0, time.UTC)},
		// Clocks that move by half an hour, by two hours, and by an hour
		// at a half-hour offset.
		{"Australia/Lord_Howe", time.Date(2027, 4, 4, 0, 0, 0, 0, time.UTC)},
		{"Australia/Lord_Howe", time.Date(2027, 10, 3, 0, 0, 0, 0, time.UTC)},
		{"Antarctica/Troll", time.Date(2027, 3, 28, 0, 0, 0, 0, time.UTC)},
		{"Antarctica/Troll", time.Date(2027, 10, 31, 0, 0, 0, 0, time.UTC)},
		{"America/St_Johns", time.Date(2027, 3, 14, 0, 0, 0, 0, time.UTC)},
		{"America/St_Johns", time.Date(2027, 11, 7, 0, 0, 0, 0, time.UTC)},
		// Samoa moved across the date line: 30 December 2011 never was.
		{"Pacific/Apia", time.Date(2011, 12, 30, 0, 0, 0, 0, time.UTC)},
	}
	crons := []string{"30 2 * * *", "0 2 * * *", "59 1 * * *", "0 3 * * *", "30 1 * * *",
		"0 * * * *", "*/15 * * * *", "* * * * *", "0 0 * * *", "@hourly", "@daily", "15 1-3 * * *"}
	for _, tr := range transitions {
		for _, expr := range crons {
			t.Run(tr.zone+"/"+tr.day.Format(time.DateOnly)+"/"+expr, func(t *testing.T) {
				t.Parallel()
				s := parseSchedule(t, expr, tr.zone)
				from, to := tr.day.Add(-36*time.Hour), tr.day.Add(60*time.Hour)
				want := wallTicks(t, expr, s.Location, from, to)
				require.NotEmpty(t, want)
				var got []time.Time
				for n := s.Next(from.Add(-time.Second)); n.Before(to); n = s.Next(n) {
					require.False(t, n.IsZero(), "the cron stopped firing after %v", got)
					got = append(got, n)
				}
				require.Equal(t, want, got)
			})
		}
	}
}

// TestScheduleNextAtTransitions pins the cases by hand: 02:30 in Berlin is
// shown twice on 31 October 2027 and fires once, at its first occurrence
// (CEST); on 28 March 2027 it does not exist and the next tick is the
// following night's.
func TestScheduleNextAtTransitions(t *testing.T) {
	t.Parallel()
	s := parseSchedule(t, "30 2 * * *", "Europe/Berlin")
	got := s.Next(time.Date(2027, 10, 30, 12, 0, 0, 0, time.UTC))
	require.Equal(t, time.Date(2027, 10, 31, 0, 30, 0, 0, time.UTC), got, "02:30 CEST")
	require.Equal(t, time.Date(2027, 11, 1, 1, 30, 0, 0, time.UTC), s.Next(got), "not 02:30 CET again")
	require.Equal(t, time.Date(2027, 3, 29, 0, 30, 0, 0, time.UTC), s.Next(time.Date(2027, 3, 27, 12, 0, 0, 0, time.UTC).Add(12*time.Hour)))

	ny := parseSchedule(t, "30 1 * * *", "America/New_York")
	got = ny.Next(time.Date(2027, 11, 6, 12, 0, 0, 0, time.UTC))
	require.Equal(t, time.Date(2027, 11, 7, 5, 30, 0, 0, time.UTC), got, "01:30 EDT")
	require.Equal(t, time.Date(2027, 11, 8, 6, 30, 0, 0, time.UTC), ny.Next(got), "not 01:30 EST again")

	// Lord Howe Island's clocks move by half an hour: 02:00 becomes 02:30
	// on 3 October 2027. Midnight on the 4th (+11:00) still fires; the
	// cron library's own walk skipped it to the 5th.
	lh := parseSchedule(t, "0 0 * * *", "Australia/Lord_Howe")
	got = lh.Next(time.Date(2027, 10, 2, 13, 30, 0, 0, time.UTC)) // midnight on the 3rd, +10:30
	require.Equal(t, time.Date(2027, 10, 3, 13, 0, 0, 0, time.UTC), got, "00:00 +11:00 on the 4th")
	require.Equal(t, time.Date(2027, 10, 4, 13, 0, 0, 0, time.UTC), lh.Next(got))
	skipped := parseSchedule(t, "15 2 * * *", "Australia/Lord_Howe")
	require.Equal(t, time.Date(2027, 10, 3, 15, 15, 0, 0, time.UTC), skipped.Next(time.Date(2027, 10, 2, 12, 0, 0, 0, time.UTC)),
		"02:15 does not exist on the 3rd: the next is the 4th's")
}

func TestScheduleEvery(t *testing.T) {
	t.Parallel()
	s := parseSchedule(t, "@every 10m", "Europe/Berlin")
	at := time.Date(2027, 10, 31, 0, 55, 0, 0, time.UTC)
	require.Equal(t, time.Date(2027, 10, 31, 1, 0, 0, 0, time.UTC), s.Next(at))
	require.Equal(t, time.Date(2027, 10, 31, 1, 10, 0, 0, time.UTC), s.Next(s.Next(at)), "real time: the transition changes nothing")
	one := parseSchedule(t, "@every 1s", "UTC")
	require.Equal(t, time.Date(2027, 1, 1, 0, 0, 1, 0, time.UTC), one.Next(time.Date(2027, 1, 1, 0, 0, 0, 400, time.UTC)),
		"every process computes the same ticks, whenever it asks")
}

func TestScheduleFields(t *testing.T) {
	t.Parallel()
	src := `name: nightly
input:
  type: object
  properties:
    region: {type: string}
schedule:
  - cron: "0 3 * * *"
    timezone: Europe/Berlin
    input: {region: eu}
    overlap: allow
    catchup: 1h
  - cron: "@every 10m"
steps:
  - name: a
    handler: echo
`
	w, err := Parse("", []byte(src), nil)
	require.NoError(t, err)
	require.Len(t, w.Schedules, 2)
	a, b := w.Schedules[0], w.Schedules[1]
	require.Equal(t, 0, a.Index)
	require.Equal(t, "Europe/Berlin", a.Timezone)
	require.JSONEq(t, `{"region":"eu"}`, string(a.Input))
	require.Equal(t, OverlapAllow, a.Overlap)
	require.Equal(t, time.Hour, a.Catchup)
	require.Equal(t, 1, b.Index)
	require.Equal(t, "UTC", b.Timezone)
	require.Equal(t, `{}`, string(b.Input))
	require.Equal(t, OverlapSkip, b.Overlap)
	require.Zero(t, b.Catchup)
	require.NotEqual(t, a.Fingerprint(), b.Fingerprint())
}

// TestScheduleCatchupZeroIsTheDefault: catchup's default, written out, is
// taken; any other zero or negative duration is not.
func TestScheduleCatchupZeroIsTheDefault(t *testing.T) {
	t.Parallel()
	const src = "name: nightly\nschedule:\n  - cron: \"@daily\"\n    catchup: %s\nsteps:\n  - name: a\n    handler: echo\n"
	for _, v := range []string{"0", "0s", "0m", "0h0m"} {
		w, err := Parse("", fmt.Appendf(nil, src, v), nil)
		require.NoError(t, err, v)
		require.Zero(t, w.Schedules[0].Catchup, v)
	}
	_, err := Parse("", fmt.Appendf(nil, src, "-1s"), nil)
	require.ErrorContains(t, err, `catchup must be 0 (only ticks from now on) or more, got "-1s"`)
	_, err = Parse("", fmt.Appendf(nil, src, "5"), nil)
	require.ErrorContains(t, err, "catchup 5 has no unit")
}

// FuzzCron feeds arbitrary cron text to the schedule parser: it must
// refuse or accept it, never panic, and an accepted cron's next tick is
// after the time asked about.
func FuzzCron(f *testing.F) {
	for _, s := range []string{"0 3 * * *", "*/15 8-18 * * mon-fri", "@every 10m", "@daily", "0 0 30 2 *", "*/0 * * * *", "TZ=", "@every -1s", "60 * * * *", "1-0 * * * *"} {
		f.Add(s)
	}
	at := time.Date(2027, 10, 31, 0, 0, 0, 0, time.UTC)
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		spec, every, msg := parseCron(expr)
		if msg != "" {
			return
		}
		s := &Schedule{spec: spec, every: every, Location: berlin}
		if n := s.Next(at); !n.IsZero() && !n.After(at) {
			t.Fatalf("cron %q: next tick %s is not after %s", expr, n, at)
		}
	})
}

// TestSundayIsSevenToo: crontab reads a day of the week of 7 as Sunday,
// and so do schedules, in lists and ranges; the expression is kept as
// written.
func TestSundayIsSevenToo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"0 12 * * 7", "0 12 * * 0"},
		{"0 12 * * 5-7", "0 12 * * 5-6,0"},
		{"0 12 * * 1-7/2", "0 12 * * 1-6/2,0"},
		{"0 12 * * 2-7/2", "0 12 * * 2-6/2"},
		{"0 12 * * 1,7", "0 12 * * 1,0"},
		{"0 12 * * 7-7", "0 12 * * 0"},
		{"7 7 7 7 1", "7 7 7 7 1"},
		{"0 12 * * SUN", "0 12 * * SUN"},
		{"0 12 * * 0-6", "0 12 * * 0-6"},
		{"0 12 * * 8", "0 12 * * 8"},
	} {
		require.Equal(t, tc.want, sundayAsSeven(tc.in), tc.in)
	}
	w := mustParse(t, `name: weekly
schedule:
  - cron: "0 12 * * 7"
steps:
  - {name: a, handler: echo}
`)
	require.Equal(t, "0 12 * * 7", w.Schedules[0].Cron)
	saturday := time.Date(2026, 12, 5, 13, 0, 0, 0, time.UTC)
	require.Equal(t, time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC), w.Schedules[0].Next(saturday), "the Sunday after")
}
