package dagrun

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type logValuer struct{}

func (logValuer) LogValue() slog.Value {
	return slog.GroupValue(slog.String("resolved", "yes"), slog.Int("n", 3))
}

type marshalingError struct{}

func (marshalingError) Error() string                { return "as an error" }
func (marshalingError) MarshalJSON() ([]byte, error) { return []byte(`{"as":"json"}`), nil }

// TestAttrsJSONMatchesSlog: a record's attributes are stored exactly as
// slog's own JSON handler writes them, whatever the logger was built from,
// but for durations, stored as text the way its text handler writes them.
func TestAttrsJSONMatchesSlog(t *testing.T) {
	t.Parallel()
	when := time.Date(2026, 11, 30, 16, 4, 5, 123456789, time.FixedZone("x", 3600))
	cases := []struct {
		name  string
		build func(*slog.Logger) *slog.Logger
		args  []any
	}{
		{"no attributes", nil, nil},
		{"kinds", nil, []any{
			slog.String("s", "text"), slog.Int("i", -3), slog.Uint64("u", math.MaxUint64), slog.Bool("b", true),
			slog.Float64("f", 1.5e21), slog.Float64("nan", math.NaN()), slog.Duration("d", 1500*time.Millisecond), slog.Duration("µs", 2500*time.Nanosecond),
			slog.Time("t", when), slog.Any("err", errors.New("boom")), slog.Any("jm", marshalingError{}),
			slog.Any("map", map[string]int{"a": 1}), slog.Any("nil", nil), slog.Any("bytes", []byte("hi")),
			slog.Any("valuer", logValuer{}), slog.Any("chan", make(chan int)),
		}},
		{"escaping", nil, []any{
			slog.String("q\"k\\", "line\nfeed\r\ttab \x01 <html> & \u2028\u2029 é 日本 \xff"),
		}},
		{"top-level built-in keys left out", nil, []any{"time", 1, "level", 2, "msg", 3, "kept", 4}},
		{"built-in keys kept inside groups", nil, []any{slog.Group("g", "time", 1, "msg", 2)}},
		{"empty attribute and empty group left out", nil, []any{slog.Attr{}, slog.Group("g"), "x", 1}},
		{"inline group", nil, []any{slog.Group("", "a", 1, "b", 2), "c", 3}},
		{"nested groups", nil, []any{slog.Group("a", slog.Group("b", "c", 1), slog.Group("empty"), "d", 2)}},
		{"with", func(l *slog.Logger) *slog.Logger { return l.With("a", 1, "b", "two") }, []any{"c", 3}},
		{"with, record empty", func(l *slog.Logger) *slog.Logger { return l.With("a", 1) }, nil},
		{"group, with, record", func(l *slog.Logger) *slog.Logger { return l.WithGroup("g").With("a", 1) }, []any{"b", 2}},
		{"group without attributes left out", func(l *slog.Logger) *slog.Logger { return l.With("a", 1).WithGroup("g") }, nil},
		{"group opened by the record", func(l *slog.Logger) *slog.Logger { return l.With("a", 1).WithGroup("g") }, []any{"b", 2}},
		{"groups in groups", func(l *slog.Logger) *slog.Logger {
			return l.WithGroup("g").With("a", 1).WithGroup("h").WithGroup("i").With("b", 2).WithGroup("j")
		}, []any{"c", 3}},
		{"only empty attributes after a group", func(l *slog.Logger) *slog.Logger { return l.WithGroup("g") }, []any{slog.Group("e")}},
		{"with empty", func(l *slog.Logger) *slog.Logger { return l.With(slog.Group("e")).WithGroup("g") }, []any{"a", 1}},
		{"group, with empty, record empty", func(l *slog.Logger) *slog.Logger { return l.WithGroup("g").With(slog.Group("e")) }, nil},
		{"top-level keys in with", func(l *slog.Logger) *slog.Logger { return l.With("msg", "x", "k", 1) }, []any{"level", 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var want bytes.Buffer
			wantLog := slog.New(slog.NewJSONHandler(&want, &slog.HandlerOptions{
				ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
					if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey || a.Key == slog.MessageKey) {
						return slog.Attr{}
					}
					if a.Value.Kind() == slog.KindDuration {
						return slog.String(a.Key, a.Value.Duration().String())
					}
					return a
				},
			}))
			al := &attemptLog{writer: &logWriter{limit: DefaultStepLogBytes}}
			al.handler = logHandler{log: al, attrs: newAttrsJSON()}
			al.queued = true // not on a writer's list
			gotLog := slog.New(&al.handler)
			if tc.build != nil {
				wantLog, gotLog = tc.build(wantLog), tc.build(gotLog)
			}
			wantLog.Log(context.Background(), slog.LevelInfo, "m", tc.args...)
			gotLog.Log(context.Background(), slog.LevelInfo, "m", tc.args...)
			require.Len(t, al.pending, 1)
			wantJSON := string(bytes.TrimSpace(want.Bytes()))
			if wantJSON == "{}" {
				require.Nil(t, al.pending[0].Attrs)
				return
			}
			require.Equal(t, wantJSON, string(al.pending[0].Attrs))
		})
	}
}
