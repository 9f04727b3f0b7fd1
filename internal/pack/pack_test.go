package pack_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/hf"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/quant"
	"github.com/sluicelm/sluice/internal/safetensors"
	"github.com/sluicelm/sluice/internal/testutil"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.Cleanup()
	os.Exit(code)
}

// ---- checkpoint writing helpers ----

// rawTensor is one tensor of a checkpoint being written.
type rawTensor struct {
	DType string
	Shape []int
	Data  []byte
}

// writeSafetensors writes a single safetensors file (testutil's writer).
func writeSafetensors(t testing.TB, path string, ts map[string]rawTensor) {
	st := make(map[string]testutil.STensor, len(ts))
	for n, x := range ts {
		st[n] = testutil.STensor(x)
	}
	testutil.WriteSafetensors(t, path, st)
}

// variant describes how to rewrite a shared checkpoint.
type variant struct {
	nested bool                                 // text fields under text_config
	prefix bool                                 // model.language_model. instead of model.
	fuse   bool                                 // trunk experts as 3-D gate_up_proj / down_proj
	dtype  string                               // "", "F32" or "F16": convert every tensor
	f16rnd bool                                 // keep bf16 but round every value through f16
	edit   func(name string, r *rawTensor) bool // false drops the tensor
	config func(cfg map[string]any)             // edit config.json (before nesting)
}

func (v variant) rewritesTensors() bool {
	return v.prefix || v.fuse || v.dtype != "" || v.f16rnd || v.edit != nil
}

var perExpert = regexp.MustCompile(`^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$`)

// makeVariant rewrites shared model `model` into a fresh directory. When
// tensors change, they are written as one model.safetensors without an index;
// otherwise the shards are linked unchanged.
func makeVariant(t testing.TB, model string, v variant) string {
	t.Helper()
	src := testutil.ModelDir(t, model)
	dst := t.TempDir()
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		testutil.Link(t, mustAbs(t, filepath.Join(src, f)), filepath.Join(dst, f))
	}
	cfg := testutil.ReadJSON(t, filepath.Join(src, "config.json"))
	if v.config != nil {
		v.config(cfg)
	}
	experts, _ := cfg["num_experts"].(float64)
	if experts == 0 {
		experts, _ = cfg["num_local_experts"].(float64)
	}
	if v.nested {
		text := map[string]any{}
		for k, x := range cfg {
			text[k] = x
		}
		text["model_type"] = "qwen3_5_moe_text"
		cfg = map[string]any{
			"architectures":       []any{"Qwen3_5MoeForConditionalGeneration"},
			"model_type":          "qwen3_5_moe",
			"text_config":         text,
			"tie_word_embeddings": false,
			"vision_config":       map[string]any{"depth": 2, "hidden_size": 64},
		}
	}
	testutil.WriteJSON(t, filepath.Join(dst, "config.json"), cfg)

	if !v.rewritesTensors() {
		ents, err := os.ReadDir(src)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), ".safetensors") || e.Name() == "model.safetensors.index.json" {
				testutil.Link(t, mustAbs(t, filepath.Join(src, e.Name())), filepath.Join(dst, e.Name()))
			}
		}
		return dst
	}

	ck, err := safetensors.OpenDir(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	out := map[string]rawTensor{}
	type fusedLayer struct{ gate, up, down [][]byte }
	fused := map[int]*fusedLayer{}
	var shapeGU, shapeD []int
	for _, name := range ck.Names() {
		tn := ck.Tensors[name]
		r := rawTensor{DType: tn.DType, Shape: append([]int(nil), tn.Shape...), Data: tn.Data}
		if v.edit != nil && !v.edit(name, &r) {
			continue
		}
		if m := perExpert.FindStringSubmatch(name); v.fuse && m != nil {
			l, _ := strconv.Atoi(m[1])
			e, _ := strconv.Atoi(m[2])
			fl := fused[l]
			if fl == nil {
				E := int(experts)
				fl = &fusedLayer{make([][]byte, E), make([][]byte, E), make([][]byte, E)}
				fused[l] = fl
			}
			switch m[3] {
			case "gate":
				fl.gate[e] = r.Data
				shapeGU = r.Shape
			case "up":
				fl.up[e] = r.Data
			case "down":
				fl.down[e] = r.Data
				shapeD = r.Shape
			}
			continue
		}
		out[name] = r
	}
	for l, fl := range fused {
		E := len(fl.gate)
		var gu, dn []byte
		for e := 0; e < E; e++ {
			if fl.gate[e] == nil || fl.up[e] == nil || fl.down[e] == nil {
				t.Fatalf("fusing layer %d: expert %d incomplete", l, e)
			}
			gu = append(append(gu, fl.gate[e]...), fl.up[e]...)
			dn = append(dn, fl.down[e]...)
		}
		p := fmt.Sprintf("model.layers.%d.mlp.experts.", l)
		out[p+"gate_up_proj"] = rawTensor{"BF16", []int{E, 2 * shapeGU[0], shapeGU[1]}, gu}
		out[p+"down_proj"] = rawTensor{"BF16", []int{E, shapeD[0], shapeD[1]}, dn}
	}
	final := map[string]rawTensor{}
	for name, r := range out {
		if r.DType != "BF16" {
			t.Fatalf("%s: source dtype %s, helper converts only BF16", name, r.DType)
		}
		switch {
		case v.dtype == "F32":
			r = rawTensor{"F32", r.Shape, convertBF16(r.Data, 4, func(h uint16) []byte {
				return binary.LittleEndian.AppendUint32(nil, uint32(h)<<16)
			})}
		case v.dtype == "F16":
			r = rawTensor{"F16", r.Shape, convertBF16(r.Data, 2, func(h uint16) []byte {
				return binary.LittleEndian.AppendUint16(nil, f32ToHalf(quant.BF16ToF32(h)))
			})}
		case v.f16rnd:
			r = rawTensor{"BF16", r.Shape, convertBF16(r.Data, 2, func(h uint16) []byte {
				f := quant.F16ToF32(f32ToHalf(quant.BF16ToF32(h)))
				b := quant.BF16(f)
				if quant.BF16ToF32(b) != f {
					t.Fatalf("f16-rounded value %g of bf16 %#04x is not a bf16", f, h)
				}
				return binary.LittleEndian.AppendUint16(nil, b)
			})}
		}
		if v.prefix && strings.HasPrefix(name, "model.") {
			name = "model.language_model." + strings.TrimPrefix(name, "model.")
		}
		final[name] = r
	}
	writeSafetensors(t, filepath.Join(dst, "model.safetensors"), final)
	return dst
}

func convertBF16(src []byte, size int, f func(uint16) []byte) []byte {
	out := make([]byte, 0, len(src)/2*size)
	for i := 0; i+1 < len(src); i += 2 {
		out = append(out, f(binary.LittleEndian.Uint16(src[i:]))...)
	}
	return out
}

// f32ToHalf rounds a float32 to binary16, to nearest even.
func f32ToHalf(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	rne := func(x uint32, s uint) uint32 {
		if s == 0 {
			return x
		}
		q, r, half := x>>s, x&(1<<s-1), uint32(1)<<(s-1)
		if r > half || (r == half && q&1 == 1) {
			q++
		}
		return q
	}
	e := exp - 127 + 15
	switch {
	case e >= 0x1f:
		return sign | 0x7c00
	case e <= 0:
		if e < -10 || exp == 0 {
			return sign
		}
		return sign | uint16(rne(man|0x800000, uint(14-e)))
	}
	h := rne(uint32(e)<<23|man, 13) // carries into the exponent, up to inf
	if h >= 0x7c00 {
		h = 0x7c00
	}
	return sign | uint16(h)
}

func mustAbs(t testing.TB, p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// packTo packs src into a fresh directory.
func packTo(t testing.TB, src string, bits int) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "packed")
	if err := pack.Pack(context.Background(), src, dst, pack.Options{Bits: bits}); err != nil {
		t.Fatalf("pack %s at %d bits: %v", src, bits, err)
	}
	return dst
}

func readManifest(t testing.TB, dir string) *format.Manifest {
	t.Helper()
	m, err := format.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// assertSamePack requires the manifests to be equal and dense.bin and
// experts.bin byte-identical.
func assertSamePack(t *testing.T, want, got string) {
	t.Helper()
	mw, mg := readManifest(t, want), readManifest(t, got)
	if !reflect.DeepEqual(mw, mg) {
		t.Errorf("manifests differ:\nwant %+v\n got %+v", mw.Config, mg.Config)
		if len(mw.Dense) != len(mg.Dense) {
			t.Errorf("dense tensors: want %d, got %d", len(mw.Dense), len(mg.Dense))
		}
	}
	for _, f := range []string{format.ManifestFile, "dense.bin", "experts.bin"} {
		a, err := os.ReadFile(filepath.Join(want, f))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(got, f))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(a, b) {
			continue
		}
		i := 0
		for i < len(a) && i < len(b) && a[i] == b[i] {
			i++
		}
		where := ""
		switch f {
		case "dense.bin":
			for _, d := range mw.Dense {
				if int64(i) >= d.Offset && int64(i) < d.End() {
					where = " in " + d.Name
				}
			}
		case "experts.bin":
			rec := int64(i) / mw.Stores[0].Stride
			where = fmt.Sprintf(" in record %d (layer %d expert %d)", rec, rec/int64(mw.Experts), rec%int64(mw.Experts))
		}
		t.Errorf("%s differs (sizes %d, %d): first difference at byte %d%s", f, len(a), len(b), i, where)
	}
}

// ---- equivalence ----

func TestPackEquivalentLayouts(t *testing.T) {
	const model = "tiny-qwen3-5-moe"
	layout := variant{nested: true, prefix: true, fuse: true}
	f32 := layout
	f32.dtype = "F32"
	for _, tc := range []struct {
		name string
		v    variant
	}{
		{"nested-prefixed-fused-single-bf16", layout},
		{"nested-prefixed-fused-single-f32", f32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := makeVariant(t, model, tc.v)
			if _, err := os.Stat(filepath.Join(src, "model.safetensors.index.json")); err == nil {
				t.Fatal("variant should have no index")
			}
			c, err := hf.Open(src)
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
			for _, bits := range []int{16, 4} {
				t.Run(strconv.Itoa(bits), func(t *testing.T) {
					assertSamePack(t, testutil.Packed(t, model, bits), packTo(t, src, bits))
				})
			}
		})
	}
}

// TestPackF16 packs an F16 checkpoint. F16 cannot hold every bf16 value
// (tiny magnitudes lose bits), so the reference is the bf16 checkpoint with
// every value rounded through f16 the same way: that must pack identically.
func TestPackF16(t *testing.T) {
	const model = "tiny-qwen3-5-moe"
	f16 := makeVariant(t, model, variant{nested: true, prefix: true, fuse: true, dtype: "F16"})
	ref := makeVariant(t, model, variant{f16rnd: true})
	for _, bits := range []int{16, 4} {
		t.Run(strconv.Itoa(bits), func(t *testing.T) {
			assertSamePack(t, packTo(t, ref, bits), packTo(t, f16, bits))
		})
	}
}

func TestF32ToHalf(t *testing.T) {
	// The test helper must invert HalfToFloat on every non-NaN half.
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			continue
		}
		if got := f32ToHalf(quant.F16ToF32(h)); got != h {
			t.Fatalf("f32ToHalf(quant.F16ToF32(%#04x)) = %#04x", h, got)
		}
	}
	for _, c := range []struct {
		f float32
		h uint16
	}{{65520, 0x7c00}, {65519, 0x7bff}, {float32(math.Ldexp(1, -25)), 0}, {float32(math.Ldexp(1.5, -25)), 1}, {float32(math.Ldexp(3, -25)), 2}, {1 + 1.0/2048, 0x3c00}, {1 + 3.0/2048, 0x3c02}} {
		if got := f32ToHalf(c.f); got != c.h {
			t.Errorf("f32ToHalf(%g) = %#04x, want %#04x", c.f, got, c.h)
		}
	}
}

func TestPackNumExpertsAlias(t *testing.T) {
	const model = "tiny-qwen3-moe"
	src := makeVariant(t, model, variant{config: func(c map[string]any) {
		c["num_experts"] = c["num_local_experts"]
		delete(c, "num_local_experts")
	}})
	for _, bits := range []int{16, 4} {
		t.Run(strconv.Itoa(bits), func(t *testing.T) {
			assertSamePack(t, testutil.Packed(t, model, bits), packTo(t, src, bits))
		})
	}
}

// ---- errors naming the tensor ----

func TestPackTensorErrors(t *testing.T) {
	const model = "tiny-qwen3-5-moe"
	for _, tc := range []struct {
		name string
		edit func(name string, r *rawTensor) bool
		want []string
	}{
		{"q-proj-rows", func(n string, r *rawTensor) bool {
			if n == "model.layers.2.self_attn.q_proj.weight" {
				r.Shape = []int{256, 256}
				r.Data = r.Data[:256*256*2]
			}
			return true
		}, []string{"layers.2.self_attn.q_proj.weight", "[256 256]", "[512 256]"}},
		{"missing-dense", func(n string, r *rawTensor) bool {
			return n != "model.layers.0.linear_attn.A_log"
		}, []string{"layers.0.linear_attn.A_log", "missing"}},
		{"missing-expert", func(n string, r *rawTensor) bool {
			return n != "model.layers.3.mlp.experts.5.up_proj.weight"
		}, []string{"layers.3.mlp.experts.5.up_proj.weight", "missing"}},
		{"mtp-fused-shape", func(n string, r *rawTensor) bool {
			if n == "mtp.layers.0.mlp.experts.down_proj" {
				r.Shape = []int{64, 64, 256}
			}
			return true
		}, []string{"layers.6.mlp.experts.down_proj", "[64 64 256]", "[64 256 64]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := makeVariant(t, model, variant{edit: tc.edit})
			parent := t.TempDir()
			dst := filepath.Join(parent, "out")
			err := pack.Pack(context.Background(), src, dst, pack.Options{Bits: 4})
			if err == nil {
				t.Fatal("pack succeeded, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			assertEmptyDir(t, parent)
		})
	}
	t.Run("unknown-model-type", func(t *testing.T) {
		src := makeVariant(t, model, variant{config: func(c map[string]any) { c["model_type"] = "llama" }})
		err := pack.Pack(context.Background(), src, filepath.Join(t.TempDir(), "out"), pack.Options{Bits: 4})
		if err == nil || !strings.Contains(err.Error(), "llama") {
			t.Errorf("model_type llama: err = %v", err)
		}
	})
}

func assertEmptyDir(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("left behind in %s: %s", dir, e.Name())
	}
}

// ---- pack behaviour ----

// TestPackExistingDestination checks what pack does with a destination
// that exists: a packed model is replaced only with Force, an empty
// directory with Force, and anything else never (a file, a directory of
// other things), leaving it as it was.
func TestPackExistingDestination(t *testing.T) {
	src := testutil.ModelDir(t, "tiny-qwen3-moe")
	parent := t.TempDir()
	names := func() []string {
		ents, _ := os.ReadDir(parent)
		var n []string
		for _, e := range ents {
			n = append(n, e.Name())
		}
		return n
	}

	// What is not a packed model is never replaced, even with Force:
	// replacing deletes it whole.
	notes := filepath.Join(parent, "notes")
	if err := os.Mkdir(notes, 0o755); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(notes, "keep.txt")
	if err := os.WriteFile(marker, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(parent, "file")
	if err := os.WriteFile(file, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ dst, want, kept string }{
		{notes, "is not a packed model: not replaced, even with --force", marker},
		{file, "is not a directory, so not a packed model", file},
	} {
		for _, force := range []bool{false, true} {
			err := pack.Pack(context.Background(), src, c.dst, pack.Options{Bits: 4, Force: force})
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.dst) {
				t.Errorf("pack onto %s (Force %v): err = %v, want %q", c.dst, force, err, c.want)
			}
		}
		if b, err := os.ReadFile(c.kept); err != nil || string(b) != "mine" {
			t.Errorf("a refused pack changed %s: %q, %v", c.kept, b, err)
		}
	}
	if n := names(); len(n) != 2 {
		t.Errorf("the refused packs left %v, want [file notes]", n)
	}

	// A packed model: replaced only with Force.
	dst := filepath.Join(parent, "out")
	if err := pack.Pack(context.Background(), src, dst, pack.Options{Bits: 4}); err != nil {
		t.Fatal(err)
	}
	marker = filepath.Join(dst, "keep.txt")
	if err := os.WriteFile(marker, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := pack.Pack(context.Background(), src, dst, pack.Options{Bits: 4})
	if err == nil || !strings.Contains(err.Error(), "already exists") || !strings.Contains(err.Error(), dst) {
		t.Fatalf("pack onto a packed model without Force: err = %v, want 'already exists'", err)
	}
	if b, err := os.ReadFile(marker); err != nil || string(b) != "mine" {
		t.Fatalf("existing destination was modified (marker %q, %v)", b, err)
	}
	var progress bytes.Buffer
	if err := pack.Pack(context.Background(), src, dst, pack.Options{Bits: 4, Force: true, Progress: &progress}); err != nil {
		t.Fatalf("pack with Force: %v", err)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("Force left the old content behind (stat marker: %v)", err)
	}
	readManifest(t, dst)
	assertSamePack(t, testutil.Packed(t, "tiny-qwen3-moe", 4), dst)
	if !strings.Contains(progress.String(), "packed "+dst) {
		t.Errorf("progress output %q lacks the final line", progress.String())
	}
	if n := names(); len(n) != 3 || n[0] != "file" || n[1] != "notes" || n[2] != "out" {
		t.Errorf("after Force the parent holds %v, want [file notes out]", n)
	}

	// An empty directory is replaced with Force, and a destination that
	// does not exist yet is made.
	empty := filepath.Join(parent, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := pack.Pack(context.Background(), src, empty, pack.Options{Bits: 4, Force: true}); err != nil {
		t.Fatal(err)
	}
	readManifest(t, empty)
	dst2 := filepath.Join(parent, "nested", "fresh")
	if err := pack.Pack(context.Background(), src, dst2, pack.Options{Bits: 4, Force: true}); err != nil {
		t.Fatal(err)
	}
	readManifest(t, dst2)
}

// TestPackOntoSource checks that pack refuses, even with Force, a
// destination that is the checkpoint, holds it or lies inside it, and
// leaves the checkpoint whole.
func TestPackOntoSource(t *testing.T) {
	shared := testutil.ModelDir(t, "tiny-qwen3-moe")
	parent := t.TempDir()
	src := filepath.Join(parent, "ck")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(shared)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, e := range ents {
		testutil.Link(t, mustAbs(t, filepath.Join(shared, e.Name())), filepath.Join(src, e.Name()))
		want = append(want, e.Name())
	}
	alias := filepath.Join(parent, "alias")
	if err := os.Symlink(src, alias); err != nil {
		t.Logf("no symbolic links here (%v): the alias case is left out", err)
		alias = ""
	}
	for _, c := range []struct{ dst, want string }{
		{src, "is the source"},
		{src + string(filepath.Separator) + ".", "is the source"},
		{filepath.Join(src, "..", "ck"), "is the source"},
		{parent, "contains the source"},
		{filepath.Join(src, "packed"), "inside the source"},
		{filepath.Join(src, "a", "b"), "inside the source"},
		{alias, "is the source"},
	} {
		if c.dst == "" {
			continue
		}
		err := pack.Pack(context.Background(), src, c.dst, pack.Options{Bits: 4, Force: true})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("pack %s onto %s: err = %v, want %q", src, c.dst, err, c.want)
		}
		var got []string
		ents, _ := os.ReadDir(src)
		for _, e := range ents {
			got = append(got, e.Name())
		}
		if !slices.Equal(got, want) {
			t.Fatalf("after pack onto %s the checkpoint holds %v, want %v", c.dst, got, want)
		}
	}
	// A sibling whose name shares the checkpoint's prefix is apart from it.
	if err := pack.Pack(context.Background(), src, src+"-packed", pack.Options{Bits: 4, Force: true}); err != nil {
		t.Fatalf("pack beside the checkpoint: %v", err)
	}
}

// TestPackUnusedTensors checks that pack refuses a checkpoint with
// weights the packed model would lack, naming them and their count, and
// accepts the tensors it leaves out on purpose.
func TestPackUnusedTensors(t *testing.T) {
	// config.json says 3 layers of a 6-layer checkpoint.
	src := makeVariant(t, "tiny-qwen3-moe", variant{config: func(c map[string]any) { c["num_hidden_layers"] = 3 }})
	parent := t.TempDir()
	err := pack.Pack(context.Background(), src, filepath.Join(parent, "out"), pack.Options{Bits: 4})
	if err == nil || !regexp.MustCompile(`has \d+ tensors that the model .* does not use .*: model\.layers\.3\.[^ ]+, .* more\)$`).MatchString(err.Error()) {
		t.Fatalf("pack of 6 layers as 3: err = %v, want the unused layers 3 to 5 named and counted", err)
	}
	assertEmptyDir(t, parent)

	// Extra tensors beside the weights in a second file.
	src = makeVariant(t, "tiny-qwen3-moe", variant{edit: func(string, *rawTensor) bool { return true }})
	vec := rawTensor{"BF16", []int{32}, make([]byte, 64)}
	extra := func(name string) {
		writeSafetensors(t, filepath.Join(src, "zz-extra.safetensors"), map[string]rawTensor{name: vec})
	}
	// Rotary buffers older transformers saved, and an MTP head the config
	// does not ask for, are left out on purpose.
	for _, name := range []string{"model.layers.0.self_attn.rotary_emb.inv_freq", "mtp.fc.weight"} {
		extra(name)
		if err := pack.Pack(context.Background(), src, filepath.Join(t.TempDir(), "out"), pack.Options{Bits: 4}); err != nil {
			t.Errorf("pack with an extra %s: %v", name, err)
		}
	}
	// DeepSeek's MTP layer stores copies of the embedding and LM head,
	// which the MTP head shares with the trunk instead.
	if err := pack.Pack(context.Background(), testutil.WithDeepSeekMTP(t, "tiny-deepseek-v32", ""), filepath.Join(t.TempDir(), "out"), pack.Options{Bits: 4}); err != nil {
		t.Errorf("pack with DeepSeek's MTP layer: %v", err)
	}
	extra("model.layers.0.mlp.shared_expert.up_proj.weight")
	err = pack.Pack(context.Background(), src, filepath.Join(t.TempDir(), "out"), pack.Options{Bits: 4})
	if err == nil || !strings.Contains(err.Error(), "has 1 tensor that") || !strings.HasSuffix(err.Error(), ": model.layers.0.mlp.shared_expert.up_proj.weight") {
		t.Errorf("pack with an unknown extra tensor: err = %v", err)
	}
}

func TestPackCancelled(t *testing.T) {
	for _, model := range testutil.Models {
		t.Run(model, func(t *testing.T) {
			parent := t.TempDir()
			dst := filepath.Join(parent, "out")
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			err := pack.Pack(ctx, testutil.ModelDir(t, model), dst, pack.Options{Bits: 4})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled pack: err = %v, want context.Canceled", err)
			}
			if _, err := os.Stat(dst); !os.IsNotExist(err) {
				t.Errorf("cancelled pack created %s (%v)", dst, err)
			}
			assertEmptyDir(t, parent) // no .out.packing-* left over
		})
	}
}

func TestPackBadBits(t *testing.T) {
	for _, bits := range []int{3, 0, 32} {
		parent := t.TempDir()
		dst := filepath.Join(parent, "out")
		err := pack.Pack(context.Background(), testutil.ModelDir(t, "tiny-qwen3-moe"), dst, pack.Options{Bits: bits})
		if err == nil || !strings.Contains(err.Error(), "bits "+strconv.Itoa(bits)) {
			t.Errorf("bits %d: err = %v", bits, err)
		}
		assertEmptyDir(t, parent)
	}
}

func TestPackMissingSource(t *testing.T) {
	parent := t.TempDir()
	err := pack.Pack(context.Background(), filepath.Join(parent, "nope"), filepath.Join(parent, "out"), pack.Options{Bits: 4})
	if err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("missing source: err = %v", err)
	}
}

// TestPackedLayout checks the files and alignment of packed directories.
func TestPackedLayout(t *testing.T) {
	for _, model := range testutil.Models {
		for _, bits := range []int{16, 8, 4} {
			t.Run(fmt.Sprintf("%s/%d", model, bits), func(t *testing.T) {
				src := testutil.ModelDir(t, model)
				dir := testutil.Packed(t, model, bits)
				for _, f := range []string{"manifest.json", "dense.bin", "experts.bin", "tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"} {
					if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
						t.Errorf("packed dir lacks %s: %v", f, err)
					}
				}
				for _, f := range pack.CopiedFiles {
					a, _ := os.ReadFile(filepath.Join(src, f))
					b, _ := os.ReadFile(filepath.Join(dir, f))
					if len(a) == 0 || !bytes.Equal(a, b) {
						t.Errorf("%s not copied verbatim", f)
					}
				}
				m := readManifest(t, dir)
				ck, err := hf.Open(src) // the config as read with the weights (an MTP layer declared but absent is dropped)
				if err != nil {
					t.Fatal(err)
				}
				cfg := ck.Config
				ck.Close()
				if m.Format != format.MinVersion || m.Bits != bits || m.GroupSize != format.GroupSize || m.Family != cfg.Family || !reflect.DeepEqual(m.Config, cfg) {
					t.Errorf("manifest header: format %d bits %d group %d family %s", m.Format, m.Bits, m.GroupSize, m.Family)
				}
				kind, _ := format.KindForBits(bits)
				if len(m.Stores) != 1 {
					t.Fatalf("%d stores, want 1", len(m.Stores))
				}
				st := m.Stores[0]
				if want := format.ExpertRecordLayout(&m.Config, kind, "experts.bin"); !reflect.DeepEqual(st, want) {
					t.Errorf("store %+v, want %+v", st, want)
				}
				if st.Stride%format.RecordAlign != 0 || st.Stride <= 0 {
					t.Errorf("stride %d not a positive multiple of %d", st.Stride, format.RecordAlign)
				}
				if m.ExpertLayers != m.Config.Layers+m.Config.MTPLayers || m.Experts != m.Config.Experts {
					t.Errorf("expert layers %d experts %d", m.ExpertLayers, m.Experts)
				}
				fi, err := os.Stat(filepath.Join(dir, "experts.bin"))
				if err != nil {
					t.Fatal(err)
				}
				if want := int64(m.ExpertLayers) * int64(m.Experts) * st.Stride; fi.Size() != want {
					t.Errorf("experts.bin is %d bytes, want %d layers × %d experts × %d = %d", fi.Size(), m.ExpertLayers, m.Experts, st.Stride, want)
				}
				di, err := os.Stat(filepath.Join(dir, "dense.bin"))
				if err != nil {
					t.Fatal(err)
				}
				if di.Size() != m.DenseBytes {
					t.Errorf("dense.bin is %d bytes, manifest says %d", di.Size(), m.DenseBytes)
				}
				specs, err := family.Specs(&m.Config)
				if err != nil {
					t.Fatal(err)
				}
				if len(specs) != len(m.Dense) {
					t.Fatalf("%d dense tensors, want %d", len(m.Dense), len(specs))
				}
				var prevEnd int64
				for i, d := range m.Dense {
					s := specs[i]
					wantKind := format.F32
					if s.Quant {
						wantKind = kind
					}
					if d.Name != s.Name || !reflect.DeepEqual(d.Shape, s.Shape) || d.Kind != wantKind {
						t.Errorf("dense[%d] = %s %v %s, want %s %v %s", i, d.Name, d.Shape, d.Kind, s.Name, s.Shape, wantKind)
					}
					if d.Offset%format.DenseAlign != 0 {
						t.Errorf("%s offset %d not %d-aligned", d.Name, d.Offset, format.DenseAlign)
					}
					v, sc := d.Kind.Sizes(d.Rows(), d.Cols())
					if d.Size != v {
						t.Errorf("%s size %d, want %d", d.Name, d.Size, v)
					}
					if d.Kind.Quantised() {
						if d.ScaleOffset%format.DenseAlign != 0 || d.BiasOffset%format.DenseAlign != 0 {
							t.Errorf("%s scale/bias offsets %d %d not aligned", d.Name, d.ScaleOffset, d.BiasOffset)
						}
						if d.ScaleOffset < d.Offset+d.Size || d.BiasOffset < d.ScaleOffset+sc {
							t.Errorf("%s: values, scales, biases overlap", d.Name)
						}
					}
					if d.Offset < prevEnd {
						t.Errorf("%s at %d overlaps the previous tensor ending at %d", d.Name, d.Offset, prevEnd)
					}
					prevEnd = d.End()
				}
				if prevEnd > m.DenseBytes {
					t.Errorf("last tensor ends at %d, past dense bytes %d", prevEnd, m.DenseBytes)
				}
			})
		}
	}
}

// TestPack16Exact checks that a 16-bit pack stores the checkpoint's bf16
// values bit for bit, in the right place: dense tensors, a trunk expert
// record and the fused MTP expert record (gate rows first).
func TestPack16Exact(t *testing.T) {
	const model = "tiny-qwen3-5-moe"
	dir := testutil.Packed(t, model, 16)
	m := readManifest(t, dir)
	ck, err := safetensors.OpenDir(testutil.ModelDir(t, model))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	dense, err := os.ReadFile(filepath.Join(dir, "dense.bin"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ canon, src string }{
		{"embed_tokens.weight", "model.embed_tokens.weight"},
		{"lm_head.weight", "lm_head.weight"},
		{"layers.0.linear_attn.in_proj_qkv.weight", "model.layers.0.linear_attn.in_proj_qkv.weight"},
		{"layers.6.self_attn.q_proj.weight", "mtp.layers.0.self_attn.q_proj.weight"},
		{"mtp.fc.weight", "mtp.fc.weight"},
		{"layers.2.input_layernorm.weight", "model.layers.2.input_layernorm.weight"},
		{"layers.6.mlp.gate.weight", "mtp.layers.0.mlp.gate.weight"},
	} {
		d, ok := m.Find(c.canon)
		if !ok {
			t.Fatalf("manifest lacks %s", c.canon)
		}
		src := ck.Tensors[c.src]
		got := dense[d.Offset : d.Offset+d.Size]
		want := src.Data
		if d.Kind == format.F32 {
			want = convertBF16(src.Data, 4, func(h uint16) []byte { return binary.LittleEndian.AppendUint32(nil, uint32(h)<<16) })
		} else if d.Kind != format.BF16 {
			t.Fatalf("%s kind %s in a 16-bit pack", c.canon, d.Kind)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s (%s) not stored exactly", c.canon, d.Kind)
		}
	}

	ex, err := os.ReadFile(filepath.Join(dir, "experts.bin"))
	if err != nil {
		t.Fatal(err)
	}
	st := m.Stores[0]
	E, I, H := m.Experts, m.Config.MoEInter, m.Config.Hidden
	record := func(l, e int) []byte {
		off := int64(l*E+e) * st.Stride
		return ex[off : off+st.Stride]
	}
	part := func(rec []byte, p format.Tensor) []byte { return rec[p.Offset : p.Offset+p.Size] }
	for _, le := range [][2]int{{0, 0}, {2, 9}, {5, 63}} {
		l, e := le[0], le[1]
		rec := record(l, e)
		p := fmt.Sprintf("model.layers.%d.mlp.experts.%d.", l, e)
		for _, x := range []struct {
			t    format.Tensor
			name string
		}{{st.Gate, "gate_proj"}, {st.Up, "up_proj"}, {st.Down, "down_proj"}} {
			if !bytes.Equal(part(rec, x.t), ck.Tensors[p+x.name+".weight"].Data) {
				t.Errorf("record layer %d expert %d: %s not stored exactly", l, e, x.name)
			}
		}
	}
	gu := ck.Tensors["mtp.layers.0.mlp.experts.gate_up_proj"].Data
	dn := ck.Tensors["mtp.layers.0.mlp.experts.down_proj"].Data
	for _, e := range []int{0, 5, 63} {
		rec := record(m.Config.Layers, e)
		base := e * 2 * I * H * 2
		if !bytes.Equal(part(rec, st.Gate), gu[base:base+I*H*2]) {
			t.Errorf("MTP expert %d gate is not rows [0, I) of gate_up_proj", e)
		}
		if !bytes.Equal(part(rec, st.Up), gu[base+I*H*2:base+2*I*H*2]) {
			t.Errorf("MTP expert %d up is not rows [I, 2I) of gate_up_proj", e)
		}
		if !bytes.Equal(part(rec, st.Down), dn[e*H*I*2:(e+1)*H*I*2]) {
			t.Errorf("MTP expert %d down not stored exactly", e)
		}
	}
}

// ---- EOS and MTP ----

func TestPackedEOS(t *testing.T) {
	for _, model := range testutil.Models {
		m := readManifest(t, testutil.Packed(t, model, 4))
		if !reflect.DeepEqual(m.Config.EOS, []int{4093, 4095}) {
			t.Errorf("%s: EOS = %v, want [4093 4095] from generation_config.json", model, m.Config.EOS)
		}
	}
}

func TestPackMTP(t *testing.T) {
	const model = "tiny-qwen3-5-moe"
	m := readManifest(t, testutil.Packed(t, model, 4))
	if m.ExpertLayers != 7 || m.Config.MTPLayers != 1 {
		t.Errorf("with MTP: ExpertLayers %d MTPLayers %d, want 7 1", m.ExpertLayers, m.Config.MTPLayers)
	}
	if _, ok := m.Find("mtp.fc.weight"); !ok {
		t.Error("mtp.fc.weight not packed")
	}
	if _, ok := m.Find("layers.6.self_attn.q_proj.weight"); !ok {
		t.Error("MTP layer not packed as layers.6")
	}

	src := makeVariant(t, model, variant{edit: func(n string, r *rawTensor) bool { return !strings.HasPrefix(n, "mtp.") }})
	if cfg := testutil.ReadJSON(t, filepath.Join(src, "config.json")); cfg["mtp_num_hidden_layers"] != 1.0 {
		t.Fatalf("variant config lost mtp_num_hidden_layers: %v", cfg["mtp_num_hidden_layers"])
	}
	dir := packTo(t, src, 4)
	m0 := readManifest(t, dir)
	if m0.ExpertLayers != 6 || m0.Config.MTPLayers != 0 {
		t.Errorf("without MTP tensors: ExpertLayers %d MTPLayers %d, want 6 0", m0.ExpertLayers, m0.Config.MTPLayers)
	}
	for _, d := range m0.Dense {
		if strings.HasPrefix(d.Name, "mtp.") || strings.HasPrefix(d.Name, "layers.6.") {
			t.Errorf("MTP-less pack holds %s", d.Name)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, "experts.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if want := 6 * int64(m0.Experts) * m0.Stores[0].Stride; fi.Size() != want {
		t.Errorf("experts.bin %d bytes, want %d", fi.Size(), want)
	}
	// The trunk is unchanged: the first six layers' records are identical.
	full, _ := os.ReadFile(filepath.Join(testutil.Packed(t, model, 4), "experts.bin"))
	part, _ := os.ReadFile(filepath.Join(dir, "experts.bin"))
	if !bytes.Equal(full[:len(part)], part) {
		t.Error("trunk expert records differ between the MTP and MTP-less packs")
	}
}

// TestRecordsThreads: the expert records are encoded on several threads
// in batches and written in order, so the store's bytes and the low-bit
// store's do not depend on the thread count (3 threads leave a partial
// last batch in every layer of 64 experts).
func TestRecordsThreads(t *testing.T) {
	model := testutil.Models[0]
	var stores [2][2][]byte // [threads 1, 3][experts.bin, experts3.bin]
	for i, n := range []int{1, 3} {
		prev := runtime.GOMAXPROCS(n)
		dst := filepath.Join(t.TempDir(), "p")
		err := pack.Pack(context.Background(), testutil.ModelDir(t, model), dst, pack.Options{Bits: 4})
		if err == nil {
			err = pack.AddLowBits(context.Background(), dst, 3, nil)
		}
		runtime.GOMAXPROCS(prev)
		if err != nil {
			t.Fatal(err)
		}
		for j, f := range []string{"experts.bin", format.LowStoreFile(3)} {
			if stores[i][j], err = os.ReadFile(filepath.Join(dst, f)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for j, f := range []string{"experts.bin", format.LowStoreFile(3)} {
		if len(stores[0][j]) == 0 || !bytes.Equal(stores[0][j], stores[1][j]) {
			t.Errorf("%s: %d bytes on one thread, %d on three, not the same", f, len(stores[0][j]), len(stores[1][j]))
		}
	}
}
