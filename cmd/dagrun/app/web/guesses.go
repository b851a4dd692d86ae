package web

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Wrong tokens are counted per client address. A token is a secret its
// user chose, and without a bound a script could try a dictionary of them
// as fast as the server answers. An address may give guessBurst wrong
// tokens at once and one more every guessEvery after that; past it, every
// request of the address that carries a token (a bearer header, a sign-in
// cookie, the sign-in form) is refused with 429 before the token is
// compared, so that a right guess cannot be told from a wrong one. A
// request without a token guesses nothing and is never counted, and a
// right token costs nothing.
//
// The address is the connection's: a client cannot choose it, as it could
// a forwarding header. Behind a reverse proxy every client shares the
// proxy's, so one guessing client there holds up the sign-ins of all of
// them until it stops (the price of bounding it at all). An IPv6 client
// is counted by its /64, which one host commonly holds whole.
const (
	guessBurst = 20
	guessEvery = 3 * time.Second
	// maxGuessers bounds the addresses tracked at once; addresses beyond
	// it, while the others' counts have not recovered, share one count.
	maxGuessers = 10_000
)

// guessLimiter counts wrong tokens per client address.
type guessLimiter struct {
	every time.Duration
	burst int
	max   int // maxGuessers
	now   func() time.Time

	mu     sync.Mutex
	byAddr map[netip.Addr]*rate.Limiter
}

func newGuessLimiter() *guessLimiter {
	return &guessLimiter{every: guessEvery, burst: guessBurst, max: maxGuessers, now: time.Now, byAddr: map[netip.Addr]*rate.Limiter{}}
}

// blocked reports whether r's address has used up its guesses, and when
// its next one comes.
func (g *guessLimiter) blocked(r *http.Request) (retryAfter time.Duration, blocked bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	lim := g.limiter(guesser(r), false)
	if lim == nil {
		return 0, false
	}
	tokens := lim.TokensAt(g.now())
	if tokens >= 1 {
		return 0, false
	}
	return time.Duration((1 - tokens) * float64(g.every)), true
}

// refuseGuesses answers a request whose address used up its guesses: 429
// with when to try again, on the sign-in page for a browser.
func (s *Server) refuseGuesses(w http.ResponseWriter, r *http.Request, retryAfter time.Duration, back string) {
	seconds := int(math.Ceil(retryAfter.Seconds()))
	w.Header().Set("Retry-After", strconv.Itoa(seconds))
	message := fmt.Sprintf("Too many wrong tokens from this address: try again in %d s.", seconds)
	if wantsLoginPage(r) {
		writeLoginPage(w, http.StatusTooManyRequests, back, message)
		return
	}
	writeError(w, http.StatusTooManyRequests, fmt.Sprintf("too many wrong tokens from this address: try again in %d s (Retry-After)", seconds))
}

// wrong counts a wrong token from r's address.
func (g *guessLimiter) wrong(r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.limiter(guesser(r), true).AllowN(g.now(), 1)
}

// limiter returns addr's count: its own, or, while the bound on addresses
// is reached and addr has none, the one they share; nil if there is none
// and create is false.
func (g *guessLimiter) limiter(addr netip.Addr, create bool) *rate.Limiter {
	if lim, ok := g.byAddr[addr]; ok {
		return lim
	}
	if create && len(g.byAddr) >= g.max {
		g.forgetRecovered()
	}
	if len(g.byAddr) >= g.max {
		addr = netip.Addr{}
	}
	lim := g.byAddr[addr]
	if lim == nil && create {
		lim = rate.NewLimiter(rate.Every(g.every), g.burst)
		g.byAddr[addr] = lim
	}
	return lim
}

// forgetRecovered drops the addresses whose guesses are all back: they
// are where a new address starts.
func (g *guessLimiter) forgetRecovered() {
	now := g.now()
	for addr, lim := range g.byAddr {
		if lim.TokensAt(now) >= float64(g.burst) {
			delete(g.byAddr, addr)
		}
	}
}

// guesser is the address r's guesses count against: the connection's
// IPv4 address, or its IPv6 /64.
func guesser(r *http.Request) netip.Addr {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	addr = addr.Unmap().WithZone("")
	if addr.Is6() {
		prefix, _ := addr.Prefix(64)
		return prefix.Addr()
	}
	return addr
}

// presentsToken reports whether r carries a token to check: a bearer
// header or a sign-in cookie.
func presentsToken(r *http.Request) bool {
	if _, ok := bearerToken(r); ok {
		return true
	}
	_, err := r.Cookie(tokenCookie)
	return err == nil
}
