package handlers_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/handlers"
)

// received is what a test server saw of a request.
type received struct {
	method string
	path   string
	host   string
	header http.Header
	body   string
}

type httpBundle struct {
	h   handlers.Handler
	srv *httptest.Server
	// got delivers each request the server received.
	got chan received
}

// setupHTTP starts a server that records each request and answers with
// respond.
func setupHTTP(t *testing.T, respond http.HandlerFunc) *httpBundle {
	t.Helper()
	b := &httpBundle{h: builtin(t, "http"), got: make(chan received, 10)}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		b.got <- received{r.Method, r.URL.Path, r.Host, r.Header.Clone(), string(body)}
		respond(w, r)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *httpBundle) call(ctx context.Context, t *testing.T, input map[string]any) (json.RawMessage, error) {
	t.Helper()
	raw, err := json.Marshal(input)
	require.NoError(t, err)
	return b.h(ctx, raw)
}

func respondWith(status int, contentType, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if contentType != "" {
			w.Header().Set("Content-Type", contentType)
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

func TestHTTPResponses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		respond   http.HandlerFunc
		wantBody  string // JSON of the output's body
		wantErr   string // with "URL" standing for the server's URL
		permanent bool
	}{
		{name: "JSONDecoded", respond: respondWith(200, "application/json; charset=utf-8", `{"ok":true,"n":[1,2]}`), wantBody: `{"ok":true,"n":[1,2]}`},
		{name: "JSONSuffixDecoded", respond: respondWith(201, "application/problem+json", `{"title":"x"}`), wantBody: `{"title":"x"}`},
		{name: "TextIsString", respond: respondWith(200, "text/plain", "hello\n"), wantBody: `"hello\n"`},
		{name: "TextInItsCharset", respond: respondWith(200, "text/plain; charset=iso-8859-1", "caf\xe9 \xff"), wantBody: `"café ÿ"`},
		{name: "TextInWindows1252", respond: respondWith(200, "text/html; charset=windows-1252", "\x80 5"), wantBody: `"€ 5"`},
		{name: "TextInAnUnknownCharset", respond: respondWith(200, "text/plain; charset=klingon", "plain"), wantBody: `"plain"`},
		{name: "InvalidJSONIsString", respond: respondWith(200, "application/json", `{"ok":`), wantBody: `"{\"ok\":"`},
		{name: "JSONWithoutContentTypeIsString", respond: respondWith(200, "", `{"ok":true}`), wantBody: `"{\"ok\":true}"`},
		{name: "EmptyBody", respond: respondWith(204, "", ""), wantBody: `""`},
		{name: "NotModifiedSucceeds", respond: respondWith(304, "", ""), wantBody: `""`},
		{name: "NotFoundPermanent", respond: respondWith(404, "text/plain", "no such order\n"), wantErr: "GET URL/thing: 404 Not Found: no such order", permanent: true},
		{name: "BadRequestNoBody", respond: respondWith(400, "", ""), wantErr: "GET URL/thing: 400 Bad Request", permanent: true},
		{name: "TooManyRequestsRetryable", respond: respondWith(429, "", "slow down"), wantErr: "GET URL/thing: 429 Too Many Requests: slow down"},
		{name: "ServerErrorRetryable", respond: respondWith(500, "text/plain", "boom"), wantErr: "GET URL/thing: 500 Internal Server Error: boom"},
		{name: "BadGatewayRetryable", respond: respondWith(502, "", ""), wantErr: "GET URL/thing: 502 Bad Gateway"},
		{
			name: "LongErrorBodyCut", respond: respondWith(422, "", strings.Repeat("é", 150)),
			// 200 bytes is 100 two-byte runes.
			wantErr: "GET URL/thing: 422 Unprocessable Entity: " + strings.Repeat("é", 100), permanent: true,
		},
		{
			name: "ErrorBodyCutBeforeASplitCharacter", respond: respondWith(422, "", "x"+strings.Repeat("é", 150)),
			// Byte 200 is the second byte of the 100th é: the cut keeps 99.
			wantErr: "GET URL/thing: 422 Unprocessable Entity: x" + strings.Repeat("é", 99), permanent: true,
		},
		{name: "MultilineErrorBodyOneLine", respond: respondWith(409, "", "a\n  b\r\nc"), wantErr: "GET URL/thing: 409 Conflict: a b c", permanent: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setupHTTP(t, tt.respond)
			out, err := b.call(t.Context(), t, map[string]any{"url": b.srv.URL + "/thing"})
			if tt.wantErr != "" {
				require.EqualError(t, err, strings.ReplaceAll(tt.wantErr, "URL", b.srv.URL))
				require.Equal(t, tt.permanent, handlers.IsPermanent(err))
				return
			}
			require.NoError(t, err)
			var got struct {
				Status  int               `json:"status"`
				Headers map[string]string `json:"headers"`
				Body    json.RawMessage   `json:"body"`
			}
			require.NoError(t, json.Unmarshal(out, &got))
			require.Less(t, got.Status, 400)
			require.JSONEq(t, tt.wantBody, string(got.Body))
		})
	}
}

func TestHTTPRequest(t *testing.T) {
	t.Parallel()

	t.Run("JSONBodyAndHeadersSent", func(t *testing.T) {
		t.Parallel()
		b := setupHTTP(t, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Add("X-Multi", "first")
			w.Header().Add("X-Multi", "second")
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"o-1"}`)
		})
		out, err := b.call(t.Context(), t, map[string]any{
			"method":  "post",
			"url":     b.srv.URL + "/orders",
			"headers": map[string]string{"Authorization": "Bearer t", "x-request-id": "r1"},
			"body":    map[string]any{"orderId": "o-1", "items": []int{1, 2}},
		})
		require.NoError(t, err)
		require.JSONEq(t, `{"status":200,"headers":{"Content-Type":"application/json","X-Multi":"first",
			"Content-Length":"12","Date":"DATE"},"body":{"id":"o-1"}}`,
			replaceDate(t, out))

		got := <-b.got
		require.Equal(t, http.MethodPost, got.method)
		require.Equal(t, "/orders", got.path)
		require.Equal(t, "application/json", got.header.Get("Content-Type"))
		require.Equal(t, "Bearer t", got.header.Get("Authorization"))
		require.Equal(t, "r1", got.header.Get("X-Request-Id"))
		require.JSONEq(t, `{"orderId":"o-1","items":[1,2]}`, got.body)
	})

	t.Run("StringBodySentAsIs", func(t *testing.T) {
		t.Parallel()
		b := setupHTTP(t, respondWith(200, "", ""))
		_, err := b.call(t.Context(), t, map[string]any{
			"method":  "PUT",
			"url":     b.srv.URL,
			"headers": map[string]string{"Content-Type": "text/csv", "Host": "example.test"},
			"body":    "a,b\n1,2\n",
		})
		require.NoError(t, err)
		got := <-b.got
		require.Equal(t, http.MethodPut, got.method)
		require.Equal(t, "a,b\n1,2\n", got.body)
		require.Equal(t, "text/csv", got.header.Get("Content-Type"))
		require.Equal(t, "example.test", got.host)
	})

	t.Run("ContentTypeNotOverridden", func(t *testing.T) {
		t.Parallel()
		b := setupHTTP(t, respondWith(200, "", ""))
		_, err := b.call(t.Context(), t, map[string]any{
			"method":  "POST",
			"url":     b.srv.URL,
			"headers": map[string]string{"content-type": "application/vnd.api+json"},
			"body":    []int{1},
		})
		require.NoError(t, err)
		got := <-b.got
		require.Equal(t, "application/vnd.api+json", got.header.Get("Content-Type"))
		require.Equal(t, "[1]", got.body)
	})

	t.Run("DefaultGETWithoutBody", func(t *testing.T) {
		t.Parallel()
		b := setupHTTP(t, respondWith(200, "", ""))
		_, err := b.call(t.Context(), t, map[string]any{"url": b.srv.URL, "body": nil})
		require.NoError(t, err)
		got := <-b.got
		require.Equal(t, http.MethodGet, got.method)
		require.Empty(t, got.body)
		require.Empty(t, got.header.Get("Content-Type"))
	})

	t.Run("TimeoutHonoured", func(t *testing.T) {
		t.Parallel()
		b := setupHTTP(t, func(_ http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		})
		start := time.Now()
		_, err := b.call(t.Context(), t, map[string]any{"url": b.srv.URL, "timeout": "50ms"})
		require.Less(t, time.Since(start), 5*time.Second)
		require.ErrorContains(t, err, "GET "+b.srv.URL+": timed out after 50ms")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.False(t, handlers.IsPermanent(err), "a timeout is worth retrying")
	})

	t.Run("CallerCancellation", func(t *testing.T) {
		t.Parallel()
		b := setupHTTP(t, func(_ http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
		})
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			<-b.got
			cancel()
		}()
		_, err := b.call(ctx, t, map[string]any{"url": b.srv.URL})
		require.ErrorIs(t, err, context.Canceled)
		require.False(t, handlers.IsPermanent(err))
	})

	t.Run("NetworkErrorRetryable", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.NotFoundHandler())
		url := srv.URL
		srv.Close() // nothing listens there any more
		raw, err := json.Marshal(map[string]any{"url": url + "/x"})
		require.NoError(t, err)
		_, err = builtin(t, "http")(t.Context(), raw)
		require.ErrorContains(t, err, "GET "+url+"/x: ")
		require.False(t, handlers.IsPermanent(err))
	})

	t.Run("CredentialsHiddenInErrors", func(t *testing.T) {
		t.Parallel()
		b := setupHTTP(t, respondWith(401, "", ""))
		u := strings.Replace(b.srv.URL, "http://", "http://user:secret@", 1) + "/p?token=hunter2"
		_, err := b.call(t.Context(), t, map[string]any{"url": u})
		require.ErrorContains(t, err, "401 Unauthorized")
		require.ErrorContains(t, err, b.srv.URL+"/p?token=xxxxx")
		require.NotContains(t, err.Error(), "secret")
		require.NotContains(t, err.Error(), "hunter2")

		// So do the errors of a URL refused before any request.
		for _, bad := range []string{"http://user:secret@host/%zz?token=hunter2", "ftp://user:secret@host/x?token=hunter2"} {
			_, err := b.call(t.Context(), t, map[string]any{"url": bad})
			require.Error(t, err)
			require.NotContains(t, err.Error(), "secret", bad)
			require.NotContains(t, err.Error(), "hunter2", bad)
		}
		require.Equal(t, "Basic dXNlcjpzZWNyZXQ=", (<-b.got).header.Get("Authorization"))
	})

	t.Run("HugeBodyPermanent", func(t *testing.T) {
		t.Parallel()
		b := setupHTTP(t, respondWith(200, "text/plain", strings.Repeat("x", 10<<20+1)))
		_, err := b.call(t.Context(), t, map[string]any{"url": b.srv.URL})
		require.ErrorContains(t, err, "response body larger than 10 MiB")
		require.True(t, handlers.IsPermanent(err))
	})

	t.Run("BadInputPermanent", func(t *testing.T) {
		t.Parallel()
		h := builtin(t, "http")
		for _, input := range []string{
			``,
			`{}`,
			`{"url":"ftp://example.test/x"}`,
			`{"url":"example.test/x"}`,
			`{"url":"http://"}`,
			`{"url":"http://example.test","timeout":"soon"}`,
			`{"url":"http://example.test","timeout":"-1s"}`,
			`{"url":"http://example.test","method":"GE T"}`,
			`{"url":"http://example.test","headers":{"a":1}}`,
			`{"url":7}`,
		} {
			_, err := h(t.Context(), json.RawMessage(input))
			require.Error(t, err, input)
			require.True(t, handlers.IsPermanent(err), "input %s: %v", input, err)
		}
	})
	t.Run("BadHeaderPermanentAndNamed", func(t *testing.T) {
		t.Parallel()
		// Nothing listens on the URL: a header that reached net/http's
		// send would fail as a network error, which is retried.
		h := builtin(t, "http")
		for _, tt := range []struct{ headers, want string }{
			{`{"X-A":1}`, `decode input for handler: headers.X-A: want a string, got a number`},
			{`{"X-A":{"b":"c"}}`, `decode input for handler: headers.X-A: want a string, got an object`},
			{`{"X A":"b"}`, `http: header "X A": invalid name`},
			{`{"X-A":"a\nb"}`, `http: header "X-A": invalid value`},
			{`{"X-A":"a\u0000b"}`, `http: header "X-A": invalid value`},
		} {
			_, err := h(t.Context(), json.RawMessage(`{"url":"http://127.0.0.1:1/x","headers":`+tt.headers+`}`))
			require.ErrorContains(t, err, tt.want, tt.headers)
			require.True(t, handlers.IsPermanent(err), "headers %s: %v", tt.headers, err)
		}
	})
}

// replaceDate replaces the response's Date header, which varies, with DATE.
func replaceDate(t *testing.T, out json.RawMessage) string {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(out, &m))
	headers, ok := m["headers"].(map[string]any)
	require.True(t, ok)
	require.NotEmpty(t, headers["Date"])
	headers["Date"] = "DATE"
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return string(b)
}
