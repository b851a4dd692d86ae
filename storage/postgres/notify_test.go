package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// heldNotifier returns a notifier whose every send waits for release: it
// tells started when a send begins, and sent lists the payloads sent.
func heldNotifier() (n *notifier, started <-chan struct{}, release chan struct{}, sent func() []string) {
	var (
		mu       sync.Mutex
		payloads []string
		begun    = make(chan struct{}, 10)
	)
	release = make(chan struct{})
	n = &notifier{origin: "o", send: func(_ context.Context, payload string) error {
		begun <- struct{}{}
		<-release
		mu.Lock()
		defer mu.Unlock()
		payloads = append(payloads, payload)
		return nil
	}}
	return n, begun, release, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return payloads
	}
}

func queueSet(names ...string) map[string]struct{} {
	m := map[string]struct{}{}
	for _, n := range names {
		m[n] = struct{}{}
	}
	return m
}

// TestNotifierCoalesces: the commits made while a NOTIFY is on its way go
// out together in one more, and close sends what is pending, then nothing.
func TestNotifierCoalesces(t *testing.T) {
	t.Parallel()
	n, started, release, sent := heldNotifier()
	n.add(queueSet("a"))
	<-started // the first NOTIFY is on its way
	n.add(queueSet("b"))
	n.add(queueSet("c", "a"))
	n.add(queueSet())
	close(release)
	n.close()
	n.add(queueSet("late"))
	n.close()
	require.Equal(t, []string{"o:a", "o:a,b,c"}, sent())
}

// TestNotifierReportsFailures: a NOTIFY the server refuses is reported,
// and the next commit's is sent all the same.
func TestNotifierReportsFailures(t *testing.T) {
	t.Parallel()
	var sent []string
	reported := make(chan error, 1)
	n := &notifier{
		origin: "o",
		send: func(_ context.Context, payload string) error {
			sent = append(sent, payload)
			if payload == "o:a" {
				return errors.New("connection refused")
			}
			return nil
		},
		failed: func(err error) { reported <- err },
	}
	n.add(queueSet("a"))
	require.EqualError(t, <-reported, "connection refused")
	n.add(queueSet("b"))
	n.close()
	require.Equal(t, []string{"o:a", "o:b"}, sent)
}

// TestNotifierUnlisted: steps of unknown queues go out as a NOTIFY that
// lists none, taking along the queues made ready meanwhile, and a closed
// notifier sends no more.
func TestNotifierUnlisted(t *testing.T) {
	t.Parallel()
	n, started, release, sent := heldNotifier()
	n.add(queueSet("a"))
	<-started
	n.add(queueSet("b"))
	n.addUnlisted()
	close(release)
	n.close()
	n.addUnlisted()
	n.close()
	require.Equal(t, []string{"o:a", "o:"}, sent())
}

func TestPayload(t *testing.T) {
	t.Parallel()
	long := map[string]struct{}{}
	for i := range 800 { // 800 names of 10 bytes and their commas: 8,799 bytes
		long[fmt.Sprintf("queue-%04d", i)] = struct{}{}
	}
	cases := []struct {
		name   string
		origin string
		queues map[string]struct{}
		want   string
	}{
		{"sorted", "x1", queueSet("b", "a"), "x1:a,b"},
		{"caller's transaction", "", queueSet("default"), ":default"},
		{"too many to list", "x1", long, "x1:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, payload(c.origin, c.queues))
		})
	}
}
