package view

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// maxAge keeps now minus the age within what every backend stores.
const maxAge = 100 * 365 * 24 * time.Hour

// ErrAgeOutOfRange is ParseAge's error for a duration it read that is
// negative or over a hundred years: its message says the range.
var ErrAgeOutOfRange = fmt.Errorf("out of range: use a duration from 0s to %dd", maxAge/(24*time.Hour))

// ParseAge parses an age: a duration (see ParseDuration) from zero to a
// hundred years.
func ParseAge(s string) (time.Duration, error) {
	d, err := ParseDuration(s)
	switch {
	case err != nil:
		return 0, err
	case d < 0 || d > maxAge:
		return 0, ErrAgeOutOfRange
	}
	return d, nil
}

// AgeError is the one line for an age flag or field what that ParseAge
// refused with err.
func AgeError(what, value string, err error) error {
	if errors.Is(err, ErrAgeOutOfRange) {
		return fmt.Errorf("invalid %s %q: %w", what, value, err)
	}
	return fmt.Errorf("invalid %s %q: use a duration such as 30d, 2w or 12h", what, value)
}

// ParseDuration parses a duration that may also count whole days (d) and
// weeks (w), which time.ParseDuration does not know: each NUMBERd or
// NUMBERw is rewritten in hours, and the rest is left to
// time.ParseDuration. Neither letter is one of its units, so they never
// clash.
func ParseDuration(s string) (time.Duration, error) {
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == '.') {
			j++
		}
		if j > i && j < len(s) && (s[j] == 'd' || s[j] == 'w') {
			n, err := strconv.ParseInt(s[i:j], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s%c is not a whole number of days or weeks", s[i:j], s[j])
			}
			if s[j] == 'w' {
				n *= 7
			}
			if n > int64(maxAge/(24*time.Hour)) {
				return 0, ErrAgeOutOfRange
			}
			b.WriteString(strconv.FormatInt(n*24, 10) + "h")
			i = j + 1
			continue
		}
		if j == i {
			j++
		}
		b.WriteString(s[i:j])
		i = j
	}
	return time.ParseDuration(b.String())
}
