//go:build linux

package gpu

import (
	"fmt"

	"github.com/sluicelm/sluice/internal/cuda"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/model"
)

// vpool is the device's expert pool when the routed experts do not all
// live in device memory: fixed slots of one record each (an expert's
// gate, up and down matrices, laid out as the resident upload lays them
// out), filled from the host's provider (the engine's resident store or
// its streaming pool over experts.bin) as the router asks for them.
//
// Per MoE layer the host learns the router's choice (the step's one round
// trip), resolves each chosen expert to a slot, copies the misses through
// pinned staging into the slots the least recently used experts held, and
// queues the products on the slots' addresses. Copies and products run in
// order on the runner's one stream, so a slot is overwritten only after
// the products that read its old record; the outputs land where the
// resident path puts them and are combined in the router's order, so the
// logits do not depend on the pool's size.
type vpool struct {
	prov  model.Provider
	slots int
	rec   int           // bytes of a slot
	lay   [3]matOffsets // gate, up, down within a slot
	buf   cuda.Buf      // slots × rec
	stage cuda.Host     // pinned staging: wave records
	wave  int           // the most experts resolved at once (≤ slots)

	tab slotTable

	// A wave's scratch: its misses (ids and their positions in the wave),
	// the rows each one has, for the provider's hint.
	missIDs, missAt, missRows []int

	Hits, Misses, BytesUp uint64
}

// slotTable maps records (layer·E + expert) to slots with least-recently
// used replacement; it holds no device memory, so the choice of slots is
// testable without a GPU.
type slotTable struct {
	slotOf []int32  // [record] → slot, or -1
	owner  []int32  // [slot] → record, or -1 (free)
	used   []uint64 // [slot] the wave that last used it (0: never)
	now    uint64   // the current wave
}

func newSlotTable(records, slots int) slotTable {
	t := slotTable{slotOf: make([]int32, records), owner: make([]int32, slots), used: make([]uint64, slots)}
	for i := range t.slotOf {
		t.slotOf[i] = -1
	}
	for i := range t.owner {
		t.owner[i] = -1
	}
	return t
}

// begin starts a wave: slots used from here on are held until the next.
func (t *slotTable) begin() { t.now++ }

// lookup returns rec's slot and marks it used by this wave, or -1.
func (t *slotTable) lookup(rec int) int {
	s := t.slotOf[rec]
	if s >= 0 {
		t.used[s] = t.now
	}
	return int(s)
}

// take gives rec a slot: a free one, else the least recently used one
// that this wave does not hold (the caller keeps a wave within the slot
// count, so there always is one). It returns -1 if every slot is held.
func (t *slotTable) take(rec int) int {
	best := -1
	for s, u := range t.used {
		if u == t.now {
			continue
		}
		if t.owner[s] < 0 {
			best = s
			break
		}
		if best < 0 || u < t.used[best] {
			best = s
		}
	}
	if best < 0 {
		return -1
	}
	if o := t.owner[best]; o >= 0 {
		t.slotOf[o] = -1
	}
	t.owner[best], t.slotOf[rec], t.used[best] = int32(rec), int32(best), t.now
	return best
}

// recordLayout lays out one expert as a slot holds it, from the host
// provider's views of expert 0 of the first layer (mapped, not read).
func recordLayout(m *model.Model) (lay [3]matOffsets, bytes int, err error) {
	prov, err := model.NewResidentProvider(m)
	if err != nil {
		return lay, 0, err
	}
	defer prov.Close()
	if err := prov.Begin(0, []int{0}, model.Hint{}); err != nil {
		return lay, 0, err
	}
	_, ex, err := prov.Next()
	if err != nil {
		return lay, 0, err
	}
	if ex.GateBias != nil {
		return lay, 0, fmt.Errorf("experts with biases are not supported on the GPU")
	}
	var a arena
	lay = [3]matOffsets{putMat(&a, &ex.Gate), putMat(&a, &ex.Up), putMat(&a, &ex.Down)}
	return lay, a.size, nil
}

// newPool allocates slots records of rec bytes and the pinned staging.
func (r *Runner) newPool(slots int, lay [3]matOffsets, rec int) error {
	p := &vpool{prov: r.M.Experts, slots: slots, rec: rec, lay: lay, wave: min(slots, max(r.K, 16))}
	if p.prov == nil {
		return fmt.Errorf("expert pool: the model has no host provider of experts")
	}
	var err error
	if p.buf, err = r.Dev.Alloc(slots * rec); err != nil {
		return fmt.Errorf("expert pool of %d records (%.2f GiB): %w", slots, gib(int64(slots)*int64(rec)), err)
	}
	r.weights = append(r.weights, p.buf)
	if p.stage, err = r.Dev.AllocHost(p.wave * rec); err != nil {
		return fmt.Errorf("expert pool staging (%d records, %.2f GiB pinned): %w", p.wave, gib(int64(p.wave)*int64(rec)), err)
	}
	nl := len(r.M.Arch.Layers)
	p.tab = newSlotTable(nl*r.E, slots)
	r.pool = p
	return nil
}

// closePool frees the staging (the slots are among r.weights).
func (r *Runner) closePool() {
	if r.pool != nil {
		r.Dev.FreeHost(r.pool.stage)
		r.pool.stage = cuda.Host{}
	}
}

// slotExpert is the expert in slot s.
func (p *vpool) slotExpert(s int) expert {
	base := p.buf.Ptr + uintptr(s*p.rec)
	return expert{p.lay[0].at(base), p.lay[1].at(base), p.lay[2].at(base)}
}

// pooledExperts multiplies the n grouped rows in gin by their experts
// (r.distinct, r.base, r.nrows, as Experts grouped them), a wave of at
// most p.wave experts at a time: each wave resolves its experts to slots,
// uploads its misses, and computes its rows' gate, up, SwiGLU and down.
// A wave's rows are consecutive in gin, so each wave prepares and
// multiplies exactly the rows one pass over all of them would, and the
// products are batch-invariant: the outputs are the resident path's bits.
func (r *Runner) pooledExperts(layer int) {
	p := r.pool
	H, I := r.H, r.I
	kind := p.lay[0].m.kind
	for w0 := 0; w0 < len(r.distinct); w0 += p.wave {
		w1 := min(w0+p.wave, len(r.distinct))
		if w0 > 0 && len(p.missIDs) > 0 {
			// The staging of the last wave's misses may still be copying.
			r.check(r.Dev.SyncStream(r.s))
		}
		slots := r.waveSlots(layer, w0, w1)
		if r.err != nil {
			return
		}
		b0 := r.base[w0]
		b1 := r.base[w1-1] + r.nrows[w1-1]
		a := r.prepare(r.gin+uintptr(4*b0*H), b1-b0, H, kind)
		for di := w0; di < w1; di++ {
			ex := p.slotExpert(slots[di-w0])
			b, rows := r.base[di], r.nrows[di]
			r.mulPrepared(r.g+uintptr(4*b*I), ex.gate, a, b-b0, rows)
			r.mulPrepared(r.u+uintptr(4*b*I), ex.up, a, b-b0, rows)
		}
		r.check(r.k.SwiGLU(r.s, r.g+uintptr(4*b0*I), r.g+uintptr(4*b0*I), r.u+uintptr(4*b0*I), (b1-b0)*I))
		a = r.prepare(r.g+uintptr(4*b0*I), b1-b0, I, kind)
		for di := w0; di < w1; di++ {
			b, rows := r.base[di], r.nrows[di]
			r.mulPrepared(r.outk+uintptr(4*b*H), p.slotExpert(slots[di-w0]).down, a, b-b0, rows)
		}
	}
}

// waveSlots resolves the experts r.distinct[w0:w1] of layer to slots
// (into r.waveSlot), fetching the misses from the host provider into the
// staging and queueing their copies into the slots they take.
func (r *Runner) waveSlots(layer, w0, w1 int) []int {
	p := r.pool
	p.tab.begin()
	ids := r.distinct[w0:w1]
	slots := r.waveSlot[:len(ids)]
	p.missIDs, p.missAt, p.missRows = p.missIDs[:0], p.missAt[:0], p.missRows[:0]
	for i, e := range ids {
		slots[i] = p.tab.lookup(layer*r.E + e)
		if slots[i] < 0 {
			p.missIDs = append(p.missIDs, e)
			p.missAt = append(p.missAt, i)
			p.missRows = append(p.missRows, r.nrows[w0+i])
		} else {
			p.Hits++
		}
	}
	if len(p.missIDs) == 0 {
		return slots
	}
	p.Misses += uint64(len(p.missIDs))
	if err := p.prov.Begin(layer, p.missIDs, model.Hint{Rows: p.missRows}); err != nil {
		r.check(fmt.Errorf("expert pool: layer %d: %w", layer, err))
		return slots
	}
	stage := p.stage.Slice()
	for range p.missIDs {
		j, ex, err := p.prov.Next()
		if err == nil && ex == nil {
			err = fmt.Errorf("the host provider cut expert %d (lossy options do not apply on the GPU)", p.missIDs[j])
		}
		if err != nil {
			r.check(fmt.Errorf("expert pool: layer %d: %w", layer, err))
			return slots
		}
		dst := stage[j*p.rec : (j+1)*p.rec]
		if err := fillRecord(dst, p.lay, ex); err != nil {
			r.check(err)
			return slots
		}
		s := p.tab.take(layer*r.E + p.missIDs[j])
		if s < 0 {
			r.check(fmt.Errorf("expert pool: no free slot among %d for a wave of %d", p.slots, len(ids)))
			return slots
		}
		slots[p.missAt[j]] = s
		r.check(r.Dev.UploadAsync(p.buf.Ptr+uintptr(s*p.rec), p.stage, j*p.rec, p.rec, r.s))
		p.BytesUp += uint64(p.rec)
	}
	return slots
}

// fillRecord copies an expert's matrices from the host views into dst at
// the slot layout lay, rows in order (a tiled host matrix is untiled).
func fillRecord(dst []byte, lay [3]matOffsets, ex *model.Expert) error {
	for i, km := range [3]*kernels.Mat{&ex.Gate, &ex.Up, &ex.Down} {
		o := lay[i]
		if km.Kind != o.m.kind || km.Rows != o.m.rows || km.Cols != o.m.cols {
			return fmt.Errorf("expert pool: a host record's matrix [%d %d] %v differs from the slot's [%d %d] %v",
				km.Rows, km.Cols, km.Kind, o.m.rows, o.m.cols, o.m.kind)
		}
		switch km.Kind {
		case format.Q4, format.Q8:
			km.FlatQInto(dst[o.q : o.q+len(km.Q)])
			copy(dst[o.s:], bytesOf(km.Scales))
			copy(dst[o.b:], bytesOf(km.Biases))
		case format.BF16:
			copy(dst[o.p:], bytesOf(km.BF16))
		default:
			copy(dst[o.p:], bytesOf(km.F32))
		}
	}
	return nil
}
