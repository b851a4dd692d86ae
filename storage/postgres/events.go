package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

// eventFields are the columns of a storage.Event, as scanEvents reads them.
const eventFields = `id, instance_id, step, type, attempt, message, at, actor`

// latestEventsSQL reads an instance's latest $2 events, newest first,
// walking events_pkey (instance_id, id) backwards from its end: as cheap at 100,000
// events as at 10.
const latestEventsSQL = `SELECT ` + eventFields + ` FROM {s}events WHERE instance_id = $1 ORDER BY id DESC LIMIT $2`

// eventsAfterSQL reads a page of an instance's events: those after ID $2,
// at most $3.
const eventsAfterSQL = `SELECT ` + eventFields + ` FROM {s}events WHERE instance_id = $1 AND id > $2 ORDER BY id LIMIT $3`

// unseenEventsSQL reads the events of an instance that the snapshot $2 did
// not see (see FollowEvents).
const unseenEventsSQL = `SELECT ` + eventFields + ` FROM {s}events
	WHERE instance_id = $1 AND tx >= pg_snapshot_xmin($2::pg_snapshot) AND NOT pg_visible_in_snapshot(tx, $2::pg_snapshot)`

// ListEvents implements storage.Store: one statement, which finds the
// instance and reads its page of events.
func (s *Store) ListEvents(ctx context.Context, p storage.EventsParams) ([]storage.Event, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 100
	}
	events, _, err := s.instanceEvents(ctx, p.InstanceID, eventsAfterSQL, p.AfterID, limit)
	if err != nil {
		return nil, s.fail("list events", err)
	}
	return events, nil
}

// FollowEvents implements storage.Store. The cursor is the snapshot of
// the previous call (see migration 15): the events it could not see are
// those of transactions from its xmin on that it does not list as
// visible, and the index on (instance_id, tx) finds them without reading
// the rest of the history. The new cursor is the snapshot the events were
// read in, taken by the same statement.
func (s *Store) FollowEvents(ctx context.Context, id string, cursor storage.EventCursor) ([]storage.Event, storage.EventCursor, error) {
	var (
		events   []storage.Event
		snapshot string
		err      error
	)
	if cursor == "" {
		events, snapshot, err = s.instanceEvents(ctx, id, latestEventsSQL, storage.FollowTail)
	} else {
		events, snapshot, err = s.instanceEvents(ctx, id, unseenEventsSQL, string(cursor))
	}
	if err != nil {
		return nil, "", s.fail("follow events", err)
	}
	return events, storage.EventCursor(snapshot), nil
}

// instanceEventsSQL wraps query, a select of an instance's events, in the
// statement instanceEvents runs.
func instanceEventsSQL(query string) string {
	return `SELECT pg_current_snapshot()::text, e.* FROM {s}instances i
		LEFT JOIN LATERAL (` + query + `) e ON true WHERE i.id = $1 ORDER BY e.id`
}

// instanceEvents runs query, a select of eventFields whose $1 is the
// instance ID and whose further parameters are args, for an instance that
// must exist, and returns the events in ID order with the snapshot they
// were read in: one statement, so one snapshot.
func (s *Store) instanceEvents(ctx context.Context, id, query string, args ...any) (events []storage.Event, snapshot string, err error) {
	err = s.retry(ctx, func() (err error) {
		events, snapshot, err = s.instanceEventsOnce(ctx, id, query, args...)
		return err
	})
	return events, snapshot, err
}

// instanceEventsOnce is one try of instanceEvents.
func (s *Store) instanceEventsOnce(ctx context.Context, id, query string, args ...any) ([]storage.Event, string, error) {
	rows, err := s.db.Query(ctx, s.q(instanceEventsSQL(query)), append([]any{id}, args...)...)
	if err != nil {
		return nil, "", err
	}
	var (
		events   []storage.Event
		snapshot string
		found    bool
		// An instance without events (never, but the join allows it)
		// reads as one row of NULLs.
		eid                             *int64
		instance, step, typ, msg, actor *string
		attempt                         *int
		at                              *time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&snapshot, &eid, &instance, &step, &typ, &attempt, &msg, &at, &actor}, func() error {
		found = true
		if eid != nil {
			events = append(events, storage.Event{ID: *eid, InstanceID: *instance, Step: *step, Type: storage.EventType(*typ),
				Attempt: *attempt, Message: *msg, At: at.UTC(), Actor: *actor})
		}
		return nil
	})
	if err == nil && !found {
		err = fmt.Errorf("instance %s: %w", id, storage.ErrNotFound)
	}
	return events, snapshot, err
}
