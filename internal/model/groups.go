package model

import "fmt"

// ExpertGroups is a batch's routed choices grouped by expert, so that each
// distinct expert runs once over the rows that chose it, those rows
// together: the layout of a MoE step on every backend.
type ExpertGroups struct {
	// Distinct is the experts the batch chose, in the order of their
	// first choice.
	Distinct []int
	// Base and Rows are, per distinct expert (index into Distinct), its
	// first row among the grouped rows and the number of its rows.
	Base, Rows []int
	members    [][]int // [experts] the choices (row·k + slot) of each, in order
	slot       []int   // [experts] index into Distinct while grouping, else -1
}

// NewExpertGroups makes the groups of batches of up to choices routed
// choices among experts experts, allocating everything a batch needs.
func NewExpertGroups(experts, choices int) ExpertGroups {
	g := ExpertGroups{
		Distinct: make([]int, 0, experts),
		Base:     make([]int, experts),
		Rows:     make([]int, experts),
		members:  make([][]int, experts),
		slot:     make([]int, experts),
	}
	for e := range experts {
		g.members[e] = make([]int, 0, choices)
		g.slot[e] = -1
	}
	return g
}

// Members is the choices (row·k + slot) of expert e in the last batch
// grouped, in order: the grouped rows from Base of e's index in Distinct.
func (g *ExpertGroups) Members(e int) []int { return g.members[e] }

// GroupChoices groups ids, a batch's choices row by row (row·k + slot),
// into g. An id outside g's experts (a router's output read back from a
// device) is an error, and leaves g with no experts.
func GroupChoices[T int | int32](g *ExpertGroups, ids []T) error {
	g.Distinct = g.Distinct[:0]
	for j, id := range ids {
		e := int(id)
		if e < 0 || e >= len(g.slot) {
			for _, d := range g.Distinct {
				g.slot[d] = -1
			}
			g.Distinct = g.Distinct[:0]
			return fmt.Errorf("router chose expert %d of %d", e, len(g.slot))
		}
		if g.slot[e] < 0 {
			g.slot[e] = len(g.Distinct)
			g.Distinct = append(g.Distinct, e)
			g.members[e] = g.members[e][:0]
		}
		g.members[e] = append(g.members[e], j)
	}
	at := 0
	for di, e := range g.Distinct {
		g.slot[e] = -1
		g.Base[di], g.Rows[di] = at, len(g.members[e])
		at += len(g.members[e])
	}
	return nil
}
