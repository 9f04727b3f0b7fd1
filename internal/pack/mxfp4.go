package pack

import (
	"fmt"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/hf"
)

// expertKind chooses the kind of the main expert store. Experts that the
// checkpoint ships in MXFP4 (gpt-oss) stay MXFP4 at --bits 4: the records
// are then the checkpoint's codes and scales, lossless and 4.25 bits a
// weight where q4 would round them again at 5 (4 bits plus a float32 scale
// and bias per 64). At 16 and 8 bits they are dequantised exactly and
// stored like every other matrix. o.Experts overrides the choice (MXFP4
// records beside bf16 dense tensors, say).
func expertKind(ck *hf.Checkpoint, o Options, dense format.Kind) (format.Kind, error) {
	cfg := &ck.Config
	mx := family.MXFP4Experts(ck, cfg)
	k := dense
	switch {
	case o.Experts != "":
		k = o.Experts
	case mx && dense == format.Q4:
		k = format.MXFP4
	}
	switch k {
	case format.BF16, format.Q8, format.Q4:
	case format.MXFP4:
		if cfg.Hidden%format.GroupSize != 0 || cfg.MoEInter%format.GroupSize != 0 {
			if o.Experts == "" {
				return dense, nil
			}
			return "", fmt.Errorf("pack: mxfp4 experts need hidden_size %d and moe_intermediate_size %d multiples of %d", cfg.Hidden, cfg.MoEInter, format.GroupSize)
		}
	default:
		return "", fmt.Errorf("pack: expert kind %q unsupported (want bf16, q8, q4 or mxfp4)", k)
	}
	if k.Quantised() && (cfg.Hidden%format.GroupSize != 0 || cfg.MoEInter%format.GroupSize != 0) {
		return "", fmt.Errorf("pack: hidden_size %d and moe_intermediate_size %d must be multiples of %d to quantise", cfg.Hidden, cfg.MoEInter, format.GroupSize)
	}
	return k, nil
}
