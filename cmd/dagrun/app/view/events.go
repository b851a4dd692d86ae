package view

import (
	"fmt"

	"github.com/dagrun/dagrun/storage"
)

// Bounds of one page of an instance's history.
const (
	DefaultEventLimit = 100
	MaxEventLimit     = 1000
)

// NewEvent converts a stored event.
func NewEvent(ev storage.Event) Event {
	return Event{At: Time(ev.At), Type: string(ev.Type), Step: ev.Step, Attempt: ev.Attempt, Message: ev.Message, Actor: ev.Actor}
}

// HistoryEvent is an event of a page of history, with its ID: the after of
// the page that follows it.
type HistoryEvent struct {
	ID int64 `json:"id"`
	Event
}

// EventPage is a page of an instance's history in ID order. Next, present
// when more events follow, is the after of the next page; on the last page
// a follower polls with the last event's ID.
type EventPage struct {
	Events []HistoryEvent `json:"events"`
	Next   *int64         `json:"next,omitempty"`
}

// NewEventPage builds a page of at most limit events from events, read
// with a limit of one more to tell whether more follow.
func NewEventPage(events []storage.Event, limit int) EventPage {
	page := EventPage{Events: make([]HistoryEvent, 0, min(len(events), limit))}
	for i, ev := range events {
		if i == limit {
			next := events[i-1].ID
			page.Next = &next
			break
		}
		page.Events = append(page.Events, HistoryEvent{ID: ev.ID, Event: NewEvent(ev)})
	}
	return page
}

// CheckEventPaging validates an after and a limit from outside; prefix is
// how the caller names its parameters ("--" for flags).
func CheckEventPaging(after int64, limit int, prefix string) error {
	return checkPaging(after, limit, MaxEventLimit, prefix)
}

// checkPaging validates the after and the limit of a page whose limit is
// at most maxLimit.
func checkPaging(after int64, limit, maxLimit int, prefix string) error {
	if after < 0 {
		return fmt.Errorf("invalid %safter %d: must not be negative", prefix, after)
	}
	if limit < 1 || limit > maxLimit {
		return fmt.Errorf("invalid %slimit %d: must be from 1 to %d", prefix, limit, maxLimit)
	}
	return nil
}
