//go:build linux

package gpu

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/model"
)

// TestSlotTable drives the device pool's slot choice (no GPU needed):
// free slots first, then the one the policy ranks lowest (least recently
// used, for LRU), never a slot the current wave holds, and a record found
// again is a hit in its old slot; a prefill's unkept expert goes first.
func TestSlotTable(t *testing.T) {
	ev, err := experts.NewEvictor(experts.LRU, 2, 5)
	if err != nil {
		t.Fatal(err)
	}
	tab := newSlotTable(10, 3, ev)
	tab.step(0, 1)
	for rec, want := range []int{0, 1, 2} {
		if tab.lookup(rec, true) != -1 {
			t.Fatalf("record %d: hit in an empty table", rec)
		}
		if s := tab.take(rec, true); s != want {
			t.Fatalf("record %d took slot %d, want free slot %d", rec, s, want)
		}
	}
	tab.step(1, 1)
	if tab.lookup(1, true) != 1 { // 1 is now the most recent
		t.Fatal("record 1 not found in slot 1")
	}
	if s := tab.take(5, true); s != 0 { // 0 and 2 are older; ties go low
		t.Fatalf("record 5 took slot %d, want 0 (least recently used)", s)
	}
	if tab.lookup(0, true) != -1 {
		t.Fatal("record 0 still found after its slot was taken")
	}
	tab.begin() // the step's next wave: its first wave's slots may go now
	if s := tab.take(6, false); s != 2 {
		t.Fatalf("record 6 took slot %d, want 2 (the oldest)", s)
	}
	tab.step(0, 1)
	// 6 came in as a prefill's unkept expert: it goes first, though it
	// arrived last.
	if s := tab.take(7, true); s != 2 {
		t.Fatalf("record 7 took slot %d, want 2 (record 6's, stamped old)", s)
	}
	if s0, s1 := tab.take(8, true), tab.take(9, true); s0 != 0 || s1 != 1 {
		t.Fatalf("records 8 and 9 took slots %d and %d, want 0 and 1", s0, s1)
	}
	// Every slot is held by this wave now: nothing may be evicted.
	if s := tab.take(3, true); s != -1 {
		t.Fatalf("record 3 took slot %d of a wave that holds all three", s)
	}
	for rec, s := range tab.slotOf {
		if s >= 0 && tab.owner[s] != int32(rec) {
			t.Fatalf("record %d maps to slot %d, owned by %d", rec, s, tab.owner[s])
		}
	}
	// A wave's victims, chosen at once: the free slot, then the oldest in
	// order; a slot the wave holds is never among them.
	ev2, _ := experts.NewEvictor(experts.LRU, 1, 8)
	t2 := newSlotTable(8, 5, ev2)
	for _, rec := range []int{4, 3, 2, 1} { // slot i gets record 4-i at step i+1
		t2.step(0, 1)
		t2.take(rec, true)
	}
	t2.step(0, 1)
	t2.lookup(3, true) // slot 1: held, and now the most recent
	if v := t2.victims(nil, 4); fmt.Sprint(v) != "[4 0 2 3]" {
		t.Fatalf("victims %v, want [4 0 2 3]", v)
	}
	if v := t2.victims(nil, 9); len(v) != 4 {
		t.Fatalf("victims %v: the wave holds one of five slots", v)
	}
	if _, err := experts.NewEvictor("mru", 2, 5); err == nil {
		t.Error("an unknown policy was accepted")
	}
}

// TestFillRecord stages an expert the way a slot holds it, the store's
// record layout: a row-major record is copied whole, and a record whose
// matrices the host tiled gives the same bytes, untiled piece by piece; a
// matrix of another shape is refused.
func TestFillRecord(t *testing.T) {
	for _, bias := range []bool{false, true} {
		fillRecordCase(t, &format.Config{Hidden: 256, MoEInter: 128, ExpertBias: bias})
	}
}

func fillRecordCase(t *testing.T, c *format.Config) {
	st := format.ExpertRecordLayout(c, format.Q4, "experts.bin")
	lay, stride, err := layoutOf(&st)
	if err != nil {
		t.Fatal(err)
	}
	rec := make([]byte, stride)
	for _, tt := range []*format.Tensor{&st.Gate, &st.Up, &st.Down} {
		v, sb := format.Q4.Sizes(tt.Shape[0], tt.Shape[1])
		for i := range v {
			rec[tt.Offset+i] = byte(i*7 + tt.Offset)
		}
		for i := range sb {
			rec[tt.ScaleOffset+i] = byte(i*3 + 1)
			rec[tt.BiasOffset+i] = byte(i*5 + 2)
		}
	}
	for _, b := range []*format.Tensor{st.GateBias, st.UpBias, st.DownBias} {
		if b != nil {
			for i := range b.Size {
				rec[b.Offset+i] = byte(i*11 + 3)
			}
		}
	}
	ex, err := model.ExpertFromRecord(rec, &st)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, stride)
	if err := fillRecord(got, lay, &ex); err != nil || string(got) != string(rec) {
		t.Fatalf("bias %v: row-major record not staged as it is (err %v)", c.ExpertBias, err)
	}

	tiledRec := append([]byte(nil), rec...)
	if _, err := model.TileRecord(tiledRec, &st, nil); err != nil {
		t.Fatal(err)
	}
	tiled, err := model.ExpertFromRecord(tiledRec, &st)
	if err != nil {
		t.Fatal(err)
	}
	tiled.MarkTiled()
	if string(tiledRec) == string(rec) || !tiled.Gate.Tiled {
		t.Fatal("tiling left the record as it was: the test would prove nothing")
	}
	got = make([]byte, stride)
	if err := fillRecord(got, lay, &tiled); err != nil || string(got) != string(rec) {
		t.Fatalf("bias %v: a tiled host record staged differently from its row-major copy (err %v)", c.ExpertBias, err)
	}

	bad := ex
	bad.Record = nil
	bad.Down.Rows, bad.Down.Cols = bad.Down.Cols, bad.Down.Rows
	if err := fillRecord(got, lay, &bad); err == nil {
		t.Fatal("a matrix of another shape was staged")
	}
}

// TestPoolFailForgets: a failed step forgets every slot's record, so that
// no later step reads a slot whose copy was never queued as a hit.
func TestPoolFailForgets(t *testing.T) {
	ev, _ := experts.NewEvictor(experts.LRU, 1, 4)
	r := &Runner{pool: &vpool{tab: newSlotTable(4, 2, ev)}}
	tab := &r.pool.tab
	tab.step(0, 1)
	tab.take(1, true)
	tab.take(3, true)
	tab.pre[1] = true
	r.poolFail(fmt.Errorf("disk gone"))
	if r.err == nil || r.err.Error() != "disk gone" {
		t.Fatalf("step error %v", r.err)
	}
	tab.step(0, 1)
	for rec := range 4 {
		if s := tab.lookup(rec, true); s != -1 {
			t.Errorf("record %d still in slot %d after the failure", rec, s)
		}
	}
	if tab.pre[1] || tab.owner[0] != -1 || tab.owner[1] != -1 {
		t.Error("slots still owned or marked prefetched")
	}
}

// TestVictimsLastFreeSlot: a wave whose misses take exactly the free
// slots, the last of them the table's last slot, gets them (this once
// read past the start of the scores), and victims agrees with choosing
// one slot at a time on every pool filling.
func TestVictimsLastFreeSlot(t *testing.T) {
	for _, p := range experts.Policies {
		ev, _ := experts.NewEvictor(p, 2, 8)
		tab := newSlotTable(16, 4, ev)
		tab.step(0, 1)
		for rec := range 2 {
			tab.take(rec, true)
		}
		tab.step(1, 1)
		if v := tab.victims(nil, 2); fmt.Sprint(v) != "[2 3]" {
			t.Fatalf("%s: victims %v, want the free slots [2 3]", p, v)
		}
		if v := tab.victims(nil, 3); len(v) != 3 || v[0] != 2 || v[1] != 3 {
			t.Fatalf("%s: victims %v, want [2 3 x]", p, v)
		}
	}
	// Random waves: victims(n) picks the slots n single takes would.
	rng := rand.New(rand.NewPCG(1, 2))
	for _, p := range experts.Policies {
		evA, _ := experts.NewEvictor(p, 4, 8)
		evB, _ := experts.NewEvictor(p, 4, 8)
		a, b := newSlotTable(32, 6, evA), newSlotTable(32, 6, evB)
		for step := range 400 {
			layer := step % 4
			a.step(layer, 1)
			b.step(layer, 1)
			var miss []int
			for _, e := range rng.Perm(8)[:1+rng.IntN(4)] {
				rec := layer*8 + e
				a.use(rec, 1, true)
				b.use(rec, 1, true)
				if a.lookup(rec, true) < 0 {
					miss = append(miss, rec)
				}
				b.lookup(rec, true)
			}
			v := a.victims(nil, len(miss))
			for i, rec := range miss {
				a.assign(rec, v[i], true)
				if s := b.take(rec, true); s != v[i] {
					t.Fatalf("%s step %d: victims %v, one at a time slot %d for the %d-th", p, step, v, s, i)
				}
			}
		}
	}
}

// take gives rec a slot, as one miss of a wave does (victims, then
// assign): the lowest free one, else the one the policy
// ranks lowest among those this wave does not hold (ties to the lowest
// slot); the caller keeps a wave within the slot count, so there always
// is one. It returns -1 if every slot is held.
func (t *slotTable) take(rec int, recent bool) int {
	var one [1]int
	v := t.victims(one[:0], 1)
	if len(v) == 0 {
		return -1
	}
	t.assign(rec, v[0], recent)
	return v[0]
}

// TestLowRecords: a pool of q4 records takes the low-bit records of
// --miss-bits beside its own (recordOf names each one's layout and size;
// fillRecord stages one at the start of a slot, as it lies in the low-bit
// store), refuses a record of another kind, and a store that is not q4
// is refused for --miss-bits by name.
func TestLowRecords(t *testing.T) {
	c := &format.Config{Hidden: 256, MoEInter: 128}
	man := &format.Manifest{Config: *c, Stores: []format.ExpertStore{
		format.ExpertRecordLayout(c, format.Q4, "experts.bin"),
		format.ExpertRecordLayout(c, format.Q3, format.LowStoreFile(3)),
	}}
	r := &Runner{M: &model.Model{Manifest: man}}
	lay, stride, err := layoutOf(&man.Stores[0])
	if err != nil {
		t.Fatal(err)
	}
	low, err := r.lowLayout(3, lay, stride)
	if err != nil {
		t.Fatal(err)
	}
	st := &man.Stores[1]
	if low.rec != int(st.Stride) || low.rec >= stride || low.lay[0].m.kind != format.Q3 {
		t.Fatalf("low-bit layout: %d-byte records of %s beside %d-byte q4 ones", low.rec, low.lay[0].m.kind, stride)
	}
	for i, o := range low.lay {
		const base = 1 << 20
		if m := o.at(base); m.kind != format.Q3 || m.q != base+uintptr(o.q) || m.s != base+uintptr(o.s) || m.b != base+uintptr(o.b) || o.s <= o.q {
			t.Fatalf("low-bit matrix %d of a slot: %+v (offsets %+v)", i, m, o)
		}
	}
	rec := make([]byte, st.Stride)
	for i := range rec {
		rec[i] = byte(i*7 + 3)
	}
	ex, err := model.ExpertFromRecord(rec, st)
	if err != nil {
		t.Fatal(err)
	}
	p := &vpool{lay: lay, rec: stride, low: low}
	gl, n, isLow, err := p.recordOf(&ex)
	if err != nil || n != low.rec || !isLow {
		t.Fatalf("a q3 record: %d bytes, low %v, err %v", n, isLow, err)
	}
	slot := make([]byte, stride)
	if err := fillRecord(slot[:n], gl, &ex); err != nil || string(slot[:n]) != string(rec) {
		t.Fatalf("a q3 record not staged as it lies in the store (err %v)", err)
	}
	ex.Record = nil // staged matrix by matrix: the same bytes where they are defined
	clear(slot)
	if err := fillRecord(slot[:n], gl, &ex); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []*format.Tensor{&st.Gate, &st.Up, &st.Down} {
		v, sb := format.Q3.Sizes(tt.Shape[0], tt.Shape[1])
		for _, part := range [][2]int64{{tt.Offset, v}, {tt.ScaleOffset, sb}, {tt.BiasOffset, sb}} {
			if a, b := slot[part[0]:part[0]+part[1]], rec[part[0]:part[0]+part[1]]; string(a) != string(b) {
				t.Fatalf("a q3 matrix staged piece by piece differs at offset %d", part[0])
			}
		}
	}
	if _, _, _, err := (&vpool{lay: lay, rec: stride}).recordOf(&ex); err == nil {
		t.Error("a pool without --miss-bits took a q3 record")
	}
	b16 := format.ExpertRecordLayout(c, format.BF16, "experts.bin")
	lay16, stride16, err := layoutOf(&b16)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.lowLayout(3, lay16, stride16); err == nil || !strings.Contains(err.Error(), "needs a q4 expert store") {
		t.Errorf("--miss-bits over a bf16 store: %v", err)
	}
	if _, err := r.lowLayout(2, lay, stride); err == nil || !strings.Contains(err.Error(), "2-bit") {
		t.Errorf("--miss-bits 2 without a 2-bit store: %v", err)
	}
}

// TestCostSplit: the hybrid cost model gives the CPU the share of a
// layer's misses that balances its time (from its later start, its first
// expert slower) against the link's; a probe of two misses while the
// CPU's speed is unmeasured, and again when one is due while the model
// would give none, at intervals that double up to maxProbeEvery, so that
// a CPU that became faster is seen and a slow one costs next to nothing.
func TestCostSplit(t *testing.T) {
	for _, c := range []struct {
		n                     int
		cp, first, next, lead float64
		want                  int
	}{
		{10, 0.12, 0.33, 0.33, 0, 2}, // 2 spans 0.96 ms, 3 spans 0.99
		{10, 1, 1, 1, 0, 5},
		{10, 1, 0.01, 0.01, 0, 10}, // the CPU is far faster: all of them
		{10, 0.01, 1, 1, 0, 0},     // the link is far faster: none
		{10, 1, 1, 1, 4, 3},        // a late start: 3 spans 7 ms, 2 and 4 spans 8
		{10, 0.136, 1.1, 1.1, 0.2, 1},
		{10, 0.136, 1.1, 1.1, 0.3, 0},  // 1 spans 1.4 ms, none 1.36
		{7, 0.137, 1.3, 0.33, 0.19, 0}, // a slow first expert: 1 spans 1.49 ms, none 0.96
		{7, 0.137, 0.5, 0.33, 0.19, 1}, // 1 spans 0.82 ms, 2 spans 1.02
		{3, 1, 1, 1, 5, 0},             // the CPU starts after the link is done
		{0, 1, 1, 1, 0, 0},
		{4, 0, 1, 1, 0, 0}, // unmeasured link
		{4, 1, 0, 1, 0, 0},
		{4, 1, 1, 0, 0, 0},
	} {
		if got := costSplit(c.n, c.cp, c.first, c.next, c.lead); got != c.want {
			t.Errorf("costSplit(%+v) = %d, want %d", c, got, c.want)
		}
	}
	var m hybridCost
	if got := m.plan(6); got != 2 {
		t.Fatalf("unmeasured CPU: %d misses on the CPU, want 2 (a probe)", got)
	}
	if got := m.plan(1); got != 1 {
		t.Fatalf("unmeasured CPU, one miss: %d on the CPU, want 1", got)
	}
	if got := m.plan(0); got != 0 {
		t.Fatalf("no misses: %d on the CPU", got)
	}
	m.first.add(1)
	m.next.add(1)
	if got := m.plan(6); got != 0 {
		t.Fatalf("unmeasured link: %d misses on the CPU, want 0", got)
	}
	m = hybridCost{recBytes: 1 << 20}
	m.first.add(1)
	m.next.add(1)
	observe(&m.copyMSB, 0.1/(1<<20)) // 0.1 ms a record: the CPU is 10× slower
	// Probes at 64, then 128, 256, ... layers apart, up to maxProbeEvery.
	var at []int
	for i := range 3 * maxProbeEvery {
		if k := m.plan(5); k > 0 {
			if k != 2 {
				t.Fatalf("a probe of %d misses, want 2", k)
			}
			at = append(at, i+1)
		}
	}
	want, next := []int{}, 0
	for gap := probeEvery; next+gap <= 3*maxProbeEvery; gap = min(2*gap, maxProbeEvery) {
		next += gap
		want = append(want, next)
	}
	if !slices.Equal(at, want) {
		t.Errorf("a slow CPU was probed after layers %v, want %v", at, want)
	}
	for range 3 {
		m.first.add(0.1) // measured faster now
		m.next.add(0.1)
	}
	if got := m.plan(6); got != 3 {
		t.Errorf("CPU as fast as the link: %d of 6 misses on the CPU, want 3", got)
	}
	if m.every != probeEvery {
		t.Errorf("after the CPU took misses, probes are %d layers apart, want %d", m.every, probeEvery)
	}
}

// TestRecentMedian: the CPU's figures are the median of their last few
// samples, so one slow product (preempted, or the first to touch its
// records) does not keep the CPU out: a probe after it, or before, shows
// its speed.
func TestRecentMedian(t *testing.T) {
	var m recent
	if m.get() != 0 {
		t.Fatal("no sample: want 0")
	}
	m.add(1.5) // a slow first product
	if m.get() != 1.5 {
		t.Fatalf("one sample: %g", m.get())
	}
	m.add(0.2) // the next probe: the lower of two
	if m.get() != 0.2 {
		t.Fatalf("an outlier and a usual sample: %g, want 0.2", m.get())
	}
	for _, v := range []float64{0.3, 9, 0.25} {
		m.add(v)
	}
	if m.get() != 0.3 { // 1.5 0.2 0.3 9 0.25
		t.Fatalf("median of five: %g, want 0.3", m.get())
	}
	for range recentN {
		m.add(2) // the CPU became slower: only the last samples count
	}
	if m.get() != 2 {
		t.Fatalf("after %d samples of 2: %g", recentN, m.get())
	}
	var c hybridCost
	c.copyMSB, c.recBytes = 0.13/(1<<20), 1<<20
	c.first.add(1.6) // the first probe's products, both slow
	c.next.add(1.5)
	if k := c.plan(8); k != 0 {
		t.Fatalf("a slow probe: %d of 8 misses on the CPU, want 0", k)
	}
	c.first.add(0.5) // a later probe at the usual speed
	c.next.add(0.17)
	if k := c.plan(8); k == 0 {
		t.Error("a probe at the usual speed after a slow one: the CPU still takes nothing")
	}
	// Flushes of one expert each measure only firsts: a further expert
	// is taken to cost a first, rather than probing for good.
	var one hybridCost
	one.copyMSB, one.recBytes = 1.0/(1<<20), 1<<20 // 1 ms a record
	one.first.add(0.1)
	if k := one.plan(6); k != 6 {
		t.Errorf("firsts of 0.1 ms against 1 ms a record, no further expert measured: %d of 6 misses on the CPU, want 6", k)
	}
}

// TestRingRuns checks the runs a copy between two caches takes (no GPU
// needed): they cover the positions in order, none crosses a ring's wrap
// in either cache, and each ends only where one of them wraps or the
// positions end; a plain cache (0 rows) keeps position p at row p.
func TestRingRuns(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	for trial := 0; trial < 2000; trial++ {
		dr, sr := r.IntN(4)*(1+r.IntN(40)), r.IntN(4)*(1+r.IntN(40)) // 0 a quarter of the time
		a := r.IntN(300)
		b := a + r.IntN(200)
		next := a
		err := ringRuns(a, b, dr, sr, func(p, n int) error {
			if p != next || n <= 0 || p+n > b {
				return fmt.Errorf("run %d+%d after %d, positions %d..%d", p, n, next, a, b)
			}
			for _, rows := range []int{dr, sr} {
				if rows > 0 && ringRow(p, rows)+n > rows {
					return fmt.Errorf("run %d+%d crosses the wrap of a ring of %d", p, n, rows)
				}
			}
			end := p + n
			wraps := end == b || (dr > 0 && end%dr == 0) || (sr > 0 && end%sr == 0)
			if !wraps {
				return fmt.Errorf("run %d+%d ends at no wrap (rings %d, %d) before %d", p, n, dr, sr, b)
			}
			next = end
			return nil
		})
		if err == nil && next != b {
			err = fmt.Errorf("runs ended at %d, want %d", next, b)
		}
		if err != nil {
			t.Fatalf("trial %d (rings %d, %d): %v", trial, dr, sr, err)
		}
	}
	if got := ringRow(1000, 134); got != 1000%134 {
		t.Errorf("ringRow(1000, 134) = %d", got)
	}
	if got := ringRow(1000, 0); got != 1000 {
		t.Errorf("ringRow(1000, 0) = %d, want the position", got)
	}
}

// TestSupportedRouting: the GPU takes the routing rules it has kernels
// for, within their limits, and refuses any other by layer rather than
// running it as a softmax (no GPU needed).
func TestSupportedRouting(t *testing.T) {
	mk := func(experts int, moe *block.MoE) *model.Model {
		moe.Act = block.SwiGLU
		return &model.Model{Config: format.Config{Family: "qwen3_moe", Experts: experts, TopK: 4},
			Arch: &family.Arch{Layers: []block.Layer{{Mixer: &block.Attn{}, FFN: moe}}}}
	}
	for _, c := range []struct {
		name    string
		experts int
		moe     *block.MoE
		ok      bool
	}{
		{"softmax", 2048, &block.MoE{Score: block.SoftmaxTopK}, true},
		{"top-k softmax", 128, &block.MoE{Score: block.TopKSoftmax}, true},
		{"top-k softmax over 2048", 2048, &block.MoE{Score: block.TopKSoftmax}, false},
		{"groups", 256, &block.MoE{Score: block.SigmoidGroups, Groups: 8, TopGroups: 4}, true},
		{"65 groups", 260, &block.MoE{Score: block.SigmoidGroups, Groups: 65, TopGroups: 4}, false},
		{"an unknown rule", 128, &block.MoE{Score: block.Score(99)}, false},
	} {
		err := Supported(mk(c.experts, c.moe))
		if (err == nil) != c.ok || err != nil && !strings.Contains(err.Error(), "layer 0") {
			t.Errorf("%s: Supported = %v, want ok %v", c.name, err, c.ok)
		}
	}
	// MXFP4 experts (gpt-oss at 4 bits) have no device kernel.
	m := mk(128, &block.MoE{Score: block.SoftmaxTopK})
	m.Manifest = &format.Manifest{Stores: []format.ExpertStore{{Kind: format.MXFP4}}}
	if err := Supported(m); err == nil || !strings.Contains(err.Error(), "mxfp4 experts run on the CPU only") {
		t.Errorf("MXFP4 experts: Supported = %v, want a refusal", err)
	}
	m.Manifest.Stores[0].Kind = format.Q4
	if err := Supported(m); err != nil {
		t.Errorf("q4 experts: Supported = %v", err)
	}
}

// scanVictims is victims as it was before experts.Victims: every slot
// scored once for the wave, the n lowest by (score, slot) after the free
// ones.
func scanVictims(t *slotTable, n int) []int {
	var out []int
	for s, o := range t.owner {
		if len(out) == n {
			return out
		}
		if o < 0 && t.used[s] != t.now {
			out = append(out, s)
		}
	}
	type cand struct {
		s  int
		sc float64
	}
	var cs []cand
	for s, u := range t.used {
		if u == t.now || t.owner[s] < 0 {
			continue
		}
		cs = append(cs, cand{s, t.ev.Score(t.owner[s], t.last[s])})
	}
	slices.SortFunc(cs, func(a, b cand) int {
		if a.sc != b.sc {
			if a.sc < b.sc {
				return -1
			}
			return 1
		}
		return a.s - b.s
	})
	for _, c := range cs {
		if len(out) == n {
			break
		}
		out = append(out, c.s)
	}
	return out
}

// TestVictimsMatchScan drives slot tables through random decode and
// prefill waves (several waves a step, hits, misses, a prefill's unkept
// experts, the lookahead's records of the next layer, a failed step
// forgetting every slot) and requires each wave's victims to be the ones
// scoring every slot gives: the same free slots, then slots of the same
// scores in the same order (a slot of another score would be a layer's
// stale candidate).
func TestVictimsMatchScan(t *testing.T) {
	const L, E = 6, 32
	rng := rand.New(rand.NewPCG(5, 8))
	for _, p := range experts.Policies {
		for _, slots := range []int{12, 40, 96} {
			ev, _ := experts.NewEvictor(p, L, E)
			tab := newSlotTable(L*E, slots, ev)
			for step := range 600 {
				layer := step % L
				rows := 1
				if step%97 < 6 {
					rows = 8 // a prefill chunk's step
				}
				tab.step(layer, rows)
				if step == 300 {
					tab.forget()
				}
				ids := rng.Perm(E)[:2+rng.IntN(5)]
				for _, e := range ids {
					tab.use(layer*E+e, rows, rows == 1 || e%2 == 0)
				}
				for w := 0; w < len(ids); w += 3 {
					if w > 0 {
						tab.begin()
					}
					var miss []int
					for _, e := range ids[w:min(w+3, len(ids))] {
						if tab.lookup(layer*E+e, rows == 1 || e%2 == 0) < 0 {
							miss = append(miss, layer*E+e)
						}
					}
					want := scanVictims(&tab, len(miss))
					got := tab.victims(nil, len(miss))
					if len(got) != len(want) {
						t.Fatalf("%s, %d slots, step %d: victims %v, scanning %v", p, slots, step, got, want)
					}
					for i := range got {
						if got[i] == want[i] {
							continue
						}
						g, w := got[i], want[i]
						if tab.owner[g] < 0 || tab.owner[w] < 0 || tab.ev.Score(tab.owner[g], tab.last[g]) != tab.ev.Score(tab.owner[w], tab.last[w]) {
							t.Fatalf("%s, %d slots, step %d: victims %v, scanning %v", p, slots, step, got, want)
						}
					}
					for i, rec := range miss[:len(got)] {
						tab.assign(rec, got[i], rows == 1)
					}
				}
				if next := (layer + 1) % L; rng.IntN(2) == 0 {
					// The lookahead's records of the next layer.
					e := rng.IntN(E)
					if tab.slotOf[next*E+e] < 0 {
						if v := tab.victims(nil, 1); len(v) == 1 {
							tab.assign(next*E+e, v[0], true)
						}
					}
				}
			}
		}
	}
}
