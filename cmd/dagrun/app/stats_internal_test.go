package app

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// TestStepP50OfZeroIsAFigure: the store gives zero for both percentiles
// when no attempt completed; a zero p50 beside a p95 is measured (wait
// steps whose signal came first complete in no time) and is shown as 0,
// not as the "-" and null of no figure.
func TestStepP50OfZeroIsAFigure(t *testing.T) {
	t.Parallel()
	zero, three := 0.0, 3000.0
	for _, tc := range []struct {
		p50, p95  time.Duration
		text      string
		json, j95 *float64
	}{
		{0, 3 * time.Second, "0s", &zero, &three},
		{0, 0, "-", nil, nil},
	} {
		w := storage.WorkflowStats{Workflow: "w", StepP50: tc.p50, StepP95: tc.p95}
		require.Equal(t, tc.text, p50OrDash(w))
		got := newStatsJSON(&storage.Stats{Workflows: []storage.WorkflowStats{w}}).Workflows[0]
		require.Equal(t, tc.json, got.StepP50Ms)
		require.Equal(t, tc.j95, got.StepP95Ms)
	}
}
