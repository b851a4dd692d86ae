package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"

	"github.com/dagrun/dagrun/storage"
)

// SQLite has one writer at a time, and a transaction takes its event IDs
// above every committed one, so events become visible in ID order: a
// follower's cursor is the greatest ID it has seen.

// instanceKey is the key events name an instance by (see migration 15),
// from its ID.
const instanceKey = `(SELECT key FROM instance_keys WHERE id = ?)`

// eventFields are the columns of a storage.Event, in the order queryEvents scans them.
const eventFields = `id, instance_id, step, type, attempt, message, at, actor`

// latestEventsSQL reads an instance's latest events, newest first, walking
// events_instance backwards from its end: as cheap at 100,000 events as at 10.
const latestEventsSQL = `SELECT ` + eventFields + ` FROM events WHERE instance_key = ` + instanceKey + ` ORDER BY id DESC LIMIT CAST(? AS INTEGER)`

// ListEvents implements storage.Store.
func (s *Store) ListEvents(ctx context.Context, p storage.EventsParams) ([]storage.Event, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 100
	}
	var out []storage.Event
	err := s.read(ctx, "list events", func(tx *sql.Tx) error {
		if err := instanceExists(ctx, tx, p.InstanceID); err != nil {
			return err
		}
		var err error
		out, err = queryEvents(ctx, tx, `SELECT `+eventFields+` FROM events WHERE instance_key = `+instanceKey+` AND id > ? ORDER BY id LIMIT CAST(? AS INTEGER)`,
			p.InstanceID, p.AfterID, limit)
		return err
	})
	return out, err
}

// FollowEvents implements storage.Store. The cursor is the greatest event
// ID of the instance the follower has seen.
func (s *Store) FollowEvents(ctx context.Context, id string, cursor storage.EventCursor) ([]storage.Event, storage.EventCursor, error) {
	var after int64
	if cursor != "" {
		var err error
		if after, err = strconv.ParseInt(string(cursor), 10, 64); err != nil {
			return nil, "", fmt.Errorf("sqlite: follow events: cursor %q is not one this store returned", cursor)
		}
	}
	var out []storage.Event
	err := s.read(ctx, "follow events", func(tx *sql.Tx) error {
		if err := instanceExists(ctx, tx, id); err != nil {
			return err
		}
		var err error
		if cursor == "" {
			out, err = latestEvents(ctx, tx, id, storage.FollowTail)
		} else {
			out, err = queryEvents(ctx, tx, `SELECT `+eventFields+` FROM events WHERE instance_key = `+instanceKey+` AND id > ? ORDER BY id`, id, after)
		}
		return err
	})
	if err != nil {
		return nil, "", err
	}
	if len(out) > 0 {
		after = out[len(out)-1].ID
	}
	return out, storage.EventCursor(strconv.FormatInt(after, 10)), nil
}

// latestEvents returns the latest n events of an instance in ID order.
func latestEvents(ctx context.Context, tx *sql.Tx, id string, n int) ([]storage.Event, error) {
	out, err := queryEvents(ctx, tx, latestEventsSQL, id, n)
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, err
}

func instanceExists(ctx context.Context, tx *sql.Tx, id string) error {
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM instances WHERE id = ?`, id).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("instance %s: %w", id, storage.ErrNotFound)
	}
	return nil
}

func queryEvents(ctx context.Context, tx *sql.Tx, query string, args ...any) ([]storage.Event, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	var out []storage.Event
	err = eachRow(rows, func(sc scanner) error {
		var (
			e  storage.Event
			at int64
		)
		if err := sc.Scan(&e.ID, &e.InstanceID, &e.Step, &e.Type, &e.Attempt, &e.Message, &at, &e.Actor); err != nil {
			return err
		}
		e.At = fromUS(at)
		out = append(out, e)
		return nil
	})
	return out, err
}
