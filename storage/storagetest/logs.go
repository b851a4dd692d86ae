package storagetest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// logRecord is one record of instance id's step at attempt, logged at the
// suite's clock.
func (b *bundle) logRecord(id, step string, attempt int, msg string) storage.LogRecord {
	return storage.LogRecord{InstanceID: id, Step: step, Item: -1, Attempt: attempt, Time: b.now(), Level: "INFO", Message: msg}
}

func (b *bundle) listLogs(p storage.LogsParams) []storage.LogRecord {
	b.t.Helper()
	out, err := b.store.ListLogs(b.ctx, p)
	require.NoError(b.t, err)
	return out
}

func messages(rs []storage.LogRecord) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Message
	}
	return out
}

// requireWarning checks a record the tests log at WARN, at the suite's
// start, from attempt 1 of step (not an item) with attrs.
func requireWarning(t *testing.T, got storage.LogRecord, id, step, attrs string) {
	t.Helper()
	require.Equal(t, id, got.InstanceID)
	require.Equal(t, step, got.Step)
	require.Equal(t, -1, got.Item)
	require.Equal(t, 1, got.Attempt)
	require.Equal(t, "WARN", got.Level)
	require.True(t, got.Time.Equal(start), "time %v", got.Time)
	require.JSONEq(t, attrs, string(got.Attrs))
}

var logTests = map[string]func(*testing.T, *Harness){
	"AppendAndList": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b"))
		require.Empty(t, b.listLogs(storage.LogsParams{InstanceID: id}))

		first := b.logRecord(id, "a", 1, "one")
		first.Level, first.Attrs = "WARN", json.RawMessage(`{"k":"v","n":{"m":1}}`)
		item := b.logRecord(id, "a", 2, "item")
		item.Item = 3
		require.NoError(t, b.store.AppendLogs(b.ctx, nil, []storage.LogRecord{first, b.logRecord(id, "b", 1, "other step"), item}))
		require.NoError(t, b.store.AppendLogs(b.ctx, nil, []storage.LogRecord{b.logRecord(id, "a", 2, "two")}))

		all := b.listLogs(storage.LogsParams{InstanceID: id})
		require.Equal(t, []string{"one", "other step", "item", "two"}, messages(all), "in the order stored")
		for i := 1; i < len(all); i++ {
			require.Greater(t, all[i].Seq, all[i-1].Seq)
		}
		requireWarning(t, all[0], id, "a", `{"k":"v","n":{"m":1}}`)
		require.Nil(t, all[1].Attrs)
		require.Equal(t, 3, all[2].Item)
		require.Equal(t, 2, all[2].Attempt)

		stepA := b.listLogs(storage.LogsParams{InstanceID: id, Step: "a"})
		require.Equal(t, []string{"one", "item", "two"}, messages(stepA))
		after := b.listLogs(storage.LogsParams{InstanceID: id, Step: "a", AfterSeq: stepA[0].Seq})
		require.Equal(t, []string{"item", "two"}, messages(after), "a follower reads what came after its last seq")
		require.Equal(t, []string{"one"}, messages(b.listLogs(storage.LogsParams{InstanceID: id, Limit: 1})))
		require.Empty(t, b.listLogs(storage.LogsParams{InstanceID: id, AfterSeq: all[3].Seq}))
	},

	"UnknownInstance": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		_, err := b.store.ListLogs(b.ctx, storage.LogsParams{InstanceID: "no-such-instance"})
		require.ErrorIs(t, err, storage.ErrNotFound)
		// Records of an instance that is gone (pruned while its worker
		// flushed them) are dropped without failing the others.
		id := b.createOne(spec("a"))
		require.NoError(t, b.store.AppendLogs(b.ctx, nil, []storage.LogRecord{
			b.logRecord("no-such-instance", "a", 1, "lost"), b.logRecord(id, "a", 1, "kept"),
		}))
		require.Equal(t, []string{"kept"}, messages(b.listLogs(storage.LogsParams{InstanceID: id})))
	},

	"TrimKeepsNewestBehindMarker": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"))
		var recs []storage.LogRecord
		for _, m := range []string{"r1", "r2", "r3", "r4"} {
			recs = append(recs, b.logRecord(id, "a", 1, m))
		}
		recs[1].Attrs = json.RawMessage(`{"x":1}`)
		other := b.logRecord(id, "a", 2, "next attempt")
		require.NoError(t, b.store.AppendLogs(b.ctx, nil, append(recs, other)))

		// Drop the two oldest of attempt 1: r1 goes, r2 becomes the marker.
		trim := storage.LogTrim{InstanceID: id, Step: "a", Item: -1, Attempt: 1, Drop: 2, Marker: "… 10 bytes of earlier logs dropped"}
		require.NoError(t, b.store.AppendLogs(b.ctx, []storage.LogTrim{trim}, []storage.LogRecord{b.logRecord(id, "a", 1, "r5")}))
		got := b.listLogs(storage.LogsParams{InstanceID: id})
		require.Equal(t, []string{"… 10 bytes of earlier logs dropped", "r3", "r4", "next attempt", "r5"}, messages(got))
		require.Equal(t, "INFO", got[0].Level)
		require.Nil(t, got[0].Attrs, "the marker has no attributes")

		// Trimming again drops the old marker too; another attempt's
		// records and an item's are untouched.
		trim.Drop, trim.Marker = 2, "… 20 bytes of earlier logs dropped"
		require.NoError(t, b.store.AppendLogs(b.ctx, []storage.LogTrim{trim}, nil))
		require.Equal(t, []string{"… 20 bytes of earlier logs dropped", "r4", "next attempt", "r5"},
			messages(b.listLogs(storage.LogsParams{InstanceID: id})))

		// A trim of an attempt with fewer records than it drops does nothing.
		trim.Attempt, trim.Drop = 3, 5
		require.NoError(t, b.store.AppendLogs(b.ctx, []storage.LogTrim{trim}, nil))
		require.Len(t, b.listLogs(storage.LogsParams{InstanceID: id}), 4)
	},

	"FinishStoresTheAttemptsLogs": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b"))
		a := b.claimStep(id, "a")
		// A record flushed while the attempt ran, then the last ones with
		// the result, pushing the first out.
		require.NoError(t, b.store.AppendLogs(b.ctx, nil, []storage.LogRecord{b.logRecord(id, "a", 1, "early")}))
		done := completed(a.Claim, `1`)
		done.Logs = []storage.LogRecord{b.logRecord(id, "a", 1, "late 1"), b.logRecord(id, "a", 1, "late 2")}
		done.LogTrim = storage.LogTrim{InstanceID: id, Step: "a", Item: -1, Attempt: 1, Drop: 1, Marker: "… 5 bytes of earlier logs dropped"}
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finish(done))
		require.Equal(t, []string{"… 5 bytes of earlier logs dropped", "late 1", "late 2"},
			messages(b.listLogs(storage.LogsParams{InstanceID: id, Step: "a"})))

		// A result the store refuses (its claim is stale) still leaves
		// what its attempt logged.
		bc := b.claimStep(id, "b")
		stale := completed(storage.Claim{InstanceID: id, StepID: bc.StepID, Fence: bc.Fence + 1}, `2`)
		stale.Logs = []storage.LogRecord{b.logRecord(id, "b", 1, "from a lost attempt")}
		require.False(t, b.finish(stale)[0].Accepted)
		require.Equal(t, []string{"from a lost attempt"}, messages(b.listLogs(storage.LogsParams{InstanceID: id, Step: "b"})))
		require.Equal(t, storage.StepRunning, step(t, b.get(id), "b").Status)
	},

	// What a completion brings is listed with the records stored before
	// and after it, in one order a follower reads without a gap, whatever
	// the store keeps it in; a late trim counts it, a rerun keeps it, and
	// it goes with its instance.
	"CompletionsLogsInOrder": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		// A message comes back as logged, whatever a store escapes to keep it.
		const a1 = "a 1: \"quoted\" back\\slash\nnext line\ttab \x01 \u2028 é 🙂"
		id := b.createOne(spec("a"), spec("b", "a"), spec("c"))
		a := b.claimStep(id, "a")
		require.NoError(t, b.store.AppendLogs(b.ctx, nil, []storage.LogRecord{b.logRecord(id, "a", 1, "a while running")}))
		done := completed(a.Claim, `1`)
		done.Logs = []storage.LogRecord{b.logRecord(id, "a", 1, a1), b.logRecord(id, "a", 1, "a 2")}
		done.Logs[1].Level, done.Logs[1].Attrs = "WARN", json.RawMessage(`{"quote":"\"","line":"x\ny","n":1.5}`)
		c := b.claimStep(id, "c")
		cDone := completed(c.Claim, `3`)
		cDone.Logs = []storage.LogRecord{b.logRecord(id, "c", 1, "c 1")}
		require.Equal(t, []storage.FinishResult{{Accepted: true}, {Accepted: true}}, b.finish(done, cDone))
		require.NoError(t, b.store.AppendLogs(b.ctx, nil, []storage.LogRecord{b.logRecord(id, "a", 1, "a after it returned")}))
		bs := b.claimStep(id, "b")
		bDone := completed(bs.Claim, `2`)
		bDone.Logs = []storage.LogRecord{b.logRecord(id, "b", 1, "b 1")}
		b.finish(bDone)

		all := b.listLogs(storage.LogsParams{InstanceID: id})
		require.Equal(t, []string{"a while running", a1, "a 2", "c 1", "a after it returned", "b 1"}, messages(all))
		for i := 1; i < len(all); i++ {
			require.Greater(t, all[i].Seq, all[i-1].Seq, "seqs grow in the order stored")
		}
		requireWarning(t, all[2], id, "a", `{"quote":"\"","line":"x\ny","n":1.5}`)
		require.Nil(t, all[1].Attrs)
		for i := range all {
			require.Equal(t, all[i:], b.listLogs(storage.LogsParams{InstanceID: id, AfterSeq: all[i].Seq - 1}), "after seq %d", all[i].Seq-1)
		}
		require.Equal(t, []string{"a while running", a1, "a 2", "a after it returned"}, messages(b.listLogs(storage.LogsParams{InstanceID: id, Step: "a"})))
		require.Equal(t, []string{"c 1"}, messages(b.listLogs(storage.LogsParams{InstanceID: id, Step: "c"})))
		require.Equal(t, []string{"a while running", a1, "a 2"}, messages(b.listLogs(storage.LogsParams{InstanceID: id, Limit: 3})))

		// A handler's goroutine logging past the attempt's bound after it
		// returned: the trim counts the records the completion brought.
		trim := storage.LogTrim{InstanceID: id, Step: "a", Item: -1, Attempt: 1, Drop: 3, Marker: "… 30 bytes of earlier logs dropped"}
		require.NoError(t, b.store.AppendLogs(b.ctx, []storage.LogTrim{trim}, []storage.LogRecord{b.logRecord(id, "a", 1, "a last")}))
		require.Equal(t, []string{"… 30 bytes of earlier logs dropped", "a after it returned", "a last"},
			messages(b.listLogs(storage.LogsParams{InstanceID: id, Step: "a"})))
		require.Equal(t, []string{"c 1"}, messages(b.listLogs(storage.LogsParams{InstanceID: id, Step: "c"})), "another step's untouched")

		// A rerun's attempts log after the earlier run's, which stay.
		require.NoError(t, b.op().RetryFrom(b.ctx, id, "c", Plan))
		c = b.claimStep(id, "c")
		cDone = completed(c.Claim, `4`)
		cDone.Logs = []storage.LogRecord{b.logRecord(id, "c", 1, "c again")}
		b.finish(cDone)
		require.Equal(t, []string{"c 1", "c again"}, messages(b.listLogs(storage.LogsParams{InstanceID: id, Step: "c"})))

		// They go with their instance.
		require.Equal(t, storage.InstanceCompleted, b.get(id).Status)
		b.clock.Advance(time.Hour)
		n, err := b.store.Prune(b.ctx, b.now(), false)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		p := params(spec("c"))
		p.ID = id
		b.create(p)
		require.Empty(t, b.listLogs(storage.LogsParams{InstanceID: id}))
	},

	"ByClaimedRow": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(2, eachSpec("each"))
		other := b.createOne(spec("each"))
		items := b.claimItems(id, "each", 10)
		require.Len(t, items, 2)
		record := func(c storage.ClaimedStep, msg string) storage.LogRecord {
			r := b.logRecord(c.InstanceID, c.Step, c.Attempt, msg)
			r.StepID, r.Item = c.StepID, c.Item
			return r
		}
		// A StepID that does not name a row of the record's step (here
		// another instance's) is not trusted: the record goes by name.
		misdirected := record(items[0], "other instance")
		misdirected.InstanceID = other
		misdirected.Item = -1
		require.NoError(t, b.store.AppendLogs(b.ctx, nil, []storage.LogRecord{record(items[1], "item 1"), misdirected}))
		done := make([]storage.StepResult, len(items))
		for i, c := range items {
			done[i] = completed(c.Claim, `1`)
		}
		done[0].Logs = []storage.LogRecord{record(items[0], "item 0")}
		require.Equal(t, []storage.FinishResult{{Accepted: true}, {Accepted: true}}, b.finishItems(done...))
		require.Equal(t, storage.InstanceCompleted, b.get(id).Status)

		got := b.listLogs(storage.LogsParams{InstanceID: id, Step: "each"})
		require.Equal(t, []string{"item 1", "item 0"}, messages(got))
		require.Equal(t, []int{1, 0}, []int{got[0].Item, got[1].Item})
		require.Equal(t, "each", got[0].Step)
		require.Equal(t, []string{"other instance"}, messages(b.listLogs(storage.LogsParams{InstanceID: other})))

		// Retrying the forEach step replaces its items; what the old ones
		// logged stays, as a retried step's earlier attempts' logs do.
		require.NoError(t, b.op().RetryFrom(b.ctx, id, "each", ItemsPlan))
		require.Equal(t, []string{"item 1", "item 0"}, messages(b.listLogs(storage.LogsParams{InstanceID: id})))
	},

	"PrunedWithInstance": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		old := b.createOne(spec("a"))
		kept := b.createOne(spec("a"))
		require.NoError(t, b.store.AppendLogs(b.ctx, nil, []storage.LogRecord{
			b.logRecord(old, "a", 1, "old"), b.logRecord(kept, "a", 1, "kept"),
		}))
		b.complete(old, "a", `1`)
		b.clock.Advance(time.Hour)
		n, err := b.store.Prune(b.ctx, b.now(), false)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		_, err = b.store.ListLogs(b.ctx, storage.LogsParams{InstanceID: old})
		require.ErrorIs(t, err, storage.ErrNotFound)
		require.Equal(t, []string{"kept"}, messages(b.listLogs(storage.LogsParams{InstanceID: kept})))

		// An instance created again with the pruned one's ID (IDs are the
		// caller's) does not inherit its logs.
		p := params(spec("a"))
		p.ID = old
		b.create(p)
		require.Empty(t, b.listLogs(storage.LogsParams{InstanceID: old}))
	},
}

var traceTests = map[string]func(*testing.T, *Harness){
	// The children a plan starts join their parent's trace, so every plan
	// sees the instance's traceparent, however the store came by the
	// state: created, read back, or kept from an eager claim.
	"PlansSeeIt": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		var seen []string
		watch := func(st *storage.InstanceState) (*storage.Plan, error) {
			seen = append(seen, st.TraceParent)
			return Plan(st)
		}
		traced := func() storage.CreateParams {
			p := params(spec("a"), spec("b", "a"))
			p.TraceParent = tp
			return p
		}
		p := traced()
		_, err := b.store.CreateInstances(b.ctx, nil, []storage.CreateParams{p}, watch)
		require.NoError(t, err)
		c := b.claimStep(p.ID, "a")
		_, err = b.store.FinishSteps(b.ctx, []storage.StepResult{completed(c.Claim, `1`)}, watch)
		require.NoError(t, err)
		require.NotEmpty(t, seen)
		for i, got := range seen {
			require.Equal(t, tp, got, "plan %d of a created and a finished step", i)
		}

		cc, ok1 := b.store.(storage.CreateClaimer)
		fc, ok2 := b.store.(storage.FinishClaimer)
		if !ok1 || !ok2 {
			return
		}
		seen = nil
		eager := storage.ClaimParams{WorkerID: "eager", Limit: 1, Lease: time.Minute}
		p = traced()
		eager.InstanceID = p.ID
		_, claimed, err := cc.CreateAndClaim(b.ctx, []storage.CreateParams{p}, watch, eager)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		_, claimed, err = fc.FinishAndClaim(b.ctx, []storage.StepResult{completed(claimed[0].Claim, `1`)}, watch, eager)
		require.NoError(t, err)
		require.Len(t, claimed, 1, "b, ready after a")
		require.NotEmpty(t, seen)
		for i, got := range seen {
			require.Equal(t, tp, got, "plan %d of an eagerly claimed instance", i)
		}
	},

	"StoredWithInstanceAndClaimed": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		p := params(spec("a"), spec("b", "a"))
		p.TraceParent, p.TraceCaller = tp, "00f067aa0ba902b7"
		id := b.create(p)[0].ID
		plain := b.createOne(spec("a"))

		in := b.get(id)
		require.Equal(t, tp, in.TraceParent)
		require.Equal(t, "00f067aa0ba902b7", in.TraceCaller)
		require.Empty(t, b.get(plain).TraceParent)
		require.Empty(t, b.get(plain).TraceCaller)

		// A claim that asks gets it, for every attempt's span to find its
		// parent; one that does not ask reads nothing more.
		traced := func(id string) storage.ClaimedStep {
			cs := b.claim(storage.ClaimParams{InstanceID: id, Limit: 1, Lease: time.Minute, TraceParent: true})
			require.Len(t, cs, 1)
			return cs[0]
		}
		a := traced(id)
		require.Equal(t, tp, a.TraceParent)
		require.Empty(t, traced(plain).TraceParent)
		b.finish(completed(a.Claim, `1`))
		p2 := params(spec("a"))
		p2.TraceParent = tp
		other := b.create(p2)[0].ID
		require.Empty(t, b.claimStep(other, "a").TraceParent, "not asked for")
		require.Equal(t, tp, traced(id).TraceParent)

		list, err := b.store.ListInstances(b.ctx, storage.ListParams{})
		require.NoError(t, err)
		for _, in := range list {
			if in.ID == id {
				require.Equal(t, tp, in.TraceParent)
			}
		}
	},
}
