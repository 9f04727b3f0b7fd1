package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/platform"
	"github.com/sluicelm/sluice/internal/quant"
)

// benchMem returns n bytes of memory like the engine's weights: huge pages
// where the system gives them (platform.Alloc), which plain reads ran
// 3-4% faster from than from 4 KiB pages on the 2-core Zen 4. free
// releases it.
func benchMem(b *testing.B, n int) (buf []byte, free func()) {
	buf, err := platform.Alloc(n)
	if err != nil {
		b.Fatal(err)
	}
	return buf, func() { platform.Free(buf) }
}

// dramMats returns q4 matrices of rows×cols laid end to end over about
// total bytes of weights, far more than the last-level cache, so that a
// pass over them reads memory as a decode step at real shapes does; free
// releases their weights.
func dramMats(b *testing.B, rows, cols int, total int) (ms []Mat, free func()) {
	ng := cols / format.GroupSize
	per := rows * cols / 2
	n := max(total/per, 2)
	q, free := benchMem(b, n*per)
	r := rand.New(rand.NewPCG(5, 6))
	for i := 0; i+8 <= len(q); i += 8 {
		v := r.Uint64()
		for j := range 8 {
			q[i+j] = byte(v >> (8 * j))
		}
	}
	sc := make([]uint16, n*rows*ng)
	bi := make([]uint16, n*rows*ng)
	for i := range sc {
		sc[i], bi[i] = quant.F16(0.01), quant.F16(-0.08)
	}
	ms = make([]Mat, n)
	for i := range ms {
		ms[i] = Mat{Rows: rows, Cols: cols, Kind: format.Q4, Q: q[i*per : (i+1)*per],
			Scales: sc[i*rows*ng : (i+1)*rows*ng], Biases: bi[i*rows*ng : (i+1)*rows*ng]}
	}
	return ms, free
}

// benchBuf is benchMem's 1 GiB, written (so that every page is there)
// with bytes that vary.
func benchBuf(b *testing.B) (buf []byte, free func()) {
	buf, free = benchMem(b, 1<<30)
	for i := range buf {
		buf[i] = byte(i)
	}
	return buf, free
}

// BenchmarkMemBW is the memory's read bandwidth with 1 and 2 threads
// (ReadBandwidth over 1 GiB), the bound of BenchmarkQ4DecodeDRAM.
func BenchmarkMemBW(b *testing.B) {
	buf, free := benchBuf(b)
	defer free()
	for _, th := range []int{1, 2} {
		b.Run(fmt.Sprint(th), func(b *testing.B) {
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				readPar(buf, th, readBytes)
			}
		})
	}
}

// BenchmarkMemBWStreams compares the bandwidth reader's four streams a
// thread (readBytes) with one (readAVX2 over the thread's whole share),
// pass by pass on 1 and 2 threads over 1 GiB, which goes first
// alternating: "4streams/1" is the median of the rounds' ratios of bytes
// a second. On the 2-core Zen 5 four streams read 0.99-1.21x as fast as
// one over eleven runs: 1.19-1.21x while the memory read 29 GB/s a thread
// (two streams of a throwaway reader 1.09-1.19x), 0.99-1.02x while it
// read 42. Most likely the more a line waits for memory (other tenants'
// traffic), the more a thread needs in flight, and one stream's prefetch
// runs out first.
func BenchmarkMemBWStreams(b *testing.B) {
	if !useAVX2 {
		b.Skip("no vector reader")
	}
	buf, free := benchBuf(b)
	defer free()
	for _, th := range []int{1, 2} {
		b.Run(fmt.Sprint(th), func(b *testing.B) {
			var n int
			pass := func(read func(p []byte) uint64) time.Duration {
				t0 := time.Now()
				n = readPar(buf, th, read)
				return time.Since(t0)
			}
			one := func(p []byte) uint64 { return readAVX2(&p[0], len(p)/256) }
			ratios, t4 := alternating(b, func() time.Duration { return pass(readBytes) }, func() time.Duration { return pass(one) })
			rates := make([]float64, len(t4))
			for i, t := range t4 {
				rates[i] = float64(n) / t.Seconds() / 1e9
			}
			b.ReportMetric(median(ratios), "4streams/1")
			b.ReportMetric(median(rates), "GB/s")
		})
	}
}

// BenchmarkMemBWPieces is BenchmarkMemBW/2 read the way a decode step
// reads its matrices: pieces of an expert matrix's size (768 KiB: a
// 768×2048 or 2048×768 q4 matrix) and of a whole 30B-A3B record, 2
// threads taking every other piece of 1 GiB (BenchmarkQ4DecodeDRAM's
// whole2), against one contiguous half each. On the 2-core Zen 5 the
// pieces read as fast as the halves (57.8-62.1 and 61.5-64.7 GB/s against
// 60.1-62.4, three runs), so the decode's pattern of reads does not lower
// the bound BenchmarkMemBW sets; the decode kernel's shortfall from it
// (BenchmarkQ4DecodeDRAM) is its own.
func BenchmarkMemBWPieces(b *testing.B) {
	buf, free := benchBuf(b)
	defer free()
	for _, piece := range []int{768 << 10, 2654208} {
		b.Run(fmt.Sprint(piece), func(b *testing.B) {
			n := len(buf) / piece
			b.SetBytes(int64(n * piece))
			var sums [2]uint64
			for b.Loop() {
				inTurns(n, func(t, i int) {
					sums[t] += readBytes(buf[i*piece : (i+1)*piece]) // pieces are whole 256-byte blocks
				})
			}
			readSink.Add(sums[0] + sums[1])
		})
	}
}

// BenchmarkQ4DecodeDRAM runs matrix-vector products at the shapes of a
// 30B-A3B expert (768×2048) and a qwen3.5-35B-A3B one (512×2048) over
// 1 GiB of distinct matrices, row-major and then tiled (TileQ4), so that every
// weight comes from memory: "whole2" gives each of 2 threads whole
// matrices in turn (the routed experts), "whole1" runs them all on one
// thread, the rate one core reaches against BenchmarkMemBW/1 without the
// other core's traffic; bytes/s counts the q4 weights, scales and biases.
func BenchmarkQ4DecodeDRAM(b *testing.B) {
	if !useAVX2 {
		b.Skip("no AVX2")
	}
	// Qwen3's and Qwen3.5's expert shapes, then rows of gpt-oss's 2880
	// and GLM-4.5's 4096 columns: the kernel streams rows of 1 or 2 KB
	// faster than rows of other sizes.
	for _, sh := range [][2]int{{768, 2048}, {2048, 768}, {512, 2048}, {2048, 512}, {2048, 2880}, {2048, 4096}} {
		ms, free := dramMats(b, sh[0], sh[1], 1<<30)
		cols := sh[1]
		x := randVec(rand.New(rand.NewPCG(1, 1)), cols)
		per := int64(len(ms[0].Q) + 4*len(ms[0].Scales))
		name := fmt.Sprintf("%dx%d", sh[0], sh[1])
		benchModes(b, ms, x, per, name, "", q4RowsModes())
		// The same weights tiled (TileQ4).
		var tmp []byte
		for i := range ms {
			tmp = TileQ4(ms[i].Q, ms[i].Rows, ms[i].Cols, tmp)
			ms[i].Tiled = true
		}
		benchModes(b, ms, x, per, name, "-tiled", q4RowsModes())
		free()
	}
}

// BenchmarkQ4DecodeShare is the decode kernel's rate from memory as a
// share of plain reads of the same weights: BenchmarkQ4DecodeDRAM's tiled
// 768×2048 matrices (and 2048×512 ones), the build's kernel variant, whole matrices in turn
// on 1 and 2 threads, each round one pass of the kernel and one of plain
// reads (readBytes over each matrix's weights, the same matrices in the
// same turns), which goes first alternating. On a shared host the
// memory's speed swings by a fifth from one minute to the next, more
// than a kernel change moves it; within a round both passes see about
// the same machine, so "kernel/plain" (the median of the rounds' ratios
// of bytes a second, scales and biases counted for the kernel) measures
// the kernel where separate runs of the two benchmarks could not. Use
// -benchtime Nx for N rounds.
func BenchmarkQ4DecodeShare(b *testing.B) {
	if !useAVX2 {
		b.Skip("no AVX2")
	}
	// 768×2048 is a dense projection's shape (8 KB tiles), 2048×512 a down
	// projection of Qwen3.5-35B-A3B's experts and 2048×768 of
	// Qwen3-30B-A3B's: tiles of 2 and 3 KB, which the software prefetch
	// reaches PFMIN ahead rounded up to whole tiles. 2048×4096 is
	// Qwen3.5's output projections (attention and DeltaNet): tiles of 16
	// KB, which it reaches PFMIN ahead rather than a whole tile.
	//
	// First Qwen3.5-35B-A3B's and Qwen3-30B-A3B's expert shapes
	// row-major ("-rows"), as a streamed pool computes them (the store's
	// layout), where the prefetch walks whole groups of 8 rows (PFMIN
	// ahead, rounded up) and the order of the rows' loads (RDOT8)
	// matters for rows of 320 to 448 bytes.
	shapes := []struct {
		rows, cols int
		tiled      bool
	}{{512, 2048, false}, {2048, 512, false}, {768, 2048, false}, {2048, 768, false}, {768, 2048, true}, {2048, 512, true}, {2048, 768, true}, {2048, 4096, true}}
	for _, sh := range shapes {
		ms, free := dramMats(b, sh.rows, sh.cols, 1<<30)
		name := fmt.Sprintf("%dx%d-rows", sh.rows, sh.cols)
		if sh.tiled {
			var tmp []byte
			for i := range ms {
				tmp = TileQ4(ms[i].Q, sh.rows, sh.cols, tmp)
				ms[i].Tiled = true
			}
			name = fmt.Sprintf("%dx%d", sh.rows, sh.cols)
		}
		x := randVec(rand.New(rand.NewPCG(1, 1)), sh.cols)
		kernelBytes := float64(len(ms) * (len(ms[0].Q) + 4*len(ms[0].Scales)))
		for _, th := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/%d", name, th), func(b *testing.B) {
				benchShare(b, ms, x, kernelBytes, th)
			})
		}
		free()
	}
}

// benchShare reports the decode kernel's rate over ms on th threads (1
// or 2, whole matrices in turn) as a share of plain reads of the same
// matrices' weights, pass by pass (alternating), kernelBytes counting
// what the kernel reads, scales included.
func benchShare(b *testing.B, ms []Mat, x []float32, kernelBytes float64, th int) {
	rows := ms[0].Rows
	plainBytes := float64(len(ms) * len(ms[0].Q))
	var sc [2]Scratch
	outs := [2][]float32{make([]float32, rows), make([]float32, rows)}
	var sums [2]uint64
	each := func(f func(t, i int)) time.Duration {
		t0 := time.Now()
		onThreads(th, len(ms), f)
		return time.Since(t0)
	}
	kernel := func() time.Duration {
		return each(func(t, i int) { sc[t].MatMul(outs[t], &ms[i], x, 1) })
	}
	plain := func() time.Duration {
		return each(func(t, i int) { sums[t] += readBytes(ms[i].Q) })
	}
	shares, tk := alternating(b, kernel, plain)
	rates := make([]float64, len(tk))
	for i, t := range tk {
		shares[i] *= kernelBytes / plainBytes
		rates[i] = kernelBytes / t.Seconds()
	}
	readSink.Add(sums[0] + sums[1])
	b.ReportMetric(median(shares), "kernel/plain")
	b.ReportMetric(median(rates)/1e9, "kernel-GB/s")
}

// alternating runs b's rounds, each a pass of x and a pass of y, which
// goes first alternating, so that the memory's swings from one minute to
// the next fall on both, and returns each round's time of y over x's
// (x's speed as a multiple of y's) and x's times.
func alternating(b *testing.B, x, y func() time.Duration) (ratios []float64, tx []time.Duration) {
	for b.Loop() {
		var dx, dy time.Duration
		if len(ratios)%2 == 0 {
			dx, dy = x(), y()
		} else {
			dy, dx = y(), x()
		}
		ratios = append(ratios, dy.Seconds()/dx.Seconds())
		tx = append(tx, dx)
	}
	return ratios, tx
}

// median returns the median of v (the upper one of an even count),
// reordering v.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// benchModes runs whole2 and whole1 for each of the decode kernel's
// variants in modes, suffix naming the weights' layout.
func benchModes(b *testing.B, ms []Mat, x []float32, per int64, name, suffix string, modes []uint8) {
	for _, mode := range modes {
		b.Run(fmt.Sprintf("whole2/%s/mode%d%s", name, mode, suffix), func(b *testing.B) {
			defer func(m uint8) { q4RowsMode = m }(q4RowsMode)
			q4RowsMode = mode
			benchWhole(b, ms, x, per, 2)
		})
		b.Run(fmt.Sprintf("whole1/%s/mode%d%s", name, mode, suffix), func(b *testing.B) {
			defer func(m uint8) { q4RowsMode = m }(q4RowsMode)
			q4RowsMode = mode
			benchWhole(b, ms, x, per, 1)
		})
	}
}

// benchWhole runs the matrices of ms on threads (1 or 2) threads, each
// taking whole matrices in turn, as the routed experts of a decode step
// run.
func benchWhole(b *testing.B, ms []Mat, x []float32, per int64, threads int) {
	rows := ms[0].Rows
	b.SetBytes(per * int64(len(ms)))
	var sc [2]Scratch
	outs := [2][]float32{make([]float32, rows), make([]float32, rows)}
	for b.Loop() {
		onThreads(threads, len(ms), func(t, i int) { sc[t].MatMul(outs[t], &ms[i], x, 1) })
	}
}

// onThreads runs f(t, i) for i in [0, n): on the calling goroutine (t 0)
// when threads is 1, else on 2 as inTurns does.
func onThreads(threads, n int, f func(t, i int)) {
	if threads == 1 {
		for i := range n {
			f(0, i)
		}
		return
	}
	inTurns(n, f)
}

// inTurns runs f(t, i) for i in [0, n) on 2 goroutines, goroutine t
// taking every other i from t, and waits for both.
func inTurns(n int, f func(t, i int)) {
	var wg sync.WaitGroup
	for t := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := t; i < n; i += 2 {
				f(t, i)
			}
		}()
	}
	wg.Wait()
}

// BenchmarkQ4RowsInCache runs the decode kernel (this CPU's variant, on
// the layout the loaders give it) on 1 and then 2 threads, each on its own
// matrix, small enough to stay in its core's L2 cache: the rate the kernel
// computes at with no wait for memory, which a decode from memory
// (BenchmarkQ4DecodeDRAM) cannot pass. On the 2-core Zen 4 two threads
// computed at 37-64 GB/s (four runs) while plain reads of memory ran at
// 31-35 and, idle, up to 55: there the two cores, not the memory, bound a
// decode whenever other tenants leave the memory idle.
func BenchmarkQ4RowsInCache(b *testing.B) {
	if !useAVX2 {
		b.Skip("no AVX2")
	}
	for _, sh := range [][2]int{{512, 2048}, {2048, 512}} {
		ms, free := dramMats(b, sh[0], sh[1], 1)
		if TiledQ4() {
			for i := range ms {
				TileQ4(ms[i].Q, ms[i].Rows, ms[i].Cols, nil)
				ms[i].Tiled = true
			}
		}
		x := randVec(rand.New(rand.NewPCG(1, 1)), sh[1])
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("%dx%d/threads%d", sh[0], sh[1], threads), func(b *testing.B) {
				b.SetBytes(int64(threads) * int64(len(ms[0].Q)+4*len(ms[0].Scales)))
				n := b.N
				b.ResetTimer()
				var wg sync.WaitGroup
				for t := range threads {
					wg.Add(1)
					go func() {
						defer wg.Done()
						var sc Scratch
						out := make([]float32, ms[t].Rows)
						for range n {
							sc.MatMul(out, &ms[t], x, 1)
						}
					}()
				}
				wg.Wait()
			})
		}
		free()
	}
}

// BenchmarkQ4RowsModes runs the decode kernel's variants on one thread on
// matrices that stay in the L2 cache: the kernel's own speed, without the
// memory's.
func BenchmarkQ4RowsModes(b *testing.B) {
	if !useAVX2 {
		b.Skip("no AVX2")
	}
	for _, sh := range [][2]int{{768, 2048}, {2048, 768}, {512, 2048}, {2048, 512}} {
		ms, free := dramMats(b, sh[0], sh[1], 1)
		m := ms[0]
		x := randVec(rand.New(rand.NewPCG(1, 1)), sh[1])
		out := make([]float32, sh[0])
		run := func(mode uint8, suffix string) {
			b.Run(fmt.Sprintf("%dx%d/mode%d%s", sh[0], sh[1], mode, suffix), func(b *testing.B) {
				defer func(m uint8) { q4RowsMode = m }(q4RowsMode)
				q4RowsMode = mode
				var sc Scratch
				b.SetBytes(int64(len(m.Q) + 4*len(m.Scales)))
				for b.Loop() {
					sc.MatMul(out, &m, x, 1)
				}
			})
		}
		for _, mode := range q4RowsModes() {
			run(mode, "")
		}
		// The same matrix tiled (TileQ4).
		m.Q = append([]byte(nil), m.Q...)
		TileQ4(m.Q, m.Rows, m.Cols, nil)
		m.Tiled = true
		for _, mode := range q4RowsModes() {
			run(mode, "-tiled")
		}
		free()
	}
}

// BenchmarkMXFP4DecodeDRAM is BenchmarkQ4DecodeDRAM for MXFP4 weights
// (gpt-oss's experts: 2880×2880, gate, up and down alike) over 1 GiB of
// distinct matrices, row-major (16 rows at a time where mxfp4Rows16 runs,
// then the row kernel alone) and then tiled (TileMXFP4); bytes/s counts
// the codes and the scale bytes.
func BenchmarkMXFP4DecodeDRAM(b *testing.B) {
	const rows, cols = 2880, 2880
	vb, _ := format.MXFP4.Sizes(rows, cols)
	n := max(int((1<<30)/vb), 2)
	buf, free := benchMem(b, n*int(vb))
	defer free()
	r := rand.New(rand.NewPCG(7, 8))
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	ms := make([]Mat, n)
	for i := range ms {
		q := buf[i*int(vb) : (i+1)*int(vb)]
		for j := rows * cols / 2; j < len(q); j++ {
			q[j] = 118 + q[j]%4 // scales near 2^-10, as trained weights have
		}
		tn := format.Tensor{Name: "w", Kind: format.MXFP4, Shape: []int{rows, cols}, Size: vb}
		m, err := MatFrom(q, &tn)
		if err != nil {
			b.Fatal(err)
		}
		ms[i] = m
	}
	x := randVec(rand.New(rand.NewPCG(1, 1)), cols)
	b.Run("whole2", func(b *testing.B) { benchWhole(b, ms, x, vb, 2) })
	b.Run("whole1", func(b *testing.B) { benchWhole(b, ms, x, vb, 1) })
	mxRows16 = false // the row kernel alone
	b.Run("whole2-row", func(b *testing.B) { benchWhole(b, ms, x, vb, 2) })
	b.Run("whole1-row", func(b *testing.B) { benchWhole(b, ms, x, vb, 1) })
	mxRows16 = true
	if !TiledMXFP4() {
		return
	}
	var tmp []byte
	for i := range ms {
		tmp = TileMXFP4(ms[i].Q, ms[i].E8, rows, cols, tmp)
		ms[i].Tiled = true
	}
	b.Run("whole2-tiled", func(b *testing.B) { benchWhole(b, ms, x, vb, 2) })
	b.Run("whole1-tiled", func(b *testing.B) { benchWhole(b, ms, x, vb, 1) })
	// The tiled kernel against plain reads of the same codes, pass by
	// pass, as BenchmarkQ4DecodeShare.
	for _, th := range []int{1, 2} {
		b.Run(fmt.Sprintf("share%d-tiled", th), func(b *testing.B) { benchShare(b, ms, x, float64(len(ms))*float64(vb), th) })
	}
}

// TestReadBytes: the bandwidth reader, its four streams and the blocks
// past them, sums every word of its bytes once, as uint64s.
func TestReadBytes(t *testing.T) {
	if !useAVX2 {
		t.Skip("no vector reader: readGo samples the words")
	}
	r := rand.New(rand.NewPCG(103, 104))
	b := make([]byte, 1<<20+768)
	for i := range b {
		b[i] = byte(r.IntN(256))
	}
	// Whole quarters and a tail past them, and lengths with no whole
	// quarter of 256-byte blocks: every word once, whatever the split.
	for _, n := range []int{256, 768, 1024, 1280, 4096, 4096 + 768, 1 << 20, len(b)} {
		var want uint64
		for i := 0; i < n; i += 8 {
			want += binary.LittleEndian.Uint64(b[i:])
		}
		if got := readBytes(b[:n]); got != want {
			t.Errorf("%d bytes: %#x, want %#x", n, got, want)
		}
	}
}

// TestReadBandwidth: a buffer too small for one 256-byte share per thread
// measures nothing, and a read too fast for the clock (1 MiB, where
// Windows' timer under emulation ticks in milliseconds) gives 0 rather
// than an infinite rate; thread counts below 1 are taken as 1, and 64 MiB
// takes long enough to time anywhere but there.
func TestReadBandwidth(t *testing.T) {
	if bw := ReadBandwidth(make([]byte, 511), 2, 1); bw != 0 {
		t.Errorf("511 bytes on 2 threads: %v, want 0", bw)
	}
	buf := make([]byte, 1<<20)
	for _, th := range []int{0, 1, 2, 3} {
		if bw := ReadBandwidth(buf, th, 2); math.IsInf(bw, 0) || math.IsNaN(bw) || bw < 0 {
			t.Errorf("1 MiB on %d threads: %v bytes/s", th, bw)
		}
	}
	if bw := ReadBandwidth(make([]byte, 64<<20), 2, 1); !(bw > 0) && runtime.GOOS != "windows" {
		t.Errorf("64 MiB on 2 threads: %v bytes/s", bw)
	}
}

// BenchmarkQ4DecodePairs runs a decode's products of tiled q4 matrices
// with and without pairs of row ranges (q4RowsPairs), pass by pass over
// 1 GiB of distinct weights, which goes first alternating: "experts",
// 30B-A3B-shaped experts (768×2048 gate and up, paired with each other,
// then the 2048×768 down projection, its halves paired), whole experts on
// 2 threads in turn, and "experts-crew" the same 8 experts a dispatch on
// a pool whose threads share their last rows as a decode's MoE step
// does; "dense", 4096×2048
// matrices (an attention projection) split across a pool of 2 threads,
// each part's halves paired. "pairs/single" is the median of the rounds'
// ratios of bytes a second. The pairs run whether or not the build's
// mode asks for them (SLUICE_Q4PAIRS).
func BenchmarkQ4DecodePairs(b *testing.B) {
	if !useAVX2 || !q4PairMode(q4RowsMode|q4RowsTiled) {
		b.Skip("no paired decode kernel on this CPU")
	}
	defer func(m uint8) { q4RowsMode = m }(q4RowsMode)
	paired := q4RowsMode | q4RowsPairs
	single := q4RowsMode &^ q4RowsPairs
	tile := func(ms []Mat) {
		var tmp []byte
		for i := range ms {
			tmp = TileQ4(ms[i].Q, ms[i].Rows, ms[i].Cols, tmp)
			ms[i].Tiled = true
		}
	}
	rounds := func(b *testing.B, pass func() time.Duration) {
		var ratios []float64
		for b.Loop() {
			var ts, tp time.Duration
			if len(ratios)%2 == 0 {
				q4RowsMode = single
				ts = pass()
				q4RowsMode = paired
				tp = pass()
			} else {
				q4RowsMode = paired
				tp = pass()
				q4RowsMode = single
				ts = pass()
			}
			ratios = append(ratios, ts.Seconds()/tp.Seconds())
		}
		b.ReportMetric(median(ratios), "pairs/single")
	}
	ups, free1 := dramMats(b, 768, 2048, 2<<28) // gate and up
	downs, free2 := dramMats(b, 2048, 768, 1<<28)
	defer free1()
	defer free2()
	tile(ups)
	tile(downs)
	n := min(len(ups)/2, len(downs))
	x := randVec(rand.New(rand.NewPCG(1, 1)), 2048)
	b.Run("experts", func(b *testing.B) {
		var sc [2]Scratch
		g := [2][]float32{make([]float32, 768), make([]float32, 768)}
		u := [2][]float32{make([]float32, 768), make([]float32, 768)}
		o := [2][]float32{make([]float32, 2048), make([]float32, 2048)}
		rounds(b, func() time.Duration {
			t0 := time.Now()
			inTurns(n, func(t, i int) {
				sc[t].MatMul2(g[t], &ups[2*i], u[t], &ups[2*i+1], x, 1)
				sc[t].MatMul(o[t], &downs[i], x[:768], 1)
			})
			return time.Since(t0)
		})
	})
	b.Run("experts-crew", func(b *testing.B) {
		p := NewPool(2)
		defer p.Close()
		task := &pairExperts{p: p, ups: ups, downs: downs, n: n, x: x}
		for i := range task.sc {
			task.sc[i].Join(p.Crew(), i)
		}
		rounds(b, func() time.Duration {
			t0 := time.Now()
			for j := 0; j < n; j += 8 {
				task.lo, task.hi = j, min(j+8, n)
				task.next.Store(0)
				p.ParallelCrew(2, 1, task)
			}
			return time.Since(t0)
		})
	})
	b.Run("dense", func(b *testing.B) {
		ms, free := dramMats(b, 4096, 2048, 1<<30)
		defer free()
		tile(ms)
		p := NewPool(2)
		defer p.Close()
		out := make([]float32, 4096)
		rounds(b, func() time.Duration {
			t0 := time.Now()
			for i := range ms {
				p.MatMul(out, &ms[i], x, 1)
			}
			return time.Since(t0)
		})
	})
}

// pairExperts runs experts [lo,hi) of BenchmarkQ4DecodePairs's on a
// pool's threads as a decode's MoE step does (model's moeTask): whole
// experts, each thread its own Scratch joined to the crew, then helping
// the other with its last rows.
type pairExperts struct {
	p          *Pool
	ups, downs []Mat
	n          int
	x          []float32
	sc         [2]Scratch
	g, u, o    [2][2048]float32
	lo, hi     int
	next       atomic.Int32
}

func (t *pairExperts) Run(lo, hi int) {
	th := lo
	defer t.p.Crew().Done(th, t.sc[th].Rooms())
	for {
		j := t.lo + int(t.next.Add(1)) - 1
		if j >= t.hi {
			return
		}
		t.sc[th].MatMul2(t.g[th][:768], &t.ups[2*j], t.u[th][:768], &t.ups[2*j+1], t.x, 1)
		t.sc[th].MatMul(t.o[th][:], &t.downs[j], t.x[:768], 1)
	}
}
