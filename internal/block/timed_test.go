package block

import (
	"errors"
	"testing"
)

// recorder is a Backend that records which operation each call reached.
type recorder struct{ got []string }

func (r *recorder) add(s string)                       { r.got = append(r.got, s) }
func (r *recorder) Norm(*Norm, bool)                   { r.add("norm") }
func (r *recorder) Project(*Attn)                      { r.add("attn_project") }
func (r *recorder) Prep(*Attn, int)                    { r.add("attn_prep") }
func (r *recorder) Attend(*Attn, int)                  { r.add("attend") }
func (r *recorder) AttnOut(*Attn)                      { r.add("attn_out") }
func (r *recorder) MLAProject(*MLA)                    { r.add("mla_project") }
func (r *recorder) MLAPrep(*MLA, int)                  { r.add("mla_prep") }
func (r *recorder) Select(*MLA, int)                   { r.add("select") }
func (r *recorder) MLAAttend(*MLA, int)                { r.add("mla_attend") }
func (r *recorder) DNProject(*DeltaNet)                { r.add("dn_project") }
func (r *recorder) Conv(*DeltaNet, int)                { r.add("conv") }
func (r *recorder) DNPrep(*DeltaNet)                   { r.add("dn_prep") }
func (r *recorder) DeltaRule(*DeltaNet, int)           { r.add("delta_rule") }
func (r *recorder) DNGate(*DeltaNet)                   { r.add("dn_gate") }
func (r *recorder) DNOut(*DeltaNet)                    { r.add("dn_out") }
func (r *recorder) RouterLogits(*MoE)                  { r.add("router") }
func (r *recorder) Route(*MoE)                         { r.add("route") }
func (r *recorder) Experts(*MoE) error                 { r.add("experts"); return errExperts }
func (r *recorder) Combine(*MoE)                       { r.add("combine") }
func (r *recorder) Dense(*MLP)                         { r.add("dense") }
func (r *recorder) Emit(name string, layer int, b Buf) { r.add("emit") }

var errExperts = errors.New("experts")

// Timed passes every operation to the backend it wraps, and times it
// under its own name once a call; Emit passes untimed, and an error
// comes back as the backend gave it.
func TestTimed(t *testing.T) {
	var rec recorder
	var ops OpTimes
	b := Timed(&rec, &ops)
	b.Norm(nil, false)
	b.Project(nil)
	b.Prep(nil, 0)
	b.Attend(nil, 0)
	b.AttnOut(nil)
	b.MLAProject(nil)
	b.MLAPrep(nil, 0)
	b.Select(nil, 0)
	b.MLAAttend(nil, 0)
	b.DNProject(nil)
	b.Conv(nil, 0)
	b.DNPrep(nil)
	b.DeltaRule(nil, 0)
	b.DNGate(nil)
	b.DNOut(nil)
	b.RouterLogits(nil)
	b.Route(nil)
	if err := b.Experts(nil); err != errExperts {
		t.Errorf("Experts returned %v, want the backend's error", err)
	}
	b.Combine(nil)
	b.Dense(nil)
	b.Emit("x", 0, X)
	if len(rec.got) != int(NumOps) { // every op but the logits, and Emit
		t.Fatalf("the backend saw %d calls, want %d: %v", len(rec.got), NumOps, rec.got)
	}
	for o := range OpLMHead {
		if rec.got[o] != o.String() {
			t.Errorf("call %d reached %s, want %s", o, rec.got[o], o)
		}
		if ops.Calls[o] != 1 || ops.Time[o] < 0 {
			t.Errorf("%s: %d calls, %v, want 1", o, ops.Calls[o], ops.Time[o])
		}
	}
	if ops.Calls[OpLMHead] != 0 || rec.got[NumOps-1] != "emit" {
		t.Errorf("the logits counted %d times, last call %s: want 0 and emit", ops.Calls[OpLMHead], rec.got[NumOps-1])
	}
	if int64(ops.Total()) != sumTimes(&ops) {
		t.Errorf("Total %v, want the sum %v", ops.Total(), sumTimes(&ops))
	}
	if Op(-1).String() != "op?" || NumOps.String() != "op?" {
		t.Errorf("out-of-range ops named %q, %q", Op(-1), NumOps)
	}
}

func sumTimes(t *OpTimes) (d int64) {
	for _, v := range t.Time {
		d += int64(v)
	}
	return d
}
