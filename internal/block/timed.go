package block

import "time"

// Op names one of Backend's operations, for OpTimes. LMHead is not a
// Backend method: a backend that computes the logits outside Forward
// times them under it.
type Op int

// The operations OpTimes counts, in Backend's order.
const (
	OpNorm Op = iota
	OpProject
	OpPrep
	OpAttend
	OpAttnOut
	OpMLAProject
	OpMLAPrep
	OpSelect
	OpMLAAttend
	OpDNProject
	OpConv
	OpDNPrep
	OpDeltaRule
	OpDNGate
	OpDNOut
	OpRouterLogits
	OpRoute
	OpExperts
	OpCombine
	OpDense
	OpLMHead
	NumOps
)

var opNames = [NumOps]string{"norm", "attn_project", "attn_prep", "attend", "attn_out",
	"mla_project", "mla_prep", "select", "mla_attend",
	"dn_project", "conv", "dn_prep", "delta_rule", "dn_gate", "dn_out",
	"router", "route", "experts", "combine", "dense", "lm_head"}

// String is the operation's name in sluice bench --ops.
func (o Op) String() string {
	if o < 0 || o >= NumOps {
		return "op?"
	}
	return opNames[o]
}

// OpTimes is the wall time and the calls of each operation of the
// forward passes a Timed backend ran: where a step's time goes, by
// operation. The clock reads cost tens of nanoseconds an operation, a
// few microseconds a step of a real model.
type OpTimes struct {
	Time  [NumOps]time.Duration
	Calls [NumOps]int64
}

// Add counts one call of o that began at t0.
func (t *OpTimes) Add(o Op, t0 time.Time) {
	t.Time[o] += time.Since(t0)
	t.Calls[o]++
}

// Total is the time of every operation together.
func (t *OpTimes) Total() time.Duration {
	var d time.Duration
	for _, v := range t.Time {
		d += v
	}
	return d
}

// Timed returns b with the wall time of each of its operations added to
// t. It is for a backend whose operations finish before they return (the
// CPU's): a GPU backend's return when their kernels are queued. Every
// method is spelled out rather than embedded, so that an operation added
// to Backend is not passed through untimed.
func Timed(b Backend, t *OpTimes) Backend { return timed{b: b, t: t} }

type timed struct {
	b Backend
	t *OpTimes
}

func (x timed) Norm(n *Norm, add bool) {
	defer x.t.Add(OpNorm, time.Now())
	x.b.Norm(n, add)
}

func (x timed) Project(a *Attn) {
	defer x.t.Add(OpProject, time.Now())
	x.b.Project(a)
}

func (x timed) Prep(a *Attn, cache int) {
	defer x.t.Add(OpPrep, time.Now())
	x.b.Prep(a, cache)
}

func (x timed) Attend(a *Attn, cache int) {
	defer x.t.Add(OpAttend, time.Now())
	x.b.Attend(a, cache)
}

func (x timed) AttnOut(a *Attn) {
	defer x.t.Add(OpAttnOut, time.Now())
	x.b.AttnOut(a)
}

func (x timed) MLAProject(m *MLA) {
	defer x.t.Add(OpMLAProject, time.Now())
	x.b.MLAProject(m)
}

func (x timed) MLAPrep(m *MLA, cache int) {
	defer x.t.Add(OpMLAPrep, time.Now())
	x.b.MLAPrep(m, cache)
}

func (x timed) Select(m *MLA, cache int) {
	defer x.t.Add(OpSelect, time.Now())
	x.b.Select(m, cache)
}

func (x timed) MLAAttend(m *MLA, cache int) {
	defer x.t.Add(OpMLAAttend, time.Now())
	x.b.MLAAttend(m, cache)
}

func (x timed) DNProject(d *DeltaNet) {
	defer x.t.Add(OpDNProject, time.Now())
	x.b.DNProject(d)
}

func (x timed) Conv(d *DeltaNet, cache int) {
	defer x.t.Add(OpConv, time.Now())
	x.b.Conv(d, cache)
}

func (x timed) DNPrep(d *DeltaNet) {
	defer x.t.Add(OpDNPrep, time.Now())
	x.b.DNPrep(d)
}

func (x timed) DeltaRule(d *DeltaNet, cache int) {
	defer x.t.Add(OpDeltaRule, time.Now())
	x.b.DeltaRule(d, cache)
}

func (x timed) DNGate(d *DeltaNet) {
	defer x.t.Add(OpDNGate, time.Now())
	x.b.DNGate(d)
}

func (x timed) DNOut(d *DeltaNet) {
	defer x.t.Add(OpDNOut, time.Now())
	x.b.DNOut(d)
}

func (x timed) RouterLogits(m *MoE) {
	defer x.t.Add(OpRouterLogits, time.Now())
	x.b.RouterLogits(m)
}

func (x timed) Route(m *MoE) {
	defer x.t.Add(OpRoute, time.Now())
	x.b.Route(m)
}

func (x timed) Experts(m *MoE) error {
	defer x.t.Add(OpExperts, time.Now())
	return x.b.Experts(m)
}

func (x timed) Combine(m *MoE) {
	defer x.t.Add(OpCombine, time.Now())
	x.b.Combine(m)
}

func (x timed) Dense(m *MLP) {
	defer x.t.Add(OpDense, time.Now())
	x.b.Dense(m)
}

func (x timed) Emit(name string, layer int, b Buf) { x.b.Emit(name, layer, b) }
