package experts

import (
	"encoding/binary"
	"fmt"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/quant"
)

// LowStore returns the manifest's low-bit expert store of bits (3 or 2).
func LowStore(man *format.Manifest, bits int) (*format.ExpertStore, error) {
	k, err := format.LowKind(bits)
	if err != nil {
		return nil, fmt.Errorf("--miss-bits: %v", err)
	}
	if !man.Stores[0].Kind.Quantised() && man.Stores[0].Kind != format.BF16 {
		return nil, fmt.Errorf("--miss-bits needs a bf16, q8 or q4 expert store, not %s", man.Stores[0].Kind)
	}
	st, ok := man.Store(k)
	if !ok {
		return nil, fmt.Errorf("the packed model has no %d-bit expert store (make it with `sluice pack --low-bits %d`)", bits, bits)
	}
	return st, nil
}

// expandLow widens a low-bit record (src, laid out as low says) into the
// main store's layout and kind (dst, laid out as st says), so the kernels
// see an ordinary record whose values happen to use only 2^b levels. q4
// and q8 keep the low-bit scale and bias exactly; bf16 gets scale*q+bias
// rounded to bf16. Misses no longer take this path (the kernels multiply
// low-bit records as they are, which for a q4 main store gives the same
// bits); tests keep it as the reference (Options.widen).
func expandLow(dst, src []byte, st, low *format.ExpertStore) error {
	for _, p := range [3][2]*format.Tensor{{&st.Gate, &low.Gate}, {&st.Up, &low.Up}, {&st.Down, &low.Down}} {
		if err := expandTensor(dst, src, p[0], p[1]); err != nil {
			return err
		}
	}
	return nil
}

// ExpandLow is expandLow for tests outside the package: a model whose
// main store holds the low-bit records widened must give, bit for bit,
// the logits of one whose every expert arrives at low bits.
func ExpandLow(dst, src []byte, st, low *format.ExpertStore) error {
	return expandLow(dst, src, st, low)
}

func expandTensor(dst, src []byte, d, s *format.Tensor) error {
	const G = format.GroupSize
	b := s.Kind.Bits()
	n := d.Rows() * d.Cols()
	groups := n / G
	sv := src[s.Offset:]
	ss := src[s.ScaleOffset:]
	sb := src[s.BiasOffset:]
	dv := dst[d.Offset:]
	var q [G]uint8
	for g := 0; g < groups; g++ {
		quant.UnpackLow(q[:], sv[g*G*b/8:(g+1)*G*b/8], b)
		switch d.Kind {
		case format.Q4:
			o := dv[g*G/2 : (g+1)*G/2]
			for j := 0; j < G/2; j++ {
				o[j] = q[j] | q[j+G/2]<<4
			}
		case format.Q8:
			copy(dv[g*G:(g+1)*G], q[:])
		case format.BF16:
			scale := quant.F16ToF32(binary.LittleEndian.Uint16(ss[2*g:]))
			bias := quant.F16ToF32(binary.LittleEndian.Uint16(sb[2*g:]))
			for j, v := range q {
				binary.LittleEndian.PutUint16(dv[2*(g*G+j):], quant.BF16(float32(scale*float32(v))+bias))
			}
		default:
			return fmt.Errorf("low-bit records cannot widen into %s", d.Kind)
		}
	}
	if d.Tiled {
		// The main store's views read this matrix tiled.
		kernels.TileQ4(dv[:d.Size], d.Rows(), d.Cols(), nil)
	}
	if d.Kind.Quantised() {
		copy(dst[d.ScaleOffset:d.ScaleOffset+int64(2*groups)], ss[:2*groups])
		copy(dst[d.BiasOffset:d.BiasOffset+int64(2*groups)], sb[:2*groups])
	}
	return nil
}
