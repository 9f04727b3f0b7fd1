//go:build linux

package cuda

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/sluicelm/sluice/internal/format"
)

// TestGPUBench measures, on the device, the figures internal/cuda/NOTES.md
// records: device-to-device copy bandwidth (the ceiling), the q4
// matrix-vector kernel's achieved bandwidth at real shapes, the batched q4
// product, kernel launch overhead and graph replay overhead. It runs only
// with SLUICE_GPU_BENCH=1 (scripts/gpu-test.sh sets it), since it takes
// seconds and a few GiB of device memory, and it asserts nothing about
// speed.
func TestGPUBench(t *testing.T) {
	if os.Getenv("SLUICE_GPU_BENCH") == "" {
		t.Skip("set SLUICE_GPU_BENCH=1 to run the GPU benchmarks")
	}
	onGPU(t, func(e *env) {
		bn := newBench(e)
		defer bn.close()
		d, s, timed := e.d, bn.s, bn.timed
		report := func(format string, a ...any) { fmt.Printf("bench: "+format+"\n", a...) }
		report("%v", d.Info)

		// Copy ceiling: 2 GiB device to device, bytes read + written.
		const cp = 2 << 30
		a, b := e.alloc(cp), e.alloc(cp)
		ms := timed(5, func(int) { must(d.CopyDAsync(b, a, cp, s)) })
		copyBW := 2 * cp / (ms / 1e3) / 1e9
		report("d2d copy %d MiB: %.3f ms, %.0f GB/s (read+write)", cp>>20, ms, copyBW)

		// q4 matrix-vector at real shapes, rotating over enough copies of
		// the matrix (≥ 1 GiB) that the 60 MB L2 holds none of them.
		r := rand.New(rand.NewPCG(20, 20))
		for _, sh := range []struct {
			name string
			O, C int
		}{
			{"4096x4096 (square)", 4096, 4096},
			{"1024x4096 (expert gate/up, Qwen3.5-397B)", 1024, 4096},
			{"4096x1024 (expert down, Qwen3.5-397B)", 4096, 1024},
			{"2048x4096 (gate+up of one expert)", 2048, 4096},
			{"20480x4096 (gate+up of 10 experts in one launch)", 20480, 4096},
			{"40960x1024 (down of 10 experts in one launch)", 40960, 1024},
		} {
			q := newQMat(e, r, sh.O, sh.C, format.Q4)
			bytes := sh.O*sh.C/2 + 4*sh.O*sh.C/64
			copies := max(4, (1<<30)/bytes)
			ws := make([]Q4, copies)
			for i := range ws {
				ws[i] = q.w
				ws[i].Q = e.alloc(sh.O * sh.C / 2)
				must(d.CopyD(ws[i].Q, q.w.Q, sh.O*sh.C/2))
				ws[i].Scales, ws[i].Biases = e.alloc(2*sh.O*sh.C/64), e.alloc(2*sh.O*sh.C/64)
				must(d.CopyD(ws[i].Scales, q.w.Scales, 2*sh.O*sh.C/64))
				must(d.CopyD(ws[i].Biases, q.w.Biases, 2*sh.O*sh.C/64))
			}
			for _, nb := range []int{1, 8, 32, 256} {
				x := randF32(r, nb*sh.C, 2)
				act := Acts{X: up(e, x), X8: e.alloc(nb * sh.C), XS: e.alloc(4 * nb * sh.C / 64), XSum: e.alloc(4 * nb * sh.C / 64), Rows: nb, Cols: sh.C}
				must(e.k.PrepQ4(s, act))
				out := e.alloc(4 * nb * sh.O)
				variants := []int{0, 16, 32, 64} // q4_mm8, q4_mma, q4_gemm32, q4_gemm64
				if nb == 256 {
					variants = []int{16, 32, 64}
				}
				if nb == 1 {
					variants = []int{1, 2} // q4_mv, q4_mv2
				}
				for _, v := range variants {
					name := "q4_mm8"
					switch v {
					case 16:
						name = "q4_mma"
					case 32, 64:
						name = gemmName(v)
					case 1:
						name = "q4_mv"
					case 2:
						name = "q4_mv2"
					}
					launch := func(i int) {
						if v == 0 {
							must(e.k.MatQ4Rows(s, out, ws[i%copies], act, 8))
						} else if v == 16 {
							must(e.k.MatQ4MMA(s, out, ws[i%copies], act))
						} else {
							must(e.k.MatQ4Rows(s, out, ws[i%copies], act, v))
						}
					}
					ms := timed(copies, launch)
					report("%s %s nb=%d: %.2f us/launch (stream), %.0f GB/s of weights (%.0f%% of the copy's), %.1f Gweight·row/s",
						name, sh.name, nb, ms*1e3, float64(bytes)/(ms/1e3)/1e9, 100*float64(bytes)/(ms/1e3)/1e9/copyBW, float64(sh.O*sh.C*nb)/(ms/1e3)/1e9)
					if nb != 1 {
						continue
					}
					// The same launches replayed from a graph: no host
					// launch cost between kernels.
					n := min(copies, 256)
					must(d.BeginCapture(s))
					for i := 0; i < n; i++ {
						launch(i)
					}
					g, err := d.EndCapture(s)
					must(err)
					ms = timed(3, func(int) { must(d.LaunchGraph(g, s)) }) / float64(n)
					must(d.DestroyGraph(g))
					report("%s %s nb=1 in a graph of %d: %.2f us/kernel, %.0f GB/s (%.0f%% of the copy's)",
						name, sh.name, n, ms*1e3, float64(bytes)/(ms/1e3)/1e9, 100*float64(bytes)/(ms/1e3)/1e9/copyBW)
				}
			}
		}

		// The low-bit products of --miss-bits at the expert shapes, beside
		// q4's (above): the same rotation over copies, one row and eight.
		for _, kind := range []format.Kind{format.Q3, format.Q2} {
			for _, sh := range [][2]int{{1024, 4096}, {4096, 1024}} {
				O, C := sh[0], sh[1]
				q := newQMat(e, r, O, C, kind)
				bytes := O*C*kind.Bits()/8 + 4*O*C/64
				copies := max(4, (1<<30)/bytes)
				ws := make([]Q4, copies)
				for i := range ws {
					ws[i] = q.w
					ws[i].Q = e.alloc(O * C * kind.Bits() / 8)
					must(d.CopyD(ws[i].Q, q.w.Q, O*C*kind.Bits()/8))
					ws[i].Scales, ws[i].Biases = e.alloc(2*O*C/64), e.alloc(2*O*C/64)
					must(d.CopyD(ws[i].Scales, q.w.Scales, 2*O*C/64))
					must(d.CopyD(ws[i].Biases, q.w.Biases, 2*O*C/64))
				}
				for _, nb := range []int{1, 8} {
					act := Acts{X: up(e, randF32(r, nb*C, 2)), X8: e.alloc(nb * C), XS: e.alloc(4 * nb * C / 64), XSum: e.alloc(4 * nb * C / 64), Rows: nb, Cols: C}
					must(e.k.PrepQ4(s, act))
					out := e.alloc(4 * nb * O)
					ms := timed(copies, func(i int) { must(e.k.MatLow(s, out, ws[i%copies], act, kind.Bits())) })
					report("%s %dx%d nb=%d: %.2f us/launch (stream), %.0f GB/s of weights (%.0f%% of the copy's)",
						kind, O, C, nb, ms*1e3, float64(bytes)/(ms/1e3)/1e9, 100*float64(bytes)/(ms/1e3)/1e9/copyBW)
				}
			}
		}

		// Attention decode at 4096 positions and the delta-rule step, at
		// the head shapes assumed for Qwen3.5-397B-A17B (32 query heads
		// over 2 kv heads of 256 dims; 64 value heads over 16 key heads of
		// 128 dims).
		{
			const n, nh, nkv, hd = 4096, 32, 2, 256
			q := up(e, randF32(r, nh*2*hd, 1))
			kc, vc := up(e, randF32(r, n*nkv*hd, 1)), up(e, randF32(r, n*nkv*hd, 1))
			o := e.alloc(4 * nh * hd)
			a := Attn{Pos: n - 1, Rows: 1, Heads: nh, KVHeads: nkv, HeadDim: hd, QRow: nh * 2 * hd, QHead: 2 * hd, ORow: nh * hd, Scale: 0.0625, Gated: true}
			scr := e.alloc(AttendScratch(a))
			ms := timed(200, func(int) { must(e.k.Attend(s, o, q, kc, vc, scr, a)) })
			report("attention decode, %d positions, %d/%d heads of %d: %.2f us (%.0f GB/s of KV cache)", n, nh, nkv, hd, ms*1e3, float64(2*n*nkv*hd*4)/(ms/1e3)/1e9)
			// DeepSeek-V3's latent attention: 128 heads over one latent of
			// 512+64 floats a position, a head a block (Attend) against
			// eight heads a block on 128 threads (mla_attend_part) and on
			// 512 (mla_attend_wide), for decode rows and prefill chunks of
			// 256 rows.
			{
				const nh, w, kvl = 128, 576, 512
				kc := up(e, randF32(r, 4096*w, 1))
				keepMin, keepWide := latentMinBlocks, latentWideBlocks
				for _, sh := range []struct {
					what      string
					pos, rows int
				}{{"decode at 100", 99, 1}, {"decode at 1000", 999, 1}, {"decode at 4096", 4095, 1}, {"256 rows at 0", 0, 256}, {"256 rows at 3840", 3840, 256}} {
					q := up(e, randF32(r, sh.rows*nh*w, 1))
					o := e.alloc(4 * sh.rows * nh * kvl)
					a := Attn{Pos: sh.pos, Rows: sh.rows, Heads: nh, KVHeads: 1, HeadDim: w, VDim: kvl, QRow: nh * w, QHead: w, ORow: nh * kvl, Scale: 0.07}
					scr := e.alloc(AttendScratch(a))
					var ms [3]float64
					for v, set := range [][2]int{{1 << 30, 1 << 30}, {0, 0}, {1 << 30, 0}} {
						latentMinBlocks, latentWideBlocks = set[0], set[1]
						ms[v] = timed(50, func(int) { must(e.k.AttendLatent(s, o, q, kc, scr, a)) })
					}
					latentMinBlocks, latentWideBlocks = keepMin, keepWide
					_, fn, _ := latentPlan(a)
					report("latent attention, %s, %d heads of %d: %.2f us a head a block, %.2f us eight heads a block on 128 threads, %.2f us on 512; AttendLatent takes %q",
						sh.what, nh, w, ms[0]*1e3, ms[1]*1e3, ms[2]*1e3, fn)
					if sh.rows == 1 { // as a recorded step: both launched, gated, over a grid of 8192 positions
						rec := a
						rec.PosDev, rec.MaxPos = up(e, []int32{int32(sh.pos)}), 8192
						rs := e.alloc(AttendScratch(rec))
						mr := timed(50, func(int) { must(e.k.AttendLatent(s, o, q, kc, rs, rec)) })
						report("latent attention, %s, recorded (grid of 8192 positions): %.2f us", sh.what, mr*1e3)
					}
				}
				// W_k (absorb, [128·512][128]) and W_v ([128·128][512]) at
				// q4, a head at a time: a (row, head) a slot of the one-row
				// kernel (MatEx), for a decode row and a prefill chunk.
				for _, sh := range [][2]int{{512, 128}, {128, 512}} {
					O, C := sh[0], sh[1]
					q := newQMat(e, r, nh*O, C, format.Q4)
					tab, err := HeadTab("q4", q.w, nh)
					must(err)
					tabd := up(e, tab)
					for _, rows := range []int{1, 256} {
						n := rows * nh
						ids := make([]int32, n)
						for k := range ids {
							ids[k] = int32(k % nh)
						}
						idd := up(e, ids)
						a := Acts{X: up(e, randF32(r, n*C, 1)), X8: e.alloc(n * C), XS: e.alloc(4 * n * C / 64), XSum: e.alloc(4 * n * C / 64), Rows: n, Cols: C}
						must(e.k.PrepQ4(s, a))
						out := e.alloc(4 * n * O)
						ms := timed(20, func(int) {
							step := 65535 / nh * nh // the grid's slots, whole heads
							for k0 := 0; k0 < n; k0 += step {
								k1 := min(n, k0+step)
								b := a
								b.X8, b.XS, b.XSum, b.Rows = a.X8+uintptr(k0*C), a.XS+uintptr(4*k0*C/64), a.XSum+uintptr(4*k0*C/64), k1-k0
								must(e.k.MatEx(s, "q4", out+uintptr(4*k0*O), tabd, idd+uintptr(4*k0), O, b, k1-k0, true))
							}
						})
						report("q4 a head at a time, %d heads of [%d %d], %d rows: %.2f us a (row, head) a slot", nh, O, C, rows, ms*1e3)
						if rows == 1 {
							continue
						}
						for _, bn := range []int{32, 64} {
							ms := timed(20, func(int) { must(e.k.MatQ4Heads(s, out, tabd, nh, O, a, bn)) })
							report("q4 a head at a time, %d heads of [%d %d], %d rows: %.2f us tiled by %d", nh, O, C, rows, ms*1e3, bn)
						}
					}
				}
			}
			dn := DN{KeyHeads: 16, ValueHeads: 64, KeyDim: 128, ValueDim: 128}
			S := up(e, randF32(r, dn.ValueHeads*128*128, 0.1))
			qkv := up(e, randF32(r, dn.Conv(), 0.1))
			dec, bet := up(e, randF32(r, dn.ValueHeads, 1)), up(e, randF32(r, dn.ValueHeads, 1))
			od := e.alloc(4 * dn.ValueHeads * dn.ValueDim)
			ms = timed(200, func(int) { must(e.k.DNRule(s, S, qkv, dec, bet, od, 1, dn, 0, 0)) })
			report("delta rule decode, 64 value heads of 128x128: %.2f us (%.0f GB/s of state read+written)", ms*1e3, float64(2*dn.ValueHeads*128*128*4)/(ms/1e3)/1e9)
		}

		// Launch overhead: an empty kernel, 20000 times.
		const L = 20000
		must(e.k.Empty(s))
		must(d.SyncStream(s))
		start := time.Now()
		for i := 0; i < L; i++ {
			must(e.k.Empty(s))
		}
		host := time.Since(start)
		must(d.SyncStream(s))
		all := time.Since(start)
		ms = timed(L, func(int) { must(e.k.Empty(s)) })
		report("empty kernel: host %.2f us/launch (cuLaunchKernel through purego), %.2f us/launch until done, device %.2f us/launch", host.Seconds()*1e6/L, all.Seconds()*1e6/L, ms*1e3)
		// Graph replay: 100 empty kernels per graph, and 1.
		for _, n := range []int{1, 100} {
			must(d.BeginCapture(s))
			for i := 0; i < n; i++ {
				must(e.k.Empty(s))
			}
			g, err := d.EndCapture(s)
			must(err)
			reps := 20000 / n
			start := time.Now()
			for i := 0; i < reps; i++ {
				must(d.LaunchGraph(g, s))
			}
			host := time.Since(start)
			must(d.SyncStream(s))
			ms := timed(reps, func(int) { must(d.LaunchGraph(g, s)) })
			report("graph of %d empty kernels: host %.2f us/replay, device %.2f us/replay = %.3f us/kernel", n, host.Seconds()*1e6/float64(reps), ms*1e3, ms*1e3/float64(n))
			must(d.DestroyGraph(g))
		}
		// Module load with the driver's JIT cache warm (TestMain loaded
		// every module once already).
		for _, m := range modules {
			ptx, err := PTX(m, e.k.PDL)
			must(err)
			mod, err := d.LoadPTX(ptx)
			must(err)
			report("module %s reloaded: %v (JIT %v)", m, mod.Load, mod.JIT)
			must(d.Unload(mod))
		}
	})
}

// TestGPUProfile launches a few kernels once each at real shapes, for a
// profiler (ncu) to look at; it runs only with SLUICE_GPU_PROFILE=1.
func TestGPUProfile(t *testing.T) {
	if os.Getenv("SLUICE_GPU_PROFILE") == "" {
		t.Skip("set SLUICE_GPU_PROFILE=1 to run the kernels for a profiler")
	}
	onGPU(t, func(e *env) {
		r := rand.New(rand.NewPCG(21, 21))
		for _, nb := range []int{1, 8} {
			q := newQMat(e, r, 20480, 4096, format.Q4)
			C := 4096
			act := Acts{X: up(e, randF32(r, nb*C, 2)), X8: e.alloc(nb * C), XS: e.alloc(4 * nb * C / 64), XSum: e.alloc(4 * nb * C / 64), Rows: nb, Cols: C}
			must(e.k.PrepQ4(e.s, act))
			must(e.k.MatQ4(e.s, e.alloc(4*nb*20480), q.w, act))
		}
		const n, nh, nkv, hd = 4096, 32, 2, 256
		q := up(e, randF32(r, nh*2*hd, 1))
		kc, vc := up(e, randF32(r, n*nkv*hd, 1)), up(e, randF32(r, n*nkv*hd, 1))
		a := Attn{Pos: n - 1, Rows: 1, Heads: nh, KVHeads: nkv, HeadDim: hd, QRow: nh * 2 * hd, QHead: 2 * hd, ORow: nh * hd, Scale: 0.0625, Gated: true}
		must(e.k.Attend(e.s, e.alloc(4*nh*hd), q, kc, vc, e.alloc(AttendScratch(a)), a))
	})
}

// TestGPUBenchOps (SLUICE_GPU_BENCH=1) times the one-row ops every decode
// layer runs, each kernel in a graph of 256 (no host launch cost): the
// residual add and RMSNorm of a hidden row, the activations' int8
// preparation for a q4 product, and the f32 router product. It asserts
// nothing about speed.
func TestGPUBenchOps(t *testing.T) {
	if os.Getenv("SLUICE_GPU_BENCH") == "" {
		t.Skip("set SLUICE_GPU_BENCH=1 to run the GPU benchmarks")
	}
	onGPU(t, func(e *env) {
		bn := newBench(e)
		defer bn.close()
		s, inGraph := bn.s, bn.inGraph
		r := rand.New(rand.NewPCG(21, 21))
		for _, H := range []int{2880, 4096} {
			x, add, w := up(e, randF32(r, H, 1)), up(e, randF32(r, H, 1)), up(e, randF32(r, H, 1))
			dst := e.alloc(4 * H)
			keep := normBlockMin
			normBlockMin = 1 << 30
			ms := inGraph(256, func() { must(e.k.RMSNorm(s, dst, x, add, w, 1, H, H, 1e-6, false)) })
			normBlockMin = 0
			mb := inGraph(256, func() { must(e.k.RMSNorm(s, dst, x, add, w, 1, H, H, 1e-6, false)) })
			normBlockMin = keep
			fmt.Printf("bench: rmsnorm with the residual add, one row of %d: %.2f us/kernel in a graph a warp a row, %.2f a block\n", H, ms*1e3, mb*1e3)
			act := Acts{X: x, X8: e.alloc(H), XS: e.alloc(4 * H / 64), XSum: e.alloc(4 * H / 64), Rows: 1, Cols: H}
			ms = inGraph(256, func() { must(e.k.PrepQ4(s, act)) })
			fmt.Printf("bench: prep_x (int8 activations for q4), one row of %d: %.2f us/kernel in a graph\n", H, ms*1e3)
			const E = 128
			wr := up(e, randF32(r, E*H, 1))
			out := e.alloc(4 * E)
			ms = inGraph(256, func() { must(e.k.MatF32(s, out, wr, E, H, x, 1)) })
			fmt.Printf("bench: f32 router %dx%d, one row: %.2f us/kernel in a graph\n", E, H, ms*1e3)
		}
	})
}

// bench times kernels on a stream of its own between two events.
type bench struct {
	d        *Device
	s        Stream
	ev0, ev1 Event
}

func newBench(e *env) *bench {
	b := &bench{d: e.d}
	var err error
	b.s, err = e.d.NewStream()
	must(err)
	b.ev0, err = e.d.NewEvent()
	must(err)
	b.ev1, err = e.d.NewEvent()
	must(err)
	return b
}

func (b *bench) close() {
	b.d.DestroyEvent(b.ev0)
	b.d.DestroyEvent(b.ev1)
	b.d.DestroyStream(b.s)
}

// timed runs f reps times between two events, three times over after a
// warm-up call, and returns the median milliseconds per rep.
func (b *bench) timed(reps int, f func(i int)) float64 {
	d, s := b.d, b.s
	f(0)
	must(d.SyncStream(s))
	var ms []float64
	for trial := 0; trial < 3; trial++ {
		must(d.Record(b.ev0, s))
		for i := 0; i < reps; i++ {
			f(i)
		}
		must(d.Record(b.ev1, s))
		must(d.WaitEvent(b.ev1))
		m, err := d.Elapsed(b.ev0, b.ev1)
		must(err)
		ms = append(ms, float64(m)/float64(reps))
	}
	sort.Float64s(ms)
	return ms[1]
}

// inGraph returns the median device time of one of n launches captured
// in a graph and replayed (no host launch cost between them).
func (b *bench) inGraph(n int, launch func()) float64 {
	must(b.d.BeginCapture(b.s))
	for i := 0; i < n; i++ {
		launch()
	}
	g, err := b.d.EndCapture(b.s)
	must(err)
	defer b.d.DestroyGraph(g)
	return b.timed(1, func(int) { must(b.d.LaunchGraph(g, b.s)) }) / float64(n)
}

// TestGPUBenchGrouped (SLUICE_GPU_BENCH=1) times the experts of a prefill
// chunk at two real shapes: every expert's rows through MatQ4, a launch
// an expert (as the batched step ran them before), against one grouped
// launch of the tiled kernel (MatQ4Groups), each row's products the same
// bits. It asserts nothing about speed.
func TestGPUBenchGrouped(t *testing.T) {
	if os.Getenv("SLUICE_GPU_BENCH") == "" {
		t.Skip("set SLUICE_GPU_BENCH=1 to run the GPU benchmarks")
	}
	onGPU(t, func(e *env) {
		bn := newBench(e)
		defer bn.close()
		s, timed := bn.s, bn.timed
		r := rand.New(rand.NewPCG(22, 22))
		for _, sh := range []struct {
			name          string
			E, O, C, rows int
		}{
			{"qwen3-30b-a3b gate (128 experts of [768 2048], 32 rows each)", 128, 768, 2048, 32},
			{"qwen3-30b-a3b down (128 experts of [2048 768], 32 rows each)", 128, 2048, 768, 32},
			{"deepseek-v3 gate (64 experts of [2048 7168], 64 rows each)", 64, 2048, 7168, 64},
			{"deepseek-v3 down (64 experts of [7168 2048], 64 rows each)", 64, 7168, 2048, 64},
		} {
			ms := make([]qmat, sh.E)
			tab := make([]uint64, 3*sh.E)
			for i := range ms {
				ms[i] = newQMat(e, r, sh.O, sh.C, format.Q4)
				tab[3*i], tab[3*i+1], tab[3*i+2] = uint64(ms[i].w.Q), uint64(ms[i].w.Scales), uint64(ms[i].w.Biases)
			}
			n := sh.E * sh.rows
			a := Acts{X: up(e, randF32(r, n*sh.C, 1)), X8: e.alloc(n * sh.C), XS: e.alloc(4 * n * sh.C / 64), XSum: e.alloc(4 * n * sh.C / 64), Rows: n, Cols: sh.C}
			must(e.k.PrepQ4(s, a))
			out := e.alloc(4 * n * sh.O)
			one := timed(5, func(int) {
				for i := range ms {
					b := a
					b.X8, b.XS, b.XSum, b.Rows = a.X8+uintptr(i*sh.rows*sh.C), a.XS+uintptr(4*i*sh.rows*sh.C/64), a.XSum+uintptr(4*i*sh.rows*sh.C/64), sh.rows
					must(e.k.MatQ4(s, out+uintptr(4*i*sh.rows*sh.O), ms[i].w, b))
				}
			})
			flop := 2 * float64(n) * float64(sh.O) * float64(sh.C)
			fmt.Printf("bench: %s: a launch an expert %.1f us (%.1f TOP/s)\n", sh.name, one*1e3, flop/(one/1e3)/1e12)
			tabd := up(e, tab)
			for _, tb := range []int{32, 64} {
				var tiles []Tile
				for i := range ms {
					for j := 0; j < sh.rows; j += tb {
						tiles = append(tiles, Tile{int32(i), int32(i*sh.rows + j), int32(min(tb, sh.rows-j)), 1})
					}
				}
				td := up(e, tiles)
				g := timed(5, func(int) { must(e.k.MatQ4Groups(s, out, tabd, td, len(tiles), tb, sh.O, a)) })
				fmt.Printf("bench: %s: grouped, tiles of %d, %.1f us (%.1f TOP/s)\n", sh.name, tb, g*1e3, flop/(g/1e3)/1e12)
			}
		}
	})
}
