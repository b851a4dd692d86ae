package postgres

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// TestStartClaimsAtInsertWhatAClaimWould: a start that claims for a
// settled worker ("Claims at insert" in create.go) inserts the steps it may take
// claimed, and leaves what the usual start and claim leave: the same
// claims, steps, instance and history, whatever the store took the
// short way or not. A step it may not take that way (one more than its
// limit, a step of a limited queue) is left to the claim loop, which
// hears of it; a start it cannot claim that way at all claims the usual
// way.
func TestStartClaimsAtInsertWhatAClaimWould(t *testing.T) {
	t.Parallel()
	two := func() storage.CreateParams { return params(spec("a"), spec("b"), spec("c", "a", "b")) }
	cases := []struct {
		name  string
		start func() storage.CreateParams
		claim storage.ClaimParams
		// limited puts a concurrency limit on the default queue first, and
		// has the claim loop look once more after the start.
		limited bool
		// atInsert is whether the settled worker's start claims at insert,
		// and then announced whether it must signal the claim loop.
		atInsert, announced bool
	}{
		{name: "a chain", start: func() storage.CreateParams { return params(spec("a"), spec("b", "a")) },
			claim: storage.ClaimParams{Limit: 2}, atInsert: true},
		{name: "two roots, room for one", start: two, claim: storage.ClaimParams{Limit: 1}, atInsert: true, announced: true},
		{name: "two roots, room for both", start: two, claim: storage.ClaimParams{Limit: 3}, atInsert: true},
		{name: "a workflow timeout", start: func() storage.CreateParams {
			p := params(spec("a"))
			p.Timeout = time.Hour
			return p
		}, claim: storage.ClaimParams{Limit: 2}, atInsert: true},
		{name: "trace context", start: func() storage.CreateParams {
			p := params(spec("a"))
			p.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
			return p
		}, claim: storage.ClaimParams{Limit: 2, TraceParent: true}, atInsert: true},
		{name: "a queue under a limit", start: func() storage.CreateParams { return params(spec("a")) },
			claim: storage.ClaimParams{Limit: 2}, limited: true, atInsert: true, announced: true},
		{name: "another queue", start: func() storage.CreateParams { return params(spec("a")) },
			claim: storage.ClaimParams{Limit: 2, Queues: []string{"other"}}},
		{name: "other handlers", start: func() storage.CreateParams { return params(spec("a")) },
			claim: storage.ClaimParams{Limit: 2, Handlers: []string{"other"}}},
		{name: "a claimer bound to another instance", start: func() storage.CreateParams { return params(spec("a")) },
			claim: storage.ClaimParams{Limit: 2, InstanceID: "pg-elsewhere"}},
		{name: "a delayed start", start: func() storage.CreateParams {
			p := params(spec("a"))
			p.RunAfter = time.Now().Add(time.Hour)
			return p
		}, claim: storage.ClaimParams{Limit: 2}},
	}
	type outcome struct {
		claimed  []string
		events   []string
		steps    []string
		instance string
	}
	run := func(t *testing.T, f *eagerFixture, start storage.CreateParams, p storage.ClaimParams, limited bool) outcome {
		t.Helper()
		ctx := t.Context()
		if limited {
			one := 1
			_, err := f.s.SetQueueLimit(ctx, storage.QueueLimitChange{Queue: "default", Concurrency: &one})
			require.NoError(t, err)
		}
		p.WorkerID, p.Lease = "w", time.Minute
		// The claim loop's look that finds nothing settles it.
		claimed, _, err := f.s.ClaimStepsAndWake(ctx, p)
		require.NoError(t, err)
		require.Empty(t, claimed)
		drain(f.signals)
		before := time.Now()
		_, claimed, err = f.s.CreateAndClaim(ctx, []storage.CreateParams{start}, storagetest.Plan, p)
		require.NoError(t, err)
		if limited {
			// The claim loop's next look, which a settled worker's start
			// leaves a limited step to.
			more, _, err := f.s.ClaimStepsAndWake(ctx, p)
			require.NoError(t, err)
			claimed = append(claimed, more...)
		}
		var out outcome
		for _, c := range claimed {
			require.WithinRange(t, c.LeaseUntil, before.Add(p.Lease-5*time.Second), time.Now().Add(p.Lease+5*time.Second))
			out.claimed = append(out.claimed, fmt.Sprintf("%s attempt %d fence %d handler %s queue %s input %s trace %q",
				c.Step, c.Attempt, c.Fence, c.Handler, c.Queue, c.Input, c.TraceParent))
		}
		events, err := f.s.ListEvents(ctx, storage.EventsParams{InstanceID: start.ID})
		require.NoError(t, err)
		for _, e := range events {
			out.events = append(out.events, fmt.Sprintf("%s %s %d %q", e.Type, e.Step, e.Attempt, e.Message))
		}
		in, err := f.s.GetInstance(ctx, start.ID)
		require.NoError(t, err)
		out.instance = fmt.Sprintf("%s started %t deadline %t", in.Status, in.StartedAt != nil, in.Deadline != nil)
		for _, s := range in.Steps {
			out.steps = append(out.steps, fmt.Sprintf("%s %s %d", s.Name, s.Status, s.Attempts))
		}
		return out
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			settled := newEagerFixture(t, "insert-settled")
			got := run(t, settled, tc.start(), tc.claim, tc.limited)
			require.Equal(t, tc.atInsert, settled.s.insertClaims.Load() == 1, "the start claimed at insert")
			if tc.atInsert {
				signalled := false
				select {
				case <-settled.signals:
					signalled = true
				default: // the store signals its subscribers before the call returns
				}
				require.Equal(t, tc.announced, signalled, "the claim loop was told of a ready step")
			}

			deaf := &eagerFixture{worker: newWorker(t, "insert-deaf", nil)}
			want := run(t, deaf, tc.start(), tc.claim, tc.limited)
			require.Zero(t, deaf.s.insertClaims.Load(), "a worker that hears of no other process's commit claimed at insert")
			require.Equal(t, want, got)
		})
	}
}
