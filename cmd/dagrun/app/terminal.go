package app

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// controlEscaper writes what the CLI prints with the characters that
// steer a terminal written as \uXXXX escapes: C0 controls but newline and
// tab, DEL, C1 controls and the bidirectional overrides. Much of what the
// CLI prints comes from outside (an HTTP body in a step's error, a key a
// client chose, a handler's log line), and printed raw such text could
// retitle the window, clear a line or draw a fake status line. JSON output
// keeps its meaning: an escape is valid in a JSON string, and outside one
// encoding/json writes none of these characters.
type controlEscaper struct{ w io.Writer }

func (e controlEscaper) Write(p []byte) (int, error) {
	if !bytes.ContainsFunc(p, steersTerminal) {
		return e.w.Write(p)
	}
	n := len(p)
	var b bytes.Buffer
	b.Grow(n + 16)
	for len(p) > 0 {
		r, size := utf8.DecodeRune(p)
		if steersTerminal(r) {
			fmt.Fprintf(&b, `\u%04x`, r)
		} else {
			b.Write(p[:size])
		}
		p = p[size:]
	}
	if _, err := e.w.Write(b.Bytes()); err != nil {
		return 0, err
	}
	return n, nil
}

// steersTerminal reports whether a terminal acts on r instead of showing
// it.
func steersTerminal(r rune) bool {
	switch {
	case r == '\n' || r == '\t':
		return false
	case r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// oneLineText is s as one line of text: quoted, with its escapes, when it
// holds a line break or another control character that would otherwise
// start a line of its own in the output.
func oneLineText(s string) string {
	if strings.ContainsFunc(s, unicode.IsControl) {
		return strconv.Quote(s)
	}
	return s
}
