//go:build linux

package gpu

import (
	"fmt"
	"math"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/model"
)

// Hybrid decode: a miss of the GPU's pool lies in host memory (the store,
// or the host's streaming pool) before it crosses PCIe. Multiplying it
// there, on the host's CPU, reads it at the memory's speed instead of the
// link's, while the GPU copies and multiplies the other misses. For q4
// experts the CPU's product is the GPU's bit for bit (the same int8
// activations and integer dots; SwiGLU too, internal/cuda's tests), so
// which side computed an expert does not change the logits. The layer's
// normed input row comes back with the router's choice; each CPU expert's
// output row goes up into its place among the experts' outputs before the
// combine.

// hybrid is the runner's CPU side of a decode step's misses.
type hybrid struct {
	share float64       // Config.CPUShare
	pool  *kernels.Pool // the CPU's threads; nil when no miss is computed there
	// Pinned: the layer's input row, and the wave's CPU outputs [K][hidden].
	offH, offOut int
	h, out       []float32
	g, u         []float32 // [moe_inter] scratch
	n            int       // CPU outputs of the wave so far
	rows         []int     // their rows of outk
}

// newHybrid starts the CPU's threads when misses may be computed there:
// a pool of q4 records and a share asked for.
func (r *Runner) newHybrid(cfg Config) error {
	p := r.pool
	if cfg.CPUShare == 0 || p == nil {
		return nil
	}
	for _, o := range p.lay {
		if o.m.kind != format.Q4 {
			return fmt.Errorf("the CPU computes misses of q4 experts only (these are %s): its product is then the GPU's bit for bit", o.m.kind)
		}
	}
	r.hyb.pool = kernels.NewPool(cfg.CPUThreads)
	r.hyb.g, r.hyb.u = make([]float32, r.I), make([]float32, r.I)
	r.hyb.rows = make([]int, 0, r.K)
	return nil
}

// cpuMisses is how many of a layer's n misses the CPU computes.
func (r *Runner) cpuMisses(decode bool, n int) int {
	if r.hyb.pool == nil || !decode {
		return 0
	}
	return min(n, int(math.Round(r.hyb.share*float64(n))))
}

// computeMiss multiplies the wave's miss j (wave w0), whose host record is
// ex, on the CPU into the next CPU output row, for uploadCPUOutputs.
func (r *Runner) computeMiss(w0, j int, ex *model.Expert) error {
	p, hy := r.pool, &r.hyb
	if ex == nil {
		return fmt.Errorf("the host provider cut expert %d, and --cut-weak is off", p.missIDs[j])
	}
	if hy.n == r.K || len(hy.h) == 0 {
		return fmt.Errorf("more CPU experts than a decode row has (%d)", r.K)
	}
	i := p.missAt[j]
	H := r.H
	out := hy.out[hy.n*H : (hy.n+1)*H]
	hy.pool.MatMul(hy.g, &ex.Gate, hy.h, 1)
	hy.pool.MatMul(hy.u, &ex.Up, hy.h, 1)
	kernels.SwiGLU(hy.g, hy.g, hy.u)
	hy.pool.MatMul(out, &ex.Down, hy.g, 1)
	hy.rows = append(hy.rows[:hy.n], r.base[w0+i])
	hy.n++
	p.isCPU[i] = true
	p.stats.CPUComputed++
	return nil
}

// uploadCPUOutputs queues the wave's CPU outputs into their rows of outk,
// ahead of the combine. The pinned rows are not written again before the
// next layer's route sync, which waits for these copies.
func (r *Runner) uploadCPUOutputs() {
	hy, H := &r.hyb, r.H
	for c := range hy.n {
		r.check(r.Dev.UploadAsync(r.outk+uintptr(4*hy.rows[c]*H), r.pin, hy.offOut+4*c*H, 4*H, r.s))
	}
}
