package view

import (
	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/storage"
)

// Queue is one queue of `dagrun queues --json` and of GET /api/queues.
// Field names and shapes are part of the public contract.
type Queue struct {
	Queue string `json:"queue"`
	// Depth counts the steps waiting to run: pending and due, held ones
	// included.
	Depth int `json:"depth"`
	// Ready is Depth under the name the first release gave it.
	Ready int `json:"ready"`
	// Held counts the ready steps a concurrency limit holds back.
	Held    int `json:"held"`
	Running int `json:"running"`
	// Scheduled counts the pending steps not due yet (a delayed start, a
	// retry's backoff, a start the queue's rate spaced out), which are
	// not in Depth.
	Scheduled int `json:"scheduled"`
	// OldestWaitSeconds is how long the oldest ready step has waited.
	OldestWaitSeconds float64 `json:"oldestWaitSeconds"`
	// Concurrency is the most steps of the queue running at once; 0 means
	// no limit.
	Concurrency int `json:"concurrency"`
	// Rate is the most steps started per period; null means no limit.
	Rate *Rate `json:"rate"`
}

// Rate is a queue's rate limit: Count starts per Per (a Go duration).
type Rate struct {
	Count int    `json:"count"`
	Per   string `json:"per"`
}

// NewQueues converts the engine's queue list to its public shape.
func NewQueues(list []dagrun.QueueInfo) []Queue {
	out := make([]Queue, len(list))
	for i, q := range list {
		out[i] = Queue{
			Queue:             q.Queue,
			Depth:             q.Ready,
			Ready:             q.Ready,
			Held:              q.Held,
			Running:           q.Running,
			Scheduled:         q.Scheduled,
			OldestWaitSeconds: q.OldestWait.Seconds(),
			Concurrency:       q.Concurrency,
		}
		if q.Rate > 0 {
			out[i].Rate = &Rate{Count: q.Rate, Per: storage.FormatDuration(q.Per)}
		}
	}
	return out
}
