//go:build linux

package cuda

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ptxFS holds the kernels compiled by scripts/gpu-ptx.sh.
//
//go:embed kernels/*.ptx
var ptxFS embed.FS

// srcFS holds the kernel sources, for the freshness check of the PTX.
//
//go:embed kernels/*.cu kernels/*.cuh
var srcFS embed.FS

// modules are the PTX files, one module each.
var modules = []string{"matvec", "ops", "attn", "delta", "fwd", "mla"}

// SourcesHash is the sha256 of the kernel sources (.cu and .cuh files in
// name order, concatenated) as scripts/gpu-ptx.sh computes it.
func SourcesHash() string {
	var names []string
	fs.WalkDir(srcFS, "kernels", func(p string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			names = append(names, p)
		}
		return nil
	})
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, _ := srcFS.ReadFile(n)
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ptxHash is the sources hash a PTX file was generated from (its first
// line), or "".
func ptxHash(ptx []byte) string {
	line, _, _ := strings.Cut(string(ptx), "\n")
	h, ok := strings.CutPrefix(line, "// sluice-sources-sha256: ")
	if !ok {
		return ""
	}
	return strings.TrimSpace(h)
}

// PTX returns the embedded PTX of module name: with pdl the sm_90 set,
// whose kernels open with PDL_ENTRY, else the sm_80 one. With
// $SLUICE_PTX_DIR set it reads the file from that directory instead: the
// GPU test script uses this to test kernels compiled in the same run,
// before they are committed.
func PTX(name string, pdl bool) ([]byte, error) {
	file := name + ".ptx"
	if pdl {
		file = name + ".sm90.ptx"
	}
	if dir := os.Getenv("SLUICE_PTX_DIR"); dir != "" {
		return os.ReadFile(filepath.Join(dir, file))
	}
	return ptxFS.ReadFile("kernels/" + file)
}

// UsePDL reports whether kernels on a device of compute capability major
// launch with programmatic dependent launch: on Hopper (9) and later,
// unless $SLUICE_PDL is 0 (which gives the sm_80 kernels and plain
// launches, for comparison).
func UsePDL(major int) bool { return major >= 9 && os.Getenv("SLUICE_PDL") != "0" }

// Kernels are sluice's GPU kernels, loaded into one device. The launch
// methods queue work on a stream and, like every Device method, must be
// called from inside Device.Do. Device addresses are passed as uintptr; the
// shapes are checked against nothing but themselves, so the caller (the
// backend) owns the buffers' sizes.
type Kernels struct {
	d    *Device
	mods []*Module
	f    map[string]Func
	// PDL: the kernels launch with programmatic dependent launch (UsePDL).
	PDL bool
	// Load has each module's load time (a JIT compile, or a hit in the
	// driver's JIT cache).
	Load []ModuleLoad
}

// ModuleLoad is one module's load time.
type ModuleLoad struct {
	Name string
	Mod  *Module
}

// LoadKernels loads every module and looks up every kernel. Modules load
// eagerly (Open sets CUDA_MODULE_LOADING=EAGER before cuInit), so no first
// launch later waits for a compile.
func LoadKernels(d *Device) (*Kernels, error) {
	k := &Kernels{d: d, f: map[string]Func{}, PDL: UsePDL(d.Major)}
	names := map[string][]string{
		"matvec": {"prep_x", "q4_mv", "q4_mv2", "q4_mm8", "q4_mma", "q4_gemm32", "q4_gemm64", "q3_mv", "q3_mm8", "q2_mv", "q2_mm8", "q8_mv", "q8_mm8", "bf16_mv", "bf16_mm8", "q4_ex", "q8_ex", "bf16_ex"},
		"ops":    {"rmsnorm", "rmsnorm_block", "rope", "swiglu", "route", "route_groups", "route_topk", "clamped_swiglu", "add_rows", "add_ex", "argmax", "dn_qk_norm", "dn_gates"},
		"attn":   {"attend_part", "attend_combine"},
		"delta":  {"dn_conv", "dn_rule32", "dn_rule64", "dn_rule128", "bench_empty"},
		"fwd":    {"f32_mv", "head_f32", "copy_rows", "gather_rows", "moe_combine", "kv_append"},
		"mla":    {"layer_norm", "index_scores", "index_select", "mla_attend_part", "mla_attend_wide"},
	}
	for _, m := range modules {
		ptx, err := PTX(m, k.PDL)
		if err != nil {
			return nil, fmt.Errorf("cuda: kernels %s: %v", m, err)
		}
		if ptxHash(ptx) == "none" {
			return nil, fmt.Errorf("cuda: kernels %s: placeholder PTX; run scripts/gpu-ptx.sh", m)
		}
		mod, err := d.LoadPTX(ptx)
		if err != nil {
			return nil, fmt.Errorf("cuda: kernels %s: %w", m, err)
		}
		k.mods = append(k.mods, mod)
		k.Load = append(k.Load, ModuleLoad{m, mod})
		for _, n := range names[m] {
			f, err := d.Func(mod, n)
			if err != nil {
				return nil, err
			}
			f.pdl = k.PDL
			k.f[n] = f
		}
	}
	for _, bn := range []int{32, 64} {
		if err := d.SetMaxDynamicShared(k.f[gemmName(bn)], gemmShared(bn)); err != nil {
			return nil, fmt.Errorf("cuda: kernel %s: %w", gemmName(bn), err)
		}
	}
	return k, nil
}

// Close unloads the modules.
func (k *Kernels) Close() error {
	var err error
	for _, m := range k.mods {
		if e := k.d.Unload(m); err == nil {
			err = e
		}
	}
	return err
}

func ceil(a, b int) int { return (a + b - 1) / b }

// Q4 is a q4 matrix on the device: [Rows][Cols] packed as format.Q4
// (Cols/2 bytes per row), with half-precision Scales and Biases
// [Rows][Cols/64] (format 3).
type Q4 struct {
	Rows, Cols        int
	Q, Scales, Biases uintptr
}

// Acts are the prepared activations of nb rows of Cols floats for
// quantised products: X8 int8 [nb][Cols] and XS float32 [nb][Cols/64] (q4
// only), XSum float32 [nb][Cols/64].
type Acts struct {
	X, X8, XS, XSum uintptr
	Rows, Cols      int
}

// PrepQ4 computes the group sums, int8 activations and scales of a's rows
// (X8 and XS are skipped when zero, as a q8 product needs only XSum).
func (k *Kernels) PrepQ4(s Stream, a Acts) error {
	if a.Cols%64 != 0 {
		return fmt.Errorf("cuda: activations of %d columns, want a multiple of 64", a.Cols)
	}
	total := a.Rows * a.Cols / 64
	return k.d.Launch(k.f["prep_x"], Dim3{ceil(total, 128), 1, 1}, Dim3{128, 1, 1}, 0, s,
		P(a.X), P(a.X8), P(a.XS), P(a.XSum), I(a.Cols), I(total))
}

// MatQ4 computes out = W·x for a.Rows rows whose activations PrepQ4
// prepared: out is float32 [a.Rows][w.Rows]. Bits match
// kernels.Scratch.MatMul's q4 path, and are the same for every a.Rows.
//
// The kernel is chosen by size, which is allowed because all of them give
// the same bits: q4_mv2 for one row; for more, once the product has at
// least 64K outputs (fewer leave the tensor cores' warps too little to
// hide their latency; measured on the H200, NOTES.md), the tiled
// q4_gemm for more than gemmMinRows rows where the columns are whole
// stages of 128, else q4_mma; below that q4_mm8.
func (k *Kernels) MatQ4(s Stream, out uintptr, w Q4, a Acts) error {
	if w.Cols != a.Cols || w.Cols%64 != 0 {
		return fmt.Errorf("cuda: q4 product of [%d %d] with %d columns", w.Rows, w.Cols, a.Cols)
	}
	if a.Rows > 1 && a.Rows*w.Rows >= 1<<16 {
		if a.Rows > gemmMinRows && GemmCols(a.Cols) {
			return k.MatQ4Tiled(s, out, w, a, GemmRows(a.Rows))
		}
		return k.MatQ4MMA(s, out, w, a)
	}
	f, R := k.f["q4_mv2"], 1
	if a.Rows > 1 {
		f, R = k.f["q4_mm8"], 8
	}
	return k.d.Launch(f, Dim3{ceil(w.Rows, 8), ceil(a.Rows, R), 1}, Dim3{256, 1, 1}, 0, s,
		P(w.Q), P(w.Scales), P(w.Biases), P(a.X8), P(a.XS), P(a.XSum), P(out), I(w.Rows), I(w.Cols), I(a.Rows))
}

// MatQ4Rows is MatQ4 with the kernel forced: r = 1 for the one-row
// kernel, 2 for its variant with fewer loads in flight and more warps, 8
// for the eight-row one, 32 and 64 for the tiled one with tiles of that
// many rows (tests and benchmarks compare them).
func (k *Kernels) MatQ4Rows(s Stream, out uintptr, w Q4, a Acts, r int) error {
	f := k.f["q4_mv"]
	switch r {
	case 32, 64:
		return k.MatQ4Tiled(s, out, w, a, r)
	case 2:
		f, r = k.f["q4_mv2"], 1
	case 8:
		f = k.f["q4_mm8"]
	}
	return k.d.Launch(f, Dim3{ceil(w.Rows, 8), ceil(a.Rows, r), 1}, Dim3{256, 1, 1}, 0, s,
		P(w.Q), P(w.Scales), P(w.Biases), P(a.X8), P(a.XS), P(a.XSum), P(out), I(w.Rows), I(w.Cols), I(a.Rows))
}

// MatQ4MMA is MatQ4 on int8 tensor cores (mma m16n8k32): the same bits,
// tiles of 16 outputs by 8 activation rows.
func (k *Kernels) MatQ4MMA(s Stream, out uintptr, w Q4, a Acts) error {
	if w.Cols != a.Cols || w.Cols%64 != 0 {
		return fmt.Errorf("cuda: q4 product of [%d %d] with %d columns", w.Rows, w.Cols, a.Cols)
	}
	return k.d.Launch(k.f["q4_mma"], Dim3{ceil(w.Rows, 64), ceil(a.Rows, 8), 1}, Dim3{128, 1, 1}, 0, s,
		P(w.Q), P(w.Scales), P(w.Biases), P(a.X8), P(a.XS), P(a.XSum), P(out), I(w.Rows), I(w.Cols), I(a.Rows))
}

// The tiled tensor-core q4 product (q4_gemm32, q4_gemm64 in matvec.cu):
// blocks of gemmM outputs by 32 or 64 activation rows, a ring of
// gemmStages stages of two groups each in dynamic shared memory.
const (
	gemmM      = 128
	gemmStages = 3
)

// gemmMinRows is the most activation rows MatQ4 leaves to q4_mma: on the
// H200 at 8 rows q4_mma took 55.1 µs for the gate and up of 10 experts
// ([20480 4096]) against 60.4 for q4_gemm32, and 19.8 against 34.0 for
// their down ([40960 1024]); at 32 rows 197.7 against 55.5 and 71.5
// against 21.1 (TestGPUBench, NOTES.md).
const gemmMinRows = 8

// gemmName is the tiled kernel for tiles of bn activation rows.
func gemmName(bn int) string { return fmt.Sprintf("q4_gemm%d", bn) }

// gemmShared is its dynamic shared memory: gemm_stage_bytes(bn) a stage.
func gemmShared(bn int) int { return gemmStages * (gemmM*96 + bn*160 + gemmM*8 + bn*16) }

// GemmRows is the tile height the tiled product takes for products of
// about rows activation rows a matrix: 32 up to 32 rows, else 64.
func GemmRows(rows int) int {
	if rows <= 32 {
		return 32
	}
	return 64
}

// GemmCols reports whether the tiled product takes C columns: whole
// stages of two groups of 64.
func GemmCols(C int) bool { return C > 0 && C%128 == 0 }

// gemm launches the tiled product in one of its modes (matvec.cu's
// q4_gemm): tiles != 0 grouped (nt tiles), heads > 0 a head at a time,
// else plain W·x over a.Rows rows.
func (k *Kernels) gemm(s Stream, out uintptr, w Q4, a Acts, tab, tiles uintptr, nt, bn, heads int) error {
	if !GemmCols(a.Cols) || (w.Cols != 0 && w.Cols != a.Cols) {
		return fmt.Errorf("cuda: tiled q4 product of [%d %d] with %d columns (want a multiple of 128)", w.Rows, w.Cols, a.Cols)
	}
	if bn != 32 && bn != 64 {
		return fmt.Errorf("cuda: tiled q4 product with tiles of %d rows", bn)
	}
	grid := Dim3{nt, ceil(w.Rows, gemmM), 1}
	if grid.Y > 65535 {
		return fmt.Errorf("cuda: tiled q4 product of %d outputs", w.Rows)
	}
	return k.d.Launch(k.f[gemmName(bn)], grid, Dim3{256, 1, 1}, gemmShared(bn), s,
		P(tab), P(tiles), P(w.Q), P(w.Scales), P(w.Biases), P(a.X8), P(a.XS), P(a.XSum), P(out),
		I(w.Rows), I(a.Cols), I(a.Rows), I(heads))
}

// MatQ4Tiled is MatQ4 through the tiled tensor-core kernel, tiles of bn
// (32 or 64) rows: the same bits. w.Cols must be a multiple of 128.
func (k *Kernels) MatQ4Tiled(s Stream, out uintptr, w Q4, a Acts, bn int) error {
	return k.gemm(s, out, w, a, 0, 0, ceil(a.Rows, bn), bn, 0)
}

// Tile is one block's rows in a grouped tiled product: matrix E of the
// address table, activation rows First + j·Step for j < Rows (Rows at
// most the launch's tile height), each product written to the same row of
// out.
type Tile struct{ E, First, Rows, Step int32 }

// MatQ4Groups computes the grouped products of a prefill chunk's
// experts in one launch: for each of the nt tiles at tiles (device
// []Tile), out row r = W_E·x row r for the tile's rows, W_E at tab[3E..]
// (codes, scales, biases, as MatEx's tables), every matrix [O][a.Cols].
// The bits are MatQ4's.
func (k *Kernels) MatQ4Groups(s Stream, out, tab, tiles uintptr, nt, bn, O int, a Acts) error {
	if nt == 0 {
		return nil
	}
	return k.gemm(s, out, Q4{Rows: O}, a, tab, tiles, nt, bn, 0)
}

// MatQ4Heads computes W a head at a time over nb token rows: activation
// row i·heads+h (a.Rows = nb·heads) times head h's [O][a.Cols] rows at
// tab[3h..] (HeadTab) into out row i·heads+h, as MatEx with one slot a
// (row, head) computes it: the same bits.
func (k *Kernels) MatQ4Heads(s Stream, out, tab uintptr, heads, O int, a Acts, bn int) error {
	if heads <= 0 || a.Rows%heads != 0 {
		return fmt.Errorf("cuda: %d rows a head at a time over %d heads", a.Rows, heads)
	}
	nb := a.Rows / heads
	b := a
	b.Rows = nb
	return k.gemm(s, out, Q4{Rows: O}, b, tab, 0, heads*ceil(nb, bn), bn, heads)
}

// MatLow computes out = W·x for a low-bit matrix of bits 3 or 2
// (format.Q3, format.Q2: the Q4 struct's fields, Cols·bits/8 bytes per
// row) and a.Rows rows that PrepQ4 prepared. The bits are MatQ4's on the
// matrix widened to q4, for every a.Rows.
func (k *Kernels) MatLow(s Stream, out uintptr, w Q4, a Acts, bits int) error {
	if w.Cols != a.Cols || w.Cols%64 != 0 {
		return fmt.Errorf("cuda: q%d product of [%d %d] with %d columns", bits, w.Rows, w.Cols, a.Cols)
	}
	var f Func
	R := 1
	switch {
	case bits == 3 && a.Rows == 1:
		f = k.f["q3_mv"]
	case bits == 3:
		f, R = k.f["q3_mm8"], 8
	case bits == 2 && a.Rows == 1:
		f = k.f["q2_mv"]
	case bits == 2:
		f, R = k.f["q2_mm8"], 8
	default:
		return fmt.Errorf("cuda: no %d-bit product (want 3 or 2)", bits)
	}
	return k.d.Launch(f, Dim3{ceil(w.Rows, 8), ceil(a.Rows, R), 1}, Dim3{256, 1, 1}, 0, s,
		P(w.Q), P(w.Scales), P(w.Biases), P(a.X8), P(a.XS), P(a.XSum), P(out), I(w.Rows), I(w.Cols), I(a.Rows))
}

// MatQ8 computes out = W·x for a q8 matrix (the Q4 struct's fields with
// one byte per weight); a needs X and XSum (PrepQ4 with X8 zero).
func (k *Kernels) MatQ8(s Stream, out uintptr, w Q4, a Acts) error {
	if w.Cols != a.Cols || w.Cols%64 != 0 {
		return fmt.Errorf("cuda: q8 product of [%d %d] with %d columns", w.Rows, w.Cols, a.Cols)
	}
	f, R := k.f["q8_mv"], 1
	if a.Rows > 1 {
		f, R = k.f["q8_mm8"], 8
	}
	return k.d.Launch(f, Dim3{ceil(w.Rows, 8), ceil(a.Rows, R), 1}, Dim3{256, 1, 1}, 0, s,
		P(w.Q), P(w.Scales), P(w.Biases), P(a.X), P(a.XSum), P(out), I(w.Rows), I(w.Cols), I(a.Rows))
}

// MatBF16 computes out = W·x for a bf16 matrix w ([rows][cols] uint16)
// and nb rows of x; cols must be a multiple of 8.
func (k *Kernels) MatBF16(s Stream, out, w uintptr, rows, cols int, x uintptr, nb int) error {
	if cols%8 != 0 {
		return fmt.Errorf("cuda: bf16 product with %d columns, want a multiple of 8", cols)
	}
	f, R := k.f["bf16_mv"], 1
	if nb > 1 {
		f, R = k.f["bf16_mm8"], 8
	}
	return k.d.Launch(f, Dim3{ceil(rows, 8), ceil(nb, R), 1}, Dim3{256, 1, 1}, 0, s,
		P(w), P(x), P(out), I(rows), I(cols), I(nb))
}

// RMSNorm normalises rows rows of n floats, stride apart: x += add (add may
// be 0), then dst = x/rms(x)·w, or ·(1+w) when zeroCentred. Bits match
// kernels.Add then kernels.RMSNorm.
func (k *Kernels) RMSNorm(s Stream, dst, x, add, w uintptr, rows, n, stride int, eps float32, zeroCentred bool) error {
	zc := 0
	if zeroCentred {
		zc = 1
	}
	if n >= normBlockMin && 4*n <= normBlockMax {
		return k.d.Launch(k.f["rmsnorm_block"], Dim3{rows, 1, 1}, Dim3{256, 1, 1}, 4*n, s,
			P(dst), P(x), P(add), P(w), I(n), I(stride), F(eps), I(zc))
	}
	return k.d.Launch(k.f["rmsnorm"], Dim3{ceil(rows, 8), 1, 1}, Dim3{256, 1, 1}, 0, s,
		P(dst), P(x), P(add), P(w), I(rows), I(n), I(stride), F(eps), I(zc))
}

// normBlockMin is the shortest row RMSNorm gives a block (rmsnorm_block)
// rather than a warp; normBlockMax is the most bytes of a row that block
// holds in shared memory (48 KiB: no opt-in needed). Both kernels give the
// same bits; the bench sets normBlockMin to time each.
var normBlockMin = 1024

const normBlockMax = 48 << 10

// Rope rotates the first 2·rh dims of nh head vectors in each of nb rows
// (vector (r, h) at x + 4·(r·rowStride + h·headStride) bytes) by the
// host-computed tables cos, sin [nb][rh]. Bits match kernels.Rope.
func (k *Kernels) Rope(s Stream, x, cos, sin uintptr, nb, nh, rowStride, headStride, rh int) error {
	n := nb * nh * rh
	return k.d.Launch(k.f["rope"], Dim3{ceil(n, 256), 1, 1}, Dim3{256, 1, 1}, 0, s,
		P(x), P(cos), P(sin), I(nb), I(nh), I(rowStride), I(headStride), I(rh))
}

// SwiGLU sets dst = silu(gate)·up over n floats (kernels.SwiGLU's bits).
func (k *Kernels) SwiGLU(s Stream, dst, gate, up uintptr, n int) error {
	return k.d.Launch(k.f["swiglu"], Dim3{ceil(n, 256), 1, 1}, Dim3{256, 1, 1}, 0, s, P(dst), P(gate), P(up), I(n))
}

// Route takes the softmax of nb rows of E router logits into probs (may
// be logits) and the top-k experts of each row into ids (int32 [nb][k])
// and w ([nb][k]), renormalised when norm: kernels.Softmax then
// model.Route, bit for bit. k is at most 32.
func (k *Kernels) Route(s Stream, logits, probs, ids, w uintptr, nb, E, topK int, norm bool) error {
	if topK < 1 || topK > 32 || topK > E {
		return fmt.Errorf("cuda: route top-%d of %d experts (at most 32)", topK, E)
	}
	nm := 0
	if norm {
		nm = 1
	}
	return k.d.Launch(k.f["route"], Dim3{ceil(nb, 8), 1, 1}, Dim3{256, 1, 1}, 0, s,
		P(logits), P(probs), P(ids), P(w), I(nb), I(E), I(topK), I(nm))
}

// Groups is DeepSeek-V3's router (block.SigmoidGroups) for RouteGroups.
type Groups struct {
	Corr        uintptr // the correction bias [E], added for the choice only
	Groups, Top int     // the groups the experts split into, and how many stay
	Norm        bool    // the weights divided by their sum
	Scale       float32 // the weights' final factor
}

// RouteGroups takes the sigmoid of nb rows of E router logits into probs
// (may be logits) and each row's top-k experts under g into ids (int32
// [nb][k]) and w ([nb][k]): model.RouteGroups, bit for bit. k is at most
// 32, E at most 1024, the groups at most 64.
func (k *Kernels) RouteGroups(s Stream, logits, probs, ids, w uintptr, nb, E, topK int, g Groups) error {
	switch {
	case topK < 1 || topK > 32 || topK > E:
		return fmt.Errorf("cuda: route top-%d of %d experts (at most 32)", topK, E)
	case E > 1024:
		return fmt.Errorf("cuda: grouped routing over %d experts (at most 1024)", E)
	case g.Groups < 1 || g.Groups > 64 || E%g.Groups != 0 || g.Top < 1 || g.Top > g.Groups:
		return fmt.Errorf("cuda: %d of %d groups over %d experts", g.Top, g.Groups, E)
	}
	nm := 0
	if g.Norm {
		nm = 1
	}
	return k.d.Launch(k.f["route_groups"], Dim3{ceil(nb, 8), 1, 1}, Dim3{256, 1, 1}, 0, s,
		P(logits), P(probs), P(g.Corr), P(ids), P(w), I(nb), I(E), I(topK), I(g.Groups), I(g.Top), I(nm), F(g.Scale))
}

// RouteTopK writes each of nb rows' top-k of E logits into ids (int32
// [nb][k]) and the softmax over those k into w ([nb][k]): gpt-oss's router
// (block.TopKSoftmax), model.Route then kernels.Softmax bit for bit. k is
// at most 32, E at most 1024.
func (k *Kernels) RouteTopK(s Stream, logits, ids, w uintptr, nb, E, topK int) error {
	if topK < 1 || topK > 32 || topK > E || E > 1024 {
		return fmt.Errorf("cuda: route top-%d of %d experts (at most 32 of 1024)", topK, E)
	}
	return k.d.Launch(k.f["route_topk"], Dim3{ceil(nb, 8), 1, 1}, Dim3{256, 1, 1}, 0, s,
		P(logits), P(ids), P(w), I(nb), I(E), I(topK))
}

// ClampedSwiGLU sets dst = gpt-oss's activation of gate and up over n
// floats (kernels.ClampedSwiGLU's bits).
func (k *Kernels) ClampedSwiGLU(s Stream, dst, gate, up uintptr, n int) error {
	return k.d.Launch(k.f["clamped_swiglu"], Dim3{ceil(n, 256), 1, 1}, Dim3{256, 1, 1}, 0, s, P(dst), P(gate), P(up), I(n))
}

// AddEx adds, to each of nk rows of out (O floats), the bias of its slot's
// expert: the vector at tab[ids[k]][which] (tab [E+1][3] uint64 device
// addresses, 0 for none), with AddRows' bits. A recorded step's expert
// biases.
func (k *Kernels) AddEx(s Stream, out, tab, ids uintptr, which, O, nk int) error {
	return k.d.Launch(k.f["add_ex"], Dim3{ceil(nk*O, 256), 1, 1}, Dim3{256, 1, 1}, 0, s,
		P(out), P(tab), P(ids), I(which), I(O), I(nk))
}

// AddRows adds b (n floats) to each of rows rows of x: a projection's
// bias, with kernels.Add's bits.
func (k *Kernels) AddRows(s Stream, x, b uintptr, rows, n int) error {
	return k.d.Launch(k.f["add_rows"], Dim3{ceil(rows*n, 256), 1, 1}, Dim3{256, 1, 1}, 0, s, P(x), P(b), I(rows), I(n))
}

// Argmax writes, for each of nb rows of V floats, the index of the largest
// (lowest index on ties) as int32 into out.
func (k *Kernels) Argmax(s Stream, x, out uintptr, nb, V int) error {
	return k.d.Launch(k.f["argmax"], Dim3{nb, 1, 1}, Dim3{1024, 1, 1}, 0, s, P(x), P(out), I(V))
}

// Attn describes one attention call: nb query rows at positions pos..,
// nh query heads of hd dims over nkv cache heads.
type Attn struct {
	Pos, Rows, Heads, KVHeads, HeadDim int
	QRow, QHead, ORow                  int // strides in floats
	Scale                              float32
	Gated                              bool // the head's output gate follows its query (QHead = 2·HeadDim)
	// Window > 0 attends to the last Window positions only (the row's own
	// included); Ring > 0 is a cache of Ring rows holding position j at
	// row j % Ring (at least Window + Rows; a ring needs a window, so a
	// chunk's positions wrap at most once); Sinks, when set, is a device
	// float per head that joins each softmax with no value.
	Window, Ring int
	Sinks        uintptr
	// VDim, when set, is the values' dims where they are the first VDim
	// of the key's HeadDim (DeepSeek's latent: vc = kc); the output has
	// VDim floats a head. Sel, when set, is the device int32 [Rows][TopK]
	// of the positions each row attends to, ascending (the indexer's
	// choice: min(n, TopK) of them for a row of n positions).
	VDim int
	Sel  uintptr
	TopK int
	// PosDev, when set, is a device int32 holding Pos, read by the
	// kernels (a step recorded once and replayed at any position); the
	// grid then covers MaxPos positions.
	PosDev uintptr
	MaxPos int
	// Scratch is the bytes of the scratch passed (0: AttendScratch(a)).
	// Where it holds fewer rows' parts than a.Rows, the rows are taken a
	// group at a time; a row's bits do not depend on its group.
	Scratch int
}

// attChunk is the kernels' ATT_CHUNK: positions per partial block.
const attChunk = 256

// AttendScratch is the scratch Attend needs for a in one launch, in
// bytes: per (row, head, chunk of 256 positions) VDim+2 floats.
func AttendScratch(a Attn) int {
	return a.Rows * a.rowParts()
}

// AttendScratchMax is what AttendScratchFor keeps an attention's scratch
// within where it can: the parts of a prefill chunk's rows over a long
// context would take gigabytes (DeepSeek-V3's 128 heads, 256 rows, 32K
// positions: 8.6 GB), and the rows' groups take turns in it instead.
const AttendScratchMax = 128 << 20

// AttendScratchFor is the scratch for steps of up to a.Rows rows over up
// to a.Pos+a.Rows positions: AttendScratch(a), or AttendScratchMax where
// that is less and holds the parts of whole rows (those of a recorded
// step, which one launch must take) at once. Pass it as Attn.Scratch.
func AttendScratchFor(a Attn, whole int) int {
	return min(AttendScratch(a), max(AttendScratchMax, max(whole, 1)*a.rowParts()))
}

// rowParts is the bytes of one row's parts in a launch of a: its chunks
// are those of a's last row (the grid's, with a.PosDev).
func (a Attn) rowParts() int {
	n := a.Pos + a.Rows
	if a.PosDev != 0 {
		n = a.MaxPos
	}
	return 4 * a.Heads * ceil(a.positions(n), attChunk) * (a.vdim() + 2)
}

// groups calls f for a's rows a group at a time, as many as a.Scratch
// holds the parts of (all of them when it is 0), with the group's first
// position, queries, outputs and selection. A recorded step's rows
// (a.PosDev) must fit in one group: their positions are on the device.
func (a Attn) groups(q, o uintptr, f func(b Attn, q, o uintptr) error) error {
	g := a.Rows
	if a.Scratch > 0 {
		g = min(g, a.Scratch/a.rowParts())
	}
	if g < 1 || a.PosDev != 0 && g < a.Rows {
		return fmt.Errorf("cuda: an attention scratch of %d bytes for %d rows of %d bytes", a.Scratch, a.Rows, a.rowParts())
	}
	for r0 := 0; r0 < a.Rows; r0 += g {
		b := a
		b.Pos, b.Rows = a.Pos+r0, min(g, a.Rows-r0)
		if b.Sel != 0 {
			b.Sel += uintptr(4 * r0 * a.TopK)
		}
		if err := f(b, q+uintptr(4*r0*a.QRow), o+uintptr(4*r0*a.ORow)); err != nil {
			return err
		}
	}
	return nil
}

// vdim is the values' dims.
func (a Attn) vdim() int {
	if a.VDim > 0 {
		return a.VDim
	}
	return a.HeadDim
}

// positions is how many positions a row of n reads: n, or at most TopK
// with a selection.
func (a Attn) positions(n int) int {
	if a.TopK > 0 {
		return min(n, a.TopK)
	}
	return n
}

// Attend computes causal attention of a.Rows query rows over the cache
// (kc, vc hold positions 0..Pos+Rows-1, position j at row j, or j % Ring
// in a ring, of KVHeads·HeadDim floats; with a window, only the last
// Window of a row's positions need be there), split over positions in
// chunks of 256 and combined in order; scratch holds a.Scratch bytes
// (AttendScratch(a) when 0), the rows taken in groups that fit.
func (k *Kernels) Attend(s Stream, o, q, kc, vc, scratch uintptr, a Attn) error {
	if _, err := a.chunks(); err != nil {
		return err
	}
	return a.groups(q, o, func(b Attn, q, o uintptr) error {
		nc, _ := b.chunks()
		if err := k.part(s, scratch, q, kc, vc, b, nc, 0); err != nil {
			return err
		}
		return k.combine(s, o, q, scratch, b, nc)
	})
}

// part launches attend_part over nc chunks, gated by gate (0: always
// runs; see att_skip in common.cuh).
func (k *Kernels) part(s Stream, scratch, q, kc, vc uintptr, a Attn, nc, gate int) error {
	return k.d.Launch(k.f["attend_part"], Dim3{a.Heads, a.Rows, nc}, Dim3{128, 1, 1}, 4*a.HeadDim, s,
		P(scratch), P(q), P(kc), P(vc), I(a.Pos), I(a.Heads), I(a.KVHeads), I(a.HeadDim),
		I(a.QRow), I(a.QHead), I(a.KVHeads*a.HeadDim), F(a.Scale), I(nc), P(a.PosDev), I(a.Window), I(a.Ring),
		I(a.vdim()), P(a.Sel), I(a.TopK), I(gate))
}

// chunks checks a and returns the chunks of 256 positions its grid covers.
func (a Attn) chunks() (int, error) {
	if a.KVHeads < 1 || a.Heads%a.KVHeads != 0 {
		return 0, fmt.Errorf("cuda: attention with %d heads over %d kv heads", a.Heads, a.KVHeads)
	}
	nc := ceil(a.positions(a.Pos+a.Rows), attChunk)
	if a.PosDev != 0 {
		nc = ceil(a.positions(a.MaxPos), attChunk)
	}
	if a.VDim > a.HeadDim || (a.Sel != 0) != (a.TopK > 0) || (a.Sel != 0 && (a.Window > 0 || a.Ring > 0)) {
		return 0, fmt.Errorf("cuda: attention of %d value dims over keys of %d, a selection of %d, a window of %d", a.VDim, a.HeadDim, a.TopK, a.Window)
	}
	if nc > 1024 {
		return 0, fmt.Errorf("cuda: attention over %d positions, at most %d", a.Pos+a.Rows, 1024*attChunk)
	}
	if a.Window < 0 || a.Ring < 0 || (a.Ring > 0 && (a.Window == 0 || a.Ring < a.Window+a.Rows)) {
		return 0, fmt.Errorf("cuda: attention over a window of %d in a ring of %d rows, %d rows a step", a.Window, a.Ring, a.Rows)
	}
	return nc, nil
}

// combine launches attend_combine over the parts of nc chunks.
func (k *Kernels) combine(s Stream, o, q, scratch uintptr, a Attn, nc int) error {
	g := 0
	if a.Gated {
		g = 1
	}
	return k.d.Launch(k.f["attend_combine"], Dim3{a.Heads, a.Rows, 1}, Dim3{128, 1, 1}, 0, s,
		P(o), P(scratch), P(q), I(a.Pos), I(a.Heads), I(a.HeadDim), I(a.QRow), I(a.QHead), I(a.ORow), I(nc), I(g), P(a.PosDev),
		I(a.Window), P(a.Sinks), I(a.vdim()), I(a.TopK))
}

// latentMinBlocks is the fewest blocks with work that mla_attend_part's
// 128 threads a block must have (about eight per SM of an H200); from
// latentWideBlocks to there, a block of several heads takes 512 threads
// (mla_attend_wide); below, each head takes a block (Attend). On the H200
// (TestGPUBench, DeepSeek-V3's 128 heads, two runs), a decode row took
// 32.5 µs a head a block, 118 µs eight heads on 128 threads and 46.1 µs on
// 512 at position 100 (16 blocks of eight heads); 75.4, 258 and 82.9 µs at
// 1000 (64 blocks); 190, 270 and 115 µs at 4096 (256 blocks); a prefill
// chunk of 256 rows (4096 blocks), 1331, 988 and 1085 µs at position 0,
// and 42.8, 22.9 and 24.9 ms at 3840. Tests set them.
var (
	latentMinBlocks  = 1024
	latentWideBlocks = 256
)

// latentPlan is how AttendLatent runs a: hb heads a block, up to 8 (their
// queries within 32 KiB of shared memory), on kernel fn; hb 1 runs Attend
// (fn ""). A recorded step's positions are known only on the device: gate
// > 0 says to launch both a head a block, for fewer than gate rows·chunks
// of work, and fn (mla_attend_wide), from gate on, each of them reading
// the position and skipping the depths the other takes (att_skip).
func latentPlan(a Attn) (hb int, fn string, gate int) {
	hb = min(8, a.Heads)
	for hb > 1 && 4*hb*a.HeadDim > 32<<10 {
		hb /= 2
	}
	if hb == 1 {
		return 1, "", 0
	}
	if a.PosDev != 0 {
		return hb, "mla_attend_wide", max(1, ceil(latentWideBlocks, ceil(a.Heads, hb)))
	}
	switch blocks := ceil(a.Heads, hb) * a.Rows * ceil(a.positions(a.Pos+a.Rows), attChunk); {
	case blocks >= latentMinBlocks:
		return hb, "mla_attend_part", 0
	case blocks >= latentWideBlocks:
		return hb, "mla_attend_wide", 0
	}
	return 1, "", 0
}

// AttendLatent is Attend for a latent cache (DeepSeek's MLA: one kv head,
// a.KVHeads 1, whose values are the keys' first a.VDim dims; no window).
// A block takes up to 8 heads (mla_attend_part, or mla_attend_wide on
// 512 threads where the step has few blocks: latentPlan), so that each
// position's latent is read once for them all. Its output is Attend's,
// bit for bit, either way.
func (k *Kernels) AttendLatent(s Stream, o, q, kc, scratch uintptr, a Attn) error {
	if a.KVHeads != 1 || a.Window > 0 || a.Ring > 0 || a.Gated || a.Sinks != 0 {
		return fmt.Errorf("cuda: latent attention over %d kv heads, a window of %d", a.KVHeads, a.Window)
	}
	hb, fn, gate := latentPlan(a)
	if hb == 1 {
		return k.Attend(s, o, q, kc, kc, scratch, a)
	}
	threads := 128
	if fn == "mla_attend_wide" {
		threads = 512
	}
	if _, err := a.chunks(); err != nil {
		return err
	}
	return a.groups(q, o, func(b Attn, q, o uintptr) error {
		nc, _ := b.chunks()
		if gate > 0 {
			if err := k.part(s, scratch, q, kc, kc, b, nc, -gate); err != nil {
				return err
			}
		}
		if err := k.d.Launch(k.f[fn], Dim3{ceil(b.Heads, hb), b.Rows, nc}, Dim3{threads, 1, 1}, 4*hb*b.HeadDim, s,
			P(scratch), P(q), P(kc), I(b.Pos), I(b.Heads), I(hb), I(b.HeadDim), I(b.vdim()), I(b.QRow), I(b.QHead),
			F(b.Scale), I(nc), P(b.PosDev), P(b.Sel), I(b.TopK), I(gate)); err != nil {
			return err
		}
		return k.combine(s, o, q, scratch, b, nc)
	})
}

// DNConv runs the DeltaNet's causal conv (kernel K, 2..8) and SiLU over nb
// rows of cd channels in place, updating the history hist [K-1][cd]. With
// nsnap > 0 the history after each of rows 0..nsnap-1 also goes to snap
// ([nsnap][K-1][cd]): a speculative verify's per-row snapshots.
func (k *Kernels) DNConv(s Stream, qkv, hist, convT uintptr, nb, cd, K int, snap uintptr, nsnap int) error {
	if K < 2 || K > 8 {
		return fmt.Errorf("cuda: conv kernel %d, want 2..8", K)
	}
	if nsnap > 0 && snap == 0 {
		nsnap = 0
	}
	return k.d.Launch(k.f["dn_conv"], Dim3{ceil(cd, 128), 1, 1}, Dim3{128, 1, 1}, 0, s,
		P(qkv), P(hist), P(convT), I(nb), I(cd), I(K), P(snap), I(nsnap))
}

// DN describes the DeltaNet's head shapes.
type DN struct {
	KeyHeads, ValueHeads, KeyDim, ValueDim int
}

// Conv is the width of the conv output: q, k and v of every head.
func (d DN) Conv() int { return 2*d.KeyHeads*d.KeyDim + d.ValueHeads*d.ValueDim }

// DNPrep normalises q and k per head (q also times qscale) in the conv
// output and turns b and a ([nb][nv]) into beta and the decay in place.
func (k *Kernels) DNPrep(s Stream, qkv, b, a, alog, dtBias uintptr, nb int, d DN, qscale float32) error {
	rows := nb * d.KeyHeads
	if err := k.d.Launch(k.f["dn_qk_norm"], Dim3{ceil(rows, 8), 1, 1}, Dim3{256, 1, 1}, 0, s,
		P(qkv), I(rows), I(d.KeyHeads), I(d.KeyDim), I(d.Conv()), F(1e-6), F(qscale)); err != nil {
		return err
	}
	n := nb * d.ValueHeads
	return k.d.Launch(k.f["dn_gates"], Dim3{ceil(n, 128), 1, 1}, Dim3{128, 1, 1}, 0, s,
		P(b), P(a), P(alog), P(dtBias), I(nb), I(d.ValueHeads))
}

// DNRule runs the gated delta rule over nb rows for every value head:
// state S [nv][dk][dv], prepared qkv, decay and beta [nb][nv], output o
// [nb][nv·dv]. dk must be 32, 64 or 128 and dv at most 1024. With nsnap > 0
// the state after each of rows 0..nsnap-1 also goes to snap
// ([nsnap][nv][dk][dv]): a speculative verify's per-row snapshots.
func (k *Kernels) DNRule(s Stream, S, qkv, decay, beta, o uintptr, nb int, d DN, snap uintptr, nsnap int) error {
	f, ok := k.f[fmt.Sprintf("dn_rule%d", d.KeyDim)]
	if !ok || d.ValueDim > 1024 || d.ValueHeads%d.KeyHeads != 0 {
		return fmt.Errorf("cuda: delta rule with key dim %d, value dim %d, %d/%d heads (key dim 32, 64 or 128)", d.KeyDim, d.ValueDim, d.KeyHeads, d.ValueHeads)
	}
	if nsnap > 0 && snap == 0 {
		nsnap = 0
	}
	return k.d.Launch(f, Dim3{d.ValueHeads, 1, 1}, Dim3{d.ValueDim, 1, 1}, 0, s,
		P(S), P(qkv), P(decay), P(beta), P(o), I(nb), I(d.KeyHeads), I(d.ValueHeads), I(d.ValueDim), P(snap), I(nsnap))
}

// Empty launches a kernel that does nothing (for overhead measurements).
func (k *Kernels) Empty(s Stream) error {
	return k.d.Launch(k.f["bench_empty"], Dim3{1, 1, 1}, Dim3{32, 1, 1}, 0, s, I(0))
}

// MatF32 computes out = W·x for a float32 matrix w ([rows][cols]) and nb
// rows of x: one warp per output, summed with fused multiply-adds in a
// fixed order (within rounding of the CPU's float32 product).
func (k *Kernels) MatF32(s Stream, out, w uintptr, rows, cols int, x uintptr, nb int) error {
	return k.d.Launch(k.f["f32_mv"], Dim3{ceil(rows, 8), nb, 1}, Dim3{256, 1, 1}, 0, s,
		P(w), P(x), P(out), I(rows), I(cols), I(nb))
}

// GatherRows sets dst row j = src row idx[j] (idx int32 [n]) for n rows of
// width floats.
func (k *Kernels) GatherRows(s Stream, dst, src, idx uintptr, n, width int) error {
	return k.d.Launch(k.f["gather_rows"], Dim3{ceil(n*width, 256), 1, 1}, Dim3{256, 1, 1}, 0, s,
		P(dst), P(src), P(idx), I(n), I(width))
}

// MoECombine writes y[i] = Σ_k w[i][k]·outk[pos[i][k]] in router order
// (pos int32 [nb][K]) plus the shared expert: mode 0 none, 1 ungated, 2
// gated by sigmoid(sgate[i]).
func (k *Kernels) MoECombine(s Stream, y, outk, pos, w, shared, sgate uintptr, nb, K, H, mode int) error {
	return k.d.Launch(k.f["moe_combine"], Dim3{ceil(nb*H, 256), 1, 1}, Dim3{256, 1, 1}, 0, s,
		P(y), P(outk), P(pos), P(w), P(shared), P(sgate), I(nb), I(K), I(H), I(mode))
}

// MatEx computes the expert products of one decode row on the device's
// choice: out row k = W_{ids[k]}·x row (k if own else 0), k < nk, where
// tab holds, per expert, the matrix's addresses (codes, scales, biases;
// bf16: values, then two zeros) as uint64. a is prepared as for MatQ4 (q4)
// or carries X and XSum (q8) or X (bf16). Bits of the one-row kernels.
func (k *Kernels) MatEx(s Stream, kind string, out, tab, ids uintptr, O int, a Acts, nk int, own bool) error {
	xsel := 0
	if own {
		xsel = 1
	}
	grid, block := Dim3{ceil(O, 8), nk, 1}, Dim3{256, 1, 1}
	switch kind {
	case "q4":
		return k.d.Launch(k.f["q4_ex"], grid, block, 0, s, P(tab), P(ids), P(a.X8), P(a.XS), P(a.XSum), P(out), I(O), I(a.Cols), I(nk), I(xsel))
	case "q8":
		return k.d.Launch(k.f["q8_ex"], grid, block, 0, s, P(tab), P(ids), P(a.X), P(a.XSum), P(out), I(O), I(a.Cols), I(nk), I(xsel))
	case "bf16":
		return k.d.Launch(k.f["bf16_ex"], grid, block, 0, s, P(tab), P(ids), P(a.X), P(out), I(O), I(a.Cols), I(nk), I(xsel))
	}
	return fmt.Errorf("cuda: expert products of kind %q", kind)
}

// KVAppend writes one row's keys and values (n floats each) into the cache
// row of position *posp (a device int32): row *posp % ring in a ring of
// ring rows, or row *posp when ring is 0. With vc 0 only the keys are
// written (val is unused).
func (k *Kernels) KVAppend(s Stream, kc, vc, key, val, posp uintptr, n, ring int) error {
	return k.d.Launch(k.f["kv_append"], Dim3{ceil(n, 256), 1, 1}, Dim3{256, 1, 1}, 0, s,
		P(kc), P(vc), P(key), P(val), P(posp), I(n), I(ring))
}

// Heads describes a product a head at a time: out row (i, h) = W_h·x row
// (i, h) for Rows rows of Heads heads, where W is [Heads·O][C] with head
// h's O rows from row h·O (DeepSeek's W_k and W_v); x row (i, h) starts
// at float i·XRow + h·XHead, out row (i, h) at i·ORow + h·OHead.
type Heads struct {
	Rows, Heads, O, C        int
	XRow, XHead, ORow, OHead int
}

// HeadTab is the address table MatEx reads to multiply w a head at a
// time (its slot k taking entry ids[k]): entry h holds the addresses of
// head h's rows h·O.. of w (O = w.Rows/heads), for kind "q4" or "q8"
// (codes, scales, biases) or "bf16" (values in w.Q).
func HeadTab(kind string, w Q4, heads int) ([]uint64, error) {
	var row int // bytes of a row's codes or values
	switch kind {
	case "q4":
		row = w.Cols / 2
	case "q8":
		row = w.Cols
	case "bf16":
		row = 2 * w.Cols
	default:
		return nil, fmt.Errorf("cuda: a product a head at a time of kind %q", kind)
	}
	if heads < 1 || w.Rows%heads != 0 {
		return nil, fmt.Errorf("cuda: %d rows in %d heads", w.Rows, heads)
	}
	O, sc := w.Rows/heads, 2*(w.Cols/64) // a row's half-precision scales (or biases)
	t := make([]uint64, 3*heads)
	for h := range heads {
		r := uint64(h * O)
		t[3*h] = uint64(w.Q) + r*uint64(row)
		if kind != "bf16" {
			t[3*h+1], t[3*h+2] = uint64(w.Scales)+r*uint64(sc), uint64(w.Biases)+r*uint64(sc)
		}
	}
	return t, nil
}

// HeadF32 computes h's product for a float32 W (head_f32: MatF32's
// arithmetic per output).
func (k *Kernels) HeadF32(s Stream, out, w, x uintptr, h Heads) error {
	if h.Rows > 65535 || h.Heads > 65535 {
		return fmt.Errorf("cuda: a product of %d heads over %d rows", h.Heads, h.Rows)
	}
	return k.d.Launch(k.f["head_f32"], Dim3{ceil(h.O, 8), h.Heads, h.Rows}, Dim3{256, 1, 1}, 0, s,
		P(w), P(x), P(out), I(h.O), I(h.C), I(h.XRow), I(h.XHead), I(h.ORow), I(h.OHead))
}

// CopyRows copies rows rows of n floats from src (rows ss floats apart)
// to dst (ds apart).
func (k *Kernels) CopyRows(s Stream, dst uintptr, ds int, src uintptr, ss, rows, n int) error {
	return k.d.Launch(k.f["copy_rows"], Dim3{ceil(rows*n, 256), 1, 1}, Dim3{256, 1, 1}, 0, s,
		P(dst), I(ds), P(src), I(ss), I(rows), I(n))
}

// LayerNorm sets dst = (x − mean)/sqrt(var + eps)·w + b over rows rows of
// n floats (dst may be x): kernels.LayerNorm within rounding.
func (k *Kernels) LayerNorm(s Stream, dst, x, w, b uintptr, rows, n int, eps float32) error {
	return k.d.Launch(k.f["layer_norm"], Dim3{ceil(rows, 8), 1, 1}, Dim3{256, 1, 1}, 0, s,
		P(dst), P(x), P(w), P(b), I(rows), I(n), F(eps))
}

// Index is a lightning indexer's step: Rows query rows at positions
// Pos.. (or *PosDev, a recorded step's, with MaxPos the most positions),
// Heads heads of Dim dims, each row keeping its TopK best positions; the
// scores are [Rows][Stride] floats.
type Index struct {
	Pos, Rows, Heads, Dim, TopK, Stride int
	Scale, WScale                       float32
	PosDev                              uintptr
	MaxPos                              int
}

// IndexSelect scores the positions of each row (DeepSeek-V3.2's indexer:
// Σ_h w_h·WScale·relu(Scale·q_h·k_t)) from the queries q [Rows][Heads][Dim],
// the key cache kc [positions][Dim] and the weights w [Rows][Heads] into
// sc, and writes each row's TopK best positions (the lower first on
// ties, as model.TopK), ascending, into sel (int32 [Rows][TopK]); a row of
// n ≤ TopK positions gets 0..n-1 and scores nothing.
func (k *Kernels) IndexSelect(s Stream, sel, sc, q, kc, w uintptr, x Index) error {
	n := x.Pos + x.Rows
	if x.PosDev != 0 {
		n = x.MaxPos
	}
	if x.TopK < 1 || n > x.Stride {
		return fmt.Errorf("cuda: an indexer keeping %d of %d positions in rows of %d scores", x.TopK, n, x.Stride)
	}
	if n > x.TopK {
		if err := k.d.Launch(k.f["index_scores"], Dim3{ceil(n, 8), x.Rows, 1}, Dim3{256, 1, 1}, 0, s,
			P(sc), P(q), P(kc), P(w), I(x.Pos), P(x.PosDev), I(x.Heads), I(x.Dim), F(x.Scale), F(x.WScale), I(x.TopK), I(x.Stride)); err != nil {
			return err
		}
	}
	return k.d.Launch(k.f["index_select"], Dim3{x.Rows, 1, 1}, Dim3{256, 1, 1}, 0, s,
		P(sel), P(sc), I(x.Pos), P(x.PosDev), I(x.TopK), I(x.Stride))
}
