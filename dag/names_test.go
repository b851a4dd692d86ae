package dag

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestIsName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"order-processing", true},
		{"a", true},
		{"v1.2_x-y", true},
		{"0ad", true},
		{strings.Repeat("a", 128), true},
		{strings.Repeat("a", 129), false},
		{"", false},
		{"-leading", false},
		{".leading", false},
		{"Upper", false},
		{"with space", false},
		{"trailing\n", false},
		{"ünïcode", false},
	} {
		require.Equal(t, tc.ok, isName(tc.name), "%q", tc.name)
	}
}
