package storage

import (
	"slices"
	"strings"
	"time"
)

// StatsBuilder accumulates the rows of a backend's aggregate queries into a
// Stats, so that each backend writes only its own SQL. The zero value is
// ready to use; call Reset before reusing it on a retried transaction.
type StatsBuilder struct {
	workflows map[string]*WorkflowStats
	queues    map[string]*QueueStats
	unserved  map[string]*HandlerStats
}

// Reset forgets everything added so far.
func (b *StatsBuilder) Reset() {
	clear(b.workflows)
	clear(b.queues)
	clear(b.unserved)
}

func (b *StatsBuilder) workflow(name string) *WorkflowStats {
	if b.workflows == nil {
		b.workflows = map[string]*WorkflowStats{}
	}
	w := b.workflows[name]
	if w == nil {
		w = &WorkflowStats{Workflow: name, Instances: map[InstanceStatus]int{}}
		b.workflows[name] = w
	}
	return w
}

func (b *StatsBuilder) queue(name string) *QueueStats {
	if b.queues == nil {
		b.queues = map[string]*QueueStats{}
	}
	q := b.queues[name]
	if q == nil {
		q = &QueueStats{Queue: name}
		b.queues[name] = q
	}
	return q
}

// Instances records n instances of workflow in status.
func (b *StatsBuilder) Instances(workflow string, status InstanceStatus, n int) {
	b.workflow(workflow).Instances[status] = n
}

// Running records running steps of workflow on queue, stuck of them past
// their lease.
func (b *StatsBuilder) Running(workflow, queue string, running, stuck int) {
	w, q := b.workflow(workflow), b.queue(queue)
	w.RunningSteps += running
	w.StuckSteps += stuck
	q.Running += running
	q.Stuck += stuck
}

// Ready records ready steps of workflow on queue, the oldest ready for age.
func (b *StatsBuilder) Ready(workflow, queue string, ready int, age time.Duration) {
	w := b.workflow(workflow)
	w.ReadySteps += ready
	w.OldestReady = max(w.OldestReady, age)
	b.queue(queue).Ready += ready
}

// Waiting adds n waiting steps of workflow.
func (b *StatsBuilder) Waiting(workflow string, n int) {
	b.workflow(workflow).WaitingSteps += n
}

// Unserved records ready steps of handler that no live worker can claim,
// the oldest ready for age; rows of one handler (say one per queue) add up.
func (b *StatsBuilder) Unserved(handler string, ready int, age time.Duration) {
	if b.unserved == nil {
		b.unserved = map[string]*HandlerStats{}
	}
	h := b.unserved[handler]
	if h == nil {
		h = &HandlerStats{Handler: handler}
		b.unserved[handler] = h
	}
	h.Ready += ready
	h.OldestReady = max(h.OldestReady, age)
}

// Durations records the completed-attempt percentiles of workflow.
func (b *StatsBuilder) Durations(workflow string, p50, p95 time.Duration) {
	w := b.workflow(workflow)
	w.StepP50, w.StepP95 = p50, p95
}

// Stats returns the figures, workflows and queues sorted by name.
func (b *StatsBuilder) Stats() *Stats {
	st := &Stats{Workflows: make([]WorkflowStats, 0, len(b.workflows)), Queues: make([]QueueStats, 0, len(b.queues))}
	for _, w := range b.workflows {
		st.Workflows = append(st.Workflows, *w)
	}
	slices.SortFunc(st.Workflows, func(x, y WorkflowStats) int { return strings.Compare(x.Workflow, y.Workflow) })
	for _, q := range b.queues {
		st.Queues = append(st.Queues, *q)
	}
	slices.SortFunc(st.Queues, func(x, y QueueStats) int { return strings.Compare(x.Queue, y.Queue) })
	for _, h := range b.unserved {
		st.Unserved = append(st.Unserved, *h)
	}
	slices.SortFunc(st.Unserved, func(x, y HandlerStats) int { return strings.Compare(x.Handler, y.Handler) })
	return st
}
