package dag

import (
	"fmt"
	"strings"

	"github.com/agnivade/levenshtein"
)

// suggest returns the candidate closest to s by edit distance, or "" when
// none is close enough to be a plausible typo. A case-insensitive match always
// wins, so "dependson" suggests "dependsOn".
func suggest(s string, candidates []string) string {
	return suggestExcept(s, candidates, "")
}

// suggestExcept is suggest ignoring one candidate (the step asking).
func suggestExcept(s string, candidates []string, except string) string {
	best, bestDist := "", -1
	ls := strings.ToLower(s)
	for _, c := range candidates {
		if c == except && except != "" {
			continue
		}
		if strings.ToLower(c) == ls {
			return c
		}
		d := levenshtein.ComputeDistance(ls, strings.ToLower(c))
		if bestDist < 0 || d < bestDist {
			best, bestDist = c, d
		}
	}
	limit := 2
	if len(s) <= 3 {
		limit = 1
	} else if len(s)/3 > limit {
		limit = len(s) / 3
	}
	if bestDist < 0 || bestDist > limit {
		return ""
	}
	return best
}

// didYouMean formats a suggestion as ` (did you mean "x"?)`, or "" when none.
func didYouMean(s string, candidates []string) string {
	if m := suggest(s, candidates); m != "" {
		return fmt.Sprintf(" (did you mean %q?)", m)
	}
	return ""
}
