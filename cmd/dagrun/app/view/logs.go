package view

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// Bounds of one page of step logs.
const (
	DefaultLogLimit = 1000
	MaxLogLimit     = 10000
)

// LogRecord is a step log record's public JSON shape.
type LogRecord struct {
	Seq  int64  `json:"seq"`
	Step string `json:"step"`
	// Item is the item's index for an item of a forEach step, absent for
	// the step itself.
	Item    *int            `json:"item,omitempty"`
	Attempt int             `json:"attempt"`
	Time    time.Time       `json:"time"`
	Level   string          `json:"level"`
	Message string          `json:"message"`
	Attrs   json.RawMessage `json:"attrs,omitempty"`
}

// NewLogRecords returns records in their public shape.
func NewLogRecords(rs []storage.LogRecord) []LogRecord {
	out := make([]LogRecord, len(rs))
	for i, r := range rs {
		out[i] = LogRecord{Seq: r.Seq, Step: r.Step, Attempt: r.Attempt, Time: r.Time, Level: r.Level, Message: r.Message, Attrs: r.Attrs}
		if r.Item >= 0 {
			item := r.Item
			out[i].Item = &item
		}
	}
	return out
}

// LoadLogs reads a page of an instance's logs, of one step when step is
// set: storage.ErrNotFound when the instance does not exist,
// *StepNotFoundError when it has no such step. It returns the instance
// too, for a follower to tell when it finished.
func LoadLogs(ctx context.Context, store storage.Store, id, step string, after int64, limit int) (*storage.Instance, []storage.LogRecord, error) {
	inst, err := store.GetInstance(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if step != "" {
		names := make([]string, len(inst.Steps))
		found := false
		for i, s := range inst.Steps {
			names[i] = s.Name
			found = found || s.Name == step
		}
		if !found {
			return nil, nil, &StepNotFoundError{Instance: id, Step: step, Steps: names}
		}
	}
	records, err := store.ListLogs(ctx, storage.LogsParams{InstanceID: id, Step: step, AfterSeq: after, Limit: limit})
	return inst, records, err
}

// CheckLogPaging validates an after and a limit from outside; prefix is
// how the caller names its parameters ("--" for flags).
func CheckLogPaging(after int64, limit int, prefix string) error {
	return checkPaging(after, limit, MaxLogLimit, prefix)
}

// WriteLogLine prints one record as a line: time, level, step#attempt
// (with [item]), message, then the attributes as key=value, groups dotted.
func WriteLogLine(w io.Writer, r storage.LogRecord) error {
	where := r.Step
	if r.Item >= 0 {
		where += "[" + strconv.Itoa(r.Item) + "]"
	}
	where += "#" + strconv.Itoa(r.Attempt)
	var b strings.Builder
	fmt.Fprintf(&b, "%s %-5s %s %s", r.Time.UTC().Format("2006-01-02T15:04:05.000Z"), r.Level, where, oneLineText(r.Message))
	if members, ok := ObjectMembers(r.Attrs); ok {
		writeAttrs(&b, "", members)
	}
	b.WriteByte('\n')
	_, err := io.WriteString(w, b.String())
	return err
}

// Member is a name of a JSON object and its value.
type Member struct {
	Name  string
	Value json.RawMessage
}

// ObjectMembers returns the members of a JSON object in the order it
// writes them, a name given twice twice (a log record's attributes as the
// handler logged them, a request's fields as the client sent them, which a
// map would lose); ok is false for anything but an object.
func ObjectMembers(raw []byte) (members []Member, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	for dec.More() {
		tok, err := dec.Token()
		key, isKey := tok.(string)
		if err != nil || !isKey {
			return nil, false
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, false
		}
		members = append(members, Member{key, value})
	}
	return members, true
}

func writeAttrs(b *strings.Builder, prefix string, members []Member) {
	for _, m := range members {
		v := bytes.TrimSpace(m.Value)
		if group, ok := ObjectMembers(v); ok {
			writeAttrs(b, prefix+m.Name+".", group)
			continue
		}
		var s string
		if len(v) > 0 && v[0] == '"' && json.Unmarshal(v, &s) == nil {
			if s == "" || strings.ContainsAny(s, " \t\n\"=") {
				s = strconv.Quote(s)
			}
		} else {
			s = string(v)
		}
		b.WriteString(" " + prefix + m.Name + "=" + s)
	}
}

// oneLineText keeps a message on its line: a log line per record.
func oneLineText(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(s)
}
