package family_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
)

// TestDeepSeekConfig: the tiny DeepSeek-V3.2 config normalises as
// transformers reads it, and its blocks carry the config's options.
func TestDeepSeekConfig(t *testing.T) {
	c, _ := parseDir(t, "tiny-deepseek-v32")
	if c.Family != family.NameDeepSeek || c.Hidden != 256 || c.Layers != 6 || c.Heads != 4 || c.Experts != 64 || c.TopK != 4 ||
		c.MoEInter != 64 || c.SharedInter != 64 || !c.NormTopK || c.FirstDense != 1 || c.RotaryDim != 16 || c.RopeTheta != 10000 {
		t.Fatalf("config %+v", c)
	}
	f, _ := family.Named(family.NameDeepSeek)
	a, err := f.Build(&c, block.Specs())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Layers[0].FFN.(*block.MLP); !ok {
		t.Error("layer 0 is not dense")
	}
	m := a.Layers[1].MoE()
	if m == nil || m.Score != block.SigmoidGroups || m.Groups != 4 || m.TopGroups != 2 || m.Scale != 2.5 || m.SharedGate.Present() {
		t.Errorf("layer 1 MoE %+v", m)
	}
	mla := a.Layers[2].Mixer.(*block.MLA)
	if mla.KVLora != 64 || mla.QLora != 96 || mla.Nope != 32 || mla.RopeDim != 16 || mla.V != 32 || mla.Index == nil || mla.Index.TopK != 64 {
		t.Errorf("MLA %+v", mla)
	}
	if want := float32(1 / 6.928203230275509); mla.Scale != want { // 48^-½
		t.Errorf("scale %v, want %v", mla.Scale, want)
	}
	if a.States[0].Kind != block.Latent || a.States[0].KVWidth != 80 || a.States[0].IndexWidth != 32 {
		t.Errorf("state %+v", a.States[0])
	}
}

// TestDeepSeekRefusals: what deepseek_v32 does not implement is refused by
// name.
func TestDeepSeekRefusals(t *testing.T) {
	_, raw := parseDir(t, "tiny-deepseek-v32")
	f, _ := family.Named(family.NameDeepSeek)
	for _, tc := range []struct {
		name string
		edit func(m map[string]any)
		want string
	}{
		{"unknown key", func(m map[string]any) { m["frobnicate"] = 1 }, "frobnicate"},
		{"fp8", func(m map[string]any) { m["quantization_config"] = map[string]any{"quant_method": "fp8"} }, "quantization_config"},
		{"scoring", func(m map[string]any) { m["scoring_func"] = "softmax" }, "scoring_func"},
		{"two mtp modules", func(m map[string]any) { m["num_nextn_predict_layers"] = 2 }, "num_nextn_predict_layers = 2"},
		{"no q lora", func(m map[string]any) { m["q_lora_rank"] = nil }, "q_lora_rank"},
		{"mlp layers", func(m map[string]any) {
			m["mlp_layer_types"] = []any{"sparse", "dense", "sparse", "sparse", "sparse", "sparse"}
		}, "mlp_layer_types"},
		{"rope type", func(m map[string]any) {
			m["rope_parameters"] = map[string]any{"rope_type": "llama3", "rope_theta": 1e4}
		}, "rope_type"},
		{"rope key", func(m map[string]any) { m["rope_parameters"] = map[string]any{"rope_type": "default", "factor": 2.0} }, "factor"},
		{"groups", func(m map[string]any) { m["topk_group"] = 5 }, "topk_group"},
		{"layer type", func(m map[string]any) { m["layer_types"] = []any{"full_attention"} }, "layer_types"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m map[string]any
			json.Unmarshal(raw, &m)
			tc.edit(m)
			b, _ := json.Marshal(m)
			if _, err := f.Parse(b); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// TestDeepSeekRopeRows: the packer reorders the rope rows of q_b_proj and
// kv_a_proj_with_mqa so that the half-split rope gives what DeepSeek's
// interleaved rope returns, cat(rot(x[0::2]), rot(x[1::2])): row j of the
// first half is interleaved row 2j, of the second 2j+1. Rows outside the
// rope parts stay.
func TestDeepSeekRopeRows(t *testing.T) {
	c, _ := parseDir(t, "tiny-deepseek-v32")
	const qk, nope, rope, kvl = 48, 32, 16, 64
	row := func(r, cols int) []float32 {
		v := make([]float32, cols)
		for i := range v {
			v[i] = float32(r)
		}
		return v
	}
	for _, tc := range []struct {
		name       string
		rows, cols int
		ropeAt     []int
	}{
		{"layers.0.self_attn.q_b_proj.weight", 4 * qk, 96, []int{nope, qk + nope, 2*qk + nope, 3*qk + nope}},
		{"layers.3.self_attn.kv_a_proj_with_mqa.weight", kvl + rope, 256, []int{kvl}},
	} {
		var v []float32
		for r := 0; r < tc.rows; r++ {
			v = append(v, row(r, tc.cols)...)
		}
		ck := fakeCheckpoint{tc.name: {[]int{tc.rows, tc.cols}, v}}
		got, err := family.DenseOf(ck, &c, format.Spec{Name: tc.name, Shape: []int{tc.rows, tc.cols}})
		if err != nil {
			t.Fatal(err)
		}
		for r := 0; r < tc.rows; r++ {
			want := r
			for _, at := range tc.ropeAt {
				if r >= at && r < at+rope {
					j := r - at
					if j < rope/2 {
						want = at + 2*j
					} else {
						want = at + 2*(j-rope/2) + 1
					}
				}
			}
			if got[r*tc.cols] != float32(want) || got[r*tc.cols+tc.cols-1] != float32(want) {
				t.Fatalf("%s row %d holds row %v, want %d", tc.name, r, got[r*tc.cols], want)
			}
		}
	}
}

// TestDeepSeekKVBSplit: the packer stores kv_b_proj [head][nope+v][kv_lora]
// as W_k transposed per head ([head][kv_lora][nope]) and W_v per head
// ([head][v][kv_lora]), every element once, in its place.
func TestDeepSeekKVBSplit(t *testing.T) {
	c, _ := parseDir(t, "tiny-deepseek-v32")
	const nh, nope, v, kvl = 4, 32, 32, 64
	// Element (h, r, j) of kv_b_proj holds h·1e6 + r·1e3 + j: exact in float32.
	src := make([]float32, nh*(nope+v)*kvl)
	for h := 0; h < nh; h++ {
		for r := 0; r < nope+v; r++ {
			for j := 0; j < kvl; j++ {
				src[(h*(nope+v)+r)*kvl+j] = float32(h*1e6 + r*1e3 + j)
			}
		}
	}
	ck := fakeCheckpoint{"layers.2.self_attn.kv_b_proj.weight": {[]int{nh * (nope + v), kvl}, src}}
	kb, err := family.DenseOf(ck, &c, format.Spec{Name: family.KBName(2), Shape: []int{nh * kvl, nope}})
	if err != nil {
		t.Fatal(err)
	}
	vb, err := family.DenseOf(ck, &c, format.Spec{Name: family.VBName(2), Shape: []int{nh * v, kvl}})
	if err != nil {
		t.Fatal(err)
	}
	if len(kb) != nh*kvl*nope || len(vb) != nh*v*kvl {
		t.Fatalf("W_k %d, W_v %d floats, want %d and %d", len(kb), len(vb), nh*kvl*nope, nh*v*kvl)
	}
	for h := 0; h < nh; h++ {
		for j := 0; j < kvl; j++ {
			for n := 0; n < nope; n++ {
				if got, want := kb[(h*kvl+j)*nope+n], float32(h*1e6+n*1e3+j); got != want {
					t.Fatalf("W_k^T head %d [%d][%d] = %v, want %v", h, j, n, got, want)
				}
			}
		}
		for r := 0; r < v; r++ {
			for j := 0; j < kvl; j++ {
				if got, want := vb[(h*v+r)*kvl+j], float32(h*1e6+(nope+r)*1e3+j); got != want {
					t.Fatalf("W_v head %d [%d][%d] = %v, want %v", h, r, j, got, want)
				}
			}
		}
	}
	if _, err := family.DenseOf(fakeCheckpoint{}, &c, format.Spec{Name: family.KBName(0), Shape: []int{nh * kvl, nope}}); err == nil {
		t.Error("W_k of a checkpoint without kv_b_proj: no error")
	}
}

// TestDeepSeekMTPConfig: num_nextn_predict_layers 1 builds DeepSeek-V3's
// MTP module from layer num_hidden_layers (eh_proj over enorm ‖ hnorm, a
// latent-attention MoE layer with its own latent cache, shared_head.norm);
// 0 builds none.
func TestDeepSeekMTPConfig(t *testing.T) {
	c0, raw := parseDir(t, "tiny-deepseek-v32")
	f, _ := family.Named(family.NameDeepSeek)
	a0, err := f.Build(&c0, block.Specs())
	if err != nil {
		t.Fatal(err)
	}
	if c0.MTPLayers != 0 || a0.MTP != nil {
		t.Fatalf("num_nextn_predict_layers 0: MTPLayers %d, MTP %v", c0.MTPLayers, a0.MTP)
	}
	var m map[string]any
	json.Unmarshal(raw, &m)
	m["num_nextn_predict_layers"] = 1
	b, _ := json.Marshal(m)
	c, err := f.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	specs := block.Specs()
	a, err := f.Build(&c, specs)
	if err != nil {
		t.Fatal(err)
	}
	if c.MTPLayers != 1 || a.MTP == nil {
		t.Fatalf("MTPLayers %d, MTP %v", c.MTPLayers, a.MTP)
	}
	mo := a.MTP.Layer.MoE()
	if mo == nil || mo.Layer != 6 || mo.Pre != &a.MTP.Layer.Post || mo.Score != block.SigmoidGroups {
		t.Errorf("MTP MoE %+v", mo)
	}
	if _, ok := a.MTP.Layer.Mixer.(*block.MLA); !ok {
		t.Errorf("MTP mixer %T, want latent attention", a.MTP.Layer.Mixer)
	}
	if a.MTPState != a.States[1] {
		t.Errorf("MTP state %+v, trunk %+v", a.MTPState, a.States[1])
	}
	names := map[string][]int{}
	for _, s := range specs.List() {
		names[s.Name] = s.Shape
	}
	for n, shape := range map[string][]int{"layers.6.eh_proj.weight": {256, 512}, "layers.6.enorm.weight": {256},
		"layers.6.hnorm.weight": {256}, "layers.6.shared_head.norm.weight": {256}, "layers.6.self_attn.q_b_proj.weight": {192, 96}} {
		if got, ok := names[n]; !ok || !slices.Equal(got, shape) {
			t.Errorf("tensor %s: %v (present %v), want %v", n, got, ok, shape)
		}
	}
	if d := strings.Join(f.Describe(&c), "\n"); !strings.Contains(d, "mtp") {
		t.Errorf("description does not mention the MTP module:\n%s", d)
	}
}
