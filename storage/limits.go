package storage

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// HeldUntil is the run_after of a held step: a step that is ready but may
// not run yet because a concurrency limit is full (its instance's, its
// step name's key, or its queue's). It stays pending, so every path that
// cancels or finishes pending steps handles it, but no claim takes it (its
// run_after never passes) and NextWake ignores it. The store releases it
// in claim order (highest priority first, then oldest) in the transaction
// that frees a slot for it.
//
// Limits are decided when state changes, never inside a claim: a step
// holds a slot of its limits from the moment it is pending and not held
// until it finishes (a retry, a release or a lost lease keep the slot), and
// the claim itself stays the plain index walk it is without limits.
var HeldUntil = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// MaxConcurrencyKeyBytes bounds a concurrency key's value: the stores index
// it with the workflow and step names.
const MaxConcurrencyKeyBytes = MaxKeyBytes

// MaxQueueLimit bounds a queue's concurrency and the count of its rate.
const MaxQueueLimit = 1_000_000

// QueueLimit is the limits of one queue, shared by every worker: at most
// Concurrency of its steps running at once (0: no limit), and at most Rate
// steps started per Per (Rate 0: no limit).
type QueueLimit struct {
	Queue       string
	Concurrency int
	Rate        int
	Per         time.Duration
}

// Check reports what is wrong with the limit, in one line.
func (l QueueLimit) Check() error {
	if l.Queue == "" {
		return fmt.Errorf("the queue name is empty")
	}
	if err := CheckText(l.Queue, MaxIDBytes); err != nil {
		return fmt.Errorf("queue name %w", err)
	}
	switch {
	case l.Concurrency < 0 || l.Concurrency > MaxQueueLimit:
		return fmt.Errorf("concurrency %d is out of range: use 0 (no limit) to %d", l.Concurrency, MaxQueueLimit)
	case l.Rate < 0 || l.Rate > MaxQueueLimit:
		return fmt.Errorf("rate %d is out of range: use 0 (no limit) to %d", l.Rate, MaxQueueLimit)
	case l.Rate > 0 && (l.Per < time.Millisecond || l.Per > 24*time.Hour):
		return fmt.Errorf("rate period %s is out of range: use 1ms to 24h (1d)", FormatDuration(l.Per))
	case l.Rate > 0 && l.Per/time.Duration(l.Rate) < time.Microsecond:
		return fmt.Errorf("rate %d/%s is more than one step per microsecond: lower it or clear it", l.Rate, l.Per)
	}
	return nil
}

// Interval is the spacing between two starts a rate allows; zero without
// a rate.
func (l QueueLimit) Interval() time.Duration {
	if l.Rate <= 0 {
		return 0
	}
	return (l.Per / time.Duration(l.Rate)).Truncate(time.Microsecond)
}

// QueueLimitChange changes some of a queue's limits: a nil field keeps
// what is stored. It is applied in the transaction that reads the stored
// limits, so two changes of different fields made at once both hold.
type QueueLimitChange struct {
	Queue string
	// Concurrency replaces the stored concurrency.
	Concurrency *int
	// Rate replaces the stored rate and its period.
	Rate *QueueRate
}

// QueueRate is a queue's rate: at most Rate steps started per Per (Rate 0:
// no limit).
type QueueRate struct {
	Rate int
	Per  time.Duration
}

// SetAll is the change that replaces every limit of l's queue with l's.
func SetAll(l QueueLimit) QueueLimitChange {
	return QueueLimitChange{Queue: l.Queue, Concurrency: &l.Concurrency, Rate: &QueueRate{Rate: l.Rate, Per: l.Per}}
}

// Apply returns stored with the change made.
func (c QueueLimitChange) Apply(stored QueueLimit) QueueLimit {
	stored.Queue = c.Queue
	if c.Concurrency != nil {
		stored.Concurrency = *c.Concurrency
	}
	if c.Rate != nil {
		stored.Rate, stored.Per = c.Rate.Rate, c.Rate.Per
	}
	if stored.Rate == 0 {
		stored.Per = 0
	}
	return stored
}

// QueueInfo is one queue as `dagrun queues` shows it: its limits and its
// load.
type QueueInfo struct {
	QueueLimit
	// Ready counts pending steps that are due, held ones included: what
	// waits for a worker or for a slot (the queue's depth).
	Ready int
	// Held counts the ready steps a concurrency limit holds back, a
	// subset of Ready.
	Held int
	// Running counts claimed steps.
	Running int
	// Scheduled counts pending steps that are not due yet: a delayed
	// start, a retry waiting out its backoff, a start the queue's rate
	// spaced out. They are not in Ready until their time comes. A paused
	// instance's steps wait for a resume, not a time, and are in neither.
	Scheduled int
	// OldestWait is how long the oldest ready step has waited.
	OldestWait time.Duration
}

// LimitStore keeps the queue limits. Workflow and step concurrency limits
// need no method: they come with CreateParams, StepSpec and StepChange.
type LimitStore interface {
	// SetQueueLimit changes a queue's limits (both zero clears them) and
	// applies them to its unfinished steps in the same transaction: held
	// steps are released up to a raised limit, ready ones beyond a lowered
	// one held again, and a new rate re-spaces the ready steps. It returns
	// the limits now stored, which must pass Check, or else nothing is
	// written.
	SetQueueLimit(ctx context.Context, c QueueLimitChange) (QueueLimit, error)

	// Queues returns every queue with a limit or with ready, held,
	// running or scheduled steps, sorted by name.
	Queues(ctx context.Context) ([]QueueInfo, error)
}

// Held reports whether the step is ready but held back by a concurrency
// limit (see HeldUntil).
func (s *Step) Held() bool {
	return s.Status == StepPending && s.RunAfter.Equal(HeldUntil)
}

// MergeQueues joins a store's queue limits and queue loads into the
// answer of Queues: one entry per queue in either, sorted by name. A queue
// may have several loads, read by different queries (each through the
// index that finds its steps): their counts add up.
func MergeQueues(limits []QueueLimit, loads []QueueInfo) []QueueInfo {
	byName := make(map[string]*QueueInfo, len(limits)+len(loads))
	out := make([]QueueInfo, 0, len(limits)+len(loads))
	for _, l := range loads {
		if q := byName[l.Queue]; q != nil {
			q.Ready += l.Ready
			q.Held += l.Held
			q.Running += l.Running
			q.Scheduled += l.Scheduled
			q.OldestWait = max(q.OldestWait, l.OldestWait)
			continue
		}
		out = append(out, l)
		byName[l.Queue] = &out[len(out)-1]
	}
	for _, l := range limits {
		if q := byName[l.Queue]; q != nil {
			q.QueueLimit = l
			continue
		}
		out = append(out, QueueInfo{QueueLimit: l})
	}
	slices.SortFunc(out, func(a, b QueueInfo) int { return strings.Compare(a.Queue, b.Queue) })
	return out
}

// Admit decides which of the new instances with a workflow-level limit
// start held: those beyond the limit of their key, counting the admitted
// unfinished instances (admitted, called once per key, counts them in the
// store) and those admitted before them in this call; and those that
// start later than now (RunAfter), which take no slot until their time
// comes: the store admits them then, or when a slot frees after it.
// Those held for a full key it marks Parked.
func Admit(instances []*NewInstance, now time.Time, admitted func(workflow, key string) (int, error)) (map[string]bool, error) {
	var held map[string]bool
	counts := map[[2]string]int{}
	for _, n := range instances {
		p := n.Params
		if p.ConcurrencyLimit <= 0 || p.ConcurrencyKey == "" || n.Status.Finished() {
			continue
		}
		if p.RunAfter.After(now) {
			if held == nil {
				held = map[string]bool{}
			}
			held[p.ID] = true
			continue
		}
		k := [2]string{p.Workflow, p.ConcurrencyKey}
		count, ok := counts[k]
		if !ok {
			var err error
			if count, err = admitted(k[0], k[1]); err != nil {
				return nil, err
			}
		}
		if count >= p.ConcurrencyLimit {
			if held == nil {
				held = map[string]bool{}
			}
			held[p.ID] = true
			n.Parked = true
		} else {
			count++
		}
		counts[k] = count
	}
	return held, nil
}
