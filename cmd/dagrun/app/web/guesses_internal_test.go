package web

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestGuesserIsTheConnectionsAddress(t *testing.T) {
	t.Parallel()
	for remote, want := range map[string]string{
		"192.0.2.7:41000":                  "192.0.2.7",
		"[::ffff:192.0.2.7]:41000":         "192.0.2.7",
		"[2001:db8:1:2:aaaa:bbbb:1:2]:443": "2001:db8:1:2::",
		"[fe80::1%eth0]:443":               "fe80::",
		"not an address":                   "invalid IP",
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		r.Header.Set("X-Forwarded-For", "198.51.100.1") // a client's choice: not counted
		require.Equal(t, want, guesser(r).String(), remote)
	}
}

// TestGuessersBeyondTheBoundShareOneCount: the addresses tracked stay
// bounded; a new one first takes the place of one whose guesses are all
// back, and else counts with the others past the bound.
func TestGuessersBeyondTheBoundShareOneCount(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	g := newGuessLimiter()
	g.burst, g.every, g.max, g.now = 2, time.Minute, 2, func() time.Time { return now }
	from := func(addr string) *http.Request {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = addr + ":41000"
		return r
	}

	g.wrong(from("192.0.2.1"))
	g.wrong(from("192.0.2.2"))
	g.wrong(from("192.0.2.3")) // past the bound, nothing recovered: the shared count
	g.wrong(from("192.0.2.4"))
	require.Len(t, g.byAddr, 3)
	for _, addr := range []string{"192.0.2.3", "192.0.2.4", "192.0.2.9"} {
		_, blocked := g.blocked(from(addr))
		require.True(t, blocked, "%s: the addresses past the bound used up their shared count", addr)
	}
	_, blocked := g.blocked(from("192.0.2.1"))
	require.False(t, blocked, "an address tracked on its own keeps its count")

	now = now.Add(2 * time.Minute) // every count is whole again
	g.wrong(from("192.0.2.5"))
	require.Len(t, g.byAddr, 1, "the recovered addresses made room")
	require.Contains(t, g.byAddr, netip.MustParseAddr("192.0.2.5"))
}
