package storage

// An instance's history is read a page at a time, never whole: an instance
// that retried or snoozed for months may have hundreds of thousands of
// events, and neither GetInstance nor a follower may read them all.

// InstanceEvents is how many of an instance's latest events GetInstance
// returns with it; Instance.EventsTruncated tells that older ones exist,
// which ListEvents pages.
const InstanceEvents = 100

// FollowTail is how many of the latest events the first FollowEvents call
// of a follower returns: the history so far, as far as a follower looks
// back.
const FollowTail = 1000

// EventsParams pages the events of one instance in ID order.
type EventsParams struct {
	InstanceID string
	// AfterID returns only events with a greater ID; 0 starts at the first.
	AfterID int64
	// Limit defaults to 100 when zero.
	Limit int
}

// EventCursor is how far a follower of an instance's history has read, as
// FollowEvents returned it: opaque to callers, meaningful only to the
// store that returned it. The zero value starts a follower.
type EventCursor string
