package dagrun

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fixedClock is a database clock at a fixed time, or failing.
type fixedClock struct {
	at  time.Time
	err error
}

func (c fixedClock) Now(context.Context) (time.Time, error) { return c.at, c.err }

// TestCheckClock: a skew beyond a second either way is logged with both
// times; a smaller one, one within the round trip, and an unreadable clock
// are not.
func TestCheckClock(t *testing.T) {
	t.Parallel()
	db := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name      string
		worker    []time.Time // before and after the round trip
		clockErr  error
		wantWarn  bool
		wantInLog string
	}{
		{"ahead", []time.Time{db.Add(20 * time.Second), db.Add(20 * time.Second)}, nil, true, "skew=20s"},
		{"behind", []time.Time{db.Add(-5 * time.Second), db.Add(-5 * time.Second)}, nil, true, "skew=-5s"},
		{"accurate", []time.Time{db, db}, nil, false, ""},
		{"within a second", []time.Time{db.Add(900 * time.Millisecond), db.Add(900 * time.Millisecond)}, nil, false, ""},
		{"within the round trip", []time.Time{db.Add(-3 * time.Second), db.Add(3 * time.Second)}, nil, false, ""},
		{"unreadable", []time.Time{db.Add(time.Hour), db.Add(time.Hour)}, errors.New("down"), false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var log bytes.Buffer
			logger := slog.New(slog.NewTextHandler(&log, nil))
			calls := 0
			now := func() time.Time { calls++; return c.worker[calls-1] }
			checkClock(t.Context(), logger, fixedClock{at: db, err: c.clockErr}, now)
			if !c.wantWarn {
				require.Empty(t, log.String())
				return
			}
			require.Contains(t, log.String(), "level=WARN")
			require.Contains(t, log.String(), "clock differs from the database's")
			require.Contains(t, log.String(), c.wantInLog)
			require.Contains(t, log.String(), "database_time=2026-11-30T12:00:00.000Z")
			require.Contains(t, log.String(), "worker_time=")
		})
	}
}
