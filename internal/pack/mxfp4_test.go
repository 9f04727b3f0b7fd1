package pack_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/quant"
	"github.com/sluicelm/sluice/internal/safetensors"
	"github.com/sluicelm/sluice/internal/testutil"
)

// fp4Values are MXFP4's E2M1 codes, as transformers lists them.
var fp4Values = [16]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6}

// mxfp4Encode quantises rows×cols values ([rows][cols], cols a multiple
// of 32) to MXFP4 as the release stores it: per row and group of 32, an
// E8M0 scale 2^(s−127) bringing the group's largest magnitude to at most 6,
// and a byte per value pair, the first in the low nibble. It returns the
// blocks, the scales and the values they decode to.
func mxfp4Encode(w []float32, rows, cols int) (blocks, scales []byte, dq []float32) {
	blocks = make([]byte, rows*cols/2)
	scales = make([]byte, rows*cols/32)
	dq = make([]float32, rows*cols)
	for g := range scales {
		grp := w[g*32 : (g+1)*32]
		var amax float64
		for _, v := range grp {
			amax = math.Max(amax, math.Abs(float64(v)))
		}
		e := 0
		if amax > 0 {
			e = int(math.Ceil(math.Log2(amax / 6)))
		}
		scales[g] = byte(e + 127)
		m := math.Ldexp(1, e)
		for j, v := range grp {
			best := 0
			for c := range fp4Values {
				if math.Abs(fp4Values[c]*m-float64(v)) < math.Abs(fp4Values[best]*m-float64(v)) {
					best = c
				}
			}
			blocks[g*16+j/2] |= byte(best) << (4 * (j % 2))
			dq[g*32+j] = float32(fp4Values[best] * m)
		}
	}
	return
}

func bf16Bytes(v []float32) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(math.Float32bits(x)>>16))
	}
	return b
}

// mxfp4Checkpoints writes two variants of tiny-gpt-oss: its experts in
// MXFP4 as the release stores them ([E][out][in/32][16] blocks, [E][out][in/32]
// scales, gate and up rows interleaved, quantization_config mxfp4), and the
// same experts dequantised in the bf16 layout ([E][in][out]). dq holds the
// dequantised experts by tensor name, in the bf16 layout. edit, when set,
// rewrites the MXFP4 checkpoint's tensors before they are written.
func mxfp4Checkpoints(t *testing.T, edit func(ts map[string]rawTensor)) (mxDir, bfDir string, dq map[string][]float32) {
	src := testutil.ModelDir(t, "tiny-gpt-oss")
	ck, err := safetensors.OpenDir(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	const E = 64
	mx, bf := map[string]rawTensor{}, map[string]rawTensor{}
	dq = map[string][]float32{}
	for name, tn := range ck.Tensors {
		switch {
		case strings.HasSuffix(name, "mlp.experts.gate_up_proj"), strings.HasSuffix(name, "mlp.experts.down_proj"):
			v, err := tn.Float32()
			if err != nil {
				t.Fatal(err)
			}
			in, out := tn.Shape[1], tn.Shape[2] // bf16 layout: [E][in][out]
			var blocks, scales []byte
			dqT := make([]float32, len(v))
			for e := 0; e < E; e++ {
				w := make([]float32, out*in) // [out][in]
				for i := 0; i < in; i++ {
					for o := 0; o < out; o++ {
						w[o*in+i] = v[(e*in+i)*out+o]
					}
				}
				b, s, dq := mxfp4Encode(w, out, in)
				blocks, scales = append(blocks, b...), append(scales, s...)
				for i := 0; i < in; i++ {
					for o := 0; o < out; o++ {
						dqT[(e*in+i)*out+o] = dq[o*in+i]
					}
				}
			}
			mx[name+"_blocks"] = rawTensor{"U8", []int{E, out, in / 32, 16}, blocks}
			mx[name+"_scales"] = rawTensor{"U8", []int{E, out, in / 32}, scales}
			bf[name] = rawTensor{"BF16", tn.Shape, bf16Bytes(dqT)}
			dq[name] = dqT
		default:
			r := rawTensor{tn.DType, tn.Shape, tn.Data}
			mx[name], bf[name] = r, r
		}
	}
	if edit != nil {
		edit(mx)
	}
	dirs := map[string]map[string]rawTensor{"mxfp4": mx, "bf16": bf}
	out := map[string]string{}
	for kind, ts := range dirs {
		dir := filepath.Join(t.TempDir(), kind)
		os.MkdirAll(dir, 0o755)
		cfg := testutil.ReadJSON(t, filepath.Join(src, "config.json"))
		if kind == "mxfp4" {
			cfg["quantization_config"] = map[string]any{"quant_method": "mxfp4", "modules_to_not_convert": []any{"model.layers.*.self_attn", "model.embed_tokens", "lm_head"}}
		}
		testutil.WriteJSON(t, filepath.Join(dir, "config.json"), cfg)
		for _, f := range []string{"generation_config.json", "tokenizer.json", "tokenizer_config.json"} {
			b, _ := os.ReadFile(filepath.Join(src, f))
			os.WriteFile(filepath.Join(dir, f), b, 0o644)
		}
		writeSafetensors(t, filepath.Join(dir, "model.safetensors"), ts)
		out[kind] = dir
	}
	return out["mxfp4"], out["bf16"], dq
}

// TestPackMXFP4 packs the MXFP4 checkpoint and its dequantised twin at 16
// bits: the experts are dequantised exactly, so the packs are
// byte-identical.
func TestPackMXFP4(t *testing.T) {
	mx, bf, _ := mxfp4Checkpoints(t, nil)
	assertSamePack(t, packTo(t, bf, 16), packTo(t, mx, 16))
}

// TestPackMXFP4Records packs the MXFP4 checkpoint at 4 bits: the experts
// stay MXFP4 records that decode to exactly the checkpoint's dequantised
// values, at 4.25 bits a weight, beside q4 dense tensors.
func TestPackMXFP4Records(t *testing.T) {
	mx, _, dq := mxfp4Checkpoints(t, nil)
	dir := packTo(t, mx, 4)
	m := readManifest(t, dir)
	st := m.Stores[0]
	if st.Kind != format.MXFP4 || st.Gate.Kind != format.MXFP4 {
		t.Fatalf("expert store kind %s, want mxfp4", st.Kind)
	}
	if d, ok := m.Find("layers.0.self_attn.q_proj.weight"); !ok || d.Kind != format.Q4 {
		t.Fatalf("q_proj: %+v, want q4", d)
	}
	c := m.Config
	E, H, I := c.Experts, c.Hidden, c.MoEInter
	if v, _ := format.MXFP4.Sizes(I, H); v*8 != int64(I*H)*17/4 {
		t.Fatalf("mxfp4 [%d %d]: %d bytes, want 4.25 bits a weight", I, H, v)
	}
	data, err := os.ReadFile(filepath.Join(dir, st.File))
	if err != nil {
		t.Fatal(err)
	}
	dec := func(rec []byte, tn *format.Tensor) []float32 {
		out := make([]float32, tn.Rows()*tn.Cols())
		quant.Decode(out, rec[tn.Offset:tn.Offset+tn.Size], nil, nil, tn.Rows(), tn.Cols(), tn.Kind)
		return out
	}
	for l := 0; l < c.Layers; l++ {
		gu := dq[fmt.Sprintf("model.layers.%d.mlp.experts.gate_up_proj", l)] // [E][H][2I]
		down := dq[fmt.Sprintf("model.layers.%d.mlp.experts.down_proj", l)]  // [E][I][H]
		for e := 0; e < E; e++ {
			rec := data[int64(l*E+e)*st.Stride:]
			g, u, d := dec(rec, &st.Gate), dec(rec, &st.Up), dec(rec, &st.Down)
			for i := 0; i < I; i++ {
				for h := 0; h < H; h++ {
					if g[i*H+h] != gu[(e*H+h)*2*I+2*i] || u[i*H+h] != gu[(e*H+h)*2*I+2*i+1] {
						t.Fatalf("layer %d expert %d gate/up [%d][%d]: %v/%v, checkpoint %v/%v", l, e, i, h,
							g[i*H+h], u[i*H+h], gu[(e*H+h)*2*I+2*i], gu[(e*H+h)*2*I+2*i+1])
					}
					if d[h*I+i] != down[(e*I+i)*H+h] {
						t.Fatalf("layer %d expert %d down [%d][%d]: %v, checkpoint %v", l, e, h, i, d[h*I+i], down[(e*I+i)*H+h])
					}
				}
			}
		}
	}
}

// TestMXFP4Logits runs the MXFP4 checkpoint packed with MXFP4 experts
// beside bf16 dense tensors against a bf16 pack of the same dequantised
// weights. The weights are identical; what differs is the expert products'
// arithmetic, int8 activations per group of 64 (as q4 products) against
// float32 ones. The logits must stay within that activation rounding and
// greedy decoding must give the same tokens.
func TestMXFP4Logits(t *testing.T) {
	mx, bf, _ := mxfp4Checkpoints(t, nil)
	mxPack := filepath.Join(t.TempDir(), "mx")
	if err := pack.Pack(context.Background(), mx, mxPack, pack.Options{Bits: 16, Experts: format.MXFP4}); err != nil {
		t.Fatal(err)
	}
	if k := readManifest(t, mxPack).Stores[0].Kind; k != format.MXFP4 {
		t.Fatalf("expert kind %s, want mxfp4", k)
	}
	bfPack := packTo(t, bf, 16)
	prompt := make([]int, 48) // past the sliding window of 32
	for i := range prompt {
		prompt[i] = (i*7919 + 13) % 1000
	}
	const gen = 24
	var logits [2][]float32
	var toks [2][]int
	for k, dir := range []string{mxPack, bfPack} {
		m, err := model.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		if m.Experts, err = model.NewResidentProvider(m); err != nil {
			t.Fatal(err)
		}
		r := model.NewRunner(m, 2, 16)
		st, err := m.NewState(len(prompt) + gen)
		if err != nil {
			t.Fatal(err)
		}
		V := m.Config.Vocab
		all := make([]float32, len(prompt)*V)
		if err := r.Forward(st, prompt, all, true); err != nil {
			t.Fatal(err)
		}
		logits[k] = all
		next := argmaxF(all[(len(prompt)-1)*V:])
		one := make([]float32, V)
		for len(toks[k]) < gen {
			toks[k] = append(toks[k], next)
			if err := r.Forward(st, []int{next}, one, false); err != nil {
				t.Fatal(err)
			}
			next = argmaxF(one)
		}
		r.Close()
		m.Close()
	}
	var maxd, maxv, sumd float64
	for i := range logits[0] {
		sumd += math.Abs(float64(logits[0][i] - logits[1][i]))
		maxd = math.Max(maxd, math.Abs(float64(logits[0][i]-logits[1][i])))
		maxv = math.Max(maxv, math.Abs(float64(logits[1][i])))
	}
	t.Logf("max |Δlogit| %.4g, mean %.4g over %d positions (max |logit| %.3g)", maxd, sumd/float64(len(logits[0])), len(prompt), maxv)
	// Measured: max 0.95, mean 0.024 against a largest logit of 14.5; with
	// float activations in the expert products the same records give
	// 3e-6, so the difference is the activations' int8 rounding alone (a
	// q4 pack of the same weights: max 2.7, mean 0.27).
	if mean := sumd / float64(len(logits[0])); maxd > 0.1*maxv || mean > 0.005*maxv {
		t.Errorf("|Δlogit| max %.4g, mean %.4g: beyond int8 activation rounding (10%%, 0.5%% of the largest logit %.3g)", maxd, mean, maxv)
	}
	if !slices.Equal(toks[0], toks[1]) {
		t.Errorf("greedy tokens differ:\nmxfp4 %v\nbf16  %v", toks[0], toks[1])
	}
}

func argmaxF(x []float32) int {
	b := 0
	for i, v := range x {
		if v > x[b] {
			b = i
		}
	}
	return b
}

// TestPackMXFP4Refused: MXFP4 tensors of another shape or dtype than the
// release's are refused, naming the tensor.
func TestPackMXFP4Refused(t *testing.T) {
	const b = "model.layers.1.mlp.experts.down_proj_blocks"
	for _, c := range []struct {
		name string
		edit func(r *rawTensor)
		want string
	}{
		{"odd shape", func(r *rawTensor) { r.Shape = []int{64, 256, 4, 8, 2} }, "down_proj_blocks"},
		{"dtype", func(r *rawTensor) { r.DType = "I8" }, "down_proj_blocks/_scales are I8/U8"},
	} {
		t.Run(c.name, func(t *testing.T) {
			mx, _, _ := mxfp4Checkpoints(t, func(ts map[string]rawTensor) {
				r := ts[b]
				c.edit(&r)
				ts[b] = r
			})
			for _, bits := range []int{16, 4} {
				err := pack.Pack(context.Background(), mx, filepath.Join(t.TempDir(), "p"), pack.Options{Bits: bits})
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Errorf("%d bits: error %v, want one naming %q", bits, err, c.want)
				}
			}
		})
	}
}

// TestMXFP4Stream: MXFP4 records stream through the expert pool like any
// other: a pack at 4 bits (MXFP4 experts) decodes the same tokens with
// the same logits, bit for bit, from the smallest pool as from the store
// mapped whole; and so do the store held whole in memory and a pool that
// keeps every record, which tile the records (kernels.TileMXFP4) where
// the CPU has the tiled kernel.
func TestMXFP4Stream(t *testing.T) {
	mx, _, _ := mxfp4Checkpoints(t, nil)
	dir := packTo(t, mx, 4)
	prompt := make([]int, 40)
	for i := range prompt {
		prompt[i] = (i*104729 + 7) % 1000
	}
	const (
		mapped = iota
		stream
		held
		streamTiled
	)
	run := func(how int) ([]int, []float32) {
		m, err := model.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		switch how {
		case stream, streamTiled:
			o := experts.Options{Slots: experts.MinSlots(&m.Config), Buffered: true}
			if how == streamTiled {
				o = experts.Options{Slots: m.Manifest.ExpertLayers * m.Manifest.Experts, Buffered: true, Tile: kernels.TiledMXFP4()}
			}
			s, err := experts.Open(dir, m.Manifest, o)
			if err != nil {
				t.Fatal(err)
			}
			m.Experts = s
		case held:
			if m.Experts, err = model.OpenResident(context.Background(), m, nil); err != nil {
				t.Fatal(err)
			}
			if err := m.Experts.Begin(0, []int{0}, model.Hint{}); err != nil {
				t.Fatal(err)
			}
			if _, ex, err := m.Experts.Next(); err != nil || ex.Gate.Tiled != kernels.TiledMXFP4() || ex.Down.Tiled != kernels.TiledMXFP4() {
				t.Fatalf("held whole: record tiled %v %v (%v), want %v", ex.Gate.Tiled, ex.Down.Tiled, err, kernels.TiledMXFP4())
			}
		default:
			if m.Experts, err = model.NewResidentProvider(m); err != nil {
				t.Fatal(err)
			}
		}
		r := model.NewRunner(m, 2, 16)
		defer r.Close()
		st, err := m.NewState(len(prompt) + 16)
		if err != nil {
			t.Fatal(err)
		}
		V := m.Config.Vocab
		logits := make([]float32, V)
		if err := r.Forward(st, prompt, logits, false); err != nil {
			t.Fatal(err)
		}
		var toks []int
		var all []float32
		for len(toks) < 16 {
			all = append(all, logits...)
			toks = append(toks, argmaxF(logits))
			if err := r.Forward(st, toks[len(toks)-1:], logits, false); err != nil {
				t.Fatal(err)
			}
		}
		return toks, all
	}
	ta, la := run(mapped)
	for how, name := range []string{stream: "streamed", held: "held whole", streamTiled: "streamed into a pool of every record"} {
		if name == "" {
			continue
		}
		tb, lb := run(how)
		if !slices.Equal(ta, tb) {
			t.Fatalf("tokens: mapped %v, %s %v", ta, name, tb)
		}
		for i := range la {
			if math.Float32bits(la[i]) != math.Float32bits(lb[i]) {
				t.Fatalf("logit %d: mapped %v, %s %v", i, la[i], name, lb[i])
			}
		}
	}
}
