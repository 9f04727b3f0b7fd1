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
		d := e.d
		s, err := d.NewStream()
		must(err)
		defer d.DestroyStream(s)
		ev0, _ := d.NewEvent()
		ev1, _ := d.NewEvent()
		defer d.DestroyEvent(ev0)
		defer d.DestroyEvent(ev1)
		// timed runs f reps times between two events, three times over,
		// and returns the median milliseconds per rep.
		timed := func(reps int, f func(i int)) float64 {
			f(0) // warm-up
			must(d.SyncStream(s))
			var ms []float64
			for trial := 0; trial < 3; trial++ {
				must(d.Record(ev0, s))
				for i := 0; i < reps; i++ {
					f(i)
				}
				must(d.Record(ev1, s))
				must(d.WaitEvent(ev1))
				m, err := d.Elapsed(ev0, ev1)
				must(err)
				ms = append(ms, float64(m)/float64(reps))
			}
			sort.Float64s(ms)
			return ms[1]
		}
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
		} {
			q := newQMat(e, r, sh.O, sh.C, format.Q4)
			bytes := sh.O*sh.C/2 + 8*sh.O*sh.C/64
			copies := max(4, (1<<30)/bytes)
			ws := make([]Q4, copies)
			for i := range ws {
				ws[i] = q.w
				ws[i].Q = e.alloc(sh.O * sh.C / 2)
				must(d.CopyD(ws[i].Q, q.w.Q, sh.O*sh.C/2))
				ws[i].Scales, ws[i].Biases = e.alloc(4*sh.O*sh.C/64), e.alloc(4*sh.O*sh.C/64)
				must(d.CopyD(ws[i].Scales, q.w.Scales, 4*sh.O*sh.C/64))
				must(d.CopyD(ws[i].Biases, q.w.Biases, 4*sh.O*sh.C/64))
			}
			for _, nb := range []int{1, 8, 32} {
				x := randF32(r, nb*sh.C, 2)
				act := Acts{X: up(e, x), X8: e.alloc(nb * sh.C), XS: e.alloc(4 * nb * sh.C / 64), XSum: e.alloc(4 * nb * sh.C / 64), Rows: nb, Cols: sh.C}
				must(e.k.PrepQ4(s, act))
				out := e.alloc(4 * nb * sh.O)
				ms := timed(copies, func(i int) { must(e.k.MatQ4(s, out, ws[i%copies], act)) })
				report("q4 %s nb=%d: %.2f us/launch (stream), %.0f GB/s of weights (%.0f%% of the copy's), %.1f Gweight·row/s",
					sh.name, nb, ms*1e3, float64(bytes)/(ms/1e3)/1e9, 100*float64(bytes)/(ms/1e3)/1e9/copyBW, float64(sh.O*sh.C*nb)/(ms/1e3)/1e9)
				if nb == 1 {
					// The same launches replayed from a graph: no host
					// launch cost between kernels.
					n := min(copies, 256)
					must(d.BeginCapture(s))
					for i := 0; i < n; i++ {
						must(e.k.MatQ4(s, out, ws[i], act))
					}
					g, err := d.EndCapture(s)
					must(err)
					ms := timed(3, func(int) { must(d.LaunchGraph(g, s)) }) / float64(n)
					must(d.DestroyGraph(g))
					report("q4 %s nb=1 in a graph of %d: %.2f us/kernel, %.0f GB/s (%.0f%% of the copy's)",
						sh.name, n, ms*1e3, float64(bytes)/(ms/1e3)/1e9, 100*float64(bytes)/(ms/1e3)/1e9/copyBW)
				}
			}
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
			ptx, err := PTX(m)
			must(err)
			mod, err := d.LoadPTX(ptx)
			must(err)
			report("module %s reloaded: %v (JIT %v)", m, mod.Load, mod.JIT)
			must(d.Unload(mod))
		}
	})
}
