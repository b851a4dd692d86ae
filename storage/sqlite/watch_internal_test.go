package sqlite

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/stretchr/testify/require"
)

// TestFollowWritesLooksAgainWhenACommitPublishesLate drives the watcher's
// answer to a write to the log with looks that see what a test says, and
// timers that fire at once: a look that falls between a commit's last
// write and its publication in the log's index (it sees no change) must be
// followed by another, or the subscriber would hear of the commit only at
// the worker's next poll.
func TestFollowWritesLooksAgainWhenACommitPublishesLate(t *testing.T) {
	const log = "/db/dagrun.db-wal"
	write := fsnotify.Event{Name: log, Op: fsnotify.Write}
	shm := fsnotify.Event{Name: "/db/dagrun.db-shm", Op: fsnotify.Write}
	tests := []struct {
		name string
		// sees is what each look reports: did data_version change.
		sees []bool
		// arrive are the events that come during each wait, in turn.
		arrive [][]fsnotify.Event
		want   []string // the looks and waits, in order
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
			arrive: [][]fsnotify.Event{{write}},
			want:   []string{"look", "wait 2ms", "look", "wait 2ms", "wait 20ms", "look"},
		},
		{
			name:   "a change seen within a burst ends it without settling",
			sees:   []bool{false, true},
			arrive: [][]fsnotify.Event{{write, shm}},
			want:   []string{"look", "wait 2ms", "look", "wait 2ms"},
		},
		{
			name:   "writes to other files call for no look",
			sees:   []bool{false, false},
			arrive: [][]fsnotify.Event{{shm}},
			want:   []string{"look", "wait 2ms", "wait 20ms", "look"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			events := make(chan fsnotify.Event, 8)
			var did []string
			look := func() bool {
				looks := len(slices.DeleteFunc(slices.Clone(did), func(s string) bool { return s != "look" }))
				require.Less(t, looks, len(tt.sees), "looked more often than expected: %v", did)
				did = append(did, "look")
				return tt.sees[looks]
			}
			waits := 0
			after := func(d time.Duration) <-chan time.Time {
				if waits < len(tt.arrive) {
					for _, ev := range tt.arrive[waits] {
						events <- ev
					}
				}
				waits++
				did = append(did, "wait "+d.String())
				fired := make(chan time.Time, 1)
				fired <- time.Time{}
				return fired
			}
			require.True(t, followWrites(t.Context(), events, log, look, after))
			require.Equal(t, tt.want, did)
		})
	}

	t.Run("a stopped watcher stops waiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		never := func(time.Duration) <-chan time.Time { return nil }
		require.False(t, followWrites(ctx, make(chan fsnotify.Event), log, func() bool { return false }, never))
	})
}
