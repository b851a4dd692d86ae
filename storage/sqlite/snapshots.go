package sqlite

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/dagrun/dagrun/storage"
)

// Finishes planned from the state the writer left. A group commit loads
// the instances of the steps it finished to plan them (loadMany), about a
// sixth of the writer's time on a chain: yet on a chain the instance is
// foreseeable, since this store's previous finish claimed the step that
// finishes now, and knew the instance as it left it. So a finish that
// planned an instance and claimed its next steps keeps the instance as it
// committed it (a snapshot), and the next finish of one of those steps
// plans from the snapshot with its completion applied, without reading.
//
// A snapshot holds only while nothing else wrote the database since the
// commit that kept it. The cache is emptied at the start of every write
// transaction of the store and filled again only by a finish that
// committed: with the snapshots of the instances it planned, and the
// earlier ones of the instances it did not write (not finished, planned
// or claimed from), or with none when it may have written other instances
// (a failure that cancels children, an expansion, a plan again: spilled).
// So a snapshot is used only by a finish with nothing but finishes since
// the commit that kept it. Another connection's
// commit (another process, or a pool of the caller's) shows as a change of
// PRAGMA data_version on the writer's connection, which every finish reads
// under its write lock, with the connection's own mark (temp.user_version,
// set once per connection) so that a new connection cannot pass for the
// old one. A store built with New writes through a pool its caller may
// write through too, on the same connection, where data_version would not
// change: it keeps no snapshots.
//
// A snapshot is kept only of an instance whose plan did nothing but make
// steps pending (or nothing), and is used only by a finish whose results
// for that instance all completed main steps, the transitions whose effect
// on the loaded state is known exactly: the step's status, its output and
// error, and for a claim the step's status and attempt.

// maxSnapshots bounds the snapshots kept: about as many as a worker runs
// steps at once.
const maxSnapshots = 4096

// snapshotCache holds the snapshots of the last finish's commit.
type snapshotCache struct {
	// used counts the instances finishes planned from snapshots.
	used atomic.Int64

	mu sync.Mutex
	// mark and version identify the writer's connection and its
	// data_version when the snapshots were taken.
	mark, version int64
	m             map[string]*loaded
	// writes counts the write transactions begun (take): a transaction
	// puts its snapshots only if none began after it, since the writer's
	// connection goes back to its pool at the commit, before the put.
	writes uint64
}

// snapshots are the snapshots a finish may use: those of the connection
// and data_version it runs under; write is the take that returned them.
type snapshots struct {
	mark, version int64
	m             map[string]*loaded
	write         uint64
}

// take empties the cache and returns what it held: a write transaction
// begins.
func (c *snapshotCache) take() snapshots {
	if c == nil {
		return snapshots{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes++
	s := snapshots{mark: c.mark, version: c.version, m: c.m, write: c.writes}
	c.m = nil
	return s
}

// put fills the cache with the snapshots of a committed write transaction,
// unless another began since it did.
func (c *snapshotCache) put(s snapshots) {
	if c == nil || len(s.m) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.writes != s.write {
		return
	}
	c.mark, c.version, c.m = s.mark, s.version, s.m
}

// writerMark returns the writer connection's mark and data_version,
// marking the connection first if it has no mark yet.
func (t *txn) writerMark() (mark, version int64, err error) {
	if err := t.tx.QueryRowContext(t.ctx, `PRAGMA temp.user_version`).Scan(&mark); err != nil {
		return 0, 0, err
	}
	if mark == 0 {
		mark = newWriterMark()
		if _, err := t.tx.ExecContext(t.ctx, `PRAGMA temp.user_version = `+strconv.FormatInt(mark, 10)); err != nil {
			return 0, 0, err
		}
	}
	if err := t.tx.QueryRowContext(t.ctx, `PRAGMA data_version`).Scan(&version); err != nil {
		return 0, 0, err
	}
	return mark, version, nil
}

// newWriterMark returns a mark for a writer's connection: never 0, which
// is an unmarked connection's.
func newWriterMark() int64 { return int64(rand.Int32N(1<<31-1)) + 1 }

// usable returns the snapshots of prior that this transaction may plan
// from: all of them when the writer's connection and data_version are as
// they were, none otherwise. It records the mark and version for the
// snapshots this transaction keeps.
func (t *txn) usable(prior snapshots) (map[string]*loaded, error) {
	mark, version, err := t.writerMark()
	if err != nil {
		return nil, err
	}
	t.kept = snapshots{mark: mark, version: version, write: prior.write}
	if prior.mark != mark || prior.version != version {
		return nil, nil
	}
	return prior.m, nil
}

// fromSnapshot returns the instance of sn with the completions of this
// transaction applied (done: its completed steps' results, by step ID),
// or nil when one of them is not a running step of the snapshot.
func fromSnapshot(sn *loaded, done map[int64]*storage.StepResult) *loaded {
	l := sn.clone()
	n := 0
	for i, id := range l.ids {
		r := done[id]
		if r == nil {
			continue
		}
		st := &l.state.Steps[i]
		if st.Status != storage.StepRunning {
			return nil
		}
		st.Status, st.Output, st.Error = storage.StepCompleted, rawJSON(r.Output), ""
		n++
	}
	if n != len(done) {
		return nil
	}
	return l
}

// foreseen returns the instances a finish may plan from snapshots: those
// whose accepted results all completed main steps, with the completions
// applied.
func foreseen(snaps map[string]*loaded, results []storage.StepResult, instanceOf []string, completedMain []bool) map[string]*loaded {
	done := make(map[string]map[int64]*storage.StepResult)
	other := make(map[string]bool)
	for i, id := range instanceOf {
		switch {
		case id == "":
		case !completedMain[i]:
			other[id] = true
		default:
			if done[id] == nil {
				done[id] = make(map[int64]*storage.StepResult)
			}
			done[id][results[i].Claim.StepID] = &results[i]
		}
	}
	out := make(map[string]*loaded, len(done))
	for id, d := range done {
		if sn := snaps[id]; sn != nil && !other[id] {
			if l := fromSnapshot(sn, d); l != nil {
				out[id] = l
			}
		}
	}
	return out
}

// keepSnapshots keeps the snapshots of a finish that wrote no other
// instances than those it finished (instanceOf), planned (touched) or
// claimed from: those of the instances it planned that it can follow
// (keep), and the prior ones (snaps) of every other instance, which it
// did not write.
func (t *txn) keepSnapshots(snaps map[string]*loaded, touched, instanceOf []string, claimed []storage.ClaimedStep) {
	claimedOf := make(map[string][]storage.ClaimedStep, len(claimed))
	for _, c := range claimed {
		claimedOf[c.InstanceID] = append(claimedOf[c.InstanceID], c)
	}
	for _, id := range touched {
		if l := t.planned[id]; l != nil {
			t.keep(l, claimedOf[id])
		}
	}
	written := make(map[string]bool, len(touched)+len(instanceOf))
	for _, id := range touched {
		written[id] = true
	}
	for _, id := range instanceOf {
		written[id] = true
	}
	for id, sn := range snaps {
		if !written[id] && claimedOf[id] == nil && len(t.kept.m) < maxSnapshots {
			if t.kept.m == nil {
				t.kept.m = make(map[string]*loaded)
			}
			t.kept.m[id] = sn
		}
	}
}

// keep records l, as its plan left it, with claimed (this transaction's
// claims of its steps) applied, as a snapshot this transaction keeps.
func (t *txn) keep(l *loaded, claimed []storage.ClaimedStep) {
	if t.kept.m == nil {
		t.kept.m = make(map[string]*loaded)
	}
	if len(t.kept.m) >= maxSnapshots {
		return
	}
	if st := &l.state; st.Deferred || st.Failure != nil || st.TimedOut != 0 || st.Status.Finished() {
		return // states whose next transitions a snapshot does not follow
	}
	sn := l.clone()
	for _, c := range claimed {
		i := slices.Index(sn.ids, c.StepID)
		if c.Item >= 0 || i < 0 {
			return // an item, or a step the snapshot does not hold
		}
		sn.state.Steps[i].Status, sn.state.Steps[i].Attempts = storage.StepRunning, c.Attempt
		if sn.state.Status == storage.InstancePending {
			sn.state.Status = storage.InstanceRunning // the claim started it
		}
	}
	sn.state.LoadDefinition = nil
	t.kept.m[sn.state.ID] = sn
}

// clone returns a copy of l that shares nothing a plan or a later
// transition changes.
func (l *loaded) clone() *loaded {
	c := *l
	c.state.Steps = slices.Clone(l.state.Steps)
	c.ids = slices.Clone(l.ids)
	if l.state.Failure != nil {
		f := *l.state.Failure
		c.state.Failure = &f
	}
	return &c
}
