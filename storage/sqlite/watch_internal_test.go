package sqlite

import (
	"context"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/stretchr/testify/require"
)

// TestFollowWritesLooksAgainWhenACommitPublishesLate drives the watcher's
// answer to a write to the log with looks that see what a test says and
// timers that fire when it says: a look that falls between a commit's
// last write and its publication in the log's index (it sees no change)
// must be followed by another, or the subscriber would hear of the commit
// only at the worker's next poll; and a write while the watcher waits to
// look again must be looked at at once, not when the wait ends.
func TestFollowWritesLooksAgainWhenACommitPublishesLate(t *testing.T) {
	const log = "/db/dagrun.db-wal"
	write := fsnotify.Event{Name: log, Op: fsnotify.Write}
	shm := fsnotify.Event{Name: "/db/dagrun.db-shm", Op: fsnotify.Write}
	// A timer of the script: the events that arrive while it runs, and
	// whether it fires (a timer that does not is cut short by an event).
	type timer struct {
		arrive []fsnotify.Event
		stuck  bool
	}
	tests := []struct {
		name   string
		sees   []bool  // what each look reports: did data_version change
		timers []timer // in the order they are set; unlisted ones fire with nothing arriving
		want   []string
	}{
		{
			name: "a commit published after the first look is seen by the settling look",
			sees: []bool{false, true},
			want: []string{"look", "wait 2ms", "wait 20ms", "look"},
		},
		{
			name: "a commit the first look saw needs no settling look",
			sees: []bool{true},
			want: []string{"look", "wait 2ms"},
		},
		{
			name:   "writes that keep coming are looked at lookGap apart, then settled",
			sees:   []bool{false, false, false},
			timers: []timer{{arrive: []fsnotify.Event{write}}},
			want:   []string{"look", "wait 2ms", "look", "wait 2ms", "wait 20ms", "look"},
		},
		{
			name:   "a change seen within a burst ends it without settling",
			sees:   []bool{false, true},
			timers: []timer{{arrive: []fsnotify.Event{write, shm}}},
			want:   []string{"look", "wait 2ms", "look", "wait 2ms"},
		},
		{
			name:   "writes to other files call for no look",
			sees:   []bool{false, false},
			timers: []timer{{arrive: []fsnotify.Event{shm}}},
			want:   []string{"look", "wait 2ms", "wait 20ms", "look"},
		},
		{
			name: "a write while settling is looked at at once",
			sees: []bool{false, true},
			timers: []timer{
				{}, // the first burst's gap: no more writes
				{arrive: []fsnotify.Event{shm, write}, stuck: true}, // settling: the commit comes
			},
			want: []string{"look", "wait 2ms", "wait 20ms", "look", "wait 2ms"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			events := make(chan fsnotify.Event, 8)
			var did []string
			looks := 0
			look := func() bool {
				require.Less(t, looks, len(tt.sees), "looked more often than expected: %v", did)
				looks++
				did = append(did, "look")
				return tt.sees[looks-1]
			}
			timers := 0
			after := func(d time.Duration) <-chan time.Time {
				var tm timer
				if timers < len(tt.timers) {
					tm = tt.timers[timers]
				}
				timers++
				for _, ev := range tm.arrive {
					events <- ev
				}
				did = append(did, "wait "+d.String())
				fired := make(chan time.Time, 1)
				if !tm.stuck {
					fired <- time.Time{}
				}
				return fired
			}
			// A watcher that waits for a timer the script holds stuck
			// fails here instead of hanging.
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			require.True(t, followWrites(ctx, events, log, look, after), "the answer ended only with its context")
			require.Equal(t, tt.want, did)
		})
	}

	never := func(time.Duration) <-chan time.Time { return nil }
	t.Run("a stopped watcher stops waiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		require.False(t, followWrites(ctx, make(chan fsnotify.Event), log, func() bool { return false }, never))
	})
	t.Run("events that stop while settling stop the watcher", func(t *testing.T) {
		events := make(chan fsnotify.Event)
		close(events)
		gap := func(d time.Duration) <-chan time.Time {
			if d == settleGap {
				return nil
			}
			fired := make(chan time.Time, 1)
			fired <- time.Time{}
			return fired
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		require.False(t, followWrites(ctx, events, log, func() bool { return false }, gap))
		require.NoError(t, ctx.Err(), "the answer ended only with its context")
	})
}
