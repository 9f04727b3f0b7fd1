package model

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/platform"
)

// Expert is one routed expert's weights, ready to compute.
type Expert struct {
	Gate, Up kernels.Mat // [moe_inter][hidden]
	Down     kernels.Mat // [hidden][moe_inter]
	// Biases after each projection, nil when the family has none.
	GateBias, UpBias, DownBias []float32
	// Record is the record the views are of, its bytes as the store lays
	// them out (row-major, except the matrices marked Tiled): a consumer
	// that keeps records in that layout (the GPU's expert pool) copies it
	// whole.
	Record []byte
}

// Provider gives the forward pass the routed experts of one layer. The
// forward calls Begin with the distinct experts a step needs, then Next
// until every one was returned: a streaming provider returns resident
// experts first and misses as they land, so compute overlaps the reads. An
// Expert is valid until the next call of Next or Begin, so a provider may
// recycle its memory once the forward moved on.
type Provider interface {
	// Begin starts a layer's step. hint says what the router decided about
	// each of ids; providers that keep no policy ignore it.
	Begin(layer int, ids []int, hint Hint) error
	// Next returns the position in ids of the next ready expert. A nil
	// Expert with a nil error means the provider cut that expert (a lossy,
	// opt-in deadline policy): the forward counts its output as zero.
	Next() (i int, e *Expert, err error)
	Close() error
}

// ReadyProvider is implemented by providers that can hand out several
// experts at once, so that the forward computes them on different threads
// in one dispatch, as it does resident experts, instead of one expert at a
// time, its products split across the threads (three hand-offs an expert)
// or, too small to split, on one thread alone.
type ReadyProvider interface {
	Provider
	// Ready appends to pos and ex, without waiting, every expert of the
	// step that is in memory and not yet returned (none when all that
	// are left are still being read: Next waits for one). They stay
	// valid until the next call of Ready, Next or Begin. A read of the
	// step that failed is an error, as from Next.
	Ready(pos []int, ex []*Expert) ([]int, []*Expert, error)
}

// Hint is what the router decided about each expert of a step, in the
// order of Begin's ids. The slices belong to the caller and are valid until
// the next Begin.
type Hint struct {
	MaxWeight []float32 // [len(ids)] largest routing weight over the rows
	Rows      []int     // [len(ids)] number of rows routed to the expert
}

// Prefetcher is implemented by providers that read ahead. Once a layer's
// step has begun, the forward predicts the next layer's experts (that
// layer's router applied to the current hidden state) and passes them to
// Prefetch, which must not block and must not evict what the current step
// needs. A decode's ids come in the router's order, best first; a negative
// id keeps a rank's place for an expert the caller needs no read for (a
// GPU pool holds it).
type Prefetcher interface {
	Lookahead() bool // whether predictions are wanted at all
	Prefetch(layer int, ids []int)
}

// DeepPrefetcher is a Prefetcher that also reads further ahead: after the
// next layer's prediction, the forward predicts each layer up to
// LookDepth layers on (that layer's router applied to the current hidden
// state, as for the next) and passes it to PrefetchAhead with its
// distance, nearest first, under the same rules as Prefetch.
type DeepPrefetcher interface {
	LookDepth() int
	PrefetchAhead(layer, depth int, ids []int)
}

// LookWeigher is a Prefetcher that weighs whether predictions pay at
// all: the forward asks Predicting before each one, with the step's row
// count, and skips it on false (the step runs without predictions).
type LookWeigher interface {
	Predicting(rows int) bool
}

// ExpertFromRecord builds the views of one record laid out as st says.
func ExpertFromRecord(rec []byte, st *format.ExpertStore) (Expert, error) {
	var e Expert
	var err error
	if e.Gate, err = kernels.MatFrom(rec, &st.Gate); err != nil {
		return e, err
	}
	if e.Up, err = kernels.MatFrom(rec, &st.Up); err != nil {
		return e, err
	}
	if e.Down, err = kernels.MatFrom(rec, &st.Down); err != nil {
		return e, err
	}
	for _, b := range []struct {
		t   *format.Tensor
		dst *[]float32
	}{{st.GateBias, &e.GateBias}, {st.UpBias, &e.UpBias}, {st.DownBias, &e.DownBias}} {
		if b.t == nil {
			continue
		}
		m, err := kernels.MatFrom(rec, b.t)
		if err != nil {
			return e, err
		}
		*b.dst = m.F32
	}
	e.Record = rec
	return e, nil
}

// Resident serves every expert from experts.bin mapped whole: the right
// provider when the model fits in memory, and the reference the streaming
// pool is tested against.
type Resident struct {
	data    []byte
	experts []Expert // [layer*E + e]
	E       int
	ids     []int
	layer   int
	next    int
}

// StableExperts reports that every Expert stays valid for the whole step.
func (r *Resident) StableExperts() bool { return true }

// Bytes is the whole store, in which every Expert's Record lies: the GPU
// page-locks it once so that its copies to the device need no staging.
func (r *Resident) Bytes() []byte { return r.data }

// NewResidentProvider maps the packed model's expert store whole, for a
// reader that passes over it once (the GPU backend's upload).
func NewResidentProvider(m *Model) (*Resident, error) {
	st := &m.Manifest.Stores[0]
	data, err := platform.MapFile(filepath.Join(m.Dir, st.File))
	if err != nil {
		return nil, fmt.Errorf("packed model %s: %v", m.Dir, err)
	}
	return newResident(m, data)
}

// OpenResident holds the expert store whole for the CPU to compute from:
// read into memory by loadWeights, with cancellation, and progress on w
// (nil: silent) while a store of a GiB or more is read.
func OpenResident(ctx context.Context, m *Model, w io.Writer) (*Resident, error) {
	st := &m.Manifest.Stores[0]
	data, own, err := loadWeights(ctx, filepath.Join(m.Dir, st.File), w)
	if err != nil {
		return nil, fmt.Errorf("packed model %s: %w", m.Dir, err)
	}
	r, err := newResident(m, data)
	if err != nil || !own {
		return r, err
	}
	// The copy is the process's own: lay it out as this CPU's decode
	// kernel reads best, whichever way the store holds it.
	switch {
	case kernels.TiledKind(st.Kind):
		err = r.each(ctx, (*Expert).tile)
	case st.Tiled():
		err = r.each(ctx, (*Expert).untile)
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// each rearranges every record in place with f (tile, untile) on as many
// threads as the process may run, a record at a time.
func (r *Resident) each(ctx context.Context, f func(*Expert, []byte) []byte) error {
	n := runtime.GOMAXPROCS(0)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var tmp []byte
			for i := int(next.Add(1) - 1); i < len(r.experts); i = int(next.Add(1) - 1) {
				if ctx.Err() != nil {
					return
				}
				tmp = f(&r.experts[i], tmp)
			}
		}()
	}
	wg.Wait()
	return ctx.Err()
}

// tile lays out the matrices of e's record as this CPU's decode kernel
// reads them, in place, and marks their views: those kernels.Tiles picks
// (q4 or MXFP4 of a whole tile of rows) tiled (kernels.Tile), and a q4
// matrix stored tiled that it does not pick (rows of an odd number of
// groups, where AMD's 512-bit decode reads rows faster) row-major again.
// tmp is scratch, returned for the next call. A record's bytes must be
// rearranged once, however many views they have.
func (e *Expert) tile(tmp []byte) []byte {
	for _, m := range []*kernels.Mat{&e.Gate, &e.Up, &e.Down} {
		if m.Tiled && !kernels.Tiles(m) {
			tmp = kernels.Untile(m, tmp)
			continue
		}
		tmp = kernels.Tile(m, tmp)
	}
	return tmp
}

// untile rearranges the matrices of e's record stored tiled back to
// row-major order (kernels.Untile) and marks their views; tmp is scratch,
// returned for the next call.
func (e *Expert) untile(tmp []byte) []byte {
	for _, m := range []*kernels.Mat{&e.Gate, &e.Up, &e.Down} {
		tmp = kernels.Untile(m, tmp)
	}
	return tmp
}

// TileRecord rearranges one expert record laid out as st says into the
// tiled layout in place (the matrices kernels.Tiles picks), for
// views that MarkTiled marked; tmp is scratch, returned for the next call.
func TileRecord(rec []byte, st *format.ExpertStore, tmp []byte) ([]byte, error) {
	e, err := ExpertFromRecord(rec, st)
	if err != nil {
		return tmp, err
	}
	return e.tile(tmp), nil
}

// MarkTiled marks e's views as views of a record that TileRecord
// rearranged: tiled exactly where kernels.Tiles says.
func (e *Expert) MarkTiled() {
	for _, m := range []*kernels.Mat{&e.Gate, &e.Up, &e.Down} {
		m.Tiled = kernels.Tiles(m)
	}
}

// newResident checks the store's size and builds the experts' views of
// data, releasing data when it cannot.
func newResident(m *Model, data []byte) (*Resident, error) {
	st := &m.Manifest.Stores[0]
	n := m.Manifest.ExpertLayers * m.Manifest.Experts
	if int64(len(data)) < int64(n)*st.Stride {
		platform.Unmap(data)
		return nil, fmt.Errorf("packed model %s: %s has %d bytes, want %d records of %d (truncated?)", m.Dir, st.File, len(data), n, st.Stride)
	}
	r := &Resident{data: data, experts: make([]Expert, n), E: m.Manifest.Experts}
	for i := range r.experts {
		rec := data[int64(i)*st.Stride : int64(i+1)*st.Stride]
		var err error
		if r.experts[i], err = ExpertFromRecord(rec, st); err != nil {
			platform.Unmap(data)
			return nil, fmt.Errorf("packed model %s: expert record %d: %v", m.Dir, i, err)
		}
	}
	return r, nil
}

// Begin implements Provider.
func (r *Resident) Begin(layer int, ids []int, _ Hint) error {
	r.layer, r.ids, r.next = layer, ids, 0
	return nil
}

// Next implements Provider.
func (r *Resident) Next() (int, *Expert, error) {
	i := r.next
	if i >= len(r.ids) {
		return -1, nil, fmt.Errorf("resident provider: Next after the last expert")
	}
	r.next++
	return i, &r.experts[r.layer*r.E+r.ids[i]], nil
}

// Close releases the store.
func (r *Resident) Close() error {
	if r.data == nil {
		return nil
	}
	err := platform.Unmap(r.data)
	r.data = nil
	return err
}
