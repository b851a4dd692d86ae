package postgres

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// One-row statements. The store's statements take their rows as arrays
// (unnest, = ANY) so that one prepared statement serves a batch of any
// size. For a batch of one, what nearly every transition of a store that
// is not saturated writes, PostgreSQL spends 0.07 to 0.2 ms more on the
// array form of a statement than on the same statement with scalar
// parameters (rolled-back probes of each, interleaved: applying one plan
// 0.41 -> 0.21 ms, finishing one step 0.28 -> 0.21 ms, locking and loading
// one instance 0.17 -> 0.10 ms). Each statement here is the array form
// with its rows given as scalars instead, made from it when the package
// loads, so the two cannot drift apart.
var (
	finishOneSQL = oneRow(finishSQL,
		finishRows, `SELECT $2::bigint AS step_id, $3::text AS instance_id, $4::bigint AS fence, $5::int AS outcome,
		$6::json AS output, $7::text AS error, $8::text AS message, $9::timestamptz AS run_after, $10::bigint AS delay_us,
		1::bigint AS ord`,
		finishLocked, `s.id = $2::bigint`)
	lockInstanceSQL    = oneRow(lockInstancesSQL, `id = ANY($1)`, `id = $1::text`)
	loadStepStateSQL   = oneRow(loadStepStatesSQL, `instance_id = ANY($1)`, `instance_id = $1::text`)
	loadSignalSQL      = oneRow(loadSignalsSQL, `instance_id = ANY($1)`, `instance_id = $1::text`)
	applyReadyOneSQL   = oneRow(applyReadySQL, applyRows, applyRow)
	applyStepChangeSQL = oneRow(applyStepChangesSQL, applyRows, applyRow)
	finishInstanceSQL  = oneRow(finishInstancesSQL, finishInstancesRows,
		`SELECT $2::text AS id, $3::text AS status, $4::json AS output, $5::text AS error, $6::text AS failed_step`)
)

// applyRow is applyRows for one change.
const applyRow = `SELECT $2::text AS instance_id, $3::text AS name, $4::text AS status, $5::json AS input,
		$6::text AS error, $7::text AS ckey, 1::bigint AS ord`

// oneRow returns sql with each of pairs' old texts replaced by the new
// text that follows it; a missing old text is a bug, caught as the
// package loads.
func oneRow(sql string, pairs ...string) string {
	for i := 0; i+1 < len(pairs); i += 2 {
		if !strings.Contains(sql, pairs[i]) {
			panic("postgres: one-row statement: " + pairs[i] + " not found")
		}
		sql = strings.Replace(sql, pairs[i], pairs[i+1], 1)
	}
	return sql
}

// queueByIDs queues many (its ids as $1, an array) on b, or one (the id
// as $1) when ids name one ID, however many times.
func queueByIDs(b *pgx.Batch, many, one string, ids []string) *pgx.QueuedQuery {
	if len(ids) == 0 {
		return b.Queue(many, ids)
	}
	for _, id := range ids[1:] {
		if id != ids[0] {
			return b.Queue(many, ids)
		}
	}
	return b.Queue(one, ids[0])
}
