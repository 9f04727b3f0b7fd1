package hf

import (
	"fmt"
	"slices"

	"github.com/sluicelm/sluice/internal/quant"
	"github.com/sluicelm/sluice/internal/safetensors"
)

// FP8Block is the side of the square blocks of a block-scaled FP8 weight
// (DeepSeek-V3's quantization_config weight_block_size [128, 128]).
const FP8Block = 128

// isFP8 reports whether a tensor is stored in one of the float8 dtypes.
func isFP8(t *safetensors.Tensor) bool {
	return t.DType == "F8_E4M3" || t.DType == "F8_E5M2"
}

// fp8Float32 dequantises the block-scaled FP8 weight name as DeepSeek's
// weight_dequant does: value (float8_e4m3fn, widened exactly) times its
// 128×128 block's name_scale_inv (float32), one float32 product each.
// Blocks at the right and bottom edges cover what is left of the matrix
// when a dimension is not a multiple of 128 (the scale tensor has
// ceil(rows/128) × ceil(cols/128) entries).
func (c *Checkpoint) fp8Float32(name string, t *safetensors.Tensor) ([]float32, error) {
	if t.DType != "F8_E4M3" {
		return nil, fmt.Errorf("checkpoint %s: tensor %s: dtype %s is not supported (FP8 weights must be F8_E4M3 with a weight_scale_inv)", c.Dir, name, t.DType)
	}
	if len(t.Shape) != 2 {
		return nil, fmt.Errorf("checkpoint %s: tensor %s: FP8 weight of shape %v, want a matrix", c.Dir, name, t.Shape)
	}
	rows, cols := t.Shape[0], t.Shape[1]
	sn := name + "_scale_inv"
	c.use(sn)
	st, ok := c.byName[sn]
	if !ok {
		return nil, fmt.Errorf("checkpoint %s: tensor %s is F8_E4M3 but %s is missing", c.Dir, name, sn)
	}
	br, bc := (rows+FP8Block-1)/FP8Block, (cols+FP8Block-1)/FP8Block
	if want := []int{br, bc}; !slices.Equal(st.Shape, want) {
		return nil, fmt.Errorf("checkpoint %s: tensor %s is %v, want %v for %s %v in blocks of %d×%d (weight_block_size)", c.Dir, sn, st.Shape, want, name, t.Shape, FP8Block, FP8Block)
	}
	s, err := st.Float32()
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %v", c.Dir, err)
	}
	if len(t.Data) != rows*cols {
		return nil, fmt.Errorf("checkpoint %s: tensor %s: %d bytes for %v", c.Dir, name, len(t.Data), t.Shape)
	}
	var lut [256]float32
	for b := range lut {
		lut[b] = quant.E4M3(byte(b))
	}
	out := make([]float32, rows*cols)
	for i := 0; i < rows; i++ {
		srow := s[i/FP8Block*bc:]
		for j, b := range t.Data[i*cols : (i+1)*cols] {
			out[i*cols+j] = lut[b] * srow[j/FP8Block]
		}
	}
	return out, nil
}
