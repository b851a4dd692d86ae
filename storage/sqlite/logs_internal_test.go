package sqlite

import (
	"encoding/json"
	"testing"

	"github.com/dagrun/dagrun/storage"
)

// TestLogsOfCompletion: a completion's event carries only its own attempt's
// records, and only when every one of them can be packed as JSON.
func TestLogsOfCompletion(t *testing.T) {
	own := storage.LogRecord{InstanceID: "i", Step: "a", Item: -1, Attempt: 2, Level: "INFO", Message: "m", Attrs: json.RawMessage(`{"k":1}`)}
	with := func(change func(r *storage.LogRecord)) []storage.LogRecord {
		r := own
		change(&r)
		return []storage.LogRecord{own, r}
	}
	tests := []struct {
		name    string
		records []storage.LogRecord
		want    bool
	}{
		{"the attempt's own", with(func(*storage.LogRecord) {}), true},
		{"none", nil, false},
		{"another instance's", with(func(r *storage.LogRecord) { r.InstanceID = "j" }), false},
		{"another step's", with(func(r *storage.LogRecord) { r.Step = "b" }), false},
		{"an item's", with(func(r *storage.LogRecord) { r.Item = 0 }), false},
		{"another attempt's", with(func(r *storage.LogRecord) { r.Attempt = 1 }), false},
		{"attributes that are not JSON", with(func(r *storage.LogRecord) { r.Attrs = json.RawMessage(`{"k":`) }), false},
		{"no attributes", with(func(r *storage.LogRecord) { r.Attrs = nil }), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := logsOfCompletion(tt.records, "i", "a", 2); got != tt.want {
				t.Errorf("logsOfCompletion = %v, want %v", got, tt.want)
			}
		})
	}
}
