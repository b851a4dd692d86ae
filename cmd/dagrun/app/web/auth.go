package web

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"

	"github.com/dagrun/dagrun/storage"
)

// PlainTokenName is the name the history gives Config.Token, and every
// request to a server without tokens.
const PlainTokenName = "api"

// tokenCookie is the cookie that carries a browser's sign-in: a browser
// cannot add an Authorization header to a page load, so the web UI's
// sign-in page (login.go) sets this instead.
const tokenCookie = "dagrun_token"

// cookieLabel is the message each token's cookie value authenticates.
const cookieLabel = "dagrun sign-in cookie v1"

// namedToken is one accepted token: the digest of its secret, the value of
// its sign-in cookie, and the name the history records for what its bearer
// did.
type namedToken struct {
	name string
	sum  [sha256.Size]byte
	// cookie is HMAC-SHA256 keyed with the secret, rather than the secret
	// itself: a cookie copied out of a browser profile or a proxy's log
	// does not disclose the token, which scripts and CI may hold too. It
	// is the same for every sign-in, so the server keeps no sessions and a
	// restart signs nobody out; changing the token voids every cookie.
	cookie [sha256.Size]byte
}

func newNamedToken(name, secret string) namedToken {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(cookieLabel))
	return namedToken{name: name, sum: sha256.Sum256([]byte(secret)), cookie: [sha256.Size]byte(mac.Sum(nil))}
}

// tokens are the accepted tokens: Config.Token (named PlainTokenName) and
// Config.Tokens, sorted by name so that the check does the same work
// whichever token a request carries.
func (c *Config) tokens() []namedToken {
	var out []namedToken
	if c.Token != "" {
		out = append(out, newNamedToken(PlainTokenName, c.Token))
	}
	for _, name := range slices.Sorted(maps.Keys(c.Tokens)) {
		out = append(out, newNamedToken(name, c.Tokens[name]))
	}
	return out
}

// protected reports whether the server needs a token.
func (s *Server) protected() bool { return len(s.tokens) > 0 }

// match returns the token whose field equals got. It compares fixed-size
// values, against every token, so neither the content nor the length of a
// token, nor which one matched, leaks through timing.
func (s *Server) match(got [sha256.Size]byte, field func(*namedToken) *[sha256.Size]byte) (namedToken, bool) {
	var found namedToken
	ok := false
	for i := range s.tokens {
		if subtle.ConstantTimeCompare(got[:], field(&s.tokens[i])[:]) == 1 {
			found, ok = s.tokens[i], true
		}
	}
	return found, ok
}

// matchSecret returns the token whose secret is secret.
func (s *Server) matchSecret(secret string) (namedToken, bool) {
	return s.match(sha256.Sum256([]byte(secret)), func(t *namedToken) *[sha256.Size]byte { return &t.sum })
}

// authenticate returns the name of the token a request carries, as
// "Authorization: Bearer <token>" or as the sign-in cookie, or else why it
// is refused. A bearer header wins over the cookie: a client that names a
// token means that one.
func (s *Server) authenticate(r *http.Request) (name, refusal string) {
	if secret, ok := bearerToken(r); ok {
		if t, ok := s.matchSecret(secret); ok {
			return t.name, ""
		}
		return "", "wrong token: use the token given to dagrun serve with --token or DAGRUN_TOKEN"
	}
	if c, err := r.Cookie(tokenCookie); err == nil {
		value, err := base64.RawURLEncoding.DecodeString(c.Value)
		if err == nil && len(value) == sha256.Size {
			if t, ok := s.match([sha256.Size]byte(value), func(t *namedToken) *[sha256.Size]byte { return &t.cookie }); ok {
				return t.name, ""
			}
		}
		return "", "the sign-in cookie is not valid for this server (was its token changed?): sign in again in the web UI, or send the header Authorization: Bearer <token>"
	}
	return "", "missing token: send the header Authorization: Bearer <token> (the token given to dagrun serve with --token or DAGRUN_TOKEN)"
}

// requireToken lets a request through when no token is configured or when
// it carries one of the tokens (see authenticate). The request's context
// then names the token (see storage.WithActor), so that what it does is
// recorded as done by that name. A browser refused on its way to the UI
// gets the sign-in page instead of the JSON error.
func (s *Server) requireToken(next http.Handler) http.Handler {
	if !s.protected() {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			next.ServeHTTP(w, r.WithContext(storage.WithActor(r.Context(), PlainTokenName)))
		})
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		guess := presentsToken(r)
		if guess {
			if retryAfter, blocked := s.guesses.blocked(r); blocked {
				s.refuseGuesses(w, r, retryAfter, returnTo(r))
				return
			}
		}
		name, refusal := s.authenticate(r)
		if name == "" {
			if guess {
				s.guesses.wrong(r)
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="dagrun"`)
			if wantsLoginPage(r) {
				writeLoginPage(w, http.StatusUnauthorized, returnTo(r), "")
				return
			}
			writeError(w, http.StatusUnauthorized, refusal)
			return
		}
		next.ServeHTTP(w, r.WithContext(storage.WithActor(r.Context(), name)))
	})
}

// returnTo is where a browser refused on its way to r goes once signed
// in: the page asked for; a form's POST (a sign-out) cannot be repeated by
// a redirect.
func returnTo(r *http.Request) string {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return r.URL.RequestURI()
	}
	return "/"
}

// bearerToken extracts the token of an "Authorization: Bearer" header; the
// scheme is case-insensitive (RFC 7235).
func bearerToken(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// checkHost guards a server without a token against DNS rebinding: a web
// page on a name the attacker controls, re-pointed at 127.0.0.1, would
// otherwise be "same origin" with the API. Browsers send the page's own
// name as Host, so requiring a loopback Host shuts that door. With a token
// the page cannot authenticate anyway (the browser keeps the sign-in cookie
// for the name the user signed in on, not the attacker's), so any Host is
// accepted (the server may sit behind a proxy or on a LAN name).
func (s *Server) checkHost(next http.Handler) http.Handler {
	if s.protected() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if !IsLoopbackHost(host) {
			writeError(w, http.StatusForbidden, "this server has no token, so it only answers requests addressed to localhost or a loopback IP; restart dagrun serve with --token to serve other host names")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// IsLoopbackHost reports whether host (a name or IP, without port, IPv6
// with or without brackets) is "localhost" or an address in 127.0.0.0/8 or
// ::1. An empty host, meaning every interface, is not.
func IsLoopbackHost(host string) bool {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
