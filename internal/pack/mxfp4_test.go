package pack_test

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

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

// TestPackMXFP4 packs a gpt-oss checkpoint whose experts are MXFP4 (the
// release's layout: [E][out][in/32][16] blocks, [E][out][in/32] scales,
// gate and up rows interleaved) and the same experts dequantised in the
// bf16 layout ([E][in][out]); at 16 bits the two packs are byte-identical.
func TestPackMXFP4(t *testing.T) {
	src := testutil.ModelDir(t, "tiny-gpt-oss")
	ck, err := safetensors.OpenDir(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	const E, H, I = 64, 256, 64
	mx, bf := map[string]rawTensor{}, map[string]rawTensor{}
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
		default:
			r := rawTensor{tn.DType, tn.Shape, tn.Data}
			mx[name], bf[name] = r, r
		}
	}
	dirs := map[string]map[string]rawTensor{"mxfp4": mx, "bf16": bf}
	packed := map[string]string{}
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
		packed[kind] = packTo(t, dir, 16)
	}
	assertSamePack(t, packed["bf16"], packed["mxfp4"])
}
