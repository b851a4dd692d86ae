package web

import dto "github.com/prometheus/client_model/go"

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
