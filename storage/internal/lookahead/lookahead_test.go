package lookahead

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

func TestVerdicts(t *testing.T) {
	var v Verdicts
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	p := storage.ClaimParams{Handlers: []string{"h.a", "h.b"}}
	other := storage.ClaimParams{Handlers: []string{"h.a", "h.b"}, Queues: []string{"q"}}

	require.False(t, v.Heads(p), "walks until a look says otherwise")
	require.True(t, v.Begin(p, at))
	require.False(t, v.Begin(p, at), "one look at a time")
	v.Done(p, true, true, at)
	require.True(t, v.Heads(p))
	require.False(t, v.Heads(other), "each filter has its own verdict")
	require.False(t, v.Begin(p, at.Add(Recheck-time.Millisecond)), "the verdict holds for Recheck")

	require.True(t, v.Begin(p, at.Add(Recheck)))
	v.Done(p, false, false, at.Add(Recheck))
	require.True(t, v.Heads(p), "a failed look keeps the verdict")
	require.True(t, v.Begin(p, at.Add(Recheck)), "and the next claim looks again")
	v.Done(p, false, true, at.Add(Recheck))
	require.False(t, v.Heads(p))

	for _, q := range []storage.ClaimParams{{}, {Handlers: []string{"h.a"}, InstanceID: "i"}} {
		require.False(t, v.Begin(q, at), "%+v walks: no handlers, or one instance's few steps", q)
		require.False(t, v.Heads(q))
	}
}
