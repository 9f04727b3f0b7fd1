package model

import (
	"slices"
	"testing"
)

func TestGroupChoices(t *testing.T) {
	g := NewExpertGroups(6, 8)
	// Two rows of top-3: row 0 chose 4, 1, 5; row 1 chose 1, 0, 4.
	if err := GroupChoices(&g, []int32{4, 1, 5, 1, 0, 4}); err != nil {
		t.Fatal(err)
	}
	if want := []int{4, 1, 5, 0}; !slices.Equal(g.Distinct, want) {
		t.Fatalf("distinct %v, want %v", g.Distinct, want)
	}
	members := map[int][]int{4: {0, 5}, 1: {1, 3}, 5: {2}, 0: {4}}
	at := 0
	for di, e := range g.Distinct {
		if !slices.Equal(g.Members(e), members[e]) {
			t.Errorf("expert %d: members %v, want %v", e, g.Members(e), members[e])
		}
		if g.Base[di] != at || g.Rows[di] != len(members[e]) {
			t.Errorf("expert %d: base %d rows %d, want %d %d", e, g.Base[di], g.Rows[di], at, len(members[e]))
		}
		at += len(members[e])
	}

	// An id out of range fails and leaves nothing behind: the next batch
	// groups as if from scratch.
	for _, bad := range [][]int{{2, 6}, {3, -1}} {
		if err := GroupChoices(&g, bad); err == nil {
			t.Fatalf("%v: no error", bad)
		}
		if len(g.Distinct) != 0 {
			t.Fatalf("%v: distinct %v after an error", bad, g.Distinct)
		}
	}
	if err := GroupChoices(&g, []int{3, 2, 2}); err != nil {
		t.Fatal(err)
	}
	if want := []int{3, 2}; !slices.Equal(g.Distinct, want) || !slices.Equal(g.Members(2), []int{1, 2}) || g.Base[1] != 1 || g.Rows[1] != 2 {
		t.Fatalf("after the errors: distinct %v, members of 2 %v, base %v rows %v", g.Distinct, g.Members(2), g.Base[:2], g.Rows[:2])
	}
}
