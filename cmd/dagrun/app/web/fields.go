package web

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
)

// checkFieldNames refuses a request object whose member names the request
// type v does not spell exactly, or that names one member twice.
// encoding/json matches names regardless of case and keeps the last of
// two, so {"KEY": ...} would set key and {"key": 1, "key": 2} would say 2
// without a word; a client with such a typo must hear of it, as of any
// unknown field. Only the top level is checked: what is inside input, data
// or output is the user's own JSON.
func checkFieldNames(data []byte, v any) error {
	members, ok := view.ObjectMembers(data)
	if !ok {
		return nil // not an object: decoding it says what is wrong
	}
	known := fieldNames(reflect.TypeOf(v))
	seen := map[string]bool{}
	for _, m := range members {
		switch {
		case seen[m.Name]:
			return fmt.Errorf("field %q appears twice", m.Name)
		case known != nil && !known[m.Name]:
			return fmt.Errorf("unknown field %q", m.Name)
		}
		seen[m.Name] = true
	}
	return nil
}

// fieldNames lists the JSON member names of the struct t points to, as
// its fields' json tags spell them; nil for a type that is no struct.
func fieldNames(t reflect.Type) map[string]bool {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	names := map[string]bool{}
	for f := range t.Fields() {
		if !f.IsExported() && !f.Anonymous {
			continue // an embedded struct of an unexported type lends its fields all the same
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-":
			continue
		case name == "" && f.Anonymous:
			// An embedded struct's fields are the object's own.
			if inner := fieldNames(f.Type); inner != nil {
				for n := range inner {
					names[n] = true
				}
				continue
			}
			name = f.Name
		case name == "":
			name = f.Name
		}
		names[name] = true
	}
	return names
}
