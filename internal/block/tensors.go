package block

import (
	"fmt"
	"slices"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
)

// Tensors is a family's one tensor list at work. A family declares each
// dense tensor once, with its shape, in the order the packer writes them;
// the same calls either record the list (Specs, for pack) or bind each
// tensor of a packed model, checking its shape (Bind, for load).
type Tensors struct {
	specs []format.Spec
	man   *format.Manifest
	dense []byte
	err   error
	// tile rearranges the matrices it binds into their kind's tiled
	// layout (kernels.Tile), each once however often it is declared.
	tile  bool
	tiled map[int64]bool // by offset in dense
	tmp   []byte
}

// Specs returns a Tensors that records declarations.
func Specs() *Tensors { return &Tensors{} }

// Bind returns a Tensors that binds declarations to the manifest's tensors
// inside dense (dense.bin mapped).
func Bind(man *format.Manifest, dense []byte) *Tensors {
	return &Tensors{man: man, dense: dense}
}

// Tile makes the binding rearrange every q4 matrix of rows enough for a
// tile into the tiled layout in place (kernels.TileQ4, Mat.Tiled), which
// the CPU's decode kernel reads faster (kernels.TiledQ4): only for dense
// memory of the process's own, before anything else reads it.
func (t *Tensors) Tile() { t.tile, t.tiled = true, map[int64]bool{} }

// List is the recorded declarations in pack order.
func (t *Tensors) List() []format.Spec { return t.specs }

// Err is the first binding error.
func (t *Tensors) Err() error { return t.err }

func (t *Tensors) find(name string, shape []int) (*format.Tensor, bool) {
	if t.man == nil {
		t.specs = append(t.specs, format.Spec{Name: name, Shape: shape})
		return nil, false
	}
	if t.err != nil {
		return nil, false
	}
	ft, ok := t.man.Find(name)
	if !ok {
		t.err = fmt.Errorf("tensor %s is missing from the manifest", name)
		return nil, false
	}
	if !slices.Equal(ft.Shape, shape) {
		t.err = fmt.Errorf("tensor %s is %v, want %v", name, ft.Shape, shape)
		return nil, false
	}
	return ft, true
}

// Has reports whether the bound model's manifest holds name (false while
// recording): a family asks it to tell a pack of an earlier layout by
// name.
func (t *Tensors) Has(name string) bool {
	if t.man == nil {
		return false
	}
	_, ok := t.man.Find(name)
	return ok
}

// Fail records err as the binding's error, unless an earlier one is.
func (t *Tensors) Fail(err error) {
	if t.err == nil {
		t.err = err
	}
}

// Mat declares a matrix the packer quantises (at --bits); one whose rows
// are not a whole number of quantisation groups stays float32.
func (t *Tensors) Mat(name string, shape ...int) Weight {
	return t.mat(name, shape[len(shape)-1]%format.GroupSize == 0, shape)
}

// F32 declares a matrix kept in float32 (routers, small gates: routing
// decisions are sensitive to their precision).
func (t *Tensors) F32(name string, shape ...int) Weight {
	return t.mat(name, false, shape)
}

func (t *Tensors) mat(name string, quant bool, shape []int) Weight {
	ft, ok := t.find(name, shape)
	if t.man == nil {
		t.specs[len(t.specs)-1].Quant = quant
	}
	if !ok {
		return Weight{}
	}
	m, err := kernels.MatFrom(t.dense, ft)
	if err != nil {
		t.err = err
		return Weight{}
	}
	if t.tile && kernels.Tiles(&m) {
		if t.tiled[ft.Offset] {
			m.Tiled = true // rearranged when first declared
		} else {
			t.tmp = kernels.Tile(&m, t.tmp)
			t.tiled[ft.Offset] = true
		}
	}
	return Weight{T: ft, Mat: m}
}

// Vec declares a float32 tensor read as a flat slice (norms, biases,
// sinks, conv taps).
func (t *Tensors) Vec(name string, shape ...int) []float32 {
	w := t.mat(name, false, shape)
	if !w.Present() {
		return nil
	}
	if w.Mat.Kind != format.F32 {
		t.err = fmt.Errorf("tensor %s is %s, want f32", name, w.Mat.Kind)
		return nil
	}
	return w.Mat.F32
}
