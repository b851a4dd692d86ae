package web

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/storage"
)

// DefaultMaxBodyBytes bounds a request body when Config.MaxBodyBytes is
// zero: an input or a signal's payload at the engine's default limit, and
// room for the request's other fields, so that the engine's own check of
// the value (a 400 naming its limit) answers a value too large, not this.
const DefaultMaxBodyBytes = max(dagrun.DefaultMaxInputBytes, dagrun.DefaultMaxOutputBytes) + 64<<10

// healthTimeout bounds the store check of /healthz, so a hung database
// makes the probe fail instead of hang.
const healthTimeout = 3 * time.Second

// Config configures a Server. The zero value (or nil) serves without a
// token, logs nothing, and keeps its own metrics.
type Config struct {
	// Token, when set, is required on every route but /healthz: as a
	// bearer token, or as the cookie the web UI's sign-in page sets.
	// Default: none.
	Token string
	// Tokens are more accepted tokens, by name: what a request with one
	// does is recorded in the history as done by its name (Token's name is
	// "api"). Default: none.
	Tokens map[string]string
	// Logger receives request errors. Default: discard.
	Logger *slog.Logger
	// Metrics is served on /metrics. Pass the Metrics the engine was
	// created with (as its dagrun.Config.Observer) to get the engine's
	// counters; the store gauges are attached here. Default: a new Metrics
	// with only the store gauges and the Go and process collectors.
	Metrics *Metrics
	// MaxBodyBytes caps a request body; larger bodies get 413. Default:
	// DefaultMaxBodyBytes (1 MiB and 64 KiB).
	MaxBodyBytes int64
}

func (c *Config) withDefaults() *Config {
	out := *c
	out.Logger = cmp.Or(c.Logger, slog.New(slog.NewTextHandler(io.Discard, nil)))
	out.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, DefaultMaxBodyBytes)
	if out.Metrics == nil {
		out.Metrics = NewMetrics()
	}
	return &out
}

func (c *Config) validate() error {
	if c.MaxBodyBytes < 0 {
		return fmt.Errorf("web: MaxBodyBytes must not be negative, got %d", c.MaxBodyBytes)
	}
	for name, secret := range c.Tokens {
		if err := CheckTokenName(name); err != nil {
			return fmt.Errorf("web: %w", err)
		}
		if secret == "" {
			return fmt.Errorf("web: token %s has an empty secret", name)
		}
		if err := CheckTokenSecret(secret); err != nil {
			return fmt.Errorf("web: token %s: %w", name, err)
		}
	}
	if c.Token != "" {
		if err := CheckTokenSecret(c.Token); err != nil {
			return fmt.Errorf("web: %w", err)
		}
	}
	return nil
}

// Server serves the API, the UI and the metrics of one engine. It is an
// http.Handler; run it with an http.Server.
type Server struct {
	engine  *dagrun.Engine
	config  *Config
	logger  *slog.Logger
	metrics *Metrics
	mux     *http.ServeMux
	handler http.Handler
	tokens  []namedToken
	guesses *guessLimiter
	// apiRoutes are the patterns of every route but the UI's, which the
	// OpenAPI document must describe (see Routes).
	apiRoutes []string
}

// Routes returns the method and path pattern of every API route the
// server answers ("GET /api/instances/{id}"), the web UI's aside.
func (s *Server) Routes() []string { return slices.Clone(s.apiRoutes) }

var _ http.Handler = (*Server)(nil)

// NewServer returns a Server over engine.
func NewServer(engine *dagrun.Engine, config *Config) (*Server, error) {
	if engine == nil {
		return nil, errors.New("web: nil engine")
	}
	if config == nil {
		config = &Config{}
	}
	config = config.withDefaults()
	if err := config.validate(); err != nil {
		return nil, err
	}
	if err := config.Metrics.watchStore(engine.Store()); err != nil {
		return nil, err
	}
	s := &Server{
		engine:  engine,
		config:  config,
		logger:  config.Logger,
		metrics: config.Metrics,
		mux:     http.NewServeMux(),
		tokens:  config.tokens(),
		guesses: newGuessLimiter(),
	}
	s.routes()
	// Built inside out. A request meets, in order: panic recovery (a 500
	// instead of a dropped connection), the security headers (so even
	// refusals carry them), the loopback Host check, cross-origin
	// protection, the body cap, and only then the token check and routing.
	var h http.Handler = http.HandlerFunc(s.dispatch)
	h = s.limitBody(h)
	csrf := http.NewCrossOriginProtection()
	csrf.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusForbidden, "cross-origin request refused: use the API from the dagrun UI or a non-browser client")
	}))
	h = csrf.Handler(h)
	h = s.checkHost(h)
	h = securityHeaders(h)
	s.handler = s.recoverPanics(h)
	return s, nil
}

func (s *Server) routes() {
	api := func(pattern string, h http.HandlerFunc) {
		s.apiRoutes = append(s.apiRoutes, pattern)
		s.mux.Handle(pattern, h)
	}
	api("GET /api/workflows", s.listWorkflows)
	api("GET /api/workflows/{name}", s.getWorkflow)
	api("POST /api/workflows/{name}/instances", s.startInstance)
	api("GET /api/instances", s.listInstances)
	api("GET /api/instances/{id}", s.getInstance)
	api("GET /api/instances/{id}/definition", s.getInstanceDefinition)
	api("GET /api/instances/{id}/steps/{step}/items", s.listItems)
	api("GET /api/instances/{id}/events", s.listEvents)
	api("GET /api/instances/{id}/logs", s.listLogs)
	api("GET /api/instances/{id}/steps/{step}/logs", s.listLogs)
	api("POST /api/instances/{id}/cancel", s.cancelInstance)
	api("POST /api/instances/{id}/retry", s.retryInstance)
	s.operationRoutes(api)
	api("POST /api/instances/{id}/signals/{name}", s.sendSignal)
	api("POST /api/workflows/{name}/signals/{signal}", s.sendSignalByKey)
	api("GET /api/schedules", s.listSchedules)
	api("POST /api/schedules/{workflow}/{index}/pause", s.pauseSchedule)
	api("POST /api/schedules/{workflow}/{index}/resume", s.resumeSchedule)
	api("GET /api/queues", s.listQueues)
	api("POST /api/queues/{name}", s.setQueueLimit)
	s.mux.Handle("GET /metrics", s.metrics.handler(s.logger))
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("GET /api/openapi.json", s.serveOpenAPI)
	s.apiRoutes = append(s.apiRoutes, "GET /metrics", "GET /healthz", "GET /api/openapi.json")
	s.uiRoutes()
	s.loginRoutes()
}

// openRoutes need no token: the health probe, for load balancers, and the
// web UI's sign-in, which is where a browser gives the token.
var openRoutes = []string{"GET /healthz", "POST /ui/login"}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.handler.ServeHTTP(w, r)
}

// dispatch checks the token and routes a request, answering unknown routes
// and wrong methods with JSON errors instead of the mux's plain text. The
// check is here rather than on each route so that no route can be added
// without it; unknown routes need the token too, so they reveal nothing to
// a caller without it.
func (s *Server) dispatch(w http.ResponseWriter, r *http.Request) {
	var h http.Handler = s.mux
	_, pattern := s.mux.Handler(r)
	if pattern == "" {
		h = http.HandlerFunc(s.noRoute)
	}
	query, err := url.ParseQuery(r.URL.RawQuery)
	switch {
	case err != nil && pattern != "":
		// r.URL.Query drops the pairs it cannot read (a ";" separator,
		// a bad escape) and a filter would silently not apply.
		h = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			writeError(w, http.StatusBadRequest, "invalid query string: "+err.Error()+": separate parameters with & and escape the rest")
		})
	case strings.HasPrefix(pattern, "GET /api/"):
		// Every parameter of the API takes one value, and the first of
		// two would apply alone: ?status=completed&status=failed listed
		// the completed ones as if that were all asked for.
		if name, n := repeatedParam(query); n > 1 {
			h = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("query parameter %q is given %d times: give it once", name, n))
			})
		}
	}
	if !slices.Contains(openRoutes, pattern) {
		h = s.requireToken(h)
	}
	h.ServeHTTP(w, r)
}

// repeatedParam returns a parameter given more than once (the first by
// name) and how often, or "", 0.
func repeatedParam(query url.Values) (string, int) {
	for _, name := range slices.Sorted(maps.Keys(query)) {
		if n := len(query[name]); n > 1 {
			return name, n
		}
	}
	return "", 0
}

func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	var allowed []string
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "" && !slices.Contains(postOnlyReads, pattern) {
			allowed = append(allowed, m)
		}
	}
	if len(allowed) > 0 {
		if slices.Contains(allowed, http.MethodGet) {
			allowed = append(allowed, http.MethodHead)
		}
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allowed, ", ")))
		return
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("no route %s %s", r.Method, r.URL.Path))
}

// contentSecurityPolicy lets a page load only this server's files; the
// sign-in page adds its inline style (loginCSP).
const contentSecurityPolicy = "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// securityHeaders sets headers that make the browser treat every response
// as what it says it is and load nothing from elsewhere.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		next.ServeHTTP(w, r)
	})
}

// limitBody caps request bodies. A declared length over the cap is refused
// before anything is read; a body that grows past it fails its read, which
// the handlers turn into 413.
func (s *Server) limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > s.config.MaxBodyBytes {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is %d bytes, over the limit of %d bytes", r.ContentLength, s.config.MaxBodyBytes))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.config.MaxBodyBytes)
		next.ServeHTTP(w, r)
	})
}

func (s *Server) recoverPanics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.logger.ErrorContext(r.Context(), "web: panic serving request", slog.String("method", r.Method),
					slog.String("path", r.URL.Path), slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
				writeError(w, http.StatusInternalServerError, "internal server error; see the server log")
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// healthz reports whether the store answers a cheap query. It needs no
// token, so with a token set its answer names nothing about the database:
// a driver's error names the host, the user and the database, which only
// the server log may show.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
	defer cancel()
	if _, err := s.engine.Store().ListInstances(ctx, storage.ListParams{Limit: 1}); err != nil {
		s.logger.WarnContext(r.Context(), "web: health check failed", slog.Any("error", err))
		msg := "storage unavailable; see the server log"
		if !s.protected() {
			msg = "storage does not answer: " + err.Error()
		}
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "error": msg})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// writeJSON writes v as the response. encoding/json escapes <, > and & in
// strings, so even a response a browser wrongly sniffs holds no markup.
func writeJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// errorBody is every error response.
type errorBody struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorBody{Error: msg})
}
