package sqlite

import (
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLimitReleasePicksThroughIndexes checks that the trigger releasing
// held steps as a limited step finishes picks the next one through the
// limits' partial indexes, in release order, never by scanning the steps
// table (history included) or sorting what it found: it runs at every
// finish of a limited step, and the pick of a queue's release as its
// limit changes once per released step.
func TestLimitReleasePicksThroughIndexes(t *testing.T) {
	t.Parallel()
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "dagrun.db"), nil)
	require.NoError(t, err)
	defer s.Close()

	var trigger string
	require.NoError(t, s.w.QueryRowContext(t.Context(),
		`SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = 'steps_limits_release'`).Scan(&trigger))
	picks := regexp.MustCompile(`(?s)SELECT h\.id FROM steps h WHERE(.*?)LIMIT 1\)`).FindAllStringSubmatch(trigger, -1)
	require.Len(t, picks, 2, "the trigger picks by key, then by queue:\n%s", trigger)
	// The trigger's OLD and NEW columns become the values of a finished
	// step of a limited queue.
	columns := regexp.MustCompile(`\b(OLD|NEW)\.(\w+)`)
	for i, want := range []string{"steps_concurrency", "steps_queue_limited"} {
		q := columns.ReplaceAllStringFunc(picks[i][1], func(c string) string {
			if c == "OLD.queue_limited" {
				return "1"
			}
			return "'x'"
		})
		plan := explain(t, s, `SELECT h.id FROM steps h WHERE`+q+`LIMIT 1`)
		require.Regexp(t, `^SEARCH h USING INDEX `+want+` \(`, plan)
		require.NotContains(t, plan, "SCAN h")
		require.NotContains(t, plan, "TEMP B-TREE")
	}

	// So does the release after a queue's limit changed, one pick per
	// released step.
	plan := explain(t, s, releaseHeldPickSQL, 0, "q")
	require.Regexp(t, `^SEARCH h USING INDEX steps_queue_limited \(`, plan)
	require.NotContains(t, plan, "SCAN h")
	require.NotContains(t, plan, "TEMP B-TREE")
}
