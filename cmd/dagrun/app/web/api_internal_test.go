package web

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFieldNamesOfAnEmbeddedStruct: a request type's embedded struct
// lends its fields, as encoding/json promotes them.
func TestFieldNamesOfAnEmbeddedStruct(t *testing.T) {
	type inner struct {
		Key string `json:"key"`
	}
	type request struct {
		inner
		Data  string `json:"data"`
		Skip  string `json:"-"`
		Plain string
	}
	require.Equal(t, map[string]bool{"key": true, "data": true, "Plain": true}, fieldNames(reflect.TypeOf(&request{})))
	require.NoError(t, checkFieldNames([]byte(`{"key": "k", "data": "d"}`), &request{}))
	require.EqualError(t, checkFieldNames([]byte(`{"Key": "k"}`), &request{}), `unknown field "Key"`)
}
