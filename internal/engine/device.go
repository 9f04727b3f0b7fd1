package engine

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/sluicelm/sluice/internal/experts"
	"github.com/sluicelm/sluice/internal/model"
)

// Forwarder runs a model's forward pass over a sequence state: the CPU's
// model.Runner or a GPU backend.
type Forwarder interface {
	// Forward consumes tokens at positions st.Pos.. and advances st,
	// writing logits of every token into out when all, else of the last.
	Forward(st *model.State, tokens []int, out []float32, all bool) error
}

// argmaxer is a Forwarder that can return the last token's greedy choice
// without handing the logits to the host.
type argmaxer interface {
	ForwardArgmax(st *model.State, tokens []int) (int, error)
}

// closer is a Forwarder with resources of its own.
type closer interface{ Close() }

// launcher counts kernel launches (GPU backends).
type launcher interface{ Launches() uint64 }

// deviceSpec is a parsed --device value.
type deviceSpec struct {
	kind    string // "auto", "cpu", "cuda"
	ordinal int
}

// parseDevice reads auto, cpu, cuda or cuda:N ("" is cpu: the library's
// default; the CLI passes auto).
func parseDevice(s string) (deviceSpec, error) {
	switch s {
	case "", "cpu":
		return deviceSpec{kind: "cpu"}, nil
	case "auto":
		return deviceSpec{kind: "auto"}, nil
	case "cuda", "gpu":
		return deviceSpec{kind: "cuda"}, nil
	}
	if n, ok := strings.CutPrefix(s, "cuda:"); ok {
		if i, err := strconv.Atoi(n); err == nil && i >= 0 {
			return deviceSpec{kind: "cuda", ordinal: i}, nil
		}
	}
	return deviceSpec{}, fmt.Errorf("--device %q: want auto, cpu, cuda or cuda:N", s)
}

// selectDevice sets e.Fwd for o.Device: the CPU runner, or a GPU backend
// when one is asked for (cuda: an error when none is usable) or usable
// (auto: else the CPU, with the reason in e.DeviceNote).
func (e *Engine) selectDevice(o Options, rows int) error {
	ds, err := parseDevice(o.Device)
	if err != nil {
		return err
	}
	e.Fwd, e.Device = e.Runner, "cpu"
	if ds.kind == "cpu" {
		return nil
	}
	// fallback is auto's choice of the CPU, said with the reason and with
	// any GPU-only option it leaves unused.
	fallback := func(why string) {
		e.DeviceNote = "device: cpu (" + why + ")"
		if u := gpuOnly(o.Experts); u != "" {
			verb := " is unused"
			if strings.Contains(u, " and ") {
				verb = " are unused"
			}
			e.DeviceNote += "; " + u + verb
		}
	}
	if e.Runner.Routes != nil {
		if ds.kind == "cuda" {
			return fmt.Errorf("device cuda: replayed routes (a synthetic model) run on the CPU only")
		}
		fallback("replayed routes run on the CPU only")
		return nil
	}
	f, name, err := openCUDA(e.Model, ds.ordinal, rows, e.Ctx, o)
	if err != nil {
		if ds.kind == "cuda" {
			return fmt.Errorf("device cuda: %v", err)
		}
		fallback(err.Error())
		return nil
	}
	e.Fwd, e.Device = f, name
	return nil
}

// mayUseGPU reports whether the forward may run on a GPU: asked for, or
// left to auto on a machine that has one.
func mayUseGPU(o Options) bool {
	ds, err := parseDevice(o.Device)
	return err == nil && ds.kind != "cpu" && gpuPresent()
}

// checkDevice refuses, before anything loads, the options the chosen
// device cannot honour.
func checkDevice(o Options) error {
	ds, err := parseDevice(o.Device)
	if err != nil {
		return err
	}
	xo := o.Experts
	if u := gpuOnly(xo); ds.kind == "cpu" && u != "" {
		return fmt.Errorf("%s: GPU options; the forward runs on the CPU here (--device %s)", u, o.Device)
	}
	return nil
}

// gpuOnly names the GPU-only options xo sets ("" for none).
func gpuOnly(xo ExpertOptions) string {
	var set []string
	if xo.GPUPoolBytes != 0 || xo.GPUPoolShare != 0 {
		set = append(set, "--gpu-pool-mb")
	}
	if xo.VRAMBytes != 0 {
		set = append(set, "--vram-gb")
	}
	if xo.GPUCPUShare != 0 { // auto applies where it can: the CLI's default
		set = append(set, "--gpu-cpu-share")
	}
	return strings.Join(set, " and ")
}

// OnGPU reports whether the engine's forward runs on a GPU.
func (e *Engine) OnGPU() bool { return e.Device != "cpu" }

// Launches is the number of GPU kernels launched so far (0 on the CPU).
func (e *Engine) Launches() uint64 {
	if l, ok := e.Fwd.(launcher); ok {
		return l.Launches()
	}
	return 0
}

// DevicePool is what a GPU's expert pool holds and did so far
// (experts.DevicePool).
type DevicePool = experts.DevicePool

// DevicePooler is a forward whose device holds an expert pool (the GPU
// backend; tests stand in for it).
type DevicePooler interface{ DevicePool() DevicePool }

// TextStarter is a forward whose device keeps an expert pool ranked by
// an eviction policy (the GPU backend): NewText is the host pool's
// (experts.Stream.NewText).
type TextStarter interface{ NewText() }

// newText tells the expert pools, the host's and the device's, that a
// new, unrelated text begins.
func (e *Engine) newText() {
	if e.Stream != nil {
		e.Stream.NewText()
	}
	if t, ok := e.Fwd.(TextStarter); ok {
		t.NewText()
	}
}

// DevicePool reports the GPU's expert pool; ok is false on the CPU.
func (e *Engine) DevicePool() (p DevicePool, ok bool) {
	if d, is := e.Fwd.(DevicePooler); is {
		return d.DevicePool(), true
	}
	return p, false
}

// Profiler is a forward with a phase profile (the GPU backend).
type Profiler interface {
	EnableProfile(maxMarks int) error
	ResetProfile()
	Profile() string
}

// StateCopier is a forward whose device keeps its own copy of each
// sequence state (the GPU backend), which CopyState copies there too.
type StateCopier interface {
	CopyState(dst, src *model.State) error
}

// StateReleaser is a forward that can free a sequence state's device
// copy at once (the GPU backend), rather than once the state is collected.
type StateReleaser interface {
	Release(st *model.State)
}

// ReleaseState frees what the forward's device holds for st, which is not
// used again (the server's prefix cache calls it for the states it drops).
func (e *Engine) ReleaseState(st *model.State) {
	if r, ok := e.Fwd.(StateReleaser); ok {
		r.Release(st)
	}
}

// CopyState makes dst an exact copy of src's first src.Pos positions
// (model.State.CopyFrom), on the forward's device too: the server saves
// and resumes prompt prefixes with it.
func (e *Engine) CopyState(dst, src *model.State) error {
	if err := dst.CopyFrom(src); err != nil {
		return err
	}
	if c, ok := e.Fwd.(StateCopier); ok {
		return c.CopyState(dst, src)
	}
	return nil
}
