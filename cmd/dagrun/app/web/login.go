package web

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"sync"
)

// loginSource is the sign-in page a browser gets instead of a 401's JSON
// when the server has a token. It loads nothing (everything else needs
// the token): a plain form posts the token to /ui/login, which sets the
// sign-in cookie (see tokenCookie). Its one script adds the address's
// fragment to where the form goes next: the UI's pages are fragments
// (#/instances/ID), which a browser never sends to the server, so a deep
// link opened while signed out would otherwise land on the start page.
//
//go:embed login.html
var loginSource string

// loginTemplate is parsed at first use, not at init (see shellTemplate).
var loginTemplate = sync.OnceValue(func() *template.Template {
	return template.Must(template.New("login").Parse(loginSource))
})

// loginCSP is the server's policy plus the digests of the page's own
// style and script elements, the only inline things it allows.
var loginCSP = contentSecurityPolicy +
	"; style-src " + inlineDigest(loginSource, "style") +
	"; script-src " + inlineDigest(loginSource, "script")

// inlineDigest returns the CSP source expression ('sha256-...') that
// allows the content of page's first element named tag.
func inlineDigest(page, tag string) string {
	_, content, _ := strings.Cut(page, "<"+tag+">")
	content, _, _ = strings.Cut(content, "</"+tag+">")
	sum := sha256.Sum256([]byte(content))
	return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
}

// wantsLoginPage reports whether a refused request is a browser on its way
// to the web UI; an API call, curl or a script keep the JSON error.
func wantsLoginPage(r *http.Request) bool {
	if r.URL.Path != "/" && !strings.HasPrefix(r.URL.Path, "/ui/") {
		return false
	}
	for _, accept := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(accept, ",") {
			mediaType, _, _ := strings.Cut(part, ";")
			if strings.EqualFold(strings.TrimSpace(mediaType), "text/html") {
				return true
			}
		}
	}
	return false
}

// writeLoginPage answers status (401, or 429 after too many wrong tokens)
// with the sign-in page, which sends the user to back once signed in, and
// says message above the button.
func writeLoginPage(w http.ResponseWriter, status int, back, message string) {
	var page bytes.Buffer
	if err := loginTemplate().Execute(&page, struct{ Next, Message string }{back, message}); err != nil {
		// The template is fixed and its data two strings: this is a bug.
		panic(err)
	}
	h := w.Header()
	h.Set("Content-Security-Policy", loginCSP)
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(page.Bytes())
}

// loginRoutes serve the sign-in and sign-out of the web UI, on a server
// with a token only. POST /ui/login needs no token, since it is where the
// token is given; like every POST it is refused cross-origin, so another
// site cannot sign a browser in to its own choice of token.
func (s *Server) loginRoutes() {
	if !s.protected() {
		return
	}
	s.mux.HandleFunc("POST /ui/login", s.login)
	s.mux.HandleFunc("POST /ui/logout", s.logout)
}

// login checks the posted token and, if it is one of the server's, sets
// the sign-in cookie and sends the browser back to the UI.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		var tooBig *http.MaxBytesError
		if !errors.As(err, &tooBig) {
			err = &requestError{status: http.StatusBadRequest, msg: "invalid sign-in form (send token=<token> as application/x-www-form-urlencoded): " + err.Error()}
		}
		s.fail(w, r, err)
		return
	}
	back := sameSitePath(r.PostForm.Get("next"))
	if retryAfter, blocked := s.guesses.blocked(r); blocked {
		s.refuseGuesses(w, r, retryAfter, back)
		return
	}
	t, ok := s.matchSecret(strings.TrimSpace(r.PostForm.Get("token")))
	if !ok {
		s.guesses.wrong(r)
		w.Header().Set("WWW-Authenticate", `Bearer realm="dagrun"`)
		if wantsLoginPage(r) {
			writeLoginPage(w, http.StatusUnauthorized, back, "That token was not accepted.")
			return
		}
		writeError(w, http.StatusUnauthorized, "wrong token: use the token given to dagrun serve with --token or DAGRUN_TOKEN")
		return
	}
	// A session cookie: gone when the browser closes, as the token a tab
	// kept used to be.
	setTokenCookie(w, r, base64.RawURLEncoding.EncodeToString(t.cookie[:]), 0)
	http.Redirect(w, r, back, http.StatusSeeOther)
}

// logout clears the sign-in cookie. It needs the token like every route:
// a browser without it has nothing to sign out of.
func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	setTokenCookie(w, r, "", -1)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// setTokenCookie sets the sign-in cookie; maxAge as http.Cookie's.
// HttpOnly keeps it from the page's script, and Secure, over HTTPS (see
// overHTTPS), from plain HTTP. SameSite=Lax keeps it from every request another site starts
// but a top-level GET, so a link to the UI pasted in a chat opens signed
// in; what such a GET answers is shown to the user, never to the site,
// no GET route changes anything, and a cross-site POST is refused anyway
// (http.CrossOriginProtection).
func setTokenCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name:     tokenCookie,
		Value:    value,
		Path:     "/",
		MaxAge:   maxAge,
		HttpOnly: true,
		Secure:   overHTTPS(r),
		SameSite: http.SameSiteLaxMode,
	})
}

// overHTTPS reports whether the browser reached the server over HTTPS:
// the server's own TLS, or a proxy in front of it that ended TLS and says
// so in X-Forwarded-Proto or Forwarded (RFC 7239), as nginx, Caddy,
// Traefik and cloud load balancers do. The headers need no trust: a
// client that claims HTTPS over plain HTTP only gets a cookie its browser
// will not send back over plain HTTP.
func overHTTPS(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if proto, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ","); strings.EqualFold(strings.TrimSpace(proto), "https") {
		return true
	}
	// Forwarded: for=...;proto=https, the first element being the
	// proxy nearest the client.
	first, _, _ := strings.Cut(r.Header.Get("Forwarded"), ",")
	for pair := range strings.SplitSeq(first, ";") {
		name, value, _ := strings.Cut(strings.TrimSpace(pair), "=")
		if strings.EqualFold(name, "proto") && strings.EqualFold(strings.Trim(value, `"`), "https") {
			return true
		}
	}
	return false
}

// sameSitePath returns next if it is a path on this server, else "/", so
// that the sign-in cannot be used to send a browser elsewhere. Browsers
// read a backslash as a slash and drop tabs and newlines from a URL, so
// "/\evil.example" would be another host: such paths are refused too.
func sameSitePath(next string) string {
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" ||
		!strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") {
		return "/"
	}
	for _, c := range []byte(next) {
		if c <= ' ' || c == '\\' || c == 0x7f {
			return "/"
		}
	}
	return next
}
