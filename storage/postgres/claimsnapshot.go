package postgres

import (
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

// Snapshots taken by claims. A finish plans from a snapshot, in one round
// trip, only where this store's own last transaction on the instance left
// one (speculate.go): the finish that readied and claimed the next step of
// a chain, or the start that claimed its first. A step taken by any other
// claim, the claim loop's or the eager claim of a finish working off a
// backlog, was finished in two round trips, its transaction open in
// between while the worker read the instance back and planned. A fleet of
// worker processes on a busy machine waits long for its turn to run: with
// 40 of them on two cores (TestFleet), 14 to 15 server backends on average
// sat in such a transaction waiting for their worker, holding their
// instances' locks and the oldest snapshot back, so that every claim
// walked index entries no one could remove yet.
//
// So a claim that may leave snapshots also reads, on its own round trip
// and in its own transaction after its writes, the instances it took steps
// of, as the usual path reads them after locking them: each row is read
// with its version, so whatever a concurrent transaction did, the snapshot
// holds what the versions it records held, and the finish's check of those
// versions (verifySnapshots) decides as it does for any snapshot. The claim
// names its instances in a setting local to its transaction (markClaimed),
// since a statement cannot read what another returned. A snapshot is kept
// only of an instance that only its claimer can change next: running, not
// failing, no signal waiting, and every step finished, blocked, or taken by
// this claim. A finish's claim reads on the tail, and when follow-ups run
// after the tail (a child instance's parent to settle, children to start
// or cancel) they may write what it read at the transaction's own row
// versions, which a check of versions cannot tell apart: its snapshots are
// then dropped.

// claimedSetting holds, for the rest of a claim's transaction, the IDs of
// the instances whose steps (not items) it took, as a text[] literal.
const claimedSetting = "dagrun.claimed"

// claimedIDs reads claimedSetting: NULL when no claim of the transaction
// named any (a claim that took nothing need not run markClaimed's CTE, and
// an earlier transaction's setting reads as the empty string).
const claimedIDs = `nullif(current_setting('` + claimedSetting + `', true), '')::text[]`

// markClaimed is the claim statement's CTE that names its instances, for
// a claim of shape c that takes snapshots; markedBy joins it to the final
// SELECT, which makes it run. Its aggregate yields one row whatever u
// holds, so the join changes no row of the result.
func markClaimed(c claimShape) string {
	if !c.snapshots {
		return ""
	}
	return `,
mark AS (
	SELECT set_config('` + claimedSetting + `', coalesce(array_agg(DISTINCT u.instance_id)::text, ''), true) AS claimed_instances
	FROM u WHERE u.item_index = -1
)`
}

// markedBy is the join that runs markClaimed's CTE.
func markedBy(c claimShape) string {
	if !c.snapshots {
		return ""
	}
	return ` CROSS JOIN mark`
}

// claimedInstancesSQL reads the instances markClaimed named but those of
// $1, as lockInstancesSQL does but without a lock, leaving out those a
// snapshot cannot serve: not running, failing, with a signal waiting, or
// with an input larger than a snapshot keeps.
var claimedInstancesSQL = `
SELECT i.id, i.workflow, i.definition_hash, i.status, i.input, i.timeout_us, i.failing, i.error, i.failed_step, i.depth,
	coalesce(i.traceparent, '') AS traceparent, i.xmin::text AS xmin,
	i.held OR i.deferred OR i.finished_at IS NOT NULL AND i.concurrency_key IS NOT NULL AS deferred
FROM {s}instances i
WHERE i.id = ANY(` + claimedIDs + `) AND i.id <> ALL($1::text[]) AND i.status = 'running' AND NOT i.failing
	AND coalesce(octet_length(i.input::text), 0) <= ` + strconv.Itoa(maxSnapshotBytes) + `
	AND NOT EXISTS (SELECT 1 FROM {s}signals g WHERE g.instance_id = i.id AND NOT g.delivered)`

// claimedStepsSQL reads the steps of the instances markClaimed named but
// those of $1, as loadStepStatesSQL does.
var claimedStepsSQL = oneRow(loadStepStatesSQL, `instance_id = ANY($1)`, `instance_id = ANY(`+claimedIDs+`) AND instance_id <> ALL($1::text[])`)

// queueClaimedReads queues, on b after a claim statement that names its
// instances, the reads of those instances but the known ones; into
// receives them.
func (s *Store) queueClaimedReads(b *pgx.Batch, known []string, into map[string]*loaded) {
	if known == nil {
		known = []string{}
	}
	b.Queue(s.q(claimedInstancesSQL), known).Query(func(rows pgx.Rows) error { return scanInstances(rows, into) })
	b.Queue(s.q(claimedStepsSQL), known).Query(func(rows pgx.Rows) error { return scanStepStates(rows, into) })
}

// claimedSnapshots returns the snapshots of the instances read after a
// claim that took claimed: those whose every step is finished, blocked, or
// running under a claim it made, and small enough to keep.
func claimedSnapshots(read map[string]*loaded, claimed []storage.ClaimedStep, taken time.Time) []*snapshot {
	var out []*snapshot
	for _, l := range read {
		if len(l.ids) == 0 || l.size() > maxSnapshotBytes || !onlyClaimedRun(l, claimed) {
			continue
		}
		out = append(out, &snapshot{loaded: l, steps: renderVersions(l.ids, l.xmins), taken: taken})
	}
	return out
}

// onlyClaimedRun reports whether every step of l is finished, blocked, or
// running under one of claimed, as read.
func onlyClaimedRun(l *loaded, claimed []storage.ClaimedStep) bool {
	for i, st := range l.state.Steps {
		switch st.Status {
		case storage.StepBlocked, storage.StepCompleted, storage.StepFailed, storage.StepSkipped, storage.StepCancelled:
		case storage.StepRunning:
			if !claimedAs(claimed, l.ids[i], l.fences[i]) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// claimedAs reports whether claimed holds the step stepID under fence.
func claimedAs(claimed []storage.ClaimedStep, stepID, fence int64) bool {
	for _, c := range claimed {
		if c.StepID == stepID && c.Fence == fence && c.Item < 0 {
			return true
		}
	}
	return false
}

// instanceIDsOf returns the IDs of the instances of list.
func instanceIDsOf(list []*loaded) []string {
	ids := make([]string, len(list))
	for i, l := range list {
		ids[i] = l.state.ID
	}
	return ids
}
