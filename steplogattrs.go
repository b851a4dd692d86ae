package dagrun

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strconv"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// attrsJSON renders slog attributes as one JSON object, as slog's own
// JSON handler renders them (same keys, values, groups and escaping), but
// into a buffer the caller reuses: an attempt's records cost no handler of
// their own and no allocation beyond the bytes kept. What the attributes of
// With and the groups of WithGroup add is rendered once, when they are
// added, as the handler's prefix.
type attrsJSON struct {
	// prefix is what With and WithGroup added, rendered: the inside of
	// the top-level object, with open groups that hold attributes.
	prefix []byte
	// open is how many groups prefix leaves open.
	open int
	// empty reports whether the innermost open level of prefix holds no
	// attribute yet, so the next one needs no comma before it.
	empty bool
	// groups are opened by WithGroup but hold no attribute yet: slog
	// leaves out a group without attributes, so they are rendered only
	// when one comes.
	groups []string
}

func newAttrsJSON() attrsJSON { return attrsJSON{empty: true} }

// withAttrs returns the renderer with attrs added to every record.
func (a attrsJSON) withAttrs(attrs []slog.Attr) attrsJSON {
	if !anyShown(attrs) {
		return a
	}
	out := attrsJSON{prefix: bytes.Clone(a.prefix), open: a.open, empty: a.empty}
	buf, empty := out.openGroups(out.prefix, a.groups, out.empty)
	out.open += len(a.groups)
	for _, at := range attrs {
		buf, empty = appendAttr(buf, at, empty, out.open == 0)
	}
	out.prefix, out.empty = buf, empty
	return out
}

// withGroup returns the renderer with the attributes that come after it
// in group name.
func (a attrsJSON) withGroup(name string) attrsJSON {
	out := a
	out.groups = append(a.groups[:len(a.groups):len(a.groups)], name)
	return out
}

// render appends to buf the JSON object of r's attributes under the
// renderer's prefix and groups.
func (a attrsJSON) render(buf []byte, r slog.Record) []byte {
	buf = append(buf, '{')
	buf = append(buf, a.prefix...)
	open, empty := a.open, a.empty
	if r.NumAttrs() > 0 {
		var shown bool
		r.Attrs(func(at slog.Attr) bool {
			shown = shownAttr(at)
			return !shown
		})
		if shown {
			buf, empty = a.openGroups(buf, a.groups, empty)
			open += len(a.groups)
			r.Attrs(func(at slog.Attr) bool {
				buf, empty = appendAttr(buf, at, empty, open == 0)
				return true
			})
		}
	}
	for range open {
		buf = append(buf, '}')
	}
	return append(buf, '}')
}

func (a attrsJSON) openGroups(buf []byte, groups []string, empty bool) ([]byte, bool) {
	for _, g := range groups {
		if !empty {
			buf = append(buf, ',')
		}
		buf = storage.AppendJSONString(buf, g)
		buf = append(buf, ':', '{')
		empty = true
	}
	return buf, empty
}

// anyShown reports whether rendering attrs writes anything.
func anyShown(attrs []slog.Attr) bool {
	for _, at := range attrs {
		if shownAttr(at) {
			return true
		}
	}
	return false
}

// shownAttr reports whether slog's JSON handler writes at: not an empty
// attribute, nor a group without attributes.
func shownAttr(at slog.Attr) bool {
	at.Value = at.Value.Resolve()
	if at.Value.Kind() == slog.KindGroup {
		return anyShown(at.Value.Group())
	}
	return !at.Equal(slog.Attr{})
}

// appendAttr appends at after a comma unless the level is empty, and
// reports whether the level is still empty. At the top level, attributes
// named time, level or msg are left out: a record stores those in columns
// of its own.
func appendAttr(buf []byte, at slog.Attr, empty, top bool) ([]byte, bool) {
	at.Value = at.Value.Resolve()
	if at.Value.Kind() == slog.KindGroup {
		members := at.Value.Group()
		if !anyShown(members) {
			return buf, empty
		}
		if at.Key == "" {
			for _, m := range members {
				buf, empty = appendAttr(buf, m, empty, top)
			}
			return buf, empty
		}
		if !empty {
			buf = append(buf, ',')
		}
		buf = storage.AppendJSONString(buf, at.Key)
		buf = append(buf, ':', '{')
		inner := true
		for _, m := range members {
			buf, inner = appendAttr(buf, m, inner, false)
		}
		return append(buf, '}'), false
	}
	if at.Equal(slog.Attr{}) || top && (at.Key == slog.TimeKey || at.Key == slog.LevelKey || at.Key == slog.MessageKey) {
		return buf, empty
	}
	if !empty {
		buf = append(buf, ',')
	}
	buf = storage.AppendJSONString(buf, at.Key)
	buf = append(buf, ':')
	return appendJSONValue(buf, at.Value), false
}

// appendJSONValue writes v as slog's JSON handler does: durations in
// nanoseconds, times as RFC 3339, errors as their
// message, anything else through encoding/json (or, when that fails, the
// error slog would write).
func appendJSONValue(buf []byte, v slog.Value) []byte {
	switch v.Kind() {
	case slog.KindString:
		return storage.AppendJSONString(buf, v.String())
	case slog.KindInt64:
		return strconv.AppendInt(buf, v.Int64(), 10)
	case slog.KindUint64:
		return strconv.AppendUint(buf, v.Uint64(), 10)
	case slog.KindBool:
		return strconv.AppendBool(buf, v.Bool())
	case slog.KindDuration:
		// As text ("1.5s"), as slog's text handler writes it: read in
		// `dagrun logs` and the UI, nanoseconds are a number to count
		// digits of. time.ParseDuration reads it back.
		return storage.AppendJSONString(buf, v.Duration().String())
	case slog.KindTime:
		buf = append(buf, '"')
		buf = v.Time().AppendFormat(buf, time.RFC3339Nano)
		return append(buf, '"')
	case slog.KindFloat64:
		return appendJSONMarshal(buf, v.Float64())
	default:
		a := v.Any()
		if err, ok := a.(error); ok {
			if _, marshals := a.(json.Marshaler); !marshals {
				return storage.AppendJSONString(buf, err.Error())
			}
		}
		return appendJSONMarshal(buf, a)
	}
}

func appendJSONMarshal(buf []byte, v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return storage.AppendJSONString(buf, "!ERROR:"+err.Error())
	}
	return append(buf, bytes.TrimRight(b.Bytes(), "\n")...)
}
