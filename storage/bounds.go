package storage

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Range of an instance's priority that every backend stores exactly.
// PostgreSQL keeps priorities in 32-bit integers and its claim query negates
// them; SQLite keeps 64-bit integers. Callers check a priority from outside
// against these bounds before anything is written, so that no value is cut,
// wrapped, or first noticed by the database. They leave room on both sides
// of int32, so negating or comparing never overflows.
const (
	MinPriority = -1_000_000
	MaxPriority = 1_000_000
)

// Lengths of the strings callers pass in, in bytes.
const (
	// MaxKeyBytes bounds an idempotency key: PostgreSQL indexes it with
	// the workflow name, and a B-tree index row must stay under 2,700
	// bytes.
	MaxKeyBytes = 512
	// MaxIDBytes bounds an instance ID, a workflow name or a queue name
	// given as a lookup or a filter; no stored one is longer.
	MaxIDBytes = 255
)

// CheckText reports why s cannot be stored or looked up as text on every
// backend: it is not valid UTF-8, holds a NUL byte (PostgreSQL's text type
// refuses both), or is longer than maxBytes. The error names no value, so
// callers prefix what s is ("idempotency key", "instance ID").
func CheckText(s string, maxBytes int) error {
	switch {
	case len(s) > maxBytes:
		return fmt.Errorf("is %d bytes, over the limit of %d bytes", len(s), maxBytes)
	case !utf8.ValidString(s):
		return errors.New("is not valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		return errors.New("contains a NUL byte")
	}
	return nil
}

// LoneSurrogate reports whether JSON text escapes a UTF-16 surrogate
// (\uD800-\uDFFF) that is not half of a pair, which no Unicode text holds:
// encoding/json reads U+FFFD in its place, so the value stored would not
// be the one given, and PostgreSQL refuses it.
func LoneSurrogate(data []byte) bool {
	hex4 := func(i int) (rune, bool) {
		if i+6 > len(data) || data[i] != '\\' || data[i+1] != 'u' {
			return 0, false
		}
		v, err := strconv.ParseUint(string(data[i+2:i+6]), 16, 16)
		return rune(v), err == nil
	}
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		r, ok := hex4(i)
		if !ok {
			i++ // another escape: skip the escaped byte
			continue
		}
		switch {
		case utf16.IsSurrogate(r) && r < 0xDC00:
			low, ok := hex4(i + 6)
			if !ok || low < 0xDC00 || low > 0xDFFF {
				return true
			}
			i += 11
		case utf16.IsSurrogate(r):
			return true // a low half with no high one before it
		default:
			i += 5
		}
	}
	return false
}
