package web_test

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app/web"
)

const (
	// browserAccept is what Chromium sends when it navigates to a page.
	browserAccept = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"
	formType      = "application/x-www-form-urlencoded"
	cookieName    = "dagrun_token"
)

var pathParam = regexp.MustCompile(`\{[^}]*\}`)

// concrete turns a route pattern into a method and a path to request.
func concrete(route string) (method, path string) {
	method, pattern, _ := strings.Cut(route, " ")
	return method, pathParam.ReplaceAllString(pattern, "x")
}

// signIn posts token to the login form as a browser does and returns the
// answer.
func (b *testBundle) signIn(t *testing.T, token, next string, header ...string) *response {
	t.Helper()
	form := url.Values{"token": {token}}
	if next != "" {
		form.Set("next", next)
	}
	return b.do(t, http.MethodPost, "/ui/login", form.Encode(), append([]string{"Content-Type", formType, "Accept", browserAccept}, header...)...)
}

// tokenCookie is the sign-in cookie a response sets, or nil.
func tokenCookie(r *response) *http.Cookie {
	for _, c := range (&http.Response{Header: r.header}).Cookies() {
		if c.Name == cookieName {
			return c
		}
	}
	return nil
}

// cookieFor signs in with token and returns the Cookie header that the
// browser then sends.
func (b *testBundle) cookieFor(t *testing.T, token string) string {
	t.Helper()
	r := b.signIn(t, token, "")
	require.Equal(t, http.StatusSeeOther, r.status, "body: %s", r.body)
	c := tokenCookie(r)
	require.NotNil(t, c, "the sign-in sets the cookie")
	return cookieName + "=" + c.Value
}

// requireLoginPage checks a browser's 401: the self-contained sign-in
// page, within the server's Content Security Policy.
func requireLoginPage(t *testing.T, r *response, message string) {
	t.Helper()
	require.Equal(t, http.StatusUnauthorized, r.status, "body: %s", r.body)
	require.Equal(t, `Bearer realm="dagrun"`, r.header.Get("WWW-Authenticate"))
	require.Equal(t, "text/html; charset=utf-8", r.header.Get("Content-Type"))
	require.Equal(t, "no-store", r.header.Get("Cache-Control"))
	page := string(r.body)
	require.Contains(t, page, `<form method="post" action="/ui/login"`)
	require.Contains(t, page, `<input id="token" name="token" type="password"`)
	if message != "" {
		require.Contains(t, page, message)
	} else {
		require.NotContains(t, page, "not accepted")
	}
	// Self-contained: nothing to load, which the token would guard.
	require.NotContains(t, page, "src=")
	require.NotContains(t, page, " style=", "the CSP allows the style element, not style attributes")
	require.NotRegexp(t, `\son[a-z]+=`, page, "the CSP allows the script element, not event handler attributes")
	for _, href := range regexp.MustCompile(`href="([^"]*)"`).FindAllStringSubmatch(page, -1) {
		require.True(t, strings.HasPrefix(href[1], "data:"), "the page links %s", href[1])
	}
	// The CSP allows exactly its one inline style and one inline script.
	csp := r.header.Get("Content-Security-Policy")
	require.Contains(t, csp, "default-src 'self'")
	for _, tag := range []string{"style", "script"} {
		require.Equal(t, 1, strings.Count(page, "<"+tag), "one %s element", tag)
		_, content, ok := strings.Cut(page, "<"+tag+">")
		require.True(t, ok, "the page has its %s inline", tag)
		content, _, ok = strings.Cut(content, "</"+tag+">")
		require.True(t, ok)
		sum := sha256.Sum256([]byte(content))
		require.Contains(t, csp, tag+"-src 'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'")
	}
}

// TestEveryRouteNeedsTheToken: with a token, every route the server
// answers, the web UI and the OpenAPI document included, refuses a request
// without it and takes it as the bearer header or as the sign-in cookie.
// Only /healthz is open.
func TestEveryRouteNeedsTheToken(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, &setupOpts{token: "s3cret", tokens: map[string]string{"alice": "a-s3cret"}})
	web.SetGuessLimit(b.web, 1<<20, time.Second, time.Now) // two wrong cookies per route
	anon := &testBundle{server: b.server}
	cookies := map[string]string{"plain token": anon.cookieFor(t, "s3cret"), "named token": anon.cookieFor(t, "a-s3cret")}

	routes := append(serverRoutes(t, b), "GET /", "GET /ui/app.js", "GET /ui/app.css", "GET /ui/favicon.svg", "GET /ui/nope", "POST /ui/logout", "GET /api/nope")
	for _, want := range []string{"GET /api/openapi.json", "GET /metrics", "GET /healthz", "GET /api/instances"} {
		require.Contains(t, routes, want)
	}
	for _, route := range routes {
		method, path := concrete(route)
		if route == "GET /healthz" {
			require.Equal(t, http.StatusOK, anon.do(t, method, path, "").status)
			continue
		}
		r := anon.do(t, method, path, "")
		requireError(t, r, http.StatusUnauthorized, "missing token")
		require.Equal(t, `Bearer realm="dagrun"`, r.header.Get("WWW-Authenticate"), route)
		require.NotEqual(t, http.StatusUnauthorized, b.do(t, method, path, "").status, "%s with the bearer header", route)
		for name, cookie := range cookies {
			r := anon.do(t, method, path, "", "Cookie", cookie)
			require.NotEqual(t, http.StatusUnauthorized, r.status, "%s with the cookie of the %s: %s", route, name, r.body)
		}
		requireError(t, anon.do(t, method, path, "", "Cookie", cookieName+"=czNjcmV0"), http.StatusUnauthorized, "sign-in cookie is not valid")
		requireError(t, anon.do(t, method, path, "", "Cookie", cookieName+"=s3cret"), http.StatusUnauthorized, "sign-in cookie is not valid")
	}
}

// TestSignInPage: a browser that navigates to the UI without the token
// gets a sign-in page; posting the token there sets the cookie that lets
// the UI in, and signing out clears it.
func TestSignInPage(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, &setupOpts{token: "s3cret"})
	anon := &testBundle{server: b.server}

	for _, path := range []string{"/", "/ui/app.js", "/ui/nope"} {
		requireLoginPage(t, anon.do(t, http.MethodGet, path, "", "Accept", browserAccept), "")
	}
	// Anything but a browser's navigation to the UI gets the JSON error.
	requireError(t, anon.do(t, http.MethodGet, "/api/workflows", "", "Accept", browserAccept), http.StatusUnauthorized, "missing token")
	requireError(t, anon.do(t, http.MethodGet, "/", "", "Accept", "*/*"), http.StatusUnauthorized, "missing token")
	requireError(t, anon.do(t, http.MethodGet, "/ui/app.js", "", "Accept", "application/json"), http.StatusUnauthorized, "missing token")

	// The right token: the cookie, then back to the UI.
	r := anon.signIn(t, "s3cret", "")
	require.Equal(t, http.StatusSeeOther, r.status, "body: %s", r.body)
	require.Equal(t, "/", r.header.Get("Location"))
	c := tokenCookie(r)
	require.NotNil(t, c)
	require.True(t, c.HttpOnly)
	require.Equal(t, http.SameSiteLaxMode, c.SameSite)
	require.Equal(t, "/", c.Path)
	require.False(t, c.Secure, "plain HTTP")
	require.Zero(t, c.MaxAge, "a session cookie")
	require.NotContains(t, c.Value, "s3cret")
	require.NotContains(t, c.Value, base64.RawURLEncoding.EncodeToString([]byte("s3cret")))
	cookie := cookieName + "=" + c.Value
	shell := anon.do(t, http.MethodGet, "/", "", "Accept", browserAccept, "Cookie", cookie)
	require.Equal(t, http.StatusOK, shell.status)
	require.Contains(t, string(shell.body), `<form id="logout" method="post" action="ui/logout">`, "the shell offers to sign out")
	require.Equal(t, http.StatusOK, anon.do(t, http.MethodGet, "/api/workflows", "", "Cookie", cookie).status)
	require.Equal(t, http.StatusSeeOther, anon.signIn(t, "  s3cret\n", "").status, "a pasted token's spaces do not count")

	// It goes back to a page of this server, never elsewhere.
	for next, want := range map[string]string{
		"/ui/app.css":          "/ui/app.css",
		"/?a=b":                "/?a=b",
		"ui/app.css":           "/",
		"//evil.example/":      "/",
		"https://evil.example": "/",
		`/\evil.example`:       "/",
		"/\t/evil.example":     "/",
		"/%0a/evil.example":    "/%0a/evil.example",
		// The sign-in page's script adds the address's fragment, a page
		// of the UI, which the redirect keeps.
		"/#/instances/01a2":           "/#/instances/01a2",
		"/#/instances?status=failed":  "/#/instances?status=failed",
		"/ui/app.css#/workflows/echo": "/ui/app.css#/workflows/echo",
		"#/instances/01a2":            "/",
	} {
		r := anon.signIn(t, "s3cret", next)
		require.Equal(t, http.StatusSeeOther, r.status, next)
		require.Equal(t, want, r.header.Get("Location"), next)
	}

	// A wrong token: the page again, with why, and no cookie.
	for _, wrong := range []string{"s3creT", "", "s3cret-and-more"} {
		r := anon.signIn(t, wrong, "")
		requireLoginPage(t, r, "That token was not accepted.")
		require.Nil(t, tokenCookie(r), "no cookie for %q", wrong)
	}
	r = anon.do(t, http.MethodPost, "/ui/login", url.Values{"token": {"nope"}}.Encode(), "Content-Type", formType)
	requireError(t, r, http.StatusUnauthorized, "wrong token")
	require.Nil(t, tokenCookie(r))

	// Signing out clears the cookie.
	r = anon.do(t, http.MethodPost, "/ui/logout", "", "Accept", browserAccept, "Cookie", cookie)
	require.Equal(t, http.StatusSeeOther, r.status, "body: %s", r.body)
	require.Equal(t, "/", r.header.Get("Location"))
	cleared := tokenCookie(r)
	require.NotNil(t, cleared)
	require.Empty(t, cleared.Value)
	require.Negative(t, cleared.MaxAge, "expired now")
	require.Equal(t, "/", cleared.Path)
	require.True(t, cleared.HttpOnly)
	require.Equal(t, http.SameSiteLaxMode, cleared.SameSite)

	// Another site cannot sign a browser in, or out.
	for _, header := range [][]string{{"Sec-Fetch-Site", "cross-site"}, {"Origin", "https://evil.example"}} {
		r := anon.signIn(t, "s3cret", "", header...)
		requireError(t, r, http.StatusForbidden, "cross-origin request refused")
		require.Nil(t, tokenCookie(r))
		r = anon.do(t, http.MethodPost, "/ui/logout", "", append([]string{"Cookie", cookie}, header...)...)
		requireError(t, r, http.StatusForbidden, "cross-origin request refused")
		require.Nil(t, tokenCookie(r))
	}
	require.Equal(t, http.StatusSeeOther, anon.signIn(t, "s3cret", "", "Sec-Fetch-Site", "same-origin").status)
}

// TestSignInCookieActsAsItsToken: what a browser signed in with a token
// does is recorded under the same name as with that token's bearer header.
func TestSignInCookieActsAsItsToken(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, &setupOpts{token: "plain", tokens: map[string]string{"alice": "a-s3cret"}})
	for secret, actor := range map[string]string{"plain": web.PlainTokenName, "a-s3cret": "alice"} {
		bearer := &testBundle{server: b.server, token: secret}
		browser := &testBundle{server: b.server}
		cookie := browser.cookieFor(t, secret)
		for _, via := range []struct {
			name   string
			client *testBundle
			header []string
		}{{"bearer header", bearer, nil}, {"cookie", browser, []string{"Cookie", cookie}}} {
			// No worker runs, so the instance stays pending.
			id := b.start(t, "greet", `{"input": {"name": "Bo"}}`)
			r := via.client.do(t, http.MethodPost, "/api/instances/"+id+"/pause", "", via.header...)
			require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
			require.Contains(t, string(r.body), `"type":"instance.paused","actor":"`+actor+`"`, "%s of %s", via.name, actor)
		}
	}
}

// TestSignInCookieIsSecureOverTLS: over HTTPS the browser must not send
// the cookie back over plain HTTP.
func TestSignInCookieIsSecureOverTLS(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, nil)
	srv, err := web.NewServer(b.engine, &web.Config{Token: "s3cret", Metrics: b.metrics})
	require.NoError(t, err)
	ts := httptest.NewTLSServer(srv)
	t.Cleanup(ts.Close)
	tls := &testBundle{server: ts}
	r := tls.signIn(t, "s3cret", "")
	require.Equal(t, http.StatusSeeOther, r.status, "body: %s", r.body)
	c := tokenCookie(r)
	require.NotNil(t, c)
	require.True(t, c.Secure)
	r = tls.do(t, http.MethodPost, "/ui/logout", "", "Cookie", cookieName+"="+c.Value)
	require.Equal(t, http.StatusSeeOther, r.status, "body: %s", r.body)
	require.True(t, tokenCookie(r).Secure)
}

// TestSignInCookieIsSecureBehindATLSProxy: a proxy that ended TLS in
// front of the server says so in X-Forwarded-Proto or Forwarded, and the
// cookie is Secure as it would be over the server's own TLS.
func TestSignInCookieIsSecureBehindATLSProxy(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, &setupOpts{token: "s3cret"})
	anon := &testBundle{server: b.server}
	for _, tc := range []struct {
		header, value string
		secure        bool
	}{
		{"X-Forwarded-Proto", "https", true},
		{"X-Forwarded-Proto", "HTTPS", true},
		{"X-Forwarded-Proto", "https, http", true}, // the proxy nearest the client first
		{"X-Forwarded-Proto", "http", false},
		{"X-Forwarded-Proto", "http, https", false},
		{"Forwarded", "for=192.0.2.60;proto=https;by=203.0.113.43", true},
		{"Forwarded", `proto="https"`, true},
		{"Forwarded", "for=192.0.2.60;proto=http", false},
		{"Forwarded", "for=192.0.2.60;proto=http, for=198.51.100.17;proto=https", false},
		{"X-Forwarded-Host", "https", false},
	} {
		r := anon.signIn(t, "s3cret", "", tc.header, tc.value)
		require.Equal(t, http.StatusSeeOther, r.status, "%s: %s: body: %s", tc.header, tc.value, r.body)
		c := tokenCookie(r)
		require.NotNil(t, c, "%s: %s", tc.header, tc.value)
		require.Equal(t, tc.secure, c.Secure, "%s: %s", tc.header, tc.value)
		r = anon.do(t, http.MethodPost, "/ui/logout", "", "Cookie", cookieName+"="+c.Value, tc.header, tc.value)
		require.Equal(t, http.StatusSeeOther, r.status, "body: %s", r.body)
		require.Equal(t, tc.secure, tokenCookie(r).Secure, "sign-out of %s: %s", tc.header, tc.value)
	}
}

// TestNoSignInWithoutAToken: a server without a token has no sign-in, no
// cookie and no sign-out.
func TestNoSignInWithoutAToken(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, nil)
	shell := b.do(t, http.MethodGet, "/", "", "Accept", browserAccept)
	require.Equal(t, http.StatusOK, shell.status)
	require.Contains(t, string(shell.body), `<main id="main">`)
	require.NotContains(t, string(shell.body), "logout")
	require.Nil(t, tokenCookie(shell))
	r := b.signIn(t, "anything", "")
	requireError(t, r, http.StatusMethodNotAllowed, "method POST is not allowed on /ui/login")
	require.Nil(t, tokenCookie(r))
	requireError(t, b.do(t, http.MethodPost, "/ui/logout", ""), http.StatusMethodNotAllowed, "method POST is not allowed on /ui/logout")
}

// TestWrongTokensAreBoundedPerAddress: an address that gave too many wrong
// tokens is refused with 429 whatever token it sends next, until its
// guesses come back; a request without a token and right tokens never
// count.
func TestWrongTokensAreBoundedPerAddress(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, &setupOpts{token: "s3cret"})
	var now atomic.Int64
	now.Store(time.Unix(1_700_000_000, 0).UnixNano())
	web.SetGuessLimit(b.web, 3, 10*time.Second, func() time.Time { return time.Unix(0, now.Load()) })
	anon := &testBundle{server: b.server}
	bearer := func(token string) *response {
		return anon.do(t, http.MethodGet, "/api/workflows", "", "Authorization", "Bearer "+token)
	}

	for range 10 {
		require.Equal(t, http.StatusOK, bearer("s3cret").status, "a right token never counts")
		requireError(t, anon.do(t, http.MethodGet, "/api/workflows", ""), http.StatusUnauthorized, "missing token")
	}
	for range 3 {
		requireError(t, bearer("guess"), http.StatusUnauthorized, "wrong token")
	}
	r := bearer("guess")
	requireError(t, r, http.StatusTooManyRequests, "too many wrong tokens from this address: try again in 10 s")
	require.Equal(t, "10", r.header.Get("Retry-After"))
	requireError(t, bearer("s3cret"), http.StatusTooManyRequests, "too many wrong tokens") // a right guess looks like a wrong one
	require.Equal(t, http.StatusTooManyRequests, anon.signIn(t, "s3cret", "").status)
	requireError(t, anon.do(t, http.MethodGet, "/api/workflows", "", "Cookie", cookieName+"=czNjcmV0"), http.StatusTooManyRequests, "too many wrong tokens")
	requireError(t, anon.do(t, http.MethodGet, "/api/workflows", ""), http.StatusUnauthorized, "missing token")
	page := anon.signIn(t, "s3cret", "/#/workflows")
	require.Equal(t, http.StatusTooManyRequests, page.status)
	require.Contains(t, string(page.body), "Too many wrong tokens from this address: try again in 10 s.")
	require.Contains(t, string(page.body), `value="/#/workflows"`, "the page still goes back where it was opened")

	now.Add(int64(4 * time.Second))
	r = bearer("s3cret")
	require.Equal(t, "6", r.header.Get("Retry-After"), "the wait counts down")
	now.Add(int64(6 * time.Second))
	require.Equal(t, http.StatusOK, bearer("s3cret").status, "one guess is back")
	require.Equal(t, http.StatusSeeOther, anon.signIn(t, "s3cret", "").status)
	requireLoginPage(t, anon.signIn(t, "guess", ""), "That token was not accepted.")
	requireError(t, bearer("s3cret"), http.StatusTooManyRequests, "too many wrong tokens")

	now.Add(int64(30 * time.Second))
	for range 3 {
		requireError(t, bearer("guess"), http.StatusUnauthorized, "wrong token")
	}
	requireError(t, bearer("guess"), http.StatusTooManyRequests, "too many wrong tokens")
}

// TestTokensNoClientCanSendAreRefused: an Authorization header drops the
// whitespace around a token and carries no control character, so a server
// given such a token would refuse everyone, saying the token is missing.
func TestTokensNoClientCanSendAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, nil)
	for _, secret := range []string{" ", "s3cret ", "\ts3cret", "s3c\nret", "s3c\x00ret"} {
		_, err := web.NewServer(b.engine, &web.Config{Token: secret})
		require.Error(t, err, "token %q", secret)
		_, err = web.NewServer(b.engine, &web.Config{Tokens: map[string]string{"ops": secret}})
		require.ErrorContains(t, err, "token ops", "named token %q", secret)
	}
	_, err := web.NewServer(b.engine, &web.Config{Token: "s3c ret", Tokens: map[string]string{"ops": "a b"}})
	require.NoError(t, err, "a space inside a token goes through")
}
