package web

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

func TestInstanceGraphDrawsOnFailureStepsAsAGroupBelow(t *testing.T) {
	t.Parallel()
	g := instanceGraph([]storage.Step{
		{Name: "a"}, {Name: "b", DependsOn: []string{"a"}},
		{Name: "cleanup", OnFailure: true}, {Name: "notify", DependsOn: []string{"cleanup"}, OnFailure: true},
	})
	require.Len(t, g.Nodes, 4)
	require.Len(t, g.Edges, 2)
	require.Len(t, g.Groups, 1)
	band := g.Groups[0].Y
	for _, n := range g.Nodes {
		onFailure := n.ID == "cleanup" || n.ID == "notify"
		require.Equal(t, onFailure, n.OnFailure, n.ID)
		if onFailure {
			require.Greater(t, n.Y, band, "%s is below the band's top", n.ID)
			require.LessOrEqual(t, n.Y+n.Height, g.Height)
		} else {
			require.Less(t, n.Y+n.Height, band, "%s is above the band", n.ID)
		}
	}
	for _, e := range g.Edges {
		if e.From == "cleanup" {
			for _, p := range e.Points {
				require.Greater(t, p.Y, band)
			}
		}
	}

	plain := instanceGraph([]storage.Step{{Name: "a"}})
	require.Empty(t, plain.Groups)
}
