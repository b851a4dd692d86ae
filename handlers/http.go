package handlers

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/propagation"
	"golang.org/x/net/http/httpguts"
	"golang.org/x/text/encoding/htmlindex"
)

// HTTPInput is the input of the built-in http handler.
type HTTPInput struct {
	// Method is the request method; default GET.
	Method string `json:"method,omitempty"`
	// URL is the request URL (http or https); required.
	URL string `json:"url"`
	// Headers are request headers. "Host" sets the request's host.
	Headers HTTPHeaders `json:"headers,omitempty"`
	// Body is any JSON value. A string is sent as is; any other value is
	// sent JSON-encoded, with Content-Type application/json unless Headers
	// sets one. Absent or null means no body.
	Body json.RawMessage `json:"body,omitempty"`
	// Timeout bounds the whole request, response body included, as a Go
	// duration ("5s"); default 30s. The step's own timeout still applies.
	Timeout string `json:"timeout,omitempty"`
}

// HTTPHeaders are the request headers of an HTTPInput, a string each.
type HTTPHeaders map[string]string

// UnmarshalJSON decodes the headers, naming the header whose value is not
// a string: encoding/json names only the map ("headers").
func (h *HTTPHeaders) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	if raw == nil {
		*h = nil
		return nil
	}
	decoded := make(HTTPHeaders, len(raw))
	for name, value := range raw {
		var s string
		if err := json.Unmarshal(value, &s); err != nil {
			return fmt.Errorf("headers.%s: %s", name, DecodeProblem(err))
		}
		decoded[name] = s
	}
	*h = decoded
	return nil
}

// HTTPOutput is the output of the built-in http handler.
type HTTPOutput struct {
	Status int `json:"status"`
	// Headers holds the first value of each response header, keyed by its
	// canonical name ("Content-Type").
	Headers map[string]string `json:"headers"`
	// Body is the decoded JSON value when the response's Content-Type is
	// JSON (application/json or any +json type) and the body parses;
	// otherwise the body as a string.
	Body any `json:"body"`
}

const (
	httpDefaultTimeout = 30 * time.Second
	// httpMaxBody caps what is read of a response: the output is stored
	// in the database with the step, so an unbounded body is a hazard.
	httpMaxBody = 10 << 20
	// httpErrorSnippet is how much of an error response goes in the error.
	httpErrorSnippet = 200
)

// newHTTPHandler returns the http built-in using client. Outcomes:
//
//   - 2xx and 3xx (redirects the client did not follow) succeed.
//   - 4xx fail permanently: the same request will be refused again. The
//     exceptions are 408 Request Timeout and 429 Too Many Requests, which
//     say "try again later" and so are retried.
//   - 5xx, network errors and timeouts are retried.
//   - Bad input (no URL, bad timeout, unsupported scheme) fails permanently.
func newHTTPHandler(client *http.Client) Handler {
	return Typed(func(ctx context.Context, in HTTPInput) (HTTPOutput, error) {
		return doHTTP(ctx, client, in)
	})
}

func doHTTP(ctx context.Context, client *http.Client, in HTTPInput) (HTTPOutput, error) {
	req, timeout, err := newHTTPRequest(ctx, in)
	if err != nil {
		return HTTPOutput{}, Permanent(fmt.Errorf("http: %w", err))
	}
	// The URL as it appears in errors, as the logs show it: step errors
	// are stored and shown by status and the web UI, and the error goes
	// into the step's log too.
	target := req.Method + " " + loggableURL(req.URL)

	reqCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req = req.WithContext(reqCtx)
	if req.Header.Get("Traceparent") == "" {
		// The request joins the step attempt's trace, when there is one.
		propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
	}
	log := Logger(ctx).With(slog.String("method", req.Method), slog.String("url", loggableURL(req.URL)))
	began := time.Now()
	// reqErr makes the handler's own timeout readable: without it the
	// error would be a bare "context deadline exceeded". url.Error is
	// unwrapped because it repeats the method and URL that target holds. A
	// cancellation of ctx itself (step timeout, instance cancelled, worker
	// stopping) stays in the chain for the engine to recognise.
	reqErr := func(err error) error {
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err
		}
		if ctx.Err() == nil && errors.Is(reqCtx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("timed out after %s: %w", timeout, context.DeadlineExceeded)
		}
		return fmt.Errorf("%s: %w", target, err)
	}

	resp, err := client.Do(req)
	if err != nil {
		err = reqErr(err)
		log.Warn("http request failed", slog.Duration("duration", time.Since(began)), slog.Any("error", err))
		return HTTPOutput{}, err
	}
	defer resp.Body.Close()
	log.Info("http response", slog.Int("status", resp.StatusCode), slog.Duration("duration", time.Since(began)))

	body, err := io.ReadAll(io.LimitReader(resp.Body, httpMaxBody+1))
	if err != nil {
		return HTTPOutput{}, reqErr(fmt.Errorf("%s: read body: %w", resp.Status, err))
	}
	tooLarge := len(body) > httpMaxBody

	if resp.StatusCode >= 400 {
		err := fmt.Errorf("%s: %s%s", target, resp.Status, errorSnippet(body))
		if resp.StatusCode < 500 && resp.StatusCode != http.StatusRequestTimeout &&
			resp.StatusCode != http.StatusTooManyRequests {
			err = Permanent(err)
		}
		return HTTPOutput{}, err
	}
	if tooLarge {
		// The same URL will most likely answer as much again.
		return HTTPOutput{}, Permanent(fmt.Errorf("%s: %s: response body larger than %d MiB",
			target, resp.Status, httpMaxBody>>20))
	}

	out := HTTPOutput{
		Status:  resp.StatusCode,
		Headers: make(map[string]string, len(resp.Header)),
		Body:    textBody(body, resp.Header.Get("Content-Type")),
	}
	for k, v := range resp.Header {
		if len(v) > 0 {
			out.Headers[k] = v[0]
		}
	}
	if isJSONContentType(resp.Header.Get("Content-Type")) && json.Valid(body) {
		out.Body = json.RawMessage(body)
	}
	return out, nil
}

// loggableURL is the URL as the step's logs show it: without user
// information, and with the value of every query parameter hidden, since
// tokens and keys often travel there.
func loggableURL(u *url.URL) string {
	c := *u
	c.User = nil
	c.Fragment, c.RawFragment = "", ""
	if c.RawQuery != "" {
		q := c.Query()
		for k := range q {
			q[k] = []string{"xxxxx"}
		}
		c.RawQuery = q.Encode()
	}
	return c.String()
}

// newHTTPRequest validates in and builds the request it describes.
func newHTTPRequest(ctx context.Context, in HTTPInput) (*http.Request, time.Duration, error) {
	if in.URL == "" {
		return nil, 0, errors.New("url is required")
	}
	u, err := url.Parse(in.URL)
	if err != nil {
		// url.Error repeats the whole URL, credentials and all: keep
		// only what is wrong with it.
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err
		}
		return nil, 0, fmt.Errorf("invalid url: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, 0, fmt.Errorf("url %q: scheme must be http or https", loggableURL(u))
	}
	if u.Host == "" {
		return nil, 0, fmt.Errorf("url %q has no host", loggableURL(u))
	}

	timeout := httpDefaultTimeout
	if in.Timeout != "" {
		timeout, err = time.ParseDuration(in.Timeout)
		if err != nil {
			return nil, 0, fmt.Errorf("invalid timeout: %w", err)
		}
		if timeout <= 0 {
			return nil, 0, fmt.Errorf("timeout must be positive, got %q", in.Timeout)
		}
	}

	method := strings.ToUpper(cmp.Or(in.Method, http.MethodGet))

	var body io.Reader
	isJSONBody := false
	if !isNull(in.Body) {
		raw := bytes.TrimSpace(in.Body)
		if raw[0] == '"' {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, 0, fmt.Errorf("invalid body: %w", err)
			}
			body = strings.NewReader(s)
		} else {
			body = bytes.NewReader(raw)
			isJSONBody = true
		}
	}

	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, 0, err
	}
	for k, v := range in.Headers {
		// net/http refuses such a request only when it sends it, which
		// would make the bad input look like a network error worth a retry.
		if !httpguts.ValidHeaderFieldName(k) {
			return nil, 0, fmt.Errorf("header %q: invalid name: a header name is a token of letters, digits and !#$%%&'*+-.^_`|~", k)
		}
		if !httpguts.ValidHeaderFieldValue(v) {
			return nil, 0, fmt.Errorf("header %q: invalid value: it may not hold control characters such as a newline", k)
		}
		// net/http ignores a Host entry in Header; the field is what sets it.
		if strings.EqualFold(k, "Host") {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	if isJSONBody && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, timeout, nil
}

// textBody is a response body as text: decoded from the charset its
// Content-Type names, as browsers read them (ISO-8859-1, windows-1252,
// Shift_JIS...), or as it is, in UTF-8 or in no known charset. Bytes
// that are not UTF-8 would become U+FFFD in the stored output.
func textBody(body []byte, contentType string) string {
	_, params, err := mime.ParseMediaType(contentType)
	if err != nil || params["charset"] == "" {
		return string(body)
	}
	enc, err := htmlindex.Get(params["charset"])
	if err != nil {
		return string(body)
	}
	if name, _ := htmlindex.Name(enc); name == "utf-8" {
		return string(body)
	}
	text, err := enc.NewDecoder().Bytes(body)
	if err != nil {
		return string(body)
	}
	return string(text)
}

// errorSnippet returns ": " and the start of body for an error message, or ""
// for an empty body.
func errorSnippet(body []byte) string {
	cut := min(len(body), httpErrorSnippet)
	// A cut inside a character moves back to its start.
	for i := cut; i < len(body) && i > cut-utf8.UTFMax && i > 0; i-- {
		if utf8.RuneStart(body[i]) {
			cut = i
			break
		}
	}
	body = body[:cut]
	// One line of valid text: the error is printed on one line by the CLI,
	// and the body need not be UTF-8.
	s := strings.Join(strings.Fields(strings.ToValidUTF8(string(body), "\uFFFD")), " ")
	if s == "" {
		return ""
	}
	return ": " + s
}

func isJSONContentType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}
