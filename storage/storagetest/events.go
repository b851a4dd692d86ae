package storagetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

var eventTests = map[string]func(*testing.T, *Harness){
	"ListPages": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b", "a"))
		other := b.createOne(spec("a"))
		b.complete(id, "a", `1`)
		b.complete(other, "a", `1`)
		b.complete(id, "b", `2`)

		all := b.get(id).Events
		require.False(t, b.get(id).EventsTruncated)
		var paged []storage.Event
		for _, limit := range []int{1, 2, 3, 100} {
			paged = b.history(id, limit)
			require.Equal(t, all, paged, "pages of %d", limit)
		}
		first, err := b.store.ListEvents(b.ctx, storage.EventsParams{InstanceID: id, AfterID: all[1].ID, Limit: 2})
		require.NoError(t, err)
		require.Equal(t, all[2:4], first, "the two events after the second")
		rest, err := b.store.ListEvents(b.ctx, storage.EventsParams{InstanceID: id, AfterID: all[len(all)-1].ID})
		require.NoError(t, err)
		require.Empty(t, rest, "nothing after the last")

		_, err = b.store.ListEvents(b.ctx, storage.EventsParams{InstanceID: "no-such-instance"})
		require.ErrorIs(t, err, storage.ErrNotFound)
	},

	// A long history is read from its end: GetInstance returns its latest
	// InstanceEvents events and says that older ones exist, a follower's
	// first call looks back FollowTail events.
	"LongHistoryShowsItsTail": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.longHistory(storage.FollowTail + 1)
		all := b.history(id, 0)
		in := b.get(id)
		require.True(t, in.EventsTruncated)
		require.Equal(t, all[len(all)-storage.InstanceEvents:], in.Events)
		require.Equal(t, all[len(all)-storage.FollowTail:], b.follower(id).seen)
	},

	"FollowReturnsEachEventOnce": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b", "a"))
		f := b.follower(id)
		require.Equal(t, b.history(id, 0), f.seen, "the first call returns the history so far")

		require.Empty(t, f.poll(), "nothing happened")
		b.complete(id, "a", `1`)
		got := f.poll()
		require.NotEmpty(t, got)
		require.Empty(t, f.poll(), "nothing happened since")
		b.snooze(id, "b")
		b.complete(id, "b", `2`)
		require.NotEmpty(t, f.poll())
		require.Equal(t, b.history(id, 0), f.seen)

		_, _, err := b.store.FollowEvents(b.ctx, "no-such-instance", "")
		require.ErrorIs(t, err, storage.ErrNotFound)
	},

	// Writers of one instance's events in many transactions at once, some
	// of which (on PostgreSQL) commit after others that took greater IDs:
	// a follower polling all along sees every event exactly once.
	"FollowConcurrentWriters": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		const steps, snoozes = 8, 15
		var specs []storage.StepSpec
		for i := range steps {
			specs = append(specs, spec(string(rune('a'+i))))
		}
		id := b.createOne(specs...)
		f := b.follower(id)
		stop := make(chan struct{})
		polled := make(chan error, 1)
		go func() {
			for {
				select {
				case <-stop:
					polled <- nil
					return
				default:
					if _, err := f.next(); err != nil {
						polled <- err
						return
					}
				}
			}
		}()
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []error
		)
		for _, s := range specs {
			wg.Go(func() {
				err := b.run(id, s.Name, snoozes)
				mu.Lock()
				defer mu.Unlock()
				errs = append(errs, err)
			})
		}
		wg.Wait()
		close(stop)
		require.NoError(t, <-polled)
		for _, err := range errs {
			require.NoError(t, err)
		}
		f.poll()
		require.Equal(t, storage.InstanceCompleted, b.get(id).Status)
		require.ElementsMatch(t, b.history(id, 0), f.seen)
	},

	// An event whose transaction took its ID before another transaction's
	// event and commits after it reaches a follower that already saw the
	// greater one.
	"FollowEventCommittedOutOfOrder": func(t *testing.T, h *Harness) {
		if h.AppendEventTx == nil {
			t.Skip("Harness.AppendEventTx not set: the backend's writers commit in ID order")
		}
		b := h.setup(t)
		id := b.createOne(spec("a"))
		f := b.follower(id)
		commit := h.AppendEventTx(t, b.store, id, storage.EventInstancePaused)
		c := b.claimStep(id, "a") // commits step.started (and instance.started) with greater IDs
		got := f.poll()
		require.NotEmpty(t, got)
		require.Equal(t, storage.EventStepStarted, got[0].Type)

		require.NoError(t, commit())
		late := f.poll()
		require.Len(t, late, 1, "the event committed last")
		require.Equal(t, storage.EventInstancePaused, late[0].Type)
		require.Less(t, late[0].ID, got[0].ID, "it took a smaller ID")
		require.Empty(t, f.poll())

		b.finish(completed(c.Claim, `1`))
		require.NotEmpty(t, f.poll())
		require.ElementsMatch(t, b.history(id, 0), f.seen)
	},
}

// history reads the whole history of an instance, limit events a page (0:
// the store's default).
func (b *bundle) history(id string, limit int) []storage.Event {
	b.t.Helper()
	var out []storage.Event
	var after int64
	for {
		page, err := b.store.ListEvents(b.ctx, storage.EventsParams{InstanceID: id, AfterID: after, Limit: limit})
		require.NoError(b.t, err)
		if len(page) == 0 {
			return out
		}
		for _, e := range page {
			require.Greater(b.t, e.ID, after, "events come in ID order")
			require.Equal(b.t, id, e.InstanceID)
			after = e.ID
		}
		out = append(out, page...)
	}
}

// longHistory creates an instance of ten steps with at least n events,
// snoozing all its steps at once, round after round.
func (b *bundle) longHistory(n int) string {
	b.t.Helper()
	var specs []storage.StepSpec
	for i := range 10 {
		specs = append(specs, spec(fmt.Sprintf("s%d", i)))
	}
	id := b.createOne(specs...)
	for events := len(b.history(id, 0)); events < n; events += 2 * len(specs) {
		got := b.claim(storage.ClaimParams{InstanceID: id})
		require.Len(b.t, got, len(specs))
		rs := make([]storage.StepResult, len(got))
		for i, c := range got {
			rs[i] = storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeSnooze, RunAfter: b.now()}
		}
		b.finish(rs...)
	}
	return id
}

// snooze claims step name of instance id and snoozes it until now: two
// events, and the step is ready again.
func (b *bundle) snooze(id, name string) {
	b.t.Helper()
	c := b.claimStep(id, name)
	require.Equal(b.t, []storage.FinishResult{{Accepted: true}},
		b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeSnooze, RunAfter: b.now()}))
}

// run snoozes step name of instance id n times, then completes it, as a
// worker would: for goroutines of a test, so errors are returned.
func (b *bundle) run(id, name string, n int) error {
	for i := 0; i <= n; i++ {
		got, err := b.store.ClaimSteps(b.ctx, storage.ClaimParams{WorkerID: "w-" + name, InstanceID: id, Queues: []string{"q." + name}, Limit: 1, Lease: time.Minute})
		if err != nil {
			return err
		}
		if len(got) != 1 {
			return fmt.Errorf("step %s of %s is not ready (attempt %d)", name, id, i)
		}
		r := storage.StepResult{Claim: got[0].Claim, Outcome: storage.OutcomeSnooze, RunAfter: b.now()}
		if i == n {
			r = completed(got[0].Claim, `1`)
		}
		res, err := b.store.FinishSteps(b.ctx, []storage.StepResult{r}, Plan)
		if err != nil {
			return err
		}
		if len(res) != 1 || !res[0].Accepted {
			return fmt.Errorf("finish %s of %s: %+v", name, id, res)
		}
	}
	return nil
}

// follower follows one instance's history with FollowEvents, keeping
// every event it was given and refusing one given twice.
type follower struct {
	b      *bundle
	id     string
	mu     sync.Mutex
	cursor storage.EventCursor
	seen   []storage.Event
	ids    map[int64]bool
}

func (b *bundle) follower(id string) *follower {
	b.t.Helper()
	f := &follower{b: b, id: id, ids: map[int64]bool{}}
	f.poll()
	return f
}

// poll returns the events the store gave since the last poll.
func (f *follower) poll() []storage.Event {
	f.b.t.Helper()
	got, err := f.next()
	require.NoError(f.b.t, err)
	return got
}

// next is poll for goroutines of a test.
func (f *follower) next() ([]storage.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	got, next, err := f.b.store.FollowEvents(f.b.ctx, f.id, f.cursor)
	if err != nil {
		return nil, err
	}
	if next == "" {
		return nil, errors.New("FollowEvents returned an empty cursor")
	}
	for i, e := range got {
		switch {
		case f.ids[e.ID]:
			return nil, fmt.Errorf("event %d (%s %s) given twice", e.ID, e.Type, e.Step)
		case e.InstanceID != f.id:
			return nil, fmt.Errorf("event %d is of instance %s, not %s", e.ID, e.InstanceID, f.id)
		case i > 0 && e.ID <= got[i-1].ID:
			return nil, fmt.Errorf("event %d comes after %d: one call's events must be in ID order", e.ID, got[i-1].ID)
		}
		f.ids[e.ID] = true
	}
	f.seen = append(f.seen, got...)
	f.cursor = next
	return got, nil
}
