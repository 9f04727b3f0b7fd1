package main

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/gguf"
)

// TestGGUFTensor converts affine q4 and q8 tensors to Q4_0 and Q8_0 and
// compares llama.cpp's dequantisation of the result with the affine
// values computed here: equal where synth's scales make the conversion
// exact, within the GGUF type's rounding elsewhere.
func TestGGUFTensor(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const rows, cols = 3, 128
	ng := cols / format.GroupSize
	for _, kind := range []format.Kind{format.Q4, format.Q8} {
		for _, exact := range []bool{true, false} {
			vb, sb := kind.Sizes(rows, cols)
			buf := make([]byte, vb+2*sb)
			fillRandom(r, buf[:vb])
			tt := format.Tensor{Name: "w", Kind: kind, Shape: []int{rows, cols}, Offset: 0, Size: vb, ScaleOffset: vb, BiasOffset: vb + sb}
			scales, biases := make([]float32, rows*ng), make([]float32, rows*ng)
			for i := range scales {
				sc, bi := synthScale(kind, float32(0.01+r.Float64()))
				if !exact {
					sc *= 1.0001
					bi = -float32(r.Float64())
				}
				scales[i], biases[i] = sc, bi
				binary.LittleEndian.PutUint32(buf[vb+int64(4*i):], math.Float32bits(sc))
				binary.LittleEndian.PutUint32(buf[vb+sb+int64(4*i):], math.Float32bits(bi))
			}
			// The affine values, from the format's definition.
			want := make([]float32, rows*cols)
			for i := range want {
				row, col := i/cols, i%cols
				g, j := col/format.GroupSize, col%format.GroupSize
				var q byte
				if kind == format.Q8 {
					q = buf[i]
				} else if j < 32 {
					q = buf[(row*cols+g*64)/2+j] & 15
				} else {
					q = buf[(row*cols+g*64)/2+j-32] >> 4
				}
				want[i] = scales[row*ng+g]*float32(q) + biases[row*ng+g]
			}
			for _, gt := range []gguf.Type{gguf.Q4_0, gguf.Q8_0} {
				var w bytes.Buffer
				if err := ggufTensor(&w, buf, &tt, gt); err != nil {
					t.Fatal(err)
				}
				got := make([]float32, rows*cols)
				if gt == gguf.Q4_0 {
					gguf.DequantizeQ4_0(got, w.Bytes())
				} else {
					gguf.DequantizeQ8_0(got, w.Bytes())
				}
				lossless := exact && !(kind == format.Q8 && gt == gguf.Q4_0)
				for i := range want {
					// Off by at most half a step of the GGUF block's scale
					// (the block spans at most 2·max|v|), plus f16 rounding.
					tol := 0.0
					if !lossless {
						m := 0.0
						b := i / gguf.BlockSize * gguf.BlockSize
						for _, v := range want[b : b+gguf.BlockSize] {
							m = max(m, math.Abs(float64(v)))
						}
						tol = m/7 + 1e-3*m
						if gt == gguf.Q8_0 {
							tol = m/127 + 1e-3*m
						}
					}
					if d := math.Abs(float64(got[i] - want[i])); d > tol {
						t.Fatalf("%s exact=%v to %s: [%d] = %v, want %v", kind, exact, gt, i, got[i], want[i])
					}
				}
			}
		}
	}
}
