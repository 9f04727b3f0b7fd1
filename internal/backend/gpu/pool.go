//go:build linux

package gpu

import (
	"fmt"
	"os"
	"slices"
	"unsafe"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/cuda"
	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/model"
)

// vpool is the device's expert pool when the routed experts do not all
// live in device memory: fixed slots of one record each, laid out as the
// store lays a record out (experts.bin's stride and offsets), filled from
// the host's provider (the engine's resident store or its streaming pool
// over experts.bin) as the router asks for them.
//
// Per MoE layer the host learns the router's choice (the step's one round
// trip) and resolves each chosen expert to a slot. The misses are copied
// into the slots the eviction policy gives up, on a copy stream
// that first waits for the products already queued (which may read those
// slots' old records): straight from page-locked host memory (Register)
// when the record lies there, the host store held whole or the host's
// streaming pool, else through pinned staging. The hits' products are queued
// at once and overlap the copies; the misses' wait for an event after
// their copies. The outputs land where the resident path puts them and
// are combined in the router's order, so the logits do not depend on the
// pool's size.
type vpool struct {
	prov  model.Provider
	slots int
	rec   int           // bytes of a slot: the store's stride
	lay   [3]matOffsets // gate, up, down within a record
	buf   cuda.Buf      // slots × rec
	stage cuda.Host     // pinned staging: wave records; none while every copy is direct
	wave  int           // the most experts resolved at once (≤ slots)
	share int           // slots per layer: a prefill keeps this many of a layer's experts

	// host is the host memory page-locked for the copies, records in it
	// copied by DMA with no staging: the provider's store held whole, or
	// the memory of the host's streaming pool (recycled), whose slots the
	// provider's next call may refill. pending says copies from recycled
	// memory were queued since the copy stream was last synced: the
	// provider is not called again until they are done (settle).
	host     []byte
	recycled bool
	pending  bool

	cs                 cuda.Stream // copies
	computed, got, pre cuda.Event  // the products queued so far; a wave's copies; the lookahead's
	prePending         bool        // the lookahead copied: the next layer's products wait for pre
	predIDs            []int       // the lookahead's choice, best first; -1 where a slot holds it
	preIDs             []int       // of them, those the gate lets through
	noLookahead        bool
	look               *experts.LookGate // gates the lookahead's copies (lookMinCopy)

	tab slotTable

	// A wave's scratch: its misses (ids and their positions in the wave),
	// the rows each one has, for the provider's hint, and which of the
	// wave's experts are misses.
	missIDs, missAt, missRows []int
	isMiss                    []bool
	// Misses the host's CPU computes (hybrid): by position in missIDs,
	// and by position in the wave.
	cpuMiss, isCPU []bool
	victims        []int
	staged         bool            // the last wave copied through the staging
	pos            []int           // a batch of the provider's experts: positions in missIDs
	exs            []*model.Expert // and the experts

	// low is the layout of the low-bit records the host's streaming pool
	// gives for its misses (--miss-bits), or nil; isLow says which slots
	// hold one. A low-bit record lies at the start of a slot and crosses
	// PCIe at its own size.
	low   *lowRecords
	isLow []bool

	// cutWeak is the host pool's --cut-weak: it drops a miss whose read
	// from disk has not landed when asked for and whose largest routing
	// weight (missW, which the host is given) is below it; such a miss
	// adds nothing to its rows (isCut, by position in the wave).
	cutWeak float32
	missW   []float32
	isCut   []bool

	// waits times the compute stream's waits for a wave's copies.
	waits copyWaits

	stats experts.DevicePool
}

// lookMinCopy is the least share of a rank's would-be copies used for the
// GPU's lookahead to copy that rank (experts.LookGate; the host's reads
// need half). A copy ahead shares the link with the demand misses queued
// behind it, and it evicts a record that might have hit; while the CPU
// takes misses the link is the busy side. On the 4-layer 397B synth at a
// 10% pool, ranks gated at one half decoded 146.6–150.0 tok/s, at 0.75
// 156.1–165.2, and without lookahead 161.1–170.6 (alternating runs on
// one H200 machine); on another run, 0.75 gave 146.6–152.1 and no
// lookahead 136.0–151.8.
const lookMinCopy = 0.75

// copyWaits times how long the compute stream waits for the misses'
// copies: an event on it before the wait for a wave's copies and one
// after; the time between is the wait. They are read once the stream has
// synced (collect), at most len(ev)/2 waits between syncs (a layer's
// waves, and every layer syncs at its route).
type copyWaits struct {
	ev     []cuda.Event
	decode []bool // [pair] in a decode step
	n      int    // pairs recorded since the last collect
}

// maxWaits is the most waits timed between two syncs of the stream.
const maxWaits = 32

func (w *copyWaits) alloc(d *cuda.Device) error {
	w.ev, w.decode = make([]cuda.Event, 2*maxWaits), make([]bool, maxWaits)
	for i := range w.ev {
		var err error
		if w.ev[i], err = d.NewEvent(); err != nil {
			return err
		}
	}
	return nil
}

// waitTimed queues wait (the stream's wait for the copies) between the
// events of the next pair, while there is one.
func (r *Runner) waitTimed(decode bool, wait func() error) error {
	w := &r.pool.waits
	if w.n == maxWaits || len(w.ev) == 0 {
		return wait()
	}
	if err := r.Dev.Record(w.ev[2*w.n], r.s); err != nil {
		return err
	}
	if err := wait(); err != nil {
		return err
	}
	if err := r.Dev.Record(w.ev[2*w.n+1], r.s); err != nil {
		return err
	}
	w.decode[w.n] = decode
	w.n++
	return nil
}

// collectWaits adds the waits timed since the last sync of the stream,
// which has just synced, to the pool's figures.
func (r *Runner) collectWaits() {
	p := r.pool
	if p == nil {
		return
	}
	w := &p.waits
	for i := range w.n {
		if ms, err := r.Dev.Elapsed(w.ev[2*i], w.ev[2*i+1]); err == nil && ms > 0 {
			p.stats.CopyWaitMS += float64(ms)
			if w.decode[i] {
				p.stats.DecodeCopyWaitMS += float64(ms)
			}
		}
	}
	w.n = 0
	r.collectCopyTime()
}

// lowRecords is the layout and stride of the low-bit expert store.
type lowRecords struct {
	lay [3]matOffsets
	rec int
}

// slotTable maps records (layer·E + expert) to slots and picks the slot a
// miss replaces by the host pool's eviction policy (experts.Evictor,
// driven as the host's pool drives it); it holds no device memory, so
// the choice of slots is testable without a GPU.
type slotTable struct {
	slotOf []int32  // [record] → slot, or -1
	owner  []int32  // [slot] → record, or -1 (free)
	used   []uint64 // [slot] the wave that last used it: held while it runs
	last   []int64  // [slot] the layer step that last used it (0: recycle first)
	now    uint64   // the current wave
	clock  int64    // the current layer step
	ev     *experts.Evictor
	pre    []bool // [slot] filled by the lookahead and not yet used
	// vs finds victims by layer (experts.Victims) rather than scoring
	// every slot each wave: a wave's host work, while the device idles,
	// took about 100 µs at 10,000 slots that way. E is the experts a
	// layer; waveLayers are the layers with a slot the wave holds, which
	// it releases when the next begins (layerWave: the wave that last
	// listed each).
	vs         *experts.Victims
	prev       []uint64 // victims' scratch
	E          int
	waveLayers []int
	layerWave  []uint64
}

func newSlotTable(records, slots int, ev *experts.Evictor) slotTable {
	layers := ev.Layers()
	t := slotTable{slotOf: make([]int32, records), owner: make([]int32, slots), used: make([]uint64, slots),
		last: make([]int64, slots), ev: ev, pre: make([]bool, slots),
		vs: experts.NewVictims(slots, layers), E: records / layers, layerWave: make([]uint64, layers)}
	for i := range t.slotOf {
		t.slotOf[i] = -1
	}
	for i := range t.owner {
		t.owner[i] = -1
	}
	return t
}

// step starts a layer step of layer, of tokens rows, and its first wave;
// the caller then counts the step's uses (use).
func (t *slotTable) step(layer, tokens int) {
	t.clock++
	t.ev.Tick(t.clock, layer, tokens)
	t.next()
}

// next starts a new wave: the slots the last one held are evictable again.
func (t *slotTable) next() {
	t.now++
	for _, l := range t.waveLayers {
		t.vs.Touch(l)
	}
	t.waveLayers = t.waveLayers[:0]
}

// hold marks slot s used by this wave.
func (t *slotTable) hold(s int, recent bool) {
	t.used[s], t.last[s] = t.now, t.stamp(recent)
	if l := int(t.owner[s]) / t.E; t.owner[s] >= 0 && t.layerWave[l] != t.now {
		t.layerWave[l] = t.now
		t.waveLayers = append(t.waveLayers, l)
		t.vs.Touch(l)
	}
}

// use counts rows uses of rec by this step (recent: see experts.Evictor).
func (t *slotTable) use(rec, rows int, recent bool) { t.ev.Use(int32(rec), rows, recent) }

// begin starts another wave of the step: slots used from here on are held
// until the next.
func (t *slotTable) begin() { t.next() }

// stamp is the step a use by this step records: old for a prefill's
// expert the pool should not keep.
func (t *slotTable) stamp(recent bool) int64 {
	if recent {
		return t.clock
	}
	return 0
}

// lookup returns rec's slot and marks it used by this wave, or -1.
func (t *slotTable) lookup(rec int, recent bool) int {
	s := t.slotOf[rec]
	if s >= 0 {
		t.hold(int(s), recent)
	}
	return int(s)
}

// victims appends the n slots that n misses of this wave replace, in
// order: the free ones from the lowest, then those the policy ranks
// lowest among the slots this wave does not hold (experts.Victims: ties
// to the lower base, then the lower slot). Fewer than n when the wave
// holds the rest. The table is left as it was.
func (t *slotTable) victims(out []int, n int) []int {
	base := len(out)
	for s := t.vs.NextFree(-1); s >= 0 && len(out)-base < n; s = t.vs.NextFree(s) {
		if t.used[s] != t.now {
			out = append(out, int(s))
		}
	}
	// Each slot chosen is held while the next is looked for, then given
	// back its wave.
	t.prev = t.prev[:0]
	for len(out)-base < n {
		s := t.vs.Evict(t.ev, t.evictable)
		if s < 0 {
			break
		}
		out = append(out, int(s))
		t.prev = append(t.prev, t.used[s])
		t.used[s] = t.now
		t.vs.Touch(int(t.owner[s]) / t.E)
	}
	for i, s := range out[len(out)-len(t.prev):] {
		t.used[s] = t.prev[i]
		t.vs.Touch(int(t.owner[s]) / t.E)
	}
	return out
}

// evictable is what victims asks of slot s.
func (t *slotTable) evictable(s int32) (rec int32, last int64, ok bool) {
	return t.owner[s], t.last[s], t.used[s] != t.now
}

// forget frees every slot (poolFail).
func (t *slotTable) forget() {
	for i := range t.slotOf {
		t.slotOf[i] = -1
	}
	for i := range t.owner {
		t.owner[i], t.pre[i] = -1, false
	}
	t.vs = experts.NewVictims(len(t.owner), len(t.layerWave))
	t.waveLayers = t.waveLayers[:0]
}

// assign gives rec slot s (from victims), held by this wave.
func (t *slotTable) assign(rec, s int, recent bool) {
	if o := t.owner[s]; o >= 0 {
		t.slotOf[o] = -1
		t.vs.Drop(int32(s), int(o)/t.E)
	}
	t.owner[s], t.slotOf[rec] = int32(rec), int32(s)
	t.vs.Take(int32(s), rec/t.E)
	t.hold(s, recent)
	t.pre[s] = false
}

// storeLayout is a record's matrices at the store's offsets, and the
// stride: a slot holds a record exactly as experts.bin does (each part
// 64-byte aligned, which the products' 16-byte loads need).
func storeLayout(m *model.Model) (lay [3]matOffsets, stride int, err error) {
	return layoutOf(&m.Manifest.Stores[0])
}

// layoutOf is storeLayout for one store's record layout.
func layoutOf(st *format.ExpertStore) (lay [3]matOffsets, stride int, err error) {
	for i, t := range []*format.Tensor{&st.Gate, &st.Up, &st.Down} {
		if len(t.Shape) != 2 {
			return lay, 0, fmt.Errorf("expert store: a matrix of shape %v", t.Shape)
		}
		for _, off := range []int64{t.Offset, t.ScaleOffset, t.BiasOffset} {
			if off%16 != 0 {
				return lay, 0, fmt.Errorf("expert store: a part at offset %d, not 16-byte aligned", off)
			}
		}
		lay[i] = matOffsets{m: mat{kind: t.Kind, rows: t.Shape[0], cols: t.Shape[1]},
			q: int(t.Offset), s: int(t.ScaleOffset), b: int(t.BiasOffset), p: int(t.Offset)}
	}
	// gpt-oss's experts carry a bias per product, after the matrices.
	for i, b := range []*format.Tensor{st.GateBias, st.UpBias, st.DownBias} {
		if b == nil {
			continue
		}
		if b.Offset <= 0 || b.Offset%16 != 0 || len(b.Shape) != 1 || b.Shape[0] != lay[i].m.rows {
			return lay, 0, fmt.Errorf("expert store: a bias of shape %v at offset %d", b.Shape, b.Offset)
		}
		lay[i].bias = int(b.Offset)
	}
	return lay, int(st.Stride), nil
}

// newPool allocates slots records of rec bytes, the staging, the copy
// stream and its events, and page-locks the host store when the provider
// holds one whole.
func (r *Runner) newPool(slots int, lay [3]matOffsets, rec int, policy experts.Policy) error {
	nl := r.xl // the MTP layer's experts share the pool
	ev, err := experts.NewEvictor(policy, nl, r.E)
	if err != nil {
		return err
	}
	p := &vpool{prov: r.M.Experts, slots: slots, rec: rec, lay: lay, wave: min(slots, max(r.K, 16)),
		share: max(slots/nl, 1), tab: newSlotTable(nl*r.E, slots, ev)}
	if p.prov == nil {
		return fmt.Errorf("expert pool: the model has no host provider of experts")
	}
	r.pool = p // Close frees what is allocated below, whatever fails
	if p.buf, err = r.Dev.Alloc(slots * rec); err != nil {
		return fmt.Errorf("expert pool of %d records (%.2f GiB): %w", slots, gib(int64(slots)*int64(rec)), err)
	}
	r.weights = append(r.weights, p.buf)
	if p.cs, err = r.Dev.NewStream(); err != nil {
		return err
	}
	if p.computed, err = r.Dev.NewEvent(); err != nil {
		return err
	}
	if p.got, err = r.Dev.NewEvent(); err != nil {
		return err
	}
	if p.pre, err = r.Dev.NewEvent(); err != nil {
		return err
	}
	p.isMiss, p.isCPU, p.cpuMiss = make([]bool, p.wave), make([]bool, p.wave), make([]bool, p.wave)
	p.isLow, p.isCut = make([]bool, slots), make([]bool, p.wave)
	p.look = experts.NewLookGate(nl, r.K, lookMinCopy)
	if err := p.waits.alloc(r.Dev); err != nil {
		return err
	}
	h, whole := p.prov.(interface{ Bytes() []byte })
	hp, streams := p.prov.(hostPool)
	if streams {
		p.cutWeak = hp.Options().CutWeak
	}
	if bits := lowBits(p.prov); bits != 0 {
		if p.low, err = r.lowLayout(bits, lay, rec); err != nil {
			return err
		}
	}
	var b []byte
	switch {
	case whole && hostTiled(p.prov), streams && (hp.Options().Tile || r.M.Manifest.Stores[0].Tiled()):
		// Its records are not in the slots' layout (tiled as they land,
		// or as the store holds them): each miss is untiled through the
		// staging, and locking gains nothing.
		p.stats.PinNote = "the host's records are tiled for the CPU's decode kernel"
	case os.Getenv("SLUICE_GPU_STAGE") == "1":
		// For comparisons and tests of the staging path.
		p.stats.PinNote = "SLUICE_GPU_STAGE=1 asks for staging"
	case whole:
		b = h.Bytes()
	case streams:
		b, p.recycled = hp.Memory(), true
	default:
		p.stats.PinNote = "the host's provider of experts exposes no memory to lock"
	}
	if len(b) > 0 {
		// Page-locking fails where the locked-memory limit is low (ulimit
		// -l) or the memory is a mapping of a file the system will not
		// lock; the copies then go through the staging.
		if err := r.Dev.Register(uintptr(unsafe.Pointer(&b[0])), len(b)); err == nil {
			p.host = b
			p.stats.HostPinned = true
		} else {
			p.recycled = false
			p.stats.PinNote = fmt.Sprintf("the host's experts (%.2f GiB) could not be page-locked (%v; see ulimit -l)", gib(int64(len(b))), err)
		}
	}
	if p.host == nil {
		// Every miss goes through the staging.
		if p.stage, err = r.Dev.AllocHost(p.wave * rec); err != nil {
			return fmt.Errorf("expert pool staging (%d records, %.2f GiB pinned): %w", p.wave, gib(int64(p.wave)*int64(rec)), err)
		}
	}
	return nil
}

// lowBits is the bits of the low-bit records the host provider gives for
// its misses (--miss-bits), or 0 when it gives the store's own.
func lowBits(prov model.Provider) int {
	if hp, ok := prov.(hostPool); ok {
		return hp.Options().MissBits
	}
	return 0
}

// lowLayout is the layout of the low-bit store of bits beside a pool of
// records laid out as lay, rec bytes each. The low-bit kernels give q4's
// bits on the widened record, so the store must be q4: then which
// experts arrived at low bits is all that --miss-bits changes.
func (r *Runner) lowLayout(bits int, lay [3]matOffsets, rec int) (*lowRecords, error) {
	for _, o := range lay {
		if o.m.kind != format.Q4 {
			return nil, fmt.Errorf("--miss-bits on the GPU needs a q4 expert store (this one is %s)", o.m.kind)
		}
	}
	st, err := experts.LowStore(r.M.Manifest, bits)
	if err != nil {
		return nil, err
	}
	llay, lrec, err := layoutOf(st)
	if err != nil {
		return nil, err
	}
	if lrec > rec {
		return nil, fmt.Errorf("--miss-bits %d: low-bit records of %d bytes do not fit slots of %d", bits, lrec, rec)
	}
	return &lowRecords{llay, lrec}, nil
}

// recordOf is the layout and size of host expert ex's record, and whether
// it is a low-bit one.
func (p *vpool) recordOf(ex *model.Expert) (lay [3]matOffsets, n int, low bool, err error) {
	switch k := ex.Gate.Kind; {
	case k == p.lay[0].m.kind:
		return p.lay, p.rec, false, nil
	case p.low != nil && k == p.low.lay[0].m.kind:
		return p.low.lay, p.low.rec, true, nil
	default:
		return lay, 0, false, fmt.Errorf("a host record of kind %s in a pool of %s records", k, p.lay[0].m.kind)
	}
}

// hostPool is what the pool uses of a provider that streams records
// through host memory of its own (experts.Stream): that memory, to
// page-lock and copy from; the records it holds now, for the lookahead;
// whether they are tiled.
type hostPool interface {
	Memory() []byte
	Cached(layer, e int) *model.Expert
	Options() experts.Options
}

// settle waits for the copies queued from the host's streaming pool
// before the provider is called again, since the call may read other
// records into their slots. False when the copy stream failed (the step
// fails).
func (r *Runner) settle() bool {
	p := r.pool
	if !p.pending {
		return true
	}
	p.pending = false
	if err := r.Dev.SyncStream(p.cs); err != nil {
		r.poolFail(err)
		return false
	}
	return true
}

// hostTiled reports whether a provider holding the store whole keeps its
// records tiled (kernels.TiledQ4), from its first record.
func hostTiled(prov model.Provider) bool {
	if prov.Begin(0, []int{0}, model.Hint{}) != nil {
		return false
	}
	_, ex, err := prov.Next()
	return err == nil && ex != nil && (ex.Gate.Tiled || ex.Up.Tiled || ex.Down.Tiled)
}

// closePool unregisters the host store and frees the staging, the copy
// stream and its events (the slots are among r.weights).
func (r *Runner) closePool() {
	p := r.pool
	if p == nil {
		return
	}
	if p.host != nil {
		if p.cs != (cuda.Stream{}) {
			r.Dev.SyncStream(p.cs) // no copy may read the memory once unlocked
		}
		r.Dev.Unregister(uintptr(unsafe.Pointer(&p.host[0])))
		p.host = nil
	}
	r.Dev.FreeHost(p.stage)
	p.stage = cuda.Host{}
	p.buf = cuda.Buf{} // freed among r.weights
	if p.cs != (cuda.Stream{}) {
		r.Dev.DestroyStream(p.cs)
		p.cs = cuda.Stream{}
	}
	for _, e := range []*cuda.Event{&p.computed, &p.got, &p.pre} {
		if *e != (cuda.Event{}) {
			r.Dev.DestroyEvent(*e)
			*e = cuda.Event{}
		}
	}
	for _, e := range p.waits.ev {
		if e != (cuda.Event{}) {
			r.Dev.DestroyEvent(e)
		}
	}
	p.waits = copyWaits{}
}

// slotExpert is the expert in slot s.
func (p *vpool) slotExpert(s int) expert {
	base := p.buf.Ptr + uintptr(s*p.rec)
	lay := &p.lay
	if p.isLow[s] {
		lay = &p.low.lay
	}
	return expert{lay[0].at(base), lay[1].at(base), lay[2].at(base)}
}

// pooledExperts multiplies the n grouped rows in gin by their experts
// (r.grp.Distinct, r.base, r.grp.Rows, as Experts grouped them), a wave of at
// most p.wave experts at a time: each wave resolves its experts to slots,
// copies its misses in, and computes its rows' gate, up, SwiGLU and down.
// A wave's rows are consecutive in gin, so each wave prepares and
// multiplies exactly the rows one pass over all of them would, and the
// products are batch-invariant: the outputs are the resident path's bits.
func (r *Runner) pooledExperts(m *block.MoE) {
	layer := m.Layer
	p := r.pool
	if r.err != nil {
		return // the step failed: queue no copies that nothing would wait for
	}
	H, I := r.H, r.I
	kind := p.lay[0].m.kind
	decode := r.nb == 1
	// A prefill keeps only the layer's most used experts recent (its
	// share of the slots), as the host's pool does, so that a long prompt
	// does not flush what decoding will ask for.
	thresh := 0
	if !decode {
		thresh = r.keepRows()
	}
	if decode {
		p.look.Score(layer, func(e int) bool { return slices.Contains(r.grp.Distinct, e) })
	}
	p.tab.step(layer, r.nb)
	for di, e := range r.grp.Distinct {
		p.tab.use(layer*r.E+e, r.grp.Rows[di], r.grp.Rows[di] >= thresh)
	}
	for w0 := 0; w0 < len(r.grp.Distinct); w0 += p.wave {
		w1 := min(w0+p.wave, len(r.grp.Distinct))
		if p.staged {
			// The last wave's staging may still be copying.
			r.poolCheck(r.Dev.SyncStream(p.cs))
			p.staged = false
		}
		if w0 > 0 {
			p.tab.begin()
		}
		r.mark("pool_host") // the device idles while the host resolves slots
		r.hyb.n, r.hyb.done = 0, 0
		slots, misses := r.waveSlots(layer, w0, w1, decode, thresh)
		if r.err != nil {
			return
		}
		b0 := r.grp.Base[w0]
		b1 := r.grp.Base[w1-1] + r.grp.Rows[w1-1]
		a := r.prepare(r.gin+uintptr(4*b0*H), b1-b0, H, kind)
		// The hits first, while the misses copy; then the misses, once
		// their copies are done.
		if p.prePending {
			// Some hits may be the lookahead's records.
			r.poolCheck(r.Dev.StreamWait(r.s, p.pre))
			p.prePending = false
		}
		r.mark("pool_hits")
		for pass := range 2 {
			if pass == 1 {
				if misses == 0 {
					break
				}
				r.mark("pool_copy_wait")
				r.poolCheck(r.waitTimed(decode, func() error { return r.Dev.StreamWait(r.s, p.got) }))
				r.mark("pool_misses")
			}
			for di := w0; di < w1; di++ {
				if p.isMiss[di-w0] != (pass == 1) || p.isCPU[di-w0] || p.isCut[di-w0] {
					continue
				}
				ex := p.slotExpert(slots[di-w0])
				b, rows := r.grp.Base[di], r.grp.Rows[di]
				r.mulPrepared(r.g+uintptr(4*b*I), ex.gate, a, b-b0, rows)
				r.mulPrepared(r.u+uintptr(4*b*I), ex.up, a, b-b0, rows)
			}
		}
		r.mark("pool_down")
		r.act(m, r.g+uintptr(4*b0*I), r.g+uintptr(4*b0*I), r.u+uintptr(4*b0*I), (b1-b0)*I)
		a = r.prepare(r.g+uintptr(4*b0*I), b1-b0, I, kind)
		for di := w0; di < w1; di++ {
			b, rows := r.grp.Base[di], r.grp.Rows[di]
			switch {
			case p.isCPU[di-w0]:
			case p.isCut[di-w0]:
				// The combine weighs its rows: zeros add nothing.
				r.check(r.Dev.Fill32Async(r.outk+uintptr(4*b*H), 0, rows*H, r.s))
			default:
				r.mulPrepared(r.outk+uintptr(4*b*H), p.slotExpert(slots[di-w0]).down, a, b-b0, rows)
			}
		}
		r.uploadCPUOutputs()
	}
}

// waveSlots resolves the experts r.grp.Distinct[w0:w1] of layer to slots
// (into r.waveSlot, p.isMiss), and queues the misses' copies on the copy
// stream after the products queued so far, then an event after them. It
// returns the slots and the number of misses.
func (r *Runner) waveSlots(layer, w0, w1 int, decode bool, thresh int) ([]int, int) {
	p := r.pool
	ids := r.grp.Distinct[w0:w1]
	slots := r.waveSlot[:len(ids)]
	p.missIDs, p.missAt, p.missRows, p.missW = p.missIDs[:0], p.missAt[:0], p.missRows[:0], p.missW[:0]
	// Copies into this wave's victims, and the lookahead's after it, wait
	// for every product queued so far: some read the records of the slots
	// they take.
	r.poolCheck(r.Dev.Record(p.computed, r.s))
	for i, e := range ids {
		slots[i] = p.tab.lookup(layer*r.E+e, r.grp.Rows[w0+i] >= thresh)
		p.isMiss[i], p.isCPU[i], p.isCut[i] = slots[i] < 0, false, false
		if s := slots[i]; s >= 0 && p.tab.pre[s] {
			p.tab.pre[s] = false
			p.stats.PrefetchUsed++
		}
		if slots[i] < 0 {
			p.missIDs = append(p.missIDs, e)
			p.missAt = append(p.missAt, i)
			p.missRows = append(p.missRows, r.grp.Rows[w0+i])
			if p.cutWeak > 0 {
				w := float32(0)
				for _, rk := range r.grp.Members(e) {
					w = max(w, r.pw[rk])
				}
				p.missW = append(p.missW, w)
			}
		}
	}
	countUses(&p.stats, decode, len(ids)-len(p.missIDs), len(p.missIDs))
	if len(p.missIDs) == 0 || !r.settle() {
		return slots, 0
	}
	// The last misses asked for go to the host's CPU, when it computes
	// some; the rest are copied.
	ncpu := r.cpuMisses(decode, len(p.missIDs))
	for j := range p.missIDs {
		p.cpuMiss[j] = j >= len(p.missIDs)-ncpu
	}
	ngpu := len(p.missIDs) - ncpu
	hint := model.Hint{Rows: p.missRows}
	if p.cutWeak > 0 {
		hint.MaxWeight = p.missW
	}
	if err := p.prov.Begin(layer, p.missIDs, hint); err != nil {
		r.poolFail(fmt.Errorf("expert pool: layer %d: %w", layer, err))
		return slots, 0
	}
	if err := r.Dev.StreamWait(p.cs, p.computed); err != nil {
		r.poolFail(err)
		return slots, 0
	}
	r.hyb.resetCopies()
	up0 := p.stats.BytesUp
	p.victims = p.tab.victims(p.victims[:0], ngpu)
	if len(p.victims) < ngpu {
		r.poolFail(fmt.Errorf("expert pool: no free slot among %d for a wave of %d", p.slots, len(ids)))
		return slots, 0
	}
	// The provider's experts come in batches: all it holds at once
	// (model.ReadyProvider), else one at a time as they are read.
	rp, batches := p.prov.(model.ReadyProvider)
	v := 0 // victims given so far
	for k := 0; k < len(p.missIDs); {
		if p.recycled && r.hyb.n > r.hyb.done {
			// The call may recycle the CPU's records: they are
			// multiplied first, while the copies queued so far run.
			// (The copy stream may then idle: its time is not the
			// link's.)
			r.hyb.copyArmed = false
			r.flushCPU()
		}
		if !r.settle() {
			return slots, 0
		}
		var err error
		p.pos, p.exs = p.pos[:0], p.exs[:0]
		if batches {
			p.pos, p.exs, err = rp.Ready(p.pos, p.exs)
		}
		if err == nil && len(p.pos) == 0 {
			if v > 0 {
				// The copy stream idles while the host reads: its time
				// is not the link's.
				r.hyb.copyArmed = false
			}
			var j int
			var ex *model.Expert
			j, ex, err = p.prov.Next()
			p.pos, p.exs = append(p.pos, j), append(p.exs, ex)
		}
		for n := 0; err == nil && n < len(p.pos); n++ {
			if k == len(p.missIDs) {
				err = fmt.Errorf("the host provider returned more experts than the %d asked", k)
				break
			}
			switch j := p.pos[n]; {
			case j >= 0 && j < len(p.missIDs) && p.exs[n] == nil && p.cutWeak > 0:
				p.isCut[p.missAt[j]] = true // late and weak: the host dropped it
			case j >= 0 && j < len(p.missIDs) && p.cpuMiss[j]:
				err = r.takeMiss(w0, j, p.exs[n])
			case v == len(p.victims):
				err = fmt.Errorf("the host provider returned more experts to copy than the %d asked", ngpu)
			default:
				if v == 0 {
					r.timeCopies(decode)
				}
				err = r.copyMiss(layer, j, p.exs[n], p.victims[v], decode, thresh)
				v++
			}
			k++
		}
		if err != nil {
			r.poolFail(fmt.Errorf("expert pool: layer %d: %w", layer, err))
			return slots, 0
		}
	}
	if p.staged {
		r.hyb.copyArmed = false // the stream idled while the host staged
	}
	r.copiesTimed(p.stats.BytesUp-up0, v)
	if err := r.Dev.Record(p.got, p.cs); err != nil {
		r.poolFail(err)
		return slots, 0
	}
	return slots, ngpu
}

// copyMiss gives the wave's miss j (p.missIDs[j]), whose host expert is
// ex, slot s, and queues its copy there on the copy stream: straight from
// page-locked memory when ex lies there, else through the staging.
func (r *Runner) copyMiss(layer, j int, ex *model.Expert, s int, decode bool, thresh int) error {
	p := r.pool
	if j < 0 || j >= len(p.missIDs) {
		return fmt.Errorf("the host provider returned position %d of %d", j, len(p.missIDs))
	}
	if ex == nil {
		return fmt.Errorf("the host provider cut expert %d, and --cut-weak is off", p.missIDs[j])
	}
	lay, n, low, err := p.recordOf(ex)
	if err != nil {
		return err
	}
	p.tab.assign(layer*r.E+p.missIDs[j], s, p.missRows[j] >= thresh)
	p.isLow[s] = low
	r.waveSlot[p.missAt[j]] = s
	dst := p.buf.Ptr + uintptr(s*p.rec)
	if src, ok := p.hostRecord(ex, n); ok {
		err = r.Dev.UploadFromAsync(dst, src, n, p.cs)
		p.pending = p.pending || p.recycled
	} else if p.stage == (cuda.Host{}) {
		err = fmt.Errorf("expert %d's record is outside the page-locked host memory and there is no staging", p.missIDs[j])
	} else if err = fillRecord(p.stage.Slice()[j*p.rec:j*p.rec+n], lay, ex); err == nil {
		err = r.Dev.UploadAsync(dst, p.stage, j*p.rec, n, p.cs)
		p.staged = true
	}
	if err == nil {
		countCopy(&p.stats, decode, uint64(n), low)
	}
	return err
}

// poolFail fails the step with err and forgets every slot's record: a
// slot may have been given to a record whose copy was never queued, or
// whose copy nothing waits for, and no later step may read it as that
// record. (A later step's copies queue behind any still in flight, and
// its products wait for its own.)
func (r *Runner) poolFail(err error) {
	r.check(err)
	r.pool.tab.forget()
}

// poolCheck is poolFail for a failed stream or event call, else nothing.
func (r *Runner) poolCheck(err error) {
	if err != nil {
		r.poolFail(err)
	}
}

// lookahead queues, in a decode step of a pool whose host memory is
// page-locked, the next MoE layer's router on this layer's input and its
// top-k choice (into ids2), and returns that layer; -1 for none.
func (r *Runner) lookahead(m *block.MoE) int {
	p := r.pool
	if p == nil || p.host == nil || p.noLookahead || r.nb != 1 || m.Layer+1 >= len(r.M.Arch.Layers) {
		return -1
	}
	nm := r.M.Arch.Layers[m.Layer+1].MoE()
	if nm == nil {
		return -1
	}
	r.mark("pool_lookahead")
	r.mul(r.rl2, r.wmat(&nm.Router), r.h, 1, r.H)
	r.bias(r.rl2, nm.RouterBias)
	r.route(nm, r.rl2, r.ids2, r.w2, 1)
	return m.Layer + 1
}

// prefetch copies the experts lookahead predicted for layer that are not
// in a slot and lie in page-locked host memory (the store, or records the
// host's streaming pool holds now) into the slots the policy gives up
// (never one this step holds), behind this step's copies on the copy
// stream: they land while the rest of this layer and the next one's
// attention compute. The next layer's products wait for them (pre). The
// predictions the streaming pool does not hold go to its own lookahead,
// which reads them from disk meanwhile (model.Prefetcher).
func (r *Runner) prefetch(layer int) {
	p := r.pool
	if r.err != nil {
		return
	}
	p.predIDs = p.predIDs[:0]
	for _, id := range r.pids2[:r.K] {
		e := int(id)
		if e < 0 || e >= r.E {
			return // the next layer's own routing reports a bad id
		}
		if p.tab.slotOf[layer*r.E+e] >= 0 || slices.Contains(p.predIDs, e) {
			e = -1
		}
		p.predIDs = append(p.predIDs, e)
	}
	p.preIDs = append(p.preIDs[:0], p.look.Predict(layer, p.predIDs, func(int) bool { return true })...)
	if p.look.WouldFetch() == 0 {
		return
	}
	p.stats.PrefetchSkipped += uint64(p.look.WouldFetch() - len(p.preIDs))
	gated := len(p.preIDs) == 0
	var ids []int
	var exs []*model.Expert
	if hp, ok := p.prov.(hostPool); ok && p.recycled {
		// The host's own lookahead still hears of the predictions; it
		// gates its reads itself.
		if !r.hostLookahead(hp, layer) || gated {
			return
		}
		ids, exs = r.cachedPredictions(hp, layer)
	} else if !gated {
		p.victims = p.tab.victims(p.victims[:0], len(p.preIDs))
		ids = p.preIDs[:len(p.victims)]
		if len(ids) > 0 {
			if err := p.prov.Begin(layer, ids, model.Hint{}); err != nil {
				r.poolFail(fmt.Errorf("expert pool: lookahead for layer %d: %w", layer, err))
				return
			}
		}
		exs = p.exs[:0]
		for range ids {
			exs = append(exs, nil)
		}
		for range ids {
			j, ex, err := p.prov.Next()
			if err == nil && (j < 0 || j >= len(ids) || ex == nil) {
				err = fmt.Errorf("the host provider returned position %d of %d, expert %v", j, len(ids), ex != nil)
			}
			if err != nil {
				r.poolFail(fmt.Errorf("expert pool: lookahead for layer %d: %w", layer, err))
				return
			}
			exs[j] = ex
		}
		p.exs = exs
	}
	if gated || len(ids) == 0 {
		return
	}
	r.poolCheck(r.Dev.StreamWait(p.cs, p.computed))
	copied := 0
	for k, ex := range exs {
		_, n, low, err := p.recordOf(ex)
		if err != nil {
			r.poolFail(fmt.Errorf("expert pool: lookahead for layer %d: %w", layer, err))
			return
		}
		src, ok := p.hostRecord(ex, n)
		if !ok {
			continue // not in locked memory: the step will copy it if asked
		}
		s := p.victims[k]
		p.tab.assign(layer*r.E+ids[k], s, true)
		p.tab.pre[s], p.isLow[s] = true, low
		if err := r.Dev.UploadFromAsync(p.buf.Ptr+uintptr(s*p.rec), src, n, p.cs); err != nil {
			r.poolFail(err)
			return
		}
		p.pending = p.pending || p.recycled
		p.stats.Prefetched++
		countCopy(&p.stats, true, uint64(n), low)
		copied++
	}
	if copied == 0 {
		return
	}
	if err := r.Dev.Record(p.pre, p.cs); err != nil {
		r.poolFail(err)
		return
	}
	p.prePending = true
}

// hostLookahead passes the lookahead's predictions for layer that the
// host's streaming pool does not hold to its own lookahead, to be read
// from disk. Its lookahead may evict records this step's copies read
// from, so those copies are waited for first. False when the copy stream
// failed (the step fails).
func (r *Runner) hostLookahead(hp hostPool, layer int) bool {
	p := r.pool
	pf, ok := p.prov.(model.Prefetcher)
	if !ok || !pf.Lookahead() {
		return true
	}
	p.missIDs = p.missIDs[:0] // the step is done with them
	reads := 0
	for _, e := range p.predIDs {
		if e >= 0 && hp.Cached(layer, e) != nil {
			e = -1
		}
		if e >= 0 {
			reads++
		}
		p.missIDs = append(p.missIDs, e) // in rank order, for the host's gate
	}
	if reads > 0 {
		if !r.settle() {
			return false
		}
		pf.Prefetch(layer, p.missIDs)
	}
	return true
}

// cachedPredictions returns the lookahead's predictions for layer that the
// host's streaming pool holds (at most the slots the policy can give up,
// in p.victims) with their experts, looked up after the pool's last
// change (hostLookahead).
func (r *Runner) cachedPredictions(hp hostPool, layer int) ([]int, []*model.Expert) {
	p := r.pool
	ids, exs := p.missIDs[:0], p.exs[:0]
	for _, e := range p.preIDs {
		if ex := hp.Cached(layer, e); ex != nil {
			ids, exs = append(ids, e), append(exs, ex)
		}
	}
	p.victims = p.tab.victims(p.victims[:0], len(ids))
	return ids[:len(p.victims)], exs[:len(p.victims)]
}

// hostRecord is the address of ex's record, n bytes, in the page-locked
// host store, when it lies there whole and row-major.
func (p *vpool) hostRecord(ex *model.Expert, n int) (uintptr, bool) {
	if p.host == nil || len(ex.Record) < n || ex.Gate.Tiled || ex.Up.Tiled || ex.Down.Tiled {
		return 0, false
	}
	lo := uintptr(unsafe.Pointer(&p.host[0]))
	a := uintptr(unsafe.Pointer(&ex.Record[0]))
	if a < lo || a+uintptr(n) > lo+uintptr(len(p.host)) {
		return 0, false
	}
	return a, true
}

// keepRows is the row count a prefill's expert needs to stay recent in the
// pool: that of the layer's share of experts with the most rows.
func (r *Runner) keepRows() int {
	return experts.ShareThreshold(r.grp.Rows[:len(r.grp.Distinct)], r.pool.share)
}

// fillRecord copies an expert's matrices and their biases from the host
// views into dst at the slot layout lay, rows in order (a tiled host
// matrix is untiled).
func fillRecord(dst []byte, lay [3]matOffsets, ex *model.Expert) error {
	mats := [3]*kernels.Mat{&ex.Gate, &ex.Up, &ex.Down}
	biases := [3][]float32{ex.GateBias, ex.UpBias, ex.DownBias}
	for i, km := range mats {
		if o := lay[i].m; km.Kind != o.kind || km.Rows != o.rows || km.Cols != o.cols {
			return fmt.Errorf("expert pool: a host record's matrix [%d %d] %v differs from the slot's [%d %d] %v",
				km.Rows, km.Cols, km.Kind, o.rows, o.cols, o.kind)
		}
		if b := biases[i]; (lay[i].bias > 0) != (b != nil) || b != nil && len(b) != km.Rows {
			return fmt.Errorf("expert pool: a host record's bias of %d values where the slot's matrix has %d rows (bias %v)",
				len(b), km.Rows, lay[i].bias > 0)
		}
	}
	if len(ex.Record) >= len(dst) && !ex.Gate.Tiled && !ex.Up.Tiled && !ex.Down.Tiled {
		copy(dst, ex.Record) // the store's layout is the slot's
		return nil
	}
	for i, km := range mats {
		o := lay[i]
		switch km.Kind {
		case format.Q4, format.Q8, format.Q3, format.Q2:
			km.FlatQInto(dst[o.q : o.q+len(km.Q)])
			copy(dst[o.s:], bytesOf(km.Scales))
			copy(dst[o.b:], bytesOf(km.Biases))
		case format.BF16:
			copy(dst[o.p:], bytesOf(km.BF16))
		default:
			copy(dst[o.p:], bytesOf(km.F32))
		}
		if o.bias > 0 {
			copy(dst[o.bias:], bytesOf(biases[i]))
		}
	}
	return nil
}
