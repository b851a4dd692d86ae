package web

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/dag"
)

func chain(names ...string) []graphStep {
	steps := make([]graphStep, len(names))
	for i, n := range names {
		steps[i].Name = n
		if i > 0 {
			steps[i].DependsOn = []string{names[i-1]}
		}
	}
	return steps
}

func nodesByID(g *Graph) map[string]GraphNode {
	out := map[string]GraphNode{}
	for _, n := range g.Nodes {
		out[n.ID] = n
	}
	return out
}

// crossings counts pairs of edges between the same two adjacent layers
// whose ends are in opposite orders (edges spanning more layers are
// checked segment by segment through their points).
func crossings(g *Graph) int {
	type seg struct{ x, y1, y2 int }
	var segs []seg
	for _, e := range g.Edges {
		for i := 1; i < len(e.Points); i++ {
			a, b := e.Points[i-1], e.Points[i]
			if a.X != b.X { // between two columns
				segs = append(segs, seg{a.X, a.Y, b.Y})
			}
		}
	}
	c := 0
	for i := range segs {
		for j := i + 1; j < len(segs); j++ {
			s, u := segs[i], segs[j]
			if s.x == u.x && (s.y1-u.y1)*(s.y2-u.y2) < 0 {
				c++
			}
		}
	}
	return c
}

// requireSane checks invariants every layout must keep: nodes in one
// column never overlap, every edge runs left to right from its source's
// right side to its target's left side, no edge passes through a node that
// is not one of its ends, and the canvas holds everything.
func requireSane(t *testing.T, steps []graphStep, g *Graph) {
	t.Helper()
	require.Len(t, g.Nodes, len(steps))
	byID := nodesByID(g)
	byLayer := map[int][]GraphNode{}
	for i, n := range g.Nodes {
		require.Equal(t, steps[i].Name, n.ID, "nodes keep definition order")
		require.GreaterOrEqual(t, n.X, 0)
		require.GreaterOrEqual(t, n.Y, 0)
		require.LessOrEqual(t, n.X+n.Width, g.Width)
		require.LessOrEqual(t, n.Y+n.Height, g.Height)
		byLayer[n.Layer] = append(byLayer[n.Layer], n)
	}
	for _, col := range byLayer {
		for i := range col {
			for j := range col {
				if i != j && col[i].Order < col[j].Order {
					require.LessOrEqual(t, col[i].Y+col[i].Height+nodeGap-1, col[j].Y, "%s and %s overlap", col[i].ID, col[j].ID)
				}
			}
		}
	}
	for _, e := range g.Edges {
		from, to := byID[e.From], byID[e.To]
		require.Less(t, from.Layer, to.Layer, "%s -> %s", e.From, e.To)
		first, last := e.Points[0], e.Points[len(e.Points)-1]
		require.Equal(t, Point{from.X + from.Width, from.Y + from.Height/2}, first)
		require.Equal(t, Point{to.X, to.Y + to.Height/2}, last)
		for i := 1; i < len(e.Points); i++ {
			require.LessOrEqual(t, e.Points[i-1].X, e.Points[i].X, "%s -> %s goes backwards", e.From, e.To)
		}
		// Straight runs through a column must miss the nodes there.
		for i := 1; i+1 < len(e.Points); i += 2 {
			a, b := e.Points[i], e.Points[i+1]
			require.Equal(t, a.Y, b.Y)
			for _, n := range g.Nodes {
				if n.X == a.X {
					require.False(t, a.Y >= n.Y && a.Y <= n.Y+n.Height, "%s -> %s runs through %s", e.From, e.To, n.ID)
				}
			}
		}
	}
}

func TestLayoutChain(t *testing.T) {
	t.Parallel()
	steps := chain("a", "b", "c", "d")
	g := layoutGraph(steps)
	requireSane(t, steps, g)
	for i, n := range g.Nodes {
		require.Equal(t, i, n.Layer)
		require.Equal(t, g.Nodes[0].Y, n.Y, "a chain is a straight line")
	}
	require.Len(t, g.Edges, 3)
	for _, e := range g.Edges {
		require.Len(t, e.Points, 2)
		require.Equal(t, e.Points[0].Y, e.Points[1].Y)
	}
}

func TestLayoutDiamondAndSkip(t *testing.T) {
	t.Parallel()
	steps := []graphStep{
		{Name: "start"},
		{Name: "left", DependsOn: []string{"start"}},
		{Name: "right", DependsOn: []string{"start"}},
		{Name: "join", DependsOn: []string{"left", "right", "start"}},
	}
	g := layoutGraph(steps)
	requireSane(t, steps, g)
	n := nodesByID(g)
	require.Equal(t, 0, n["start"].Layer)
	require.Equal(t, 1, n["left"].Layer)
	require.Equal(t, 1, n["right"].Layer)
	require.Equal(t, 2, n["join"].Layer, "longest path decides the layer")
	require.Len(t, g.Edges, 5)
	for _, e := range g.Edges {
		if e.From == "start" && e.To == "join" {
			require.Len(t, e.Points, 4, "the skipping edge passes the middle column in a lane of its own")
		}
	}
	require.Zero(t, crossings(g))
}

func TestLayoutUncrossesEdges(t *testing.T) {
	t.Parallel()
	// Written order crosses: a1 feeds b2 and a2 feeds b1.
	steps := []graphStep{
		{Name: "a1"}, {Name: "a2"}, {Name: "a3"},
		{Name: "b1", DependsOn: []string{"a3"}},
		{Name: "b2", DependsOn: []string{"a2"}},
		{Name: "b3", DependsOn: []string{"a1"}},
		{Name: "c", DependsOn: []string{"b1", "b3"}},
	}
	g := layoutGraph(steps)
	requireSane(t, steps, g)
	require.Zero(t, crossings(g))
}

func TestLayoutLargeRandomDAG(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	var steps []graphStep
	for i := range 45 {
		s := graphStep{Name: fmt.Sprintf("step-%02d", i)}
		for j := range i {
			if rng.IntN(10) == 0 || (j == i-1 && rng.IntN(3) == 0) {
				s.DependsOn = append(s.DependsOn, steps[j].Name)
			}
		}
		steps = append(steps, s)
	}
	g := layoutGraph(steps)
	requireSane(t, steps, g)
	require.Equal(t, g, layoutGraph(steps), "the layout is deterministic")

	// Barycenter ordering must do clearly better than the written order
	// on a tangle like this.
	naive := layoutWithoutOrdering(steps)
	require.Less(t, crossings(g), crossings(naive))
	t.Logf("45 steps: %d crossings (written order: %d), %dx%d", crossings(g), crossings(naive), g.Width, g.Height)
}

func TestLayoutWideFanOut(t *testing.T) {
	t.Parallel()
	steps := []graphStep{{Name: "root"}}
	for i := range 32 {
		steps = append(steps, graphStep{Name: fmt.Sprintf("leaf-%02d", i), DependsOn: []string{"root"}})
	}
	steps = append(steps, graphStep{Name: "join", DependsOn: []string{"leaf-00", "leaf-31"}})
	g := layoutGraph(steps)
	requireSane(t, steps, g)
	n := nodesByID(g)
	// The root sits level with the middle of its fan.
	mid := (n["leaf-00"].Y + n["leaf-31"].Y) / 2
	require.InDelta(t, mid, n["root"].Y, nodeHeight)
	require.Greater(t, g.Height, 32*nodeHeight)
}

func TestLayoutTolerantInput(t *testing.T) {
	t.Parallel()
	require.Equal(t, &Graph{Nodes: []GraphNode{}, Edges: []GraphEdge{}}, layoutGraph(nil))
	// Unknown and duplicate dependencies are ignored; a cycle (which
	// validation rejects) still terminates.
	g := layoutGraph([]graphStep{
		{Name: "a", DependsOn: []string{"ghost", "a"}},
		{Name: "b", DependsOn: []string{"a", "a", "c"}},
		{Name: "c", DependsOn: []string{"b"}},
	})
	require.Len(t, g.Nodes, 3)
	require.Equal(t, 0, g.Nodes[0].Layer)
}

// layoutWithoutOrdering is the layout with the ordering phase skipped, as a
// baseline for crossing counts.
func layoutWithoutOrdering(steps []graphStep) *Graph {
	return layout(steps, 0)
}

func TestLayoutWidensColumnsForLongNames(t *testing.T) {
	t.Parallel()
	long := "verify-publication-and-notify-downstream-teams" // 46 characters
	huge := strings.Repeat("x", 200)
	steps := []graphStep{
		{Name: "a"},
		{Name: "b", DependsOn: []string{"a"}},
		{Name: long, DependsOn: []string{"a"}},
		{Name: huge, DependsOn: []string{"b"}},
	}
	g := layoutGraph(steps)
	requireSane(t, steps, g)
	n := nodesByID(g)
	require.Equal(t, minNodeWidth, n["a"].Width, "a short name keeps the usual width")
	require.GreaterOrEqual(t, n[long].Width, len(long)*8+namePadding, "room for every character of the name")
	require.Equal(t, n[long].Width, n["b"].Width, "a column is as wide as its widest node")
	require.Equal(t, maxNodeWidth, n[huge].Width, "a very long name is shortened by the UI, not the layout")
}

// TestLayoutLongEdgesWithinBudget is a chain where every step also depends
// on the first: the edges from the first step skip 1, 2, ... n-2 columns,
// so routing each through every column it passes would take n²/2 lanes.
// The shortest are routed, the rest drawn direct, and the output stays
// proportional to steps plus edges.
func TestLayoutLongEdgesWithinBudget(t *testing.T) {
	t.Parallel()
	steps := chainWithRoot(200)
	g := layoutGraph(steps)
	requireSane(t, steps, g)
	edges := 2*200 - 3
	require.Len(t, g.Edges, edges)
	points, direct := 0, 0
	for _, e := range g.Edges {
		points += len(e.Points)
		if e.Direct {
			direct++
			require.Len(t, e.Points, 2)
		}
	}
	require.LessOrEqual(t, points, 2*edges+2*(len(steps)+edges))
	require.Positive(t, direct)
	n := nodesByID(g)
	for _, e := range g.Edges {
		if n[e.To].Layer-n[e.From].Layer <= 10 {
			require.False(t, e.Direct, "%s -> %s is short enough to route", e.From, e.To)
		}
	}
}

// TestCrossingCounts checks the fast crossing counts against counting
// every pair of edges.
func TestCrossingCounts(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		var vs []*vertex
		layers := make([][]int, 2+rng.IntN(3))
		for l := range layers {
			for range 1 + rng.IntN(8) {
				layers[l] = append(layers[l], len(vs))
				vs = append(vs, &vertex{layer: l})
			}
		}
		for l := 0; l+1 < len(layers); l++ {
			for _, u := range layers[l] {
				for _, w := range layers[l+1] {
					if rng.IntN(3) == 0 {
						link(vs, u, w)
					}
				}
			}
		}
		setPositions(vs, layers)
		brute := 0
		for l := 0; l+1 < len(layers); l++ {
			for _, u := range layers[l] {
				for _, w := range layers[l] {
					for _, a := range vs[u].succs {
						for _, b := range vs[w].succs {
							if vs[u].pos < vs[w].pos && vs[a].pos > vs[b].pos {
								brute++
							}
						}
					}
				}
			}
		}
		require.Equal(t, brute, totalCrossings(vs, layers))

		var c crossCounter
		layer := layers[0]
		for i := 0; i+1 < len(layer); i++ {
			u, w := vs[layer[i]], vs[layer[i+1]]
			asIs, swapped := c.pair(vs, u.succs, w.succs)
			wantAsIs, wantSwapped := 0, 0
			for _, a := range u.succs {
				for _, b := range w.succs {
					if vs[a].pos > vs[b].pos {
						wantAsIs++
					}
					if vs[a].pos < vs[b].pos {
						wantSwapped++
					}
				}
			}
			require.Equal(t, [2]int{wantAsIs, wantSwapped}, [2]int{asIs, swapped})
		}
	}
}

// TestWorkflowDetailSizeIsLinear checks that GET /api/workflows/NAME stays
// proportional to the workflow: a 1,500-step chain whose steps all also
// depend on the first once came to 50 MB, an edge drawn through every
// column it passed.
func TestWorkflowDetailSizeIsLinear(t *testing.T) {
	t.Parallel()
	shapes := map[string]func(n int) []graphStep{
		"chain":           func(n int) []graphStep { return chain(stepNames(n)...) },
		"fan-out and in":  fanOutIn,
		"chain with root": chainWithRoot,
	}
	for name, shape := range shapes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			size := map[int]int{}
			for _, n := range []int{750, 1500} {
				steps := shape(n)
				data, err := json.Marshal(newWorkflowDetail(workflowOf(steps)))
				require.NoError(t, err)
				size[n] = len(data)
				edges := 0
				for _, s := range steps {
					edges += len(s.DependsOn)
				}
				require.LessOrEqual(t, len(data)/(n+edges), 400, "%d steps and %d edges: %d bytes", n, edges, len(data))
			}
			require.Less(t, float64(size[1500])/float64(size[750]), 2.2, "twice the steps, about twice the bytes: %v", size)
			t.Logf("1500 steps: %d bytes", size[1500])
		})
	}
}

// BenchmarkLayoutLarge lays out 1,500-step graphs of the shapes above.
func BenchmarkLayoutLarge(b *testing.B) {
	for _, bc := range []struct {
		name  string
		steps []graphStep
	}{
		{"chain", chain(stepNames(1500)...)},
		{"fan-out and in", fanOutIn(1500)},
		{"chain with root", chainWithRoot(1500)},
		{"random", randomDAG(1500)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				layoutGraph(bc.steps)
			}
		})
	}
}

func stepNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("step-%04d", i)
	}
	return names
}

func chainWithRoot(n int) []graphStep {
	steps := chain(stepNames(n)...)
	for i := 2; i < n; i++ {
		steps[i].DependsOn = append(steps[i].DependsOn, steps[0].Name)
	}
	return steps
}

func fanOutIn(n int) []graphStep {
	names := stepNames(n)
	steps := make([]graphStep, n)
	for i, name := range names {
		steps[i].Name = name
		switch {
		case i == n-1:
			steps[i].DependsOn = names[1 : n-1]
		case i > 0:
			steps[i].DependsOn = []string{names[0]}
		}
	}
	return steps
}

// randomDAG gives each step a few dependencies among the 50 steps before it.
func randomDAG(n int) []graphStep {
	rng := rand.New(rand.NewPCG(5, 6))
	names := stepNames(n)
	steps := make([]graphStep, n)
	for i, name := range names {
		steps[i].Name = name
		for range min(i, rng.IntN(4)) {
			steps[i].DependsOn = append(steps[i].DependsOn, names[i-1-rng.IntN(min(i, 50))])
		}
	}
	return steps
}

// workflowOf is a definition of steps with the source text a file of them
// would have.
func workflowOf(steps []graphStep) *dag.Workflow {
	wf := &dag.Workflow{Name: "big"}
	var src strings.Builder
	src.WriteString("name: big\nsteps:\n")
	for _, s := range steps {
		fmt.Fprintf(&src, "  - {name: %s, handler: noop, dependsOn: [%s]}\n", s.Name, strings.Join(s.DependsOn, ", "))
		wf.Steps = append(wf.Steps, &dag.Step{Name: s.Name, Handler: "noop", Queue: dag.DefaultQueue, DependsOn: s.DependsOn,
			Retry: dag.RetryPolicy{MaxAttempts: dag.DefaultMaxAttempts, Backoff: dag.DefaultBackoff, MaxBackoff: dag.DefaultMaxBackoff}})
	}
	wf.Source = []byte(src.String())
	return wf
}
