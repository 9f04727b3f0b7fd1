package kernels

// gpt-oss's clamped SwiGLU constants.
const (
	gluAlpha = 1.702
	gluLimit = 7
)

// ClampedSwiGLU writes gpt-oss's expert activation into dst: the gate
// clamped above at 7 and up to [-7, 7], then
// gate·sigmoid(1.702·gate)·(up + 1). dst may alias gate.
func ClampedSwiGLU(dst, gate, up []float32) {
	up = up[:len(dst)]
	gate = gate[:len(dst)]
	for i := range dst {
		g := min(gate[i], gluLimit)
		u := min(max(up[i], -gluLimit), gluLimit)
		dst[i] = (u + 1) * (g * Sigmoid(g*gluAlpha))
	}
}
