//go:build linux

package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/quant"
)

// The GPU tests share one device, opened once; without a GPU (or a
// driver) they skip with the reason, so CI on a CPU machine stays green.
var gpu struct {
	d   *Device
	k   *Kernels
	err error
}

func TestMain(m *testing.M) {
	d, err := Open(0)
	if err == nil {
		var k *Kernels
		err = d.Do(func() error {
			var e error
			k, e = LoadKernels(d)
			return e
		})
		if err != nil {
			d.Close()
			d = nil
			err = fmt.Errorf("loading the kernels: %w", err)
		}
		gpu.k = k
	}
	gpu.d, gpu.err = d, err
	if err != nil {
		fmt.Println("cuda: GPU tests skip:", err)
	} else {
		fmt.Println("cuda:", d.Info)
		for _, l := range gpu.k.Load {
			fmt.Printf("cuda: module %s loaded in %v (JIT %v)\n", l.Name, l.Mod.Load, l.Mod.JIT)
		}
	}
	code := m.Run()
	if gpu.d != nil {
		gpu.d.Do(func() error { return gpu.k.Close() })
		gpu.d.Close()
	}
	os.Exit(code)
}

// env is a test's view of the device inside Do: helpers panic on driver
// errors (Do turns the panic into an error) and remember buffers to free.
type env struct {
	t    *testing.T
	d    *Device
	k    *Kernels
	s    Stream
	bufs []Buf
}

// onGPU runs f on the device thread, skipping where there is no GPU.
func onGPU(t *testing.T, f func(e *env)) {
	t.Helper()
	if gpu.err != nil {
		t.Skip("no GPU:", gpu.err)
	}
	err := gpu.d.Do(func() error {
		e := &env{t: t, d: gpu.d, k: gpu.k}
		defer func() {
			for _, b := range e.bufs {
				gpu.d.Free(b)
			}
		}()
		f(e)
		return gpu.d.Sync()
	})
	if err != nil {
		t.Fatal(err)
	}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// alloc returns n bytes of device memory poisoned with NaNs, so an output
// element that a kernel fails to write cannot pass.
func (e *env) alloc(n int) uintptr {
	b, err := e.d.Alloc(max(n, 4))
	must(err)
	e.bufs = append(e.bufs, b)
	must(e.d.Fill32(b.Ptr, 0x7fc0dead, b.Bytes/4))
	return b.Ptr
}

func up[T any](e *env, v []T) uintptr {
	_, n := bytesOf(v)
	p := e.alloc(n)
	must(Upload(e.d, Buf{Ptr: p, Bytes: n}, 0, v))
	return p
}

func down[T any](e *env, p uintptr, n int) []T {
	v := make([]T, n)
	_, b := bytesOf(v)
	must(Download(e.d, v, Buf{Ptr: p, Bytes: b}, 0))
	return v
}

func randF32(r *rand.Rand, n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = (r.Float32()*2 - 1) * scale
	}
	return v
}

// sameBits reports the first element where got and want differ in bits
// (NaN included), or -1.
func sameBits(got, want []float32) int {
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return i
		}
	}
	return -1
}

func (e *env) exact(what string, got, want []float32) {
	e.t.Helper()
	if i := sameBits(got, want); i >= 0 {
		n := 0
		for j := range want {
			if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
				n++
			}
		}
		e.t.Errorf("%s: %d of %d elements differ; first at %d: GPU %g (%08x), CPU %g (%08x)", what, n, len(want), i,
			got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
	}
}

// sameIDs checks a router's choices, k a row, against want.
func (e *env) sameIDs(what string, got, want []int32, k int) {
	e.t.Helper()
	for i := range want {
		if got[i] != want[i] {
			e.t.Errorf("%s: row %d slot %d: expert %d, want %d", what, i/k, i%k, got[i], want[i])
			return
		}
	}
}

// close checks ‖got−want‖/‖want‖ ≤ tol and that nothing is NaN.
func (e *env) close(what string, got, want []float32, tol float64) {
	e.t.Helper()
	var d, w float64
	for i := range want {
		if math.IsNaN(float64(got[i])) {
			e.t.Errorf("%s: element %d is NaN (unwritten?)", what, i)
			return
		}
		x := float64(got[i]) - float64(want[i])
		d += x * x
		w += float64(want[i]) * float64(want[i])
	}
	if rel := math.Sqrt(d / max(w, 1e-30)); rel > tol {
		e.t.Errorf("%s: relative error %.3g, want ≤ %g", what, rel, tol)
	}
}

// TestDriver covers the binding itself: device info, memory info, sync
// and async copies through pinned memory on a stream, events, errors that
// name the call and the CUDA error, and a captured graph replayed.
func TestDriver(t *testing.T) {
	onGPU(t, func(e *env) {
		d := e.d
		if d.Name == "" || d.Major < 8 || d.SMs < 1 || d.TotalBytes <= 0 {
			t.Errorf("implausible device info: %+v", d.Info)
		}
		free, total, err := d.MemInfo()
		must(err)
		if free <= 0 || free > total || total != d.TotalBytes {
			t.Errorf("MemInfo: free %d, total %d, device total %d", free, total, d.TotalBytes)
		}
		// Errors carry the call and the error's name.
		_, err = d.Alloc(1 << 60)
		var ce *Error
		if !errors.As(err, &ce) || ce.Call != "cuMemAlloc" || ce.Name != "CUDA_ERROR_OUT_OF_MEMORY" {
			t.Errorf("huge Alloc: error %v, want cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY", err)
		}
		r := rand.New(rand.NewPCG(1, 1))
		n := 1 << 20
		src := randF32(r, n, 1)
		a := up(e, src)
		b := e.alloc(4 * n)
		must(d.CopyD(b, a, 4*n))
		e.exact("sync copies", down[float32](e, b, n), src)

		s, err := d.NewStream()
		must(err)
		defer d.DestroyStream(s)
		h, err := d.AllocHost(4 * n)
		must(err)
		defer d.FreeHost(h)
		src2 := randF32(r, n, 1)
		copy(h.F32(), src2)
		ev0, err := d.NewEvent()
		must(err)
		defer d.DestroyEvent(ev0)
		ev1, err := d.NewEvent()
		must(err)
		defer d.DestroyEvent(ev1)
		must(d.Record(ev0, s))
		must(d.UploadAsync(a, h, 0, 4*n, s))
		must(d.CopyDAsync(b, a, 4*n, s))
		clear(h.F32())
		must(d.SyncStream(s))
		must(d.DownloadAsync(h, 0, b, 4*n, s))
		must(d.Record(ev1, s))
		must(d.WaitEvent(ev1))
		ms, err := d.Elapsed(ev0, ev1)
		must(err)
		if !(ms > 0) {
			t.Errorf("event time %v ms", ms)
		}
		e.exact("async copies through pinned memory", h.F32(), src2)

		// A graph of two kernels, replayed twice: y = silu(x)·x, then
		// silu(y)·y.
		x := randF32(r, 1000, 4)
		want := make([]float32, len(x))
		kernels.SwiGLU(want, x, x)
		kernels.SwiGLU(want, want, want)
		xd := up(e, x)
		must(d.BeginCapture(s))
		must(e.k.SwiGLU(s, xd, xd, xd, len(x)))
		must(e.k.SwiGLU(s, xd, xd, xd, len(x)))
		g, err := d.EndCapture(s)
		must(err)
		defer d.DestroyGraph(g)
		e.exact("graph captured, not run", down[float32](e, xd, len(x)), x)
		must(d.LaunchGraph(g, s))
		must(d.SyncStream(s))
		e.exact("graph replay", down[float32](e, xd, len(x)), want)
		kernels.SwiGLU(want, want, want)
		kernels.SwiGLU(want, want, want)
		must(d.LaunchGraph(g, s))
		must(d.SyncStream(s))
		e.exact("second graph replay", down[float32](e, xd, len(x)), want)
	})
}

// TestOpenNoGPU checks the error without a driver: Open fails cleanly,
// naming the cause, and nothing panics.
func TestOpenNoGPU(t *testing.T) {
	if gpu.err == nil {
		if _, err := Open(1 << 20); err == nil || !strings.Contains(err.Error(), "no GPU") {
			t.Errorf("Open of a missing ordinal: %v", err)
		}
		return
	}
	_, err := Open(0)
	if err == nil {
		t.Fatal("Open succeeded where TestMain's failed")
	}
	t.Log("Open(0):", err)
}

// qmat is a random quantised matrix on both sides.
type qmat struct {
	m    kernels.Mat
	w    Q4
	enc  *quant.Encoded
	kind format.Kind
}

func newQMat(e *env, r *rand.Rand, rows, cols int, kind format.Kind) qmat {
	enc, err := quant.Encode(randF32(r, rows*cols, 1), rows, cols, kind)
	must(err)
	m := kernels.Mat{Rows: rows, Cols: cols, Kind: kind, Q: enc.Values, Scales: quant.F16s(enc.Scales), Biases: quant.F16s(enc.Biases)}
	w := Q4{Rows: rows, Cols: cols, Q: up(e, enc.Values), Scales: up(e, m.Scales), Biases: up(e, m.Biases)}
	return qmat{m, w, enc, kind}
}

// gpuMat runs the product of w with nb rows of x on the GPU, with the
// activations prepared there.
func gpuMat(e *env, q qmat, x []float32, nb int, rowsVariant int) []float32 {
	C := q.w.Cols
	a := Acts{X: up(e, x[:nb*C]), XSum: e.alloc(4 * nb * C / 64), Rows: nb, Cols: C}
	if q.kind != format.Q8 {
		a.X8, a.XS = e.alloc(nb*C), e.alloc(4*nb*C/64)
	}
	must(e.k.PrepQ4(e.s, a))
	out := e.alloc(4 * nb * q.w.Rows)
	switch {
	case q.kind == format.Q8:
		must(e.k.MatQ8(e.s, out, q.w, a))
	case q.kind == format.Q3 || q.kind == format.Q2:
		must(e.k.MatLow(e.s, out, q.w, a, q.kind.Bits()))
	case rowsVariant == 16:
		must(e.k.MatQ4MMA(e.s, out, q.w, a))
	case rowsVariant != 0:
		must(e.k.MatQ4Rows(e.s, out, q.w, a, rowsVariant))
	default:
		must(e.k.MatQ4(e.s, out, q.w, a))
	}
	return down[float32](e, out, nb*q.w.Rows)
}

// TestQ4 checks the q4 product bit for bit against the CPU's
// (kernels.Scratch.MatMul, whose integer design the kernel reproduces) for
// shapes whose group counts are and are not multiples of the warp's step,
// and batch invariance: every row alone, and in every batch of 1..N rows,
// through both kernel variants, gives the same bits.
func TestQ4(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(2, 2))
		for _, sh := range [][2]int{{40, 64}, {72, 320}, {33, 1088}, {64, 4096}, {256, 1024}, {70, 8192}, {2000, 512}, {4500, 64}} {
			O, C := sh[0], sh[1]
			q := newQMat(e, r, O, C, format.Q4)
			const N = 11
			x := randF32(r, N*C, 3)
			var sc kernels.Scratch
			want := make([]float32, N*O)
			sc.MatMul(want, &q.m, x, N)
			full := gpuMat(e, q, x, N, 0)
			e.exact(fmt.Sprintf("q4 [%d %d] x %d rows vs CPU", O, C, N), full, want)
			for nb := 1; nb <= N; nb++ {
				e.exact(fmt.Sprintf("q4 [%d %d]: batch of %d (8-row kernel) vs %d", O, C, nb, N), gpuMat(e, q, x, nb, 8), full[:nb*O])
				e.exact(fmt.Sprintf("q4 [%d %d]: batch of %d (1-row kernel) vs %d", O, C, nb, N), gpuMat(e, q, x, nb, 1), full[:nb*O])
				e.exact(fmt.Sprintf("q4 [%d %d]: batch of %d (1-row kernel, variant 2) vs %d", O, C, nb, N), gpuMat(e, q, x, nb, 2), full[:nb*O])
				e.exact(fmt.Sprintf("q4 [%d %d]: batch of %d (tensor cores) vs %d", O, C, nb, N), gpuMat(e, q, x, nb, 16), full[:nb*O])
				if GemmCols(C) {
					for _, bn := range []int{32, 64} {
						e.exact(fmt.Sprintf("q4 [%d %d]: batch of %d (tiled by %d) vs %d", O, C, nb, bn, N), gpuMat(e, q, x, nb, bn), full[:nb*O])
					}
				}
			}
			for i := 0; i < N; i++ {
				e.exact(fmt.Sprintf("q4 [%d %d]: row %d alone vs in %d", O, C, i, N), gpuMat(e, q, x[i*C:], 1, 0), full[i*O:(i+1)*O])
			}
		}
	})
}

// TestQ4Tiled checks the tiled tensor-core product over more rows than a
// tile (several row tiles, the last one partial) and outputs that are not
// whole tiles, bit for bit against the CPU, and its grouped form: tiles
// of contiguous and of strided rows over several matrices in one launch,
// each row's products the bits of its matrix's own product.
func TestQ4Tiled(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(7, 9))
		for _, sh := range [][3]int{{300, 256, 150}, {129, 1024, 70}, {1000, 128, 33}, {64, 4096, 65}} {
			O, C, N := sh[0], sh[1], sh[2]
			q := newQMat(e, r, O, C, format.Q4)
			x := randF32(r, N*C, 3)
			var sc kernels.Scratch
			want := make([]float32, N*O)
			sc.MatMul(want, &q.m, x, N)
			for _, bn := range []int{32, 64} {
				e.exact(fmt.Sprintf("q4 [%d %d] x %d rows, tiled by %d", O, C, N, bn), gpuMat(e, q, x, N, bn), want)
			}
			e.exact(fmt.Sprintf("q4 [%d %d] x %d rows, MatQ4", O, C, N), gpuMat(e, q, x, N, 0), want)
		}

		// Grouped: 4 matrices of [O][C], 90 activation rows; each tile
		// names a matrix and its rows (contiguous runs and a strided one).
		const nm, O, C, N = 4, 160, 384, 90
		ms := make([]qmat, nm)
		tab := make([]uint64, 3*nm)
		for i := range ms {
			ms[i] = newQMat(e, r, O, C, format.Q4)
			tab[3*i], tab[3*i+1], tab[3*i+2] = uint64(ms[i].w.Q), uint64(ms[i].w.Scales), uint64(ms[i].w.Biases)
		}
		x := randF32(r, N*C, 2)
		// Rows 0..39 matrix 2 (two tiles of 32 and 8), rows 40..44
		// matrix 0, every third row of 45..89 matrix 3, the others of
		// 45..89 matrix 1.
		which := make([]int, N)
		var tiles32 []Tile
		add := func(m, first, rows, step int) {
			for j := 0; j < rows; j += 32 {
				n := min(32, rows-j)
				tiles32 = append(tiles32, Tile{int32(m), int32(first + j*step), int32(n), int32(step)})
				for k := 0; k < n; k++ {
					which[first+(j+k)*step] = m
				}
			}
		}
		add(2, 0, 40, 1)
		add(0, 40, 5, 1)
		add(3, 45, 15, 3)
		add(1, 46, 15, 3)
		add(1, 47, 15, 3)
		want := make([]float32, N*O)
		var sc kernels.Scratch
		for i := range N {
			sc.MatMul(want[i*O:(i+1)*O], &ms[which[i]].m, x[i*C:(i+1)*C], 1)
		}
		a := Acts{X: up(e, x), X8: e.alloc(N * C), XS: e.alloc(4 * N * C / 64), XSum: e.alloc(4 * N * C / 64), Rows: N, Cols: C}
		must(e.k.PrepQ4(e.s, a))
		out := e.alloc(4 * N * O)
		must(e.k.MatQ4Groups(e.s, out, up(e, tab), up(e, tiles32), len(tiles32), 32, O, a))
		e.exact("q4 grouped, tiles of 32", down[float32](e, out, N*O), want)
		must(e.k.MatQ4Groups(e.s, out, up(e, tab), up(e, tiles32), len(tiles32), 64, O, a))
		e.exact("q4 grouped, the same tiles in a launch of 64-row tiles", down[float32](e, out, N*O), want)
		if err := e.k.MatQ4Tiled(e.s, out, ms[0].w, Acts{Rows: 3, Cols: C}, 48); err == nil {
			t.Error("MatQ4Tiled took tiles of 48 rows")
		}
	})
}

// TestLowBits checks the 3- and 2-bit products (the records --miss-bits
// reads) bit for bit against the CPU's low-bit kernels, which give q4's
// bits on the widened record, and their batch invariance: a row alone, in
// the one-row kernel, and in every batch of 1..N rows gives the same bits.
func TestLowBits(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(5, 5))
		for _, kind := range []format.Kind{format.Q3, format.Q2} {
			for _, sh := range [][2]int{{40, 64}, {72, 320}, {33, 1088}, {64, 4096}, {70, 8192}, {2000, 512}} {
				O, C := sh[0], sh[1]
				q := newQMat(e, r, O, C, kind)
				const N = 11
				x := randF32(r, N*C, 3)
				var sc kernels.Scratch
				want := make([]float32, N*O)
				sc.MatMul(want, &q.m, x, N)
				full := gpuMat(e, q, x, N, 0)
				e.exact(fmt.Sprintf("%s [%d %d] x %d rows vs CPU", kind, O, C, N), full, want)
				for nb := 1; nb <= N; nb++ {
					e.exact(fmt.Sprintf("%s [%d %d]: batch of %d vs %d", kind, O, C, nb, N), gpuMat(e, q, x, nb, 0), full[:nb*O])
				}
				for i := 0; i < N; i++ {
					e.exact(fmt.Sprintf("%s [%d %d]: row %d alone vs in %d", kind, O, C, i, N), gpuMat(e, q, x[i*C:], 1, 0), full[i*O:(i+1)*O])
				}
			}
		}
	})
}

// TestQ8 checks the q8 product against the CPU's within float32 rounding
// (the CPU's vector lanes order the products differently) and bit-exact
// batch invariance.
func TestQ8(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(3, 3))
		for _, sh := range [][2]int{{40, 64}, {72, 576}, {64, 4096}} {
			O, C := sh[0], sh[1]
			q := newQMat(e, r, O, C, format.Q8)
			const N = 10
			x := randF32(r, N*C, 3)
			var sc kernels.Scratch
			want := make([]float32, N*O)
			sc.MatMul(want, &q.m, x, N)
			full := gpuMat(e, q, x, N, 0)
			e.close(fmt.Sprintf("q8 [%d %d]", O, C), full, want, 2e-6)
			for i := 0; i < N; i++ {
				e.exact(fmt.Sprintf("q8 [%d %d]: row %d alone vs in %d", O, C, i, N), gpuMat(e, q, x[i*C:], 1, 0), full[i*O:(i+1)*O])
			}
		}
	})
}

// TestBF16 checks the bf16 product likewise.
func TestBF16(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(4, 4))
		for _, sh := range [][2]int{{40, 8}, {72, 584}, {64, 4096}} {
			O, C := sh[0], sh[1]
			w := make([]uint16, O*C)
			for i := range w {
				w[i] = quant.BF16(r.Float32()*2 - 1)
			}
			m := kernels.Mat{Rows: O, Cols: C, Kind: format.BF16, BF16: w}
			wd := up(e, w)
			const N = 10
			x := randF32(r, N*C, 3)
			var sc kernels.Scratch
			want := make([]float32, N*O)
			sc.MatMul(want, &m, x, N)
			run := func(xs []float32, nb int) []float32 {
				out := e.alloc(4 * nb * O)
				must(e.k.MatBF16(e.s, out, wd, O, C, up(e, xs[:nb*C]), nb))
				return down[float32](e, out, nb*O)
			}
			full := run(x, N)
			e.close(fmt.Sprintf("bf16 [%d %d]", O, C), full, want, 2e-6)
			for i := 0; i < N; i++ {
				e.exact(fmt.Sprintf("bf16 [%d %d]: row %d alone vs in %d", O, C, i, N), run(x[i*C:], 1), full[i*O:(i+1)*O])
			}
		}
	})
}

// TestRMSNorm checks the norm with and without the fused residual add,
// plain and zero-centred, for lengths with and without a tail past the
// last 32-float block, a warp a row and a block a row (rmsnorm_block, from
// normBlockMin floats), and a strided in-place use (per-head q norms).
func TestRMSNorm(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(5, 5))
		for _, n := range []int{4096, 100, 7, 256, 1100, 7168} {
			for _, zc := range []bool{false, true} {
				for _, withAdd := range []bool{false, true} {
					const rows = 9
					x := randF32(r, rows*n, 5)
					add := randF32(r, rows*n, 5)
					w := randF32(r, n, 1)
					wantX := append([]float32(nil), x...)
					want := make([]float32, rows*n)
					for i := 0; i < rows; i++ {
						xi := wantX[i*n : (i+1)*n]
						if withAdd {
							kernels.Add(xi, add[i*n:(i+1)*n])
						}
						kernels.RMSNorm(want[i*n:(i+1)*n], xi, w, 1e-6, zc)
					}
					xd, dd := up(e, x), e.alloc(4*rows*n)
					var ad uintptr
					if withAdd {
						ad = up(e, add)
					}
					must(e.k.RMSNorm(e.s, dd, xd, ad, up(e, w), rows, n, n, 1e-6, zc))
					what := fmt.Sprintf("rmsnorm n=%d zc=%v add=%v", n, zc, withAdd)
					e.exact(what, down[float32](e, dd, rows*n), want)
					e.exact(what+" residual", down[float32](e, xd, rows*n), wantX)
				}
			}
		}
		// In place over heads of 64 dims, 128 floats apart (query, gate).
		const heads, hd = 12, 64
		x := randF32(r, heads*2*hd, 5)
		w := randF32(r, hd, 1)
		want := append([]float32(nil), x...)
		for h := 0; h < heads; h++ {
			q := want[h*2*hd : h*2*hd+hd]
			kernels.RMSNorm(q, q, w, 1e-6, true)
		}
		xd := up(e, x)
		must(e.k.RMSNorm(e.s, xd, xd, 0, up(e, w), heads, hd, 2*hd, 1e-6, true))
		e.exact("strided in-place head norm", down[float32](e, xd, len(x)), want)
	})
}

// TestRope checks partial rotary embedding on strided heads.
func TestRope(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(6, 6))
		const nb, nh, hd, rh = 5, 6, 128, 16 // a quarter of the dims rotate
		x := randF32(r, nb*nh*2*hd, 3)
		inv := kernels.RopeFreqs(2*rh, 1e7)
		cos, sin := make([]float32, nb*rh), make([]float32, nb*rh)
		for i := 0; i < nb; i++ {
			kernels.RopeTable(cos[i*rh:(i+1)*rh], sin[i*rh:(i+1)*rh], 1000+i*37, inv)
		}
		want := append([]float32(nil), x...)
		for i := 0; i < nb; i++ {
			for h := 0; h < nh; h++ {
				o := i*nh*2*hd + h*2*hd
				kernels.Rope(want[o:o+hd], cos[i*rh:(i+1)*rh], sin[i*rh:(i+1)*rh])
			}
		}
		xd := up(e, x)
		must(e.k.Rope(e.s, xd, up(e, cos), up(e, sin), nb, nh, nh*2*hd, 2*hd, rh))
		e.exact("rope", down[float32](e, xd, len(x)), want)
	})
}

// TestSwiGLU checks the experts' activations bit for bit: silu(gate)·up
// over a range that reaches Exp's cut-offs, and gpt-oss's clamped one over
// a range that reaches both clamps.
func TestSwiGLU(t *testing.T) {
	onGPU(t, func(e *env) {
		for _, c := range []struct {
			name     string
			seed     uint64
			gate, up float32
			cpu      func(dst, gate, up []float32)
			gpu      func(s Stream, dst, gate, up uintptr, n int) error
		}{
			{"swiglu", 7, 100, 3, kernels.SwiGLU, e.k.SwiGLU},
			{"clamped_swiglu", 8, 12, 12, kernels.ClampedSwiGLU, e.k.ClampedSwiGLU},
		} {
			r := rand.New(rand.NewPCG(7, c.seed))
			n := 100003
			g, u := randF32(r, n, c.gate), randF32(r, n, c.up)
			want := make([]float32, n)
			c.cpu(want, g, u)
			out := e.alloc(4 * n)
			must(c.gpu(e.s, out, up(e, g), up(e, u), n))
			e.exact(c.name, down[float32](e, out, n), want)
		}
	})
}

// refTopK is an independent top-k: sort by probability, descending, ties
// to the lower id, then renormalise in order.
func refTopK(p []float32, k int, norm bool) ([]int32, []float32) {
	idx := make([]int, len(p))
	for i := range idx {
		idx[i] = i
	}
	for a := 0; a < k; a++ { // selection: the best of the rest
		b := a
		for c := a + 1; c < len(idx); c++ {
			if p[idx[c]] > p[idx[b]] || (p[idx[c]] == p[idx[b]] && idx[c] < idx[b]) {
				b = c
			}
		}
		idx[a], idx[b] = idx[b], idx[a]
	}
	ids, w := make([]int32, k), make([]float32, k)
	var s float32
	for j := 0; j < k; j++ {
		ids[j], w[j] = int32(idx[j]), p[idx[j]]
		s += w[j]
	}
	if norm {
		for j := range w {
			w[j] /= s
		}
	}
	return ids, w
}

// TestRoute checks the router's softmax and top-k, with ties planted.
func TestRoute(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(8, 8))
		for _, c := range []struct {
			E, K int
			norm bool
		}{{512, 10, true}, {128, 8, false}, {256, 8, true}, {40, 1, true}} {
			const nb = 13
			logits := randF32(r, nb*c.E, 4)
			for i := range logits {
				if i%3 == 0 { // coarse values: many exact ties
					logits[i] = float32(math.Round(float64(logits[i])))
				}
			}
			probs := append([]float32(nil), logits...)
			var wantIDs []int32
			var wantW []float32
			for i := 0; i < nb; i++ {
				p := probs[i*c.E : (i+1)*c.E]
				kernels.Softmax(p)
				ids, w := refTopK(p, c.K, c.norm)
				wantIDs = append(wantIDs, ids...)
				wantW = append(wantW, w...)
			}
			ld, pd := up(e, logits), e.alloc(4*nb*c.E)
			idd, wd := e.alloc(4*nb*c.K), e.alloc(4*nb*c.K)
			must(e.k.Route(e.s, ld, pd, idd, wd, nb, c.E, c.K, c.norm))
			e.sameIDs(fmt.Sprintf("route E=%d K=%d", c.E, c.K), down[int32](e, idd, nb*c.K), wantIDs, c.K)
			e.exact(fmt.Sprintf("route E=%d K=%d weights", c.E, c.K), down[float32](e, wd, nb*c.K), wantW)
		}
	})
}

// TestRouteNaN: a NaN logit (corrupt weights) leaves each router's ids
// distinct and in range, for rows all NaN and rows with one NaN, so that
// the experts they address exist; the forward's logits then come out NaN
// and the caller refuses them. An id out of range would address memory
// outside the experts' and end the context.
func TestRouteNaN(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(8, 10))
		const E, K, nb = 128, 8, 3
		logits := randF32(r, nb*E, 3)
		nan := float32(math.NaN())
		for i := range E {
			logits[i] = nan // row 0: all NaN
		}
		logits[E+5] = nan // row 1: one NaN
		logits[2*E] = nan // row 2: the first NaN
		check := func(what string, ids []int32) {
			t.Helper()
			for row := range nb {
				seen := map[int32]bool{}
				for _, id := range ids[row*K : (row+1)*K] {
					if id < 0 || id >= E || seen[id] {
						t.Errorf("%s row %d: ids %v, want %d distinct in [0,%d)", what, row, ids[row*K:(row+1)*K], K, E)
						break
					}
					seen[id] = true
				}
			}
		}
		idd, wd := e.alloc(4*nb*K), e.alloc(4*nb*K)
		must(e.k.Route(e.s, up(e, logits), e.alloc(4*nb*E), idd, wd, nb, E, K, true))
		check("route", down[int32](e, idd, nb*K))
		must(e.k.RouteTopK(e.s, up(e, logits), idd, wd, nb, E, K))
		check("route_topk", down[int32](e, idd, nb*K))
		g := Groups{Corr: up(e, make([]float32, E)), Groups: 8, Top: 4, Norm: true, Scale: 1}
		must(e.k.RouteGroups(e.s, up(e, logits), e.alloc(4*nb*E), idd, wd, nb, E, K, g))
		check("route_groups", down[int32](e, idd, nb*K))
	})
}

// TestRouteGroups checks DeepSeek-V3's group-limited sigmoid router
// against the CPU's model.RouteGroups, bit for bit: one group (GLM-4.5),
// DeepSeek-V3's 8 groups keeping 4, groups past a warp's lanes, the
// largest expert count, without renormalising; with ties planted in the
// logits and the correction.
func TestRouteGroups(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(8, 9))
		for _, c := range []struct {
			E, K, G, TG int
			norm        bool
			scale       float32
		}{{128, 8, 1, 1, true, 1}, {160, 8, 1, 1, true, 2.5}, {256, 8, 8, 4, true, 2.5}, {128, 4, 64, 40, true, 1.5},
			{1024, 32, 32, 2, false, 2}, {64, 6, 8, 3, true, 2.5}} {
			const nb = 13
			logits := randF32(r, nb*c.E, 3)
			for i := range logits {
				if i%3 == 0 { // coarse values: many exact ties
					logits[i] = float32(math.Round(float64(logits[i])))
				}
			}
			corr := randF32(r, c.E, 0.1)
			for i := range corr {
				if i%4 == 0 {
					corr[i] = 0
				}
			}
			m := &block.MoE{Score: block.SigmoidGroups, NormTopK: c.norm, Groups: c.G, TopGroups: c.TG, Scale: c.scale, Correction: corr}
			probs := append([]float32(nil), logits...)
			wantIDs, wantW := make([]int32, nb*c.K), make([]float32, nb*c.K)
			ids, choice := make([]int, c.K), make([]float32, c.E)
			for i := 0; i < nb; i++ {
				model.RouteGroups(m, probs[i*c.E:(i+1)*c.E], choice, ids, wantW[i*c.K:(i+1)*c.K])
				for k, id := range ids {
					wantIDs[i*c.K+k] = int32(id)
				}
			}
			ld := up(e, logits)
			idd, wd := e.alloc(4*nb*c.K), e.alloc(4*nb*c.K)
			g := Groups{Corr: up(e, corr), Groups: c.G, Top: c.TG, Norm: c.norm, Scale: c.scale}
			must(e.k.RouteGroups(e.s, ld, ld, idd, wd, nb, c.E, c.K, g))
			what := fmt.Sprintf("route_groups E=%d K=%d G=%d/%d", c.E, c.K, c.TG, c.G)
			e.sameIDs(what, down[int32](e, idd, nb*c.K), wantIDs, c.K)
			e.exact(what+" weights", down[float32](e, wd, nb*c.K), wantW)
			e.exact(what+" scores", down[float32](e, ld, nb*c.E), probs)
		}
	})
}

// TestAddRows checks the projections' bias add.
func TestAddRows(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(8, 10))
		const rows, n = 7, 1000
		x, b := randF32(r, rows*n, 3), randF32(r, n, 1)
		want := append([]float32(nil), x...)
		for i := 0; i < rows; i++ {
			kernels.Add(want[i*n:(i+1)*n], b)
		}
		xd := up(e, x)
		must(e.k.AddRows(e.s, xd, up(e, b), rows, n))
		e.exact("add_rows", down[float32](e, xd, rows*n), want)
	})
}

// TestAddEx checks a recorded step's expert biases: each slot's row gets
// its expert's vector, none where the table holds 0.
func TestAddEx(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(8, 12))
		const O, E = 300, 3
		ids := []int32{2, 0, 3, 2} // expert 3: the shared slot, no bias
		x := randF32(r, len(ids)*O, 3)
		bias := [E][]float32{randF32(r, O, 1), randF32(r, O, 1), randF32(r, O, 1)}
		tab := make([]uint64, 3*(E+1))
		for i, b := range bias {
			tab[3*i+1] = uint64(up(e, b)) // the up bias
		}
		want := append([]float32(nil), x...)
		for k, id := range ids {
			if int(id) < E {
				kernels.Add(want[k*O:(k+1)*O], bias[id])
			}
		}
		xd := up(e, x)
		must(e.k.AddEx(e.s, xd, up(e, tab), up(e, ids), 1, O, len(ids)))
		e.exact("add_ex", down[float32](e, xd, len(ids)*O), want)
	})
}

// TestMatF32 checks the float32 product (routers, the shared expert's
// gate) against float64 sums, and that a row's bits do not depend on the
// rows beside it, for widths with and without a remainder past the
// eight-load steps.
func TestMatF32(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(9, 10))
		for _, C := range []int{2880, 4096, 100, 7} {
			const O, nb = 129, 5
			w, x := randF32(r, O*C, 1), randF32(r, nb*C, 1)
			want := make([]float32, nb*O)
			for i := 0; i < nb; i++ {
				for o := 0; o < O; o++ {
					var s float64
					for c := 0; c < C; c++ {
						s += float64(w[o*C+c]) * float64(x[i*C+c])
					}
					want[i*O+o] = float32(s)
				}
			}
			wd, xd, out := up(e, w), up(e, x), e.alloc(4*nb*O)
			must(e.k.MatF32(e.s, out, wd, O, C, xd, nb))
			all := down[float32](e, out, nb*O)
			e.close(fmt.Sprintf("f32 product C=%d", C), all, want, 1e-5)
			for i := 0; i < nb; i++ {
				one := e.alloc(4 * O)
				must(e.k.MatF32(e.s, one, wd, O, C, xd+uintptr(4*i*C), 1))
				e.exact(fmt.Sprintf("f32 product C=%d: row %d alone vs in the batch", C, i), down[float32](e, one, O), all[i*O:(i+1)*O])
			}
		}
	})
}

// TestArgmax checks greedy argmax with planted ties, at vocabulary sizes
// that take the kernel's float4 path (a multiple of 4) and its scalar one,
// below one element a thread, and rows whose largest value is not finite
// (no finite value, or +Inf), which give -1.
func TestArgmax(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(9, 9))
		for _, V := range []int{151937, 151936, 4100, 7} {
			const nb = 6
			x := randF32(r, nb*V, 10)
			want := make([]int32, nb)
			for i := 0; i < 4; i++ {
				row := x[i*V : (i+1)*V]
				a, b := r.IntN(V), r.IntN(V)
				row[a], row[b] = 11, 11 // a tie for the maximum
				want[i] = int32(min(a, b))
				if i == 3 {
					n := (max(a, b) + 1) % V
					for n == a || n == b {
						n = (n + 1) % V
					}
					row[n] = float32(math.NaN()) // NaN never wins
				}
			}
			for j := range V {
				x[4*V+j] = float32(math.Inf(-1))
				if j%3 == 0 {
					x[4*V+j] = float32(math.NaN())
				}
			}
			want[4] = -1
			x[5*V+r.IntN(V)] = float32(math.Inf(1)) // an overflow
			want[5] = -1
			out := e.alloc(4 * nb)
			must(e.k.Argmax(e.s, up(e, x), out, nb, V))
			got := down[int32](e, out, nb)
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("argmax V=%d row %d: %d, want %d", V, i, got[i], want[i])
				}
			}
		}
	})
}

// TestAttend checks causal attention (plain and gated, grouped-query, one
// chunk of positions and several)
// against kernels.Attend within float32 rounding (the q·k dot products sum
// in another order), and bit-exact batch invariance: each row of a prefill
// batch equals the same row decoded alone.
func TestAttend(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(10, 10))
		for _, c := range []struct {
			pos   int
			gated bool
		}{{37, false}, {37, true}, {700, true}, {250, false}} {
			pos, gated := c.pos, c.gated
			const nb, nh, nkv, hd = 6, 8, 2, 128
			qh := hd
			if gated {
				qh = 2 * hd
			}
			kvw := nkv * hd
			n := pos + nb
			q := randF32(r, nb*nh*qh, 2)
			kc, vc := randF32(r, n*kvw, 2), randF32(r, n*kvw, 2)
			scale := float32(1 / math.Sqrt(hd))
			want := make([]float32, nb*nh*hd)
			sc := make([]float32, n)
			for i := 0; i < nb; i++ {
				for h := 0; h < nh; h++ {
					g := h / (nh / nkv)
					o := want[i*nh*hd+h*hd : i*nh*hd+(h+1)*hd]
					kernels.Attend(o, q[i*nh*qh+h*qh:i*nh*qh+h*qh+hd], kc[g*hd:], vc[g*hd:], kvw, pos+i+1, scale, sc)
					if gated {
						kernels.MulSigmoid(o, q[i*nh*qh+h*qh+hd:i*nh*qh+h*qh+2*hd])
					}
				}
			}
			qd, kd, vd := up(e, q), up(e, kc), up(e, vc)
			a := Attn{Pos: pos, Rows: nb, Heads: nh, KVHeads: nkv, HeadDim: hd, QRow: nh * qh, QHead: qh, ORow: nh * hd, Scale: scale, Gated: gated}
			od := e.alloc(4 * nb * nh * hd)
			must(e.k.Attend(e.s, od, qd, kd, vd, e.alloc(AttendScratch(a)), a))
			full := down[float32](e, od, nb*nh*hd)
			e.close(fmt.Sprintf("attention pos=%d gated=%v", pos, gated), full, want, 2e-6)
			e.grouped(fmt.Sprintf("attention pos=%d gated=%v", pos, gated), a, full, func(g Attn, o, scr uintptr) error { return e.k.Attend(e.s, o, qd, kd, vd, scr, g) })
			for i := 0; i < nb; i++ {
				b := a
				b.Pos, b.Rows = pos+i, 1
				o1 := e.alloc(4 * nh * hd)
				must(e.k.Attend(e.s, o1, qd+uintptr(4*i*nh*qh), kd, vd, e.alloc(AttendScratch(b)), b))
				e.exact(fmt.Sprintf("attention pos=%d gated=%v: row %d alone vs in the batch", pos, gated, i), down[float32](e, o1, nh*hd), full[i*nh*hd:(i+1)*nh*hd])
			}
		}
	})
}

// grouped checks that an attention whose scratch holds two rows' parts,
// its rows taken two at a time, gives the bits full gives for all of them
// at once (run launches the attention g with its output and scratch).
func (e *env) grouped(what string, a Attn, full []float32, run func(g Attn, o, scr uintptr) error) {
	g := a
	g.Scratch = 2 * a.rowParts()
	o := e.alloc(4 * len(full))
	must(run(g, o, e.alloc(g.Scratch)))
	e.exact(what+": two rows at a time", down[float32](e, o, len(full)), full)
}

// TestAttendWindow checks gpt-oss's attention, a sliding window with a
// sink per head, over a plain cache and over a ring of window + rows rows
// (before and after it wraps, the window across a chunk boundary or not),
// against kernels.AttendRing within float32 rounding, and that each row
// alone gives the batch's bits; and KVAppend's ring row.
func TestAttendWindow(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(10, 11))
		const nb, nh, nkv, hd, W = 6, 8, 2, 64, 128
		for _, c := range []struct {
			pos  int
			ring bool
		}{{37, false}, {37, true}, {300, true}, {700, false}, {700, true}, {1021, true}} {
			pos := c.pos
			kvw := nkv * hd
			n := pos + nb
			rows, ring := n, 0
			if c.ring {
				rows, ring = W+nb, W+nb
			}
			q := randF32(r, nb*nh*hd, 2)
			kl, vl := randF32(r, n*kvw, 2), randF32(r, n*kvw, 2) // position p's key at p·kvw
			sinks := randF32(r, nh, 3)
			kc, vc := make([]float32, rows*kvw), make([]float32, rows*kvw)
			for p := max(0, n-rows); p < n; p++ {
				at := p % rows * kvw
				copy(kc[at:at+kvw], kl[p*kvw:(p+1)*kvw])
				copy(vc[at:at+kvw], vl[p*kvw:(p+1)*kvw])
			}
			scale := float32(1 / math.Sqrt(hd))
			want := make([]float32, nb*nh*hd)
			sc := make([]float32, W)
			for i := 0; i < nb; i++ {
				m := pos + i + 1
				first := max(0, m-W)
				for h := 0; h < nh; h++ {
					g := h / (nh / nkv)
					o := want[i*nh*hd+h*hd : i*nh*hd+(h+1)*hd]
					kernels.AttendRing(o, q[i*nh*hd+h*hd:i*nh*hd+(h+1)*hd], kc[g*hd:], vc[g*hd:], kvw, rows, first, m-first, scale, sinks[h:h+1], sc)
				}
			}
			qd, kd, vd := up(e, q), up(e, kc), up(e, vc)
			a := Attn{Pos: pos, Rows: nb, Heads: nh, KVHeads: nkv, HeadDim: hd, QRow: nh * hd, QHead: hd, ORow: nh * hd, Scale: scale,
				Window: W, Ring: ring, Sinks: up(e, sinks)}
			od := e.alloc(4 * nb * nh * hd)
			must(e.k.Attend(e.s, od, qd, kd, vd, e.alloc(AttendScratch(a)), a))
			what := fmt.Sprintf("windowed attention pos=%d ring=%d", pos, ring)
			full := down[float32](e, od, nb*nh*hd)
			e.close(what, full, want, 2e-6)
			e.grouped(what, a, full, func(g Attn, o, scr uintptr) error { return e.k.Attend(e.s, o, qd, kd, vd, scr, g) })
			for i := 0; i < nb; i++ {
				b := a
				b.Pos, b.Rows = pos+i, 1
				o1 := e.alloc(4 * nh * hd)
				must(e.k.Attend(e.s, o1, qd+uintptr(4*i*nh*hd), kd, vd, e.alloc(AttendScratch(b)), b))
				e.exact(fmt.Sprintf("%s: row %d alone vs in the batch", what, i), down[float32](e, o1, nh*hd), full[i*nh*hd:(i+1)*nh*hd])
			}
		}
		// KVAppend into a ring: position 1000 of a ring of 134 rows is row 62.
		const R, w, p = 134, 16, 1000
		key, val := randF32(r, w, 1), randF32(r, w, 1)
		kd, vd := e.alloc(4*R*w), e.alloc(4*R*w)
		must(e.d.Fill32Async(kd, 0, R*w, e.s))
		must(e.d.Fill32Async(vd, 0, R*w, e.s))
		must(e.k.KVAppend(e.s, kd, vd, up(e, key), up(e, val), up(e, []int32{p}), w, R))
		wantK, wantV := make([]float32, R*w), make([]float32, R*w)
		copy(wantK[p%R*w:], key)
		copy(wantV[p%R*w:], val)
		e.exact("kv_append ring keys", down[float32](e, kd, R*w), wantK)
		e.exact("kv_append ring values", down[float32](e, vd, R*w), wantV)
	})
}

// TestRouteTopK checks gpt-oss's router (the top k of the logits, then the
// softmax over them) against model.Route and kernels.Softmax, bit for bit,
// with ties planted.
func TestRouteTopK(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(8, 11))
		for _, c := range []struct{ E, K int }{{32, 4}, {128, 4}, {1024, 32}, {40, 9}} {
			const nb = 13
			logits := randF32(r, nb*c.E, 4)
			for i := range logits {
				if i%3 == 0 {
					logits[i] = float32(math.Round(float64(logits[i])))
				}
			}
			wantIDs, wantW := make([]int32, nb*c.K), make([]float32, nb*c.K)
			ids := make([]int, c.K)
			for i := 0; i < nb; i++ {
				w := wantW[i*c.K : (i+1)*c.K]
				model.Route(append([]float32(nil), logits[i*c.E:(i+1)*c.E]...), c.K, false, ids, w)
				kernels.Softmax(w)
				for k, id := range ids {
					wantIDs[i*c.K+k] = int32(id)
				}
			}
			idd, wd := e.alloc(4*nb*c.K), e.alloc(4*nb*c.K)
			must(e.k.RouteTopK(e.s, up(e, logits), idd, wd, nb, c.E, c.K))
			what := fmt.Sprintf("route_topk E=%d K=%d", c.E, c.K)
			e.sameIDs(what, down[int32](e, idd, nb*c.K), wantIDs, c.K)
			e.exact(what+" weights", down[float32](e, wd, nb*c.K), wantW)
		}
	})
}

// dnShape is a small DeltaNet: 2 key heads, 4 value heads.
var dnShape = DN{KeyHeads: 2, ValueHeads: 4, KeyDim: 128, ValueDim: 128}

// TestDNConv checks the causal conv + SiLU bit for bit against the CPU's
// arithmetic (kernels.MulSet, MulAdd, SiLUInPlace, as the model's conv),
// that a step of nb rows equals nb steps of one row, and that its per-row
// snapshots hold the history after each row.
func TestDNConv(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(11, 11))
		const K, nb = 4, 5
		cd := dnShape.Conv()
		x := randF32(r, nb*cd, 3)
		hist := randF32(r, (K-1)*cd, 3)
		convT := randF32(r, K*cd, 1)
		// CPU: the timeline [hist, x], out_i = Σ_j w_j·t_{i+j}.
		tl := append(append([]float32(nil), hist...), x...)
		want := make([]float32, nb*cd)
		for i := 0; i < nb; i++ {
			acc := want[i*cd : (i+1)*cd]
			kernels.MulSet(acc, convT[:cd], tl[i*cd:(i+1)*cd])
			for j := 1; j < K; j++ {
				kernels.MulAdd(acc, convT[j*cd:(j+1)*cd], tl[(i+j)*cd:(i+j+1)*cd])
			}
			kernels.SiLUInPlace(acc)
		}
		wantHist := tl[nb*cd:]
		xd, hd, wd := up(e, x), up(e, hist), up(e, convT)
		hw := (K - 1) * cd
		snap := e.alloc(4 * (nb - 1) * hw)
		must(e.k.DNConv(e.s, xd, hd, wd, nb, cd, K, snap, nb-1))
		e.exact("conv", down[float32](e, xd, nb*cd), want)
		e.exact("conv history", down[float32](e, hd, hw), wantHist)
		snaps := down[float32](e, snap, (nb-1)*hw)
		for i := 0; i < nb-1; i++ {
			e.exact(fmt.Sprintf("conv snapshot after row %d", i), snaps[i*hw:(i+1)*hw], tl[(i+1)*cd:(i+K)*cd])
		}
		// Row by row from the same history.
		xd, hd = up(e, x), up(e, hist)
		for i := 0; i < nb; i++ {
			must(e.k.DNConv(e.s, xd+uintptr(4*i*cd), hd, wd, 1, cd, K, 0, 0))
		}
		e.exact("conv row by row vs one step", down[float32](e, xd, nb*cd), want)
	})
}

// TestDNPrep checks the q/k norms bit for bit and beta and the decay
// (float64 exp and log1p on both sides, which may differ in the last bit
// of a float64) to one float32 ulp.
func TestDNPrep(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(12, 12))
		d := dnShape
		const nb = 7
		cd := d.Conv()
		qkv := randF32(r, nb*cd, 3)
		b, a := randF32(r, nb*d.ValueHeads, 6), randF32(r, nb*d.ValueHeads, 30)
		alog, dt := randF32(r, d.ValueHeads, 2), randF32(r, d.ValueHeads, 2)
		qscale := float32(1 / math.Sqrt(float64(d.KeyDim)))
		want := append([]float32(nil), qkv...)
		kd := d.KeyHeads * d.KeyDim
		for i := 0; i < nb; i++ {
			x := want[i*cd : (i+1)*cd]
			for h := 0; h < d.KeyHeads; h++ {
				q := x[h*d.KeyDim : (h+1)*d.KeyDim]
				kernels.L2Norm(q, 1e-6)
				for j := range q {
					q[j] *= qscale
				}
				kernels.L2Norm(x[kd+h*d.KeyDim:kd+(h+1)*d.KeyDim], 1e-6)
			}
		}
		wantB, wantA := make([]float32, len(b)), make([]float32, len(a))
		for i := range b {
			h := i % d.ValueHeads
			wantB[i] = kernels.Sigmoid(b[i])
			wantA[i] = float32(math.Exp(float64(-float32(math.Exp(float64(alog[h]))) * kernels.Softplus(a[i]+dt[h]))))
		}
		qd, bd, ad := up(e, qkv), up(e, b), up(e, a)
		must(e.k.DNPrep(e.s, qd, bd, ad, up(e, alog), up(e, dt), nb, d, qscale))
		e.exact("dn q/k norms", down[float32](e, qd, nb*cd), want)
		e.exact("dn beta", down[float32](e, bd, len(b)), wantB)
		got := down[float32](e, ad, len(a))
		for i := range got {
			if d := int64(math.Float32bits(got[i])) - int64(math.Float32bits(wantA[i])); d < -1 || d > 1 {
				t.Errorf("dn decay %d: %g, want %g", i, got[i], wantA[i])
				break
			}
		}
	})
}

// TestDNRule checks the delta rule against kernels.DeltaRule, over nb rows
// in one step and row by row (bit-exact against each other, the step's
// per-row snapshots against the state after each row), for each key dim
// the kernel is built for. The GPU reproduces the CPU's AVX2 kernel's
// arithmetic; against the pure-Go twin (no FMA) it is within rounding.
func TestDNRule(t *testing.T) {
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(13, 13))
		for _, dk := range []int{32, 64, 128} {
			d := DN{KeyHeads: 2, ValueHeads: 4, KeyDim: dk, ValueDim: 128}
			const nb = 6
			cd, kd, vd := d.Conv(), d.KeyHeads*dk, d.ValueHeads*d.ValueDim
			qkv := randF32(r, nb*cd, 0.2)
			S := randF32(r, d.ValueHeads*dk*d.ValueDim, 1)
			decay, beta := make([]float32, nb*d.ValueHeads), make([]float32, nb*d.ValueHeads)
			for i := range decay {
				decay[i], beta[i] = 0.5+r.Float32()/2, r.Float32()
			}
			wantS := append([]float32(nil), S...)
			want := make([]float32, nb*vd)
			kv := make([]float32, d.ValueDim)
			for h := 0; h < d.ValueHeads; h++ {
				kh := h / (d.ValueHeads / d.KeyHeads)
				for i := 0; i < nb; i++ {
					x := qkv[i*cd : (i+1)*cd]
					kernels.DeltaRule(wantS[h*dk*d.ValueDim:(h+1)*dk*d.ValueDim], x[kd+kh*dk:kd+(kh+1)*dk], x[kh*dk:(kh+1)*dk],
						x[2*kd+h*d.ValueDim:2*kd+(h+1)*d.ValueDim], kv, want[i*vd+h*d.ValueDim:i*vd+(h+1)*d.ValueDim], decay[i*d.ValueHeads+h], beta[i*d.ValueHeads+h])
				}
			}
			qd, dd, bd := up(e, qkv), up(e, decay), up(e, beta)
			Sd, od := up(e, S), e.alloc(4*nb*vd)
			sw := len(S)
			snap := e.alloc(4 * (nb - 1) * sw)
			must(e.k.DNRule(e.s, Sd, qd, dd, bd, od, nb, d, snap, nb-1))
			snaps := down[float32](e, snap, (nb-1)*sw)
			got, gotS := down[float32](e, od, nb*vd), down[float32](e, Sd, len(S))
			e.close(fmt.Sprintf("delta rule dk=%d output", dk), got, want, 1e-6)
			e.close(fmt.Sprintf("delta rule dk=%d state", dk), gotS, wantS, 1e-6)
			if i := sameBits(got, want); i >= 0 {
				t.Logf("delta rule dk=%d: not bit-identical to the CPU's (first at %d; expected where the CPU has no AVX2)", dk, i)
			}
			Sd, od = up(e, S), e.alloc(4*nb*vd)
			for i := 0; i < nb; i++ {
				must(e.k.DNRule(e.s, Sd, qd+uintptr(4*i*cd), dd+uintptr(4*i*d.ValueHeads), bd+uintptr(4*i*d.ValueHeads), od+uintptr(4*i*vd), 1, d, 0, 0))
				if i < nb-1 {
					e.exact(fmt.Sprintf("delta rule dk=%d snapshot after row %d", dk, i), snaps[i*sw:(i+1)*sw], down[float32](e, Sd, sw))
				}
			}
			e.exact(fmt.Sprintf("delta rule dk=%d row by row vs one step", dk), down[float32](e, od, nb*vd), got)
			e.exact(fmt.Sprintf("delta rule dk=%d state row by row", dk), down[float32](e, Sd, len(S)), gotS)
		}
	})
}
