package app

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGCPercent(t *testing.T) {
	tests := []struct {
		name    string
		gogc    string
		percent int
		set     bool
	}{
		{name: "unset", gogc: "", percent: defaultGCPercent, set: true},
		{name: "a number", gogc: "50", set: false},
		{name: "off", gogc: "off", set: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			percent, set := gcPercent(func(name string) string {
				if name == "GOGC" {
					return tt.gogc
				}
				return ""
			})
			require.Equal(t, tt.set, set)
			require.Equal(t, tt.percent, percent)
		})
	}
}
