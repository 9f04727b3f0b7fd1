package pack_test

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/quant"
	"github.com/sluicelm/sluice/internal/safetensors"
	"github.com/sluicelm/sluice/internal/testutil"
)

// fp8Quantise quantises a [rows][cols] matrix as DeepSeek's block-scaled
// FP8 checkpoints store it: per 128×128 block (smaller at the right and
// bottom edges) a scale s = amax/448 (pow2: rounded up to a power of two,
// the ue8m0 scale format), values float8_e4m3fn(w/s), and s stored as the
// float32 weight_scale_inv [ceil(rows/128)][ceil(cols/128)]. It returns the
// codes, the scales and the float32 dequantisation, e4m3 · s.
func fp8Quantise(w []float32, rows, cols int, pow2 bool) (codes []byte, scales, dq []float32) {
	const B = 128
	br, bc := (rows+B-1)/B, (cols+B-1)/B
	codes, scales, dq = make([]byte, rows*cols), make([]float32, br*bc), make([]float32, rows*cols)
	for bi := 0; bi < br; bi++ {
		for bj := 0; bj < bc; bj++ {
			var amax float32
			for i := bi * B; i < min(rows, bi*B+B); i++ {
				for j := bj * B; j < min(cols, bj*B+B); j++ {
					amax = max(amax, float32(math.Abs(float64(w[i*cols+j]))))
				}
			}
			s := amax / 448
			if pow2 && s > 0 {
				s = float32(math.Ldexp(1, int(math.Ceil(math.Log2(float64(s))))))
			}
			if s == 0 {
				s = 1
			}
			scales[bi*bc+bj] = s
			for i := bi * B; i < min(rows, bi*B+B); i++ {
				for j := bj * B; j < min(cols, bj*B+B); j++ {
					c := quant.ToE4M3(w[i*cols+j] / s)
					codes[i*cols+j] = c
					dq[i*cols+j] = quant.E4M3(c) * s
				}
			}
		}
	}
	return
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// isFP8Weight picks the tensors DeepSeek's releases store in FP8: the
// linear layers' weights, not the embeddings, the head, the norms or the
// router.
func isFP8Weight(name string, shape []int) bool {
	return len(shape) == 2 && strings.HasSuffix(name, ".weight") && !strings.Contains(name, "norm") &&
		!strings.Contains(name, "embed_tokens") && !strings.HasPrefix(name, "lm_head") && !strings.HasSuffix(name, "mlp.gate.weight")
}

// fp8Checkpoints writes an FP8 variant of tiny-deepseek-v32 and its twin
// holding the dequantised weights, as BF16 (twinDType "BF16", exact when
// the scales are powers of two) or F32. edit, when set, rewrites the FP8
// checkpoint's tensors and config before they are written.
func fp8Checkpoints(t *testing.T, pow2 bool, twinDType string, edit func(ts map[string]rawTensor, cfg map[string]any)) (fp8Dir, twinDir string) {
	src := testutil.ModelDir(t, "tiny-deepseek-v32")
	ck, err := safetensors.OpenDir(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	f8, tw := map[string]rawTensor{}, map[string]rawTensor{}
	n := 0
	for name, tn := range ck.Tensors {
		if !isFP8Weight(name, tn.Shape) {
			r := rawTensor{tn.DType, tn.Shape, tn.Data}
			f8[name], tw[name] = r, r
			continue
		}
		v, err := tn.Float32()
		if err != nil {
			t.Fatal(err)
		}
		rows, cols := tn.Shape[0], tn.Shape[1]
		codes, scales, dq := fp8Quantise(v, rows, cols, pow2)
		f8[name] = rawTensor{"F8_E4M3", tn.Shape, codes}
		f8[name+"_scale_inv"] = rawTensor{"F32", []int{(rows + 127) / 128, (cols + 127) / 128}, f32Bytes(scales)}
		if twinDType == "BF16" {
			for _, x := range dq {
				if math.Float32bits(x)&0xffff != 0 {
					t.Fatalf("%s: dequantised %v is not a bf16 value", name, x)
				}
			}
			tw[name] = rawTensor{"BF16", tn.Shape, bf16Bytes(dq)}
		} else {
			tw[name] = rawTensor{"F32", tn.Shape, f32Bytes(dq)}
		}
		n++
	}
	if n < 10 {
		t.Fatalf("only %d FP8 tensors", n)
	}
	fp8Dir, twinDir = filepath.Join(t.TempDir(), "fp8"), filepath.Join(t.TempDir(), "twin")
	for dir, ts := range map[string]map[string]rawTensor{fp8Dir: f8, twinDir: tw} {
		os.MkdirAll(dir, 0o755)
		cfg := testutil.ReadJSON(t, filepath.Join(src, "config.json"))
		if dir == fp8Dir {
			cfg["quantization_config"] = map[string]any{"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": []any{128, 128}, "scale_fmt": "ue8m0"}
			if edit != nil {
				edit(ts, cfg)
			}
		}
		testutil.WriteJSON(t, filepath.Join(dir, "config.json"), cfg)
		for _, f := range []string{"generation_config.json", "tokenizer.json", "tokenizer_config.json"} {
			b, _ := os.ReadFile(filepath.Join(src, f))
			os.WriteFile(filepath.Join(dir, f), b, 0o644)
		}
		writeSafetensors(t, filepath.Join(dir, "model.safetensors"), ts)
	}
	return fp8Dir, twinDir
}

// TestPackFP8 packs FP8 variants of tiny-deepseek-v32 (matrices of 80, 96
// and 192 rows exercise the edge blocks) and their dequantised twins: with
// power-of-two scales the dequantised values are bf16 values and the bf16
// twin packs byte-identically; with amax/448 scales the twin holds the
// float32 dequantisation and packs byte-identically too, at 16 bits
// (rounded to bf16 as the packer rounds) and at 4.
func TestPackFP8(t *testing.T) {
	for _, c := range []struct {
		name string
		pow2 bool
		twin string
		bits []int
	}{{"pow2 scales", true, "BF16", []int{16, 4}}, {"float scales", false, "F32", []int{16, 4}}} {
		t.Run(c.name, func(t *testing.T) {
			fp8, twin := fp8Checkpoints(t, c.pow2, c.twin, nil)
			for _, bits := range c.bits {
				assertSamePack(t, packTo(t, twin, bits), packTo(t, fp8, bits))
			}
		})
	}
}

// TestPackFP8Refused: what the FP8 reader does not support is refused, and
// the error names the tensor or config field.
func TestPackFP8Refused(t *testing.T) {
	const q = "model.layers.0.self_attn.q_a_proj.weight"
	for _, c := range []struct {
		name string
		edit func(ts map[string]rawTensor, cfg map[string]any)
		want []string
	}{
		{"block size", func(ts map[string]rawTensor, cfg map[string]any) {
			cfg["quantization_config"].(map[string]any)["weight_block_size"] = []any{64, 64}
		}, []string{"quantization_config.weight_block_size"}},
		{"float8 kind", func(ts map[string]rawTensor, cfg map[string]any) {
			r := ts[q]
			r.DType = "F8_E5M2"
			ts[q] = r
		}, []string{"q_a_proj.weight", "F8_E5M2"}},
		{"scale shape", func(ts map[string]rawTensor, cfg map[string]any) {
			r := ts[q+"_scale_inv"]
			r.Shape, r.Data = []int{2, 1}, r.Data[:8]
			ts[q+"_scale_inv"] = r
		}, []string{"q_a_proj.weight_scale_inv", "weight_block_size"}},
		{"no scale", func(ts map[string]rawTensor, cfg map[string]any) {
			delete(ts, q+"_scale_inv")
		}, []string{"q_a_proj.weight_scale_inv", "missing"}},
		{"format", func(ts map[string]rawTensor, cfg map[string]any) {
			cfg["quantization_config"].(map[string]any)["fmt"] = "e5m2"
		}, []string{"quantization_config.fmt"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			fp8, _ := fp8Checkpoints(t, true, "BF16", c.edit)
			err := pack.Pack(context.Background(), fp8, filepath.Join(t.TempDir(), "p"), pack.Options{Bits: 16})
			if err == nil {
				t.Fatal("packed")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}
