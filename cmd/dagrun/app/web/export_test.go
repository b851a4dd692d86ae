package web

import (
	"time"

	dto "github.com/prometheus/client_model/go"
)

// Test access to single series.

func InstancesFinished(m *Metrics, workflow, status string) float64 {
	var out dto.Metric
	_ = m.finished.WithLabelValues(workflow, status).Write(&out)
	return out.GetCounter().GetValue()
}

func StepAttempts(m *Metrics, handler, outcome string) float64 {
	var out dto.Metric
	_ = m.attempts.WithLabelValues(handler, outcome).Write(&out)
	return out.GetCounter().GetValue()
}

// SetGuessLimit replaces s's bound on wrong tokens: burst at once per
// address and one more every every, on the clock now.
func SetGuessLimit(s *Server, burst int, every time.Duration, now func() time.Time) {
	g := newGuessLimiter()
	g.burst, g.every, g.now = burst, every, now
	s.guesses = g
}
