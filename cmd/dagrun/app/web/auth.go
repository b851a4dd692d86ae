package web

import (
	"crypto/sha256"
	"crypto/subtle"
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

// namedToken is one accepted token: the digest of its secret, and the name
// the history records for what its bearer did.
type namedToken struct {
	name string
	sum  [sha256.Size]byte
}

// tokens are the accepted tokens: Config.Token (named PlainTokenName) and
// Config.Tokens, sorted by name so that the check does the same work
// whichever token a request carries.
func (c *Config) tokens() []namedToken {
	var out []namedToken
	if c.Token != "" {
		out = append(out, namedToken{PlainTokenName, sha256.Sum256([]byte(c.Token))})
	}
	for _, name := range slices.Sorted(maps.Keys(c.Tokens)) {
		out = append(out, namedToken{name, sha256.Sum256([]byte(c.Tokens[name]))})
	}
	return out
}

// protected reports whether the server needs a token.
func (s *Server) protected() bool { return len(s.tokens) > 0 }

// requireToken lets a request through when no token is configured or when
// it carries "Authorization: Bearer <token>" of one of the tokens. The
// request's context then names the token (see storage.WithActor), so that
// what it does is recorded as done by that name.
func (s *Server) requireToken(next http.Handler) http.Handler {
	if !s.protected() {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			next.ServeHTTP(w, r.WithContext(storage.WithActor(r.Context(), PlainTokenName)))
		})
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := bearerToken(r)
		// Compare fixed-size digests, against every token, so neither the
		// content nor the length of a token leaks through timing.
		sum := sha256.Sum256([]byte(got))
		name := ""
		for _, t := range s.tokens {
			if subtle.ConstantTimeCompare(sum[:], t.sum[:]) == 1 {
				name = t.name
			}
		}
		if !ok || name == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="dagrun"`)
			msg := "missing token: send the header Authorization: Bearer <token> (the token given to dagrun serve with --token or DAGRUN_TOKEN)"
			if ok {
				msg = "wrong token: use the token given to dagrun serve with --token or DAGRUN_TOKEN"
			}
			writeError(w, http.StatusUnauthorized, msg)
			return
		}
		next.ServeHTTP(w, r.WithContext(storage.WithActor(r.Context(), name)))
	})
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
// the page cannot authenticate anyway, so any Host is accepted (the server
// may sit behind a proxy or on a LAN name).
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
