package web

import (
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/storage"
)

// GraphGroup is a labelled band of a Graph below the steps: the onFailure
// steps, drawn apart since they run only when the instance fails. Y is
// the top of the band, where the UI draws its label and a separator.
type GraphGroup struct {
	Label string `json:"label"`
	Y     int    `json:"y"`
}

// groupGap is the vertical room between the main graph and a group,
// where the group's label goes.
const groupGap = 36

// instanceGraph lays out an instance's steps: the main steps, and below
// them, as a group of their own (nodes marked onFailure), its onFailure
// steps, which depend only on each other.
func instanceGraph(steps []storage.Step) *Graph {
	var main, onFailure []graphStep
	for _, st := range steps {
		gs := graphStep{Name: st.Name, DependsOn: st.DependsOn}
		if st.OnFailure {
			onFailure = append(onFailure, gs)
		} else {
			main = append(main, gs)
		}
	}
	return withOnFailure(layoutGraph(main), onFailure)
}

// withOnFailure adds the onFailure steps to g, laid out on their own below
// it.
func withOnFailure(g *Graph, onFailure []graphStep) *Graph {
	if len(onFailure) == 0 {
		return g
	}
	f := layoutGraph(onFailure)
	top := g.Height + groupGap - margin // the group's own margin stays
	for _, n := range f.Nodes {
		n.Y += top
		n.OnFailure = true
		g.Nodes = append(g.Nodes, n)
	}
	for _, e := range f.Edges {
		for i := range e.Points {
			e.Points[i].Y += top
		}
		g.Edges = append(g.Edges, e)
	}
	g.Groups = append(g.Groups, GraphGroup{Label: "onFailure: run when the instance fails", Y: g.Height})
	g.Width = max(g.Width, f.Width)
	g.Height = top + f.Height
	return g
}

// addOnFailure adds a definition's workflow timeout and onFailure steps
// to its detail, and the steps to its graph.
func addOnFailure(out *workflowDetail, wf *dag.Workflow) {
	if wf.Timeout > 0 {
		t := storage.FormatDuration(wf.Timeout)
		out.Timeout = &t
	}
	var gs []graphStep
	for _, st := range wf.OnFailure {
		out.OnFailure = append(out.OnFailure, newStepDef(st))
		gs = append(gs, graphStep{Name: st.Name, DependsOn: st.DependsOn})
	}
	out.Graph = withOnFailure(out.Graph, gs)
}
