package app

import (
	"fmt"
	"strings"
)

// Graph is a workflow's DAG laid out for SVG: tasks in columns by depth
// (longest chain of inputs before them), edges from an upstream task's
// right side to a downstream task's left side. A big workflow is drawn
// with one node per group of similar tasks (same depth, same name apart
// from trailing numbers), or per depth when even that is too many.
type Graph struct {
	W, H    int
	Nodes   []GNode
	Edges   []string // SVG path data
	Grouped bool
}

// GNode is one node: a task, or a group of tasks.
type GNode struct {
	ID         int
	X, Y, W, H int
	Label      string
	Title      string
	Total      int
	Done       int
	State      string // the node's class: the task's state or the group's summary
	BarW       int    // width of the done bar of a group
	Task       string // the task, when the node is one task
}

const (
	maxSingleNodes = 300
	maxGroupNodes  = 300
	maxRows        = 25
	nodeW, nodeH   = 132, 30
	groupW, groupH = 160, 44
	gapX, gapY     = 56, 12
	pad            = 10
)

// layout lays out tasks (in submission order) with edges [from, to] by name.
// unitOf[i] is the node of task i.
func layout(names, states []string, edges [][2]string) (g Graph, unitOf []int) {
	n := len(names)
	idx := make(map[string]int, n)
	for i, s := range names {
		idx[s] = i
	}
	children := make([][]int, n)
	indeg := make([]int, n)
	for _, e := range edges {
		f, ok1 := idx[e[0]]
		t, ok2 := idx[e[1]]
		if ok1 && ok2 {
			children[f] = append(children[f], t)
			indeg[t]++
		}
	}
	level := make([]int, n)
	queue := make([]int, 0, n)
	for i := range n {
		if indeg[i] == 0 {
			queue = append(queue, i)
		}
	}
	for q := 0; q < len(queue); q++ {
		u := queue[q]
		for _, v := range children[u] {
			level[v] = max(level[v], level[u]+1)
			if indeg[v]--; indeg[v] == 0 {
				queue = append(queue, v)
			}
		}
	}

	// Units: one per task, or groups.
	unitOf = make([]int, n)
	type unit struct {
		level   int
		members []int
		label   string
	}
	var units []unit
	group := func(key func(i int) string) {
		units = units[:0]
		byKey := map[string]int{}
		for i := range n {
			k := fmt.Sprintf("%d\x00%s", level[i], key(i))
			u, ok := byKey[k]
			if !ok {
				u = len(units)
				byKey[k] = u
				units = append(units, unit{level: level[i], label: key(i)})
			}
			units[u].members = append(units[u].members, i)
			unitOf[i] = u
		}
	}
	perLevel := map[int]int{}
	for i := range n {
		perLevel[level[i]]++
	}
	crowded := false
	for _, c := range perLevel {
		if c > maxRows*4 {
			crowded = true
		}
	}
	if n <= maxSingleNodes && !crowded {
		group(func(i int) string { return names[i] })
	} else {
		g.Grouped = true
		group(func(i int) string { return namePrefix(names[i]) })
		if len(units) > maxGroupNodes {
			group(func(i int) string { return "" })
		}
	}

	// Columns by level; a column with many units wraps into sub-columns.
	w, h := nodeW, nodeH
	if g.Grouped {
		w, h = groupW, groupH
	}
	byLevel := map[int][]int{}
	maxLevel := 0
	for u := range units {
		byLevel[units[u].level] = append(byLevel[units[u].level], u)
		maxLevel = max(maxLevel, units[u].level)
	}
	g.Nodes = make([]GNode, len(units))
	x := pad
	for l := 0; l <= maxLevel; l++ {
		us := byLevel[l]
		for k, u := range us {
			col, row := k/maxRows, k%maxRows
			nd := GNode{ID: u, X: x + col*(w+gapX/2), Y: pad + row*(h+gapY), W: w, H: h, Total: len(units[u].members)}
			counts := map[string]int{}
			for _, i := range units[u].members {
				counts[states[i]]++
			}
			nd.Done = counts["done"]
			nd.State = summary(counts, nd.Total)
			if nd.Total == 1 {
				i := units[u].members[0]
				nd.Task = names[i]
				nd.Label = truncate(names[i], 17)
				nd.Title = names[i] + ": " + states[i]
			} else {
				label := units[u].label
				if label == "" {
					label = fmt.Sprintf("depth %d", l)
				}
				nd.Label = fmt.Sprintf("%s ×%d", truncate(label, 12), nd.Total)
				nd.Title = fmt.Sprintf("%d tasks (%s…) at depth %d", nd.Total, label, l)
			}
			nd.BarW = (w - 8) * nd.Done / max(nd.Total, 1)
			g.Nodes[u] = nd
			g.H = max(g.H, nd.Y+h+pad)
		}
		cols := (len(us) + maxRows - 1) / maxRows
		if cols > 0 {
			x += cols*(w+gapX/2) - gapX/2 + gapX
		}
	}
	g.W = max(x-gapX+pad, 200)
	g.H = max(g.H, 60)

	seen := map[[2]int]bool{}
	var b strings.Builder
	for _, e := range edges {
		f, ok1 := idx[e[0]]
		t, ok2 := idx[e[1]]
		if !ok1 || !ok2 {
			continue
		}
		k := [2]int{unitOf[f], unitOf[t]}
		if seen[k] || k[0] == k[1] {
			continue
		}
		seen[k] = true
		a, z := g.Nodes[k[0]], g.Nodes[k[1]]
		x1, y1, x2, y2 := a.X+a.W, a.Y+a.H/2, z.X, z.Y+z.H/2
		mid := (x1 + x2) / 2
		b.Reset()
		fmt.Fprintf(&b, "M%d %dC%d %d %d %d %d %d", x1, y1, mid, y1, mid, y2, x2, y2)
		g.Edges = append(g.Edges, b.String())
	}
	return g, unitOf
}

// summary is a node's colour for tasks in these states: a failure shows
// first, then work in progress, then work done, then waiting.
func summary(c map[string]int, total int) string {
	switch {
	case c["failed"]+c["upstream_failed"] > 0:
		return "failed"
	case c["running"] > 0:
		return "running"
	case c["done"] == total:
		return "done"
	case c["cancelled"] > 0 && c["done"]+c["cancelled"] == total:
		return "cancelled"
	case c["ready"] > 0:
		return "ready"
	case c["cancelled"] > 0:
		return "cancelled"
	}
	return "blocked"
}

// namePrefix is a name without trailing numbers and separators:
// "count-17" and "count-18" both give "count".
func namePrefix(s string) string {
	p := strings.TrimRight(s, "0123456789")
	p = strings.TrimRight(p, "-_.:/ ")
	if p == "" {
		return s
	}
	return p
}

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
