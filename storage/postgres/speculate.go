package postgres

import (
	"cmp"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dagrun/dagrun/storage"
)

// Finishes planned from snapshots. A finish takes two round trips: one to
// lock the instances, record the results and read the instances back, one
// to apply the plans made from what it read, claim, and commit. On a chain
// the read is foreseeable: the step that finishes was claimed by this
// store's previous transaction on the instance, which made that step
// ready and knew the instance as it left it. So a FinishAndClaim whose
// claim continues an instance keeps a snapshot of it: what it read,
// changed by what it wrote (its results, a plan that made steps pending,
// the claim), with the version (xmin) of each row, the ID of the
// transaction that last wrote it. The next finish of the claimed step
// plans from the snapshot with its result applied, without reading, and
// sends the lock, a check that the instance and its steps are still the
// row versions the snapshot holds and that no signal waits, the results,
// the plans, the claim and the commit in one round trip. When the check
// fails (another transaction wrote the instance in between: a cancel, a
// signal, a sibling's claim or lease renewal), it raises, the transaction
// rolls back, and the finish runs again the usual way. A claim that took
// a step of an instance no one else can change reads the instance and
// keeps a snapshot of it too (claimsnapshot.go).
//
// The check is complete because a plan is a pure function of what
// lockInstancesSQL, loadStepStatesSQL and loadSignalsSQL read: the same
// row versions read the same. A snapshot that gets a version wrong only
// fails the next check; what must hold is that a row the snapshot gives
// this transaction's version holds what the snapshot says, which derive
// ensures by keeping no snapshot of an instance whose plan did more than
// make steps pending. After the lock, only claims and lease renewals
// change an instance's steps; the usual path may see them or not as well.

// maxSnapshots bounds the snapshots a store keeps, and maxSnapshotBytes
// the input and outputs of an instance it keeps one of (16 MiB at most in
// all: a worker has about as many as it runs steps, and a step that is
// released or cancelled leaves one behind until it expires); snapshotTTL
// is how long one stays usable (a step that runs long is finished the
// usual way, and no transaction ID comes round again meanwhile).
const (
	maxSnapshots     = 1024
	maxSnapshotBytes = 16 << 10
	snapshotTTL      = time.Minute
)

// staleSnapshot is raised by verifySnapshots; it travels in the error
// of a failed cast to int, the one way a plain statement can raise.
const staleSnapshot = "dagrun: stale snapshot"

// snapshot is an instance as a transaction of this store left it.
type snapshot struct {
	loaded *loaded
	// steps renders the steps' versions as verifySnapshots does.
	steps string
	taken time.Time
}

// snapshots holds the snapshots of a store, by instance.
type snapshots struct {
	mu sync.Mutex
	m  map[string]*snapshot
}

// put keeps the snapshots of list, in place of any of the same instances,
// making room within maxSnapshots.
func (c *snapshots) put(list []*snapshot) {
	if len(list) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]*snapshot)
	}
	if len(c.m)+len(list) > maxSnapshots {
		// The expired first; all of them if that is not enough.
		now := time.Now()
		for id, sn := range c.m {
			if now.Sub(sn.taken) > snapshotTTL {
				delete(c.m, id)
			}
		}
		if len(c.m)+len(list) > maxSnapshots {
			clear(c.m)
		}
	}
	for _, sn := range list {
		c.m[sn.loaded.state.ID] = sn
	}
}

// renewed gives the steps whose leases a renewal of this store extended
// their new versions in the snapshots that hold them, so that a worker's
// heartbeat does not make its own snapshots stale.
func (c *snapshots) renewed(claims []storage.Claim, versions map[int64]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cl := range claims {
		sn := c.m[cl.InstanceID]
		xmin, ok := versions[cl.StepID]
		if sn == nil || !ok {
			continue
		}
		l := sn.loaded
		i := slices.Index(l.ids, cl.StepID)
		if i < 0 || l.fences[i] != cl.Fence {
			continue
		}
		// Replaced, not changed: a kept snapshot never changes.
		l = l.clone()
		l.xmins[i] = xmin
		c.m[cl.InstanceID] = &snapshot{loaded: l, steps: renderVersions(l.ids, l.xmins), taken: sn.taken}
	}
}

// predict returns, for results that are all completions of steps whose
// instances have fresh snapshots, each instance as the usual path would
// read it after the results, and the snapshots to check. It takes the
// snapshots it uses, and returns nil when any result cannot be foreseen.
func (c *snapshots) predict(results []storage.StepResult, now time.Time) (map[string]*loaded, []*snapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) == 0 {
		return nil, nil
	}
	// A snapshot serves the next finish of its instance or none.
	taken := make(map[string]*snapshot)
	for _, r := range results {
		if sn := c.m[r.Claim.InstanceID]; sn != nil {
			taken[r.Claim.InstanceID] = sn
			delete(c.m, r.Claim.InstanceID)
		}
	}
	predicted := make(map[string]*loaded)
	var used []*snapshot
	for _, r := range results {
		if r.Outcome != storage.OutcomeCompleted {
			return nil, nil
		}
		id := r.Claim.InstanceID
		l := predicted[id]
		if l == nil {
			sn := taken[id]
			if sn == nil || now.Sub(sn.taken) > snapshotTTL {
				return nil, nil
			}
			l = sn.loaded.clone()
			predicted[id] = l
			used = append(used, sn)
		}
		i := slices.Index(l.ids, r.Claim.StepID)
		if i < 0 || l.fences[i] != r.Claim.Fence || l.state.Steps[i].Status != storage.StepRunning {
			return nil, nil // an item, or a claim the snapshot does not show
		}
		// What finishSQL writes for a completion.
		l.state.Steps[i].Status = storage.StepCompleted
		l.state.Steps[i].Output = rawJSON(jsonOrNil(r.Output))
		l.state.Steps[i].Error = ""
	}
	return predicted, used
}

// clone copies l deeply enough for a transaction to change its steps.
func (l *loaded) clone() *loaded {
	cp := *l
	cp.state.Steps = slices.Clone(l.state.Steps)
	cp.fences = slices.Clone(l.fences)
	cp.xmins = slices.Clone(l.xmins)
	return &cp
}

// snapshotStepsSQL renders the versions of the steps of instance v.id.
const snapshotStepsSQL = `SELECT coalesce(string_agg(s.id || ':' || s.xmin::text, ',' ORDER BY s.id), '')
	FROM {s}steps s WHERE s.instance_id = v.id AND s.item_index = -1`

// verifySnapshots returns the check of the snapshots whose instance IDs,
// instance versions (xmin) and rendered step versions are the arrays ids,
// xmins and steps: one row whose ok raises staleSnapshot unless every
// instance is that row version, with no signal waiting, and its steps the
// versions listed, and the condition also holds, and whose txid is the
// transaction's ID, the xmin of the rows it writes. It reads each
// instance by key.
func verifySnapshots(ids, xmins, steps, also string) string {
	return `SELECT (CASE WHEN count(*) = cardinality(` + ids + `::text[]) AND ` + also + ` THEN '0' ELSE '` + staleSnapshot + `' END)::int AS ok,
	pg_current_xact_id()::xid::text AS txid
FROM unnest(` + ids + `::text[], ` + xmins + `::text[], ` + steps + `::text[]) AS v(id, xmin, steps)
JOIN {s}instances i ON i.id = v.id
WHERE i.xmin::text = v.xmin
	AND NOT EXISTS (SELECT 1 FROM {s}signals g WHERE g.instance_id = v.id AND NOT g.delivered)
	AND (` + snapshotStepsSQL + `) = v.steps`
}

// A finish planned from snapshots checks them in its finishing statement,
// after the statement that locked their instances: a statement's snapshot
// is taken as it starts, so the check sees every transaction that held an
// instance's lock before this one, and sees the steps as they were before
// the statement's own writes, as the snapshots have them. The check also
// counts the steps the statement finished: the plans, the claim and the
// COMMIT follow on the same round trip, so a finish that recorded fewer
// results than it had (a step no longer running under its claim, which the
// snapshots said it was) must abort the transaction on the server, as a
// stale snapshot does; the client learns of it only once all of it ran.
// The check is the preserved side of the join with the finished rows, so
// it runs even when there are none, and both its columns are returned, or
// the planner would drop the unread cast that raises.
var (
	verifiedFinishSQL    = verifiedFinish(finishSQL, "cardinality($2::bigint[])")
	verifiedFinishOneSQL = verifiedFinish(finishOneSQL, "1")
)

// verifiedFinish returns finish with the snapshots' check, finish
// recording expected results.
func verifiedFinish(finish, expected string) string {
	return oneRow(finish, finishSelect, `,
checked AS (`+verifySnapshots("$11", "$12", "$13", "(SELECT count(*) FROM u) = "+expected)+`
)
SELECT u.ord, u.instance_id, u.status, u.queue, coalesce(u.parent_id, 0), `+slotWanted+`, checked.ok, checked.txid
FROM checked LEFT JOIN u ON true`)
}

// snapshotChecks returns the arguments of verifySnapshots for the
// snapshots used.
func snapshotChecks(used []*snapshot) (ids, xmins, steps []string) {
	ids, xmins, steps = make([]string, len(used)), make([]string, len(used)), make([]string, len(used))
	for i, sn := range used {
		ids[i], xmins[i], steps[i] = sn.loaded.state.ID, sn.loaded.xmin, sn.steps
	}
	return ids, xmins, steps
}

// isStaleSnapshot reports whether err is the snapshots' check's.
func isStaleSnapshot(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "22P02" && strings.Contains(pe.Message, staleSnapshot)
}

// planRecorder wraps a PlanFunc, keeping each instance's plan and how often
// it was asked, so that derive can tell what the plans wrote.
type planRecorder struct {
	plan  storage.PlanFunc
	plans map[string]*storage.Plan
	calls map[string]int
}

func newPlanRecorder(plan storage.PlanFunc) *planRecorder {
	return &planRecorder{plan: plan, plans: map[string]*storage.Plan{}, calls: map[string]int{}}
}

func (r *planRecorder) record(st *storage.InstanceState) (*storage.Plan, error) {
	p, err := r.plan(st)
	r.plans[st.ID] = p
	r.calls[st.ID]++
	return p, err
}

// derive returns the snapshots a committed finish leaves: each planned
// instance (its steps after the results and its plan, with the versions
// it was read or predicted with), with the steps the claim took running,
// and the rows the transaction wrote at its ID txid. It keeps one only
// where it knows every column the plans read that the transaction wrote,
// and where only this worker is to write next: a plan that made steps
// pending and did nothing else, in a running instance (which the claim
// does not start) with no signal waiting, whose steps are all finished,
// blocked, or taken by the claim. The rows the transaction wrote are
// then the results' steps and the claimed ones (a step made pending was
// claimed too).
func derive(planned []*loaded, rec *planRecorder, results []storage.StepResult,
	claimed []storage.ClaimedStep, txid string, taken time.Time) []*snapshot {
	if txid == "" || len(claimed) == 0 {
		return nil
	}
	var out []*snapshot
	for _, l := range planned {
		id := l.state.ID
		p := rec.plans[id]
		if rec.calls[id] != 1 || p == nil || p.Instance != nil || p.Failure != nil || len(l.signals) > 0 ||
			l.state.Status != storage.InstanceRunning || len(l.ids) != len(l.state.Steps) || !claimedIn(claimed, id) ||
			l.size() > maxSnapshotBytes {
			continue
		}
		sn := l.clone()
		sn.state.LoadDefinition = nil
		written := map[int64]bool{}
		for _, r := range results {
			if r.Claim.InstanceID == id {
				written[r.Claim.StepID] = true
			}
		}
		simple := true
		for _, ch := range p.Steps {
			if ch.Status != storage.StepPending || len(ch.Items) > 0 || len(ch.Children) > 0 {
				simple = false
				break
			}
		}
		for _, c := range claimed {
			if !simple {
				break
			}
			if c.InstanceID != id || c.Item >= 0 {
				continue
			}
			i := stepIndex(&sn.state, c.Step)
			if i < 0 || sn.ids[i] != c.StepID {
				simple = false
				break
			}
			// What the claim writes.
			sn.state.Steps[i].Status = storage.StepRunning
			sn.state.Steps[i].Attempts = c.Attempt
			sn.fences[i] = c.Fence
			written[c.StepID] = true
		}
		// Only an instance no other worker can change is worth keeping:
		// every step not finished is blocked or was claimed right here
		// (a step made pending that the claim left, or one running
		// elsewhere, would change before the next finish, failing it).
		for i, st := range sn.state.Steps {
			if !simple {
				break
			}
			switch st.Status {
			case storage.StepBlocked, storage.StepCompleted, storage.StepFailed, storage.StepSkipped, storage.StepCancelled:
			case storage.StepRunning:
				simple = slices.ContainsFunc(claimed, func(c storage.ClaimedStep) bool { return c.StepID == sn.ids[i] })
			default:
				simple = false
			}
		}
		if !simple {
			continue
		}
		for i, stepID := range sn.ids {
			if written[stepID] {
				sn.xmins[i] = txid
			}
		}
		out = append(out, &snapshot{loaded: sn, steps: renderVersions(sn.ids, sn.xmins), taken: taken})
	}
	return out
}

// createdStepsSQL reads the IDs of the steps of instances this
// transaction created, and the transaction's ID: with what it created and
// claimed, all a snapshot of them needs (see deriveCreated).
const createdStepsSQL = `
SELECT instance_id, id, pg_current_xact_id()::xid::text FROM {s}steps
WHERE instance_id = ANY($1) AND item_index = -1 ORDER BY instance_id, position`

// queueCreatedSteps queues, on the tail after the claim of a start, the
// read of the step IDs of the instances it creates that an eager claim
// may continue (a few at most: a large batch of starts is its own round
// trip's worth); ids and txid receive them.
func (s *Store) queueCreatedSteps(st *txState, created []*storage.NewInstance, ids *map[string][]int64, txid *string) {
	var want []string
	for _, n := range created {
		if len(want) == maxCreatedSnapshots {
			break
		}
		if createdSnapshottable(n) {
			want = append(want, n.Params.ID)
		}
	}
	if len(want) == 0 {
		return
	}
	st.tail.Queue(s.q(createdStepsSQL), want).Query(func(rows pgx.Rows) error {
		got := map[string][]int64{}
		var (
			instanceID string
			stepID     int64
		)
		_, err := pgx.ForEachRow(rows, []any{&instanceID, &stepID, txid}, func() error {
			got[instanceID] = append(got[instanceID], stepID)
			return nil
		})
		*ids = got
		return err
	})
}

// maxCreatedSnapshots bounds the instances of one start read back for
// snapshots.
const maxCreatedSnapshots = 8

// createdSnapshottable reports whether a new instance is one derive could
// keep a snapshot of once claimed: pending, not failing, its steps blocked
// or ready, and small.
func createdSnapshottable(n *storage.NewInstance) bool {
	if n.Status != storage.InstancePending || n.Failing || len(n.Params.Input) > maxSnapshotBytes {
		return false
	}
	for _, ns := range n.Steps {
		if ns.Status != storage.StepBlocked && ns.Status != storage.StepPending {
			return false
		}
	}
	return true
}

// deriveCreated returns the snapshots a committed start with an eager
// claim leaves: each instance it created as the usual read would find it,
// with the steps the claim took running, every row at the transaction's
// ID; but only where every step it made ready was claimed (see derive).
func deriveCreated(created []*storage.NewInstance, ids map[string][]int64, claimed []storage.ClaimedStep, txid string, taken time.Time) []*snapshot {
	if txid == "" || len(claimed) == 0 {
		return nil
	}
	var out []*snapshot
	for _, n := range created {
		p := n.Params
		stepIDs := ids[p.ID]
		if !createdSnapshottable(n) || len(stepIDs) != len(p.Steps) || !claimedIn(claimed, p.ID) {
			continue
		}
		l := &loaded{
			state: storage.InstanceState{ID: p.ID, Workflow: p.Workflow, DefinitionHash: p.DefinitionHash,
				// The eager claim started it.
				Status: storage.InstanceRunning, Input: rawJSON(jsonOrNil(p.Input)), Depth: p.Depth,
				TraceParent: p.TraceParent,
				Steps:       make([]storage.StepState, len(p.Steps))},
			timeout: p.Timeout.Microseconds(),
			ids:     stepIDs,
			fences:  make([]int64, len(p.Steps)),
			xmins:   make([]string, len(p.Steps)),
			xmin:    txid,
		}
		ok := true
		for i, sp := range p.Steps {
			st := storage.StepState{Name: sp.Name, Status: n.Steps[i].Status, Error: n.Steps[i].Error}
			if len(sp.DependsOn) > 0 {
				st.DependsOn = sp.DependsOn
			}
			if k := slices.IndexFunc(claimed, func(c storage.ClaimedStep) bool { return c.StepID == stepIDs[i] }); k >= 0 {
				st.Status, st.Attempts, l.fences[i] = storage.StepRunning, claimed[k].Attempt, claimed[k].Fence
			}
			// A step made ready that the claim left could be claimed
			// elsewhere before the next finish.
			ok = ok && st.Status != storage.StepPending
			l.state.Steps[i] = st
			l.queues = append(l.queues, queueOf(sp))
			signal := ""
			if sp.Wait != nil {
				signal = sp.Wait.Signal
			}
			l.waitSignals = append(l.waitSignals, signal)
			l.onFailure = append(l.onFailure, sp.OnFailure)
			l.xmins[i] = txid
		}
		if !ok || l.size() > maxSnapshotBytes {
			continue
		}
		out = append(out, &snapshot{loaded: l, steps: renderVersions(l.ids, l.xmins), taken: taken})
	}
	return out
}

// size is the bytes of the instance's input and step outputs.
func (l *loaded) size() int {
	n := len(l.state.Input)
	for _, st := range l.state.Steps {
		n += len(st.Output)
	}
	return n
}

// claimedIn reports whether claimed holds a step (not an item) of the
// instance.
func claimedIn(claimed []storage.ClaimedStep, instanceID string) bool {
	return slices.ContainsFunc(claimed, func(c storage.ClaimedStep) bool { return c.InstanceID == instanceID && c.Item < 0 })
}

// renderVersions renders step versions as snapshotStepsSQL does: "id:xmin"
// ordered by id, comma-separated.
func renderVersions(ids []int64, xmins []string) string {
	order := make([]int, len(ids))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(ids[a], ids[b]) })
	var sb strings.Builder
	for k, i := range order {
		if k > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(strconv.FormatInt(ids[i], 10))
		sb.WriteByte(':')
		sb.WriteString(xmins[i])
	}
	return sb.String()
}

// clonePredicted copies predicted states for one attempt of a
// transaction, which plans change as they go.
func clonePredicted(predicted map[string]*loaded) []*loaded {
	out := make([]*loaded, 0, len(predicted))
	for _, l := range predicted {
		out = append(out, l.clone())
	}
	return out
}
