package web

import (
	"slices"
	"sort"
	"unicode/utf8"
)

// Layout sizes, in SVG user units (CSS pixels). Layers are columns, laid out
// left to right, because step names are wide and screens are wider than
// tall; a long chain scrolls sideways, a wide fan-out scrolls down.
const (
	minNodeWidth = 184
	// maxNodeWidth bounds a column for a very long name; the UI shortens
	// such a name with an ellipsis and shows it whole in a tooltip.
	maxNodeWidth = 440
	// nameCharWidth and namePadding estimate the room a name takes in the
	// UI's bold 13px label (the widest common fonts, DejaVu Sans Bold
	// among them, average under 8.4px per lowercase letter or digit),
	// plus the node's left and right padding.
	nameCharWidth = 8.4
	namePadding   = 28
	nodeHeight    = 60
	layerGap      = 64 // horizontal space between two columns, where edges bend
	nodeGap       = 22 // vertical space between two nodes of a column
	dummyHeight   = 10 // vertical room a long edge takes where it passes a column
	margin        = 24

	// orderSweeps bounds the barycenter iterations; crossing counts settle
	// within a handful of sweeps on workflows of realistic size.
	orderSweeps = 24
	// placeIterations bounds the vertical balancing passes.
	placeIterations = 8
)

// Graph is a workflow DAG laid out for drawing: the UI only draws what it
// gets here, so the layout is tested in Go and identical wherever it is shown.
type Graph struct {
	Nodes  []GraphNode `json:"nodes"`
	Edges  []GraphEdge `json:"edges"`
	Width  int         `json:"width"`
	Height int         `json:"height"`
	// Mermaid is the same graph as Mermaid source (set for workflows).
	Mermaid string `json:"mermaid,omitempty"`
	// Groups are labelled bands below the main graph (an instance's
	// onFailure steps); absent when there are none.
	Groups []GraphGroup `json:"groups,omitempty"`
}

// GraphNode is one step. X and Y are its top-left corner.
type GraphNode struct {
	ID     string `json:"id"`
	Layer  int    `json:"layer"`
	Order  int    `json:"order"`
	X      int    `json:"x"`
	Y      int    `json:"y"`
	Width  int    `json:"width"`
	Height int    `json:"height"`
	// OnFailure marks a node of the onFailure group.
	OnFailure bool `json:"onFailure,omitempty"`
}

// GraphEdge is one dependency, From must finish before To. Points is the
// polyline from the right side of From to the left side of To; an edge that
// spans several layers passes each column in between through its own lane,
// so it never runs across a node. Such lanes cost room and layout time in
// every column crossed, so a graph gets only as many of them as it has
// steps and edges: the shortest long edges are routed first, and an edge
// left over is Direct, two points joined straight across the columns
// between (the UI draws it faintly).
type GraphEdge struct {
	From   string  `json:"from"`
	To     string  `json:"to"`
	Points []Point `json:"points"`
	Direct bool    `json:"direct,omitempty"`
}

// Point is a position in the graph's coordinates.
type Point struct {
	X int `json:"x"`
	Y int `json:"y"`
}

// graphStep is the part of a step the layout needs.
type graphStep struct {
	Name      string
	DependsOn []string
}

// vertex is a node of the layered graph: a step (the first vertices, in
// the steps' order), or a dummy that carries a long edge through a layer it
// skips.
type vertex struct {
	layer int
	pos   int     // index within its layer
	y     float64 // top, during placement
	h     float64
	preds []int // vertices in layer-1
	succs []int // vertices in layer+1
}

// layoutGraph lays steps out Sugiyama-style: each step's layer is the length
// of the longest dependency path leading to it; edges that skip layers get a
// dummy vertex per skipped layer (within a budget proportional to the graph,
// see GraphEdge); the order within each layer comes from barycenter sweeps
// (plus adjacent swaps), keeping the ordering with the fewest crossings;
// then vertical positions are balanced towards neighbours without
// overlapping. Each column is as wide as its longest name needs, within
// bounds. Time and output grow with steps plus edges (times a logarithm),
// never with their product. Deterministic: the same steps give the same
// picture. Dependencies on unknown steps are ignored, and a cycle (which
// validation rejects) cannot loop: steps left over by the topological pass
// go last.
func layoutGraph(steps []graphStep) *Graph {
	return layout(steps, orderSweeps)
}

// layout is layoutGraph with the number of ordering sweeps as a parameter
// (tests compare against no ordering at all).
func layout(steps []graphStep, sweeps int) *Graph {
	index := make(map[string]int, len(steps))
	for i, s := range steps {
		index[s.Name] = i
	}
	// deps[i] are the indexes of step i's dependencies, deduplicated, in
	// the order written. seenBy[j] == i+1 marks j as already a dependency
	// of i, so a step with many dependencies costs no more than their
	// number.
	deps := make([][]int, len(steps))
	seenBy := make([]int, len(steps))
	nEdges := 0
	for i, s := range steps {
		for _, d := range s.DependsOn {
			if j, ok := index[d]; ok && j != i && seenBy[j] != i+1 {
				seenBy[j] = i + 1
				deps[i] = append(deps[i], j)
				nEdges++
			}
		}
	}
	layer := longestPathLayers(deps)

	// Build the layered graph, with dummies for the long edges that fit
	// the budget, shortest first.
	vs := make([]*vertex, len(steps))
	for i := range steps {
		vs[i] = &vertex{layer: layer[i], h: nodeHeight}
	}
	type longEdge struct {
		from, to int
		chain    []int
		direct   bool
	}
	var edges []longEdge
	for to := range steps {
		for _, from := range deps[to] {
			if layer[from] < layer[to] { // else only possible on a cycle
				edges = append(edges, longEdge{from: from, to: to})
			}
		}
	}
	span := func(e *longEdge) int { return layer[e.to] - layer[e.from] }
	byLength := make([]int, len(edges))
	for i := range byLength {
		byLength[i] = i
	}
	slices.SortStableFunc(byLength, func(a, b int) int { return span(&edges[a]) - span(&edges[b]) })
	budget := len(steps) + nEdges
	for _, i := range byLength {
		e := &edges[i]
		dummies := span(e) - 1
		if dummies > budget {
			e.direct = true
			continue
		}
		budget -= dummies
		prev := e.from
		for l := layer[e.from] + 1; l < layer[e.to]; l++ {
			d := len(vs)
			vs = append(vs, &vertex{layer: l, h: dummyHeight})
			e.chain = append(e.chain, d)
			link(vs, prev, d)
			prev = d
		}
		link(vs, prev, e.to)
	}
	nLayers := 0
	for _, v := range vs {
		nLayers = max(nLayers, v.layer+1)
	}
	layers := make([][]int, nLayers)
	for i, v := range vs {
		layers[v.layer] = append(layers[v.layer], i)
	}
	orderLayers(vs, layers, sweeps)
	height := placeVertically(vs, layers)

	// Columns: as wide as their widest name; x is the left of each.
	colWidth := make([]int, nLayers)
	for i, s := range steps {
		colWidth[layer[i]] = max(colWidth[layer[i]], nodeWidth(s.Name))
	}
	colX := make([]int, nLayers+1)
	colX[0] = margin
	for l, w := range colWidth {
		colX[l+1] = colX[l] + w + layerGap
	}

	g := &Graph{Nodes: make([]GraphNode, len(steps)), Edges: make([]GraphEdge, 0, len(edges))}
	for i, s := range steps {
		v := vs[i]
		g.Nodes[i] = GraphNode{ID: s.Name, Layer: v.layer, Order: v.pos, X: colX[v.layer], Y: int(v.y + 0.5), Width: colWidth[v.layer], Height: nodeHeight}
	}
	center := func(v *vertex) int { return int(v.y + v.h/2 + 0.5) }
	for _, e := range edges {
		from, to := vs[e.from], vs[e.to]
		pts := make([]Point, 0, 2+2*len(e.chain))
		pts = append(pts, Point{X: colX[from.layer] + colWidth[from.layer], Y: center(from)})
		for _, d := range e.chain {
			dv := vs[d]
			// Run straight through the column, so the edge never crosses
			// the nodes stacked in it.
			pts = append(pts, Point{X: colX[dv.layer], Y: center(dv)}, Point{X: colX[dv.layer] + colWidth[dv.layer], Y: center(dv)})
		}
		pts = append(pts, Point{X: colX[to.layer], Y: center(to)})
		g.Edges = append(g.Edges, GraphEdge{From: steps[e.from].Name, To: steps[e.to].Name, Points: pts, Direct: e.direct})
	}
	if nLayers > 0 {
		g.Width = colX[nLayers] - layerGap + margin
		g.Height = int(height+0.5) + margin
	}
	return g
}

// nodeWidth is the width of a node whose name is shown whole, within
// [minNodeWidth, maxNodeWidth]. Step names are lowercase ASCII letters,
// digits and ".-_", so a width per character is a fair estimate.
func nodeWidth(name string) int {
	w := int(float64(utf8.RuneCountInString(name))*nameCharWidth+0.5) + namePadding
	return min(max(w, minNodeWidth), maxNodeWidth)
}

func link(vs []*vertex, from, to int) {
	vs[from].succs = append(vs[from].succs, to)
	vs[to].preds = append(vs[to].preds, from)
}

// longestPathLayers returns each step's layer: 0 for roots, else one more
// than its deepest dependency. Kahn's algorithm in definition order.
func longestPathLayers(deps [][]int) []int {
	n := len(deps)
	layer := make([]int, n)
	indegree := make([]int, n)
	dependents := make([][]int, n)
	for i, ds := range deps {
		indegree[i] = len(ds)
		for _, d := range ds {
			dependents[d] = append(dependents[d], i)
		}
	}
	done := make([]bool, n)
	var queue []int
	for i := range n {
		if indegree[i] == 0 {
			queue = append(queue, i)
		}
	}
	seen := 0
	for len(queue) > 0 {
		i := queue[0]
		queue = queue[1:]
		done[i] = true
		seen++
		for _, j := range dependents[i] {
			layer[j] = max(layer[j], layer[i]+1)
			if indegree[j]--; indegree[j] == 0 {
				queue = append(queue, j)
			}
		}
	}
	if seen < n {
		// A cycle: put what is left after everything else.
		last := slices.Max(append(layer, 0))
		for i := range n {
			if !done[i] {
				last++
				layer[i] = last
			}
		}
	}
	return layer
}

// orderLayers orders the vertices within each layer to reduce crossings,
// starting from definition order (so an already tidy file stays as
// written) and keeping the best ordering seen.
func orderLayers(vs []*vertex, layers [][]int, sweeps int) {
	setPositions(vs, layers)
	best := cloneLayers(layers)
	bestCrossings := totalCrossings(vs, layers)
	for sweep := 0; sweep < sweeps && bestCrossings > 0; sweep++ {
		if sweep%2 == 0 {
			for l := 1; l < len(layers); l++ {
				sortByBarycenter(vs, layers[l], func(v *vertex) []int { return v.preds })
				setPositions(vs, layers[l:l+1])
			}
		} else {
			for l := len(layers) - 2; l >= 0; l-- {
				sortByBarycenter(vs, layers[l], func(v *vertex) []int { return v.succs })
				setPositions(vs, layers[l:l+1])
			}
		}
		transpose(vs, layers)
		if c := totalCrossings(vs, layers); c < bestCrossings {
			bestCrossings = c
			best = cloneLayers(layers)
		}
	}
	copy(layers, best)
	setPositions(vs, layers)
}

func setPositions(vs []*vertex, layers [][]int) {
	for _, layer := range layers {
		for p, v := range layer {
			vs[v].pos = p
		}
	}
}

func cloneLayers(layers [][]int) [][]int {
	out := make([][]int, len(layers))
	for i, l := range layers {
		out[i] = slices.Clone(l)
	}
	return out
}

// sortByBarycenter orders a layer by the mean position of each vertex's
// neighbours in the adjacent layer; a vertex without neighbours there keeps
// its place.
func sortByBarycenter(vs []*vertex, layer []int, neighbours func(*vertex) []int) {
	bary := make(map[int]float64, len(layer))
	for _, v := range layer {
		ns := neighbours(vs[v])
		if len(ns) == 0 {
			bary[v] = float64(vs[v].pos)
			continue
		}
		sum := 0.0
		for _, n := range ns {
			sum += float64(vs[n].pos)
		}
		bary[v] = sum / float64(len(ns))
	}
	sort.SliceStable(layer, func(i, j int) bool { return bary[layer[i]] < bary[layer[j]] })
}

// transpose swaps adjacent vertices of a layer while that lowers the
// crossings with both neighbouring layers.
func transpose(vs []*vertex, layers [][]int) {
	var c crossCounter
	for improved, rounds := true, 0; improved && rounds < 4; rounds++ {
		improved = false
		for _, layer := range layers {
			for i := 0; i+1 < len(layer); i++ {
				u, w := vs[layer[i]], vs[layer[i+1]]
				predsAsIs, predsSwapped := c.pair(vs, u.preds, w.preds)
				succsAsIs, succsSwapped := c.pair(vs, u.succs, w.succs)
				if predsSwapped+succsSwapped < predsAsIs+succsAsIs {
					layer[i], layer[i+1] = layer[i+1], layer[i]
					u.pos, w.pos = i+1, i
					improved = true
				}
			}
		}
	}
}

// crossCounter counts crossings, reusing its buffers between calls.
type crossCounter struct {
	a, b []int
	tree []int // Fenwick tree over positions in the lower layer
}

// pair counts the crossings between the edges from u to us and from w to
// ws (neighbours in one adjacent layer) with u placed above w (asIs) and
// with w above u (swapped), in time linear in the neighbours (after
// sorting them) rather than their product.
func (c *crossCounter) pair(vs []*vertex, us, ws []int) (asIs, swapped int) {
	if len(us) == 0 || len(ws) == 0 {
		return 0, 0
	}
	c.a, c.b = positions(vs, us, c.a), positions(vs, ws, c.b)
	below, belowOrEqual := 0, 0 // how many of b are < and <= the current a
	for _, pa := range c.a {
		for below < len(c.b) && c.b[below] < pa {
			below++
		}
		for belowOrEqual < len(c.b) && c.b[belowOrEqual] <= pa {
			belowOrEqual++
		}
		asIs += below
		swapped += len(c.b) - belowOrEqual
	}
	return asIs, swapped
}

func positions(vs []*vertex, of []int, buf []int) []int {
	buf = buf[:0]
	for _, v := range of {
		buf = append(buf, vs[v].pos)
	}
	slices.Sort(buf)
	return buf
}

// totalCrossings counts edge crossings between every pair of adjacent
// layers: two edges cross when their ends are in opposite orders. Taking
// the upper ends in order, an edge crosses every earlier one (with an upper
// end strictly above) whose lower end lies strictly below its own, which a
// Fenwick tree over lower positions counts in logarithmic time.
func totalCrossings(vs []*vertex, layers [][]int) int {
	var c crossCounter
	total := 0
	for l := 0; l+1 < len(layers); l++ {
		c.tree = slices.Grow(c.tree[:0], len(layers[l+1])+1)[:len(layers[l+1])+1]
		clear(c.tree)
		inserted := 0
		for _, v := range layers[l] {
			// Edges sharing their upper end never cross each other: count
			// them all against the earlier ones before adding any.
			for _, s := range vs[v].succs {
				total += inserted - c.countUpTo(vs[s].pos)
			}
			for _, s := range vs[v].succs {
				c.add(vs[s].pos)
				inserted++
			}
		}
	}
	return total
}

// countUpTo is how many added positions are <= pos.
func (c *crossCounter) countUpTo(pos int) int {
	n := 0
	for i := pos + 1; i > 0; i -= i & -i {
		n += c.tree[i]
	}
	return n
}

func (c *crossCounter) add(pos int) {
	for i := pos + 1; i < len(c.tree); i += i & -i {
		c.tree[i]++
	}
}

// placeVertically gives every vertex a top coordinate: first stacked in
// order, then pulled towards the mean centre of its neighbours, alternately
// from the left and from the right, keeping the order and the gaps. Chains
// come out straight and a join sits between its inputs. It returns the
// bottom of the lowest vertex.
func placeVertically(vs []*vertex, layers [][]int) float64 {
	for _, layer := range layers {
		y := float64(margin)
		for _, v := range layer {
			vs[v].y = y
			y += vs[v].h + nodeGap
		}
	}
	centre := func(v *vertex) float64 { return v.y + v.h/2 }
	for it := 0; it < placeIterations; it++ {
		order := make([]int, len(layers))
		for i := range order {
			order[i] = i
		}
		if it%2 == 1 {
			slices.Reverse(order)
		}
		for _, l := range order {
			layer := layers[l]
			want := make([]float64, len(layer))
			for i, v := range layer {
				preds, succs := vs[v].preds, vs[v].succs
				if len(preds)+len(succs) == 0 {
					want[i] = vs[v].y
					continue
				}
				sum := 0.0
				for _, n := range preds {
					sum += centre(vs[n])
				}
				for _, n := range succs {
					sum += centre(vs[n])
				}
				want[i] = sum/float64(len(preds)+len(succs)) - vs[v].h/2
			}
			packLayer(vs, layer, want)
		}
	}
	// Shift everything so the topmost vertex sits at the margin.
	top := 0.0
	first := true
	for _, v := range vs {
		if first || v.y < top {
			top, first = v.y, false
		}
	}
	bottom := 0.0
	for _, v := range vs {
		v.y += margin - top
		bottom = max(bottom, v.y+v.h)
	}
	return bottom
}

// packLayer moves a layer's vertices as close to their wanted tops as the
// minimum gaps allow, keeping their order. It is the least-squares optimum:
// subtracting from each vertex the room the ones above it need turns the
// gap constraints into "non-decreasing", which pool-adjacent-violators
// solves exactly in linear time.
func packLayer(vs []*vertex, layer []int, want []float64) {
	type block struct {
		sum   float64
		count int
	}
	offsets := make([]float64, len(layer))
	for i := 1; i < len(layer); i++ {
		offsets[i] = offsets[i-1] + vs[layer[i-1]].h + nodeGap
	}
	var blocks []block
	mean := func(b block) float64 { return b.sum / float64(b.count) }
	for i := range layer {
		blocks = append(blocks, block{sum: want[i] - offsets[i], count: 1})
		for len(blocks) > 1 && mean(blocks[len(blocks)-2]) > mean(blocks[len(blocks)-1]) {
			last := blocks[len(blocks)-1]
			blocks = blocks[:len(blocks)-1]
			blocks[len(blocks)-1].sum += last.sum
			blocks[len(blocks)-1].count += last.count
		}
	}
	i := 0
	for _, b := range blocks {
		for range b.count {
			vs[layer[i]].y = mean(b) + offsets[i]
			i++
		}
	}
}
