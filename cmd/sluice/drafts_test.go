package main

import (
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/testutil"
)

// TestRunDrafts: --drafts leaves greedy tokens unchanged, reports the MTP
// statistics in --json, and is refused when negative; a model without an
// MTP head runs plainly and says so.
func TestRunDrafts(t *testing.T) {
	type mtpJSON struct {
		Tokens []int `json:"tokens"`
		Stats  struct {
			MTP *struct {
				Drafts     int       `json:"drafts"`
				Steps      int       `json:"steps"`
				Drafted    int       `json:"drafted"`
				Accepted   int       `json:"accepted"`
				Acceptance []float64 `json:"acceptance_by_depth"`
				Disabled   string    `json:"disabled"`
			} `json:"mtp"`
		} `json:"stats"`
	}
	run := func(extra ...string) mtpJSON {
		args := append([]string{"run", "--temp", "0", "-n", "32", "--ignore-eos", "--json", "--threads", "2", "-p", "def add(a, b):"}, extra...)
		out, _ := ok(t, args...)
		var v mtpJSON
		decode(t, out, &v)
		return v
	}
	plain := run("--drafts", "0")
	if plain.Stats.MTP != nil {
		t.Errorf("--drafts 0 reports MTP stats %+v", plain.Stats.MTP)
	}
	for _, d := range []string{"1", "3"} {
		v := run("--drafts", d)
		if !equalInts(v.Tokens, plain.Tokens) {
			t.Errorf("--drafts %s: tokens %v, without drafts %v", d, v.Tokens, plain.Tokens)
		}
		m := v.Stats.MTP
		if m == nil || m.Drafted == 0 || m.Steps == 0 || len(m.Acceptance) != m.Drafts || m.Accepted > m.Drafted {
			t.Errorf("--drafts %s: mtp stats %+v", d, m)
		}
	}
	if _, e, code := sluice(t, "run", "--drafts", "-1", "-p", "x"); code == 0 || !strings.Contains(e, "drafts") {
		t.Errorf("--drafts -1: exit %d, %q", code, e)
	}
	dir := testutil.Packed(t, "tiny-qwen3-moe", 4)
	out, e := ok(t, "run", "-m", dir, "--temp", "0", "-n", "8", "--json", "--threads", "2", "--drafts", "2", "--tokens", "1,2,3")
	var v mtpJSON
	decode(t, out, &v)
	if v.Stats.MTP == nil || v.Stats.MTP.Disabled == "" || !strings.Contains(e, "no MTP head") {
		t.Errorf("model without MTP: stats %+v, stderr %q", v.Stats.MTP, e)
	}
}
