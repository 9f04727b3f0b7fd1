// Package model loads a packed model and runs its forward pass over a batch
// of consecutive token rows. The family (package family) gives the blocks
// and their order; the Runner is the CPU implementation of block.Backend,
// running each block over the worker pool, and State is one sequence's
// memory as the family's StateSpecs describe it.
package model

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/platform"
)

// Model is a loaded packed model: dense weights mapped read-only, experts
// reached through a Provider.
type Model struct {
	Dir      string
	Manifest *format.Manifest
	Config   format.Config
	Arch     *family.Arch // the family's blocks, bound to the mapped weights
	MTP      *block.MTP   // nil when the model has none
	Experts  Provider
	// MaxBatch is the most rows a step of any runner of the model takes:
	// a sliding-window layer's ring holds window + MaxBatch rows.
	// NewRunner raises it; a state made before then errs on wider steps.
	MaxBatch int

	// Tiled says that the dense weights' q4 matrices are in the tiled
	// layout (kernels.TileQ4): they are the process's own copy, and this
	// CPU's decode kernel reads that layout faster (kernels.TiledQ4).
	Tiled bool

	dense []byte
}

// DefaultMaxBatch is MaxBatch before any runner asks for more.
const DefaultMaxBatch = 256

// Load loads dir/dense.bin and builds the layer views. Experts are served
// by a Provider the caller sets (NewResidentProvider holds experts.bin
// whole).
func Load(dir string) (*Model, error) { return LoadContext(context.Background(), dir, nil) }

// LoadContext is Load with cancellation, and progress on w (nil: silent)
// while a weight file of a GiB or more is read.
func LoadContext(ctx context.Context, dir string, w io.Writer) (*Model, error) {
	man, err := format.ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	dense, own, err := loadWeights(ctx, filepath.Join(dir, "dense.bin"), w)
	if err != nil {
		return nil, fmt.Errorf("packed model %s: %w", dir, err)
	}
	m := &Model{Dir: dir, Manifest: man, Config: man.Config, dense: dense, MaxBatch: DefaultMaxBatch}
	m.Tiled = own && kernels.TiledQ4()
	if int64(len(dense)) < man.DenseBytes {
		m.Close()
		return nil, fmt.Errorf("packed model %s: dense.bin has %d bytes, manifest says %d (truncated?)", dir, len(dense), man.DenseBytes)
	}
	if err := m.bind(); err != nil {
		m.Close()
		return nil, fmt.Errorf("packed model %s: %v", dir, err)
	}
	return m, nil
}

// loadWeights reads a weight file whole (platform.LoadFile: on Linux into
// memory backed by huge pages, which decode reads faster than a file
// mapping), telling w how far it got when the file is a GiB or more. A
// file larger than the memory available (less the budget's headroom) is
// mapped instead, and w told why: pages the kernel may drop and read
// again run slowly, where a copy would run out of memory. own reports
// whether the memory is the process's own copy, which it may rearrange.
func loadWeights(ctx context.Context, path string, w io.Writer) (b []byte, own bool, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, false, err
	}
	if avail, src := availableMemory(); avail > 0 && st.Size() > avail-max(avail/10, 256<<20) {
		if w != nil {
			fmt.Fprintf(w, "%s (%.1f GiB) is larger than the memory available (%s): mapping it, to be paged from disk\n",
				filepath.Base(path), float64(st.Size())/(1<<30), src)
		}
		b, err := platform.MapFile(path)
		return b, false, err
	}
	var progress func(done, total int64)
	if w != nil && st.Size() >= 1<<30 {
		name := filepath.Base(path)
		progress = func(done, total int64) {
			fmt.Fprintf(w, "\rloading %s: %.1f of %.1f GiB", name, float64(done)/(1<<30), float64(total)/(1<<30))
			if done == total {
				fmt.Fprintln(w)
			}
		}
	}
	b, _, err = platform.LoadFile(ctx, path, progress)
	return b, err == nil && platform.LoadCopies(), err
}

// availableMemory is platform.Available, replaced in tests.
var availableMemory = platform.Available

// Close releases the weights and the expert provider.
func (m *Model) Close() error {
	if m.Experts != nil {
		m.Experts.Close()
		m.Experts = nil
	}
	if m.dense != nil {
		err := platform.Unmap(m.dense)
		m.dense = nil
		return err
	}
	return nil
}

// bind builds the family's blocks over the mapped weights, checking every
// tensor against the family's list.
func (m *Model) bind() error {
	f, err := family.Named(m.Manifest.Family)
	if err != nil {
		return err
	}
	t := block.Bind(m.Manifest, m.dense)
	if m.Tiled {
		t.Tile()
	}
	a, err := f.Build(&m.Config, t)
	if err != nil {
		return err
	}
	if err := t.Err(); err != nil {
		return err
	}
	m.Arch, m.MTP = a, a.MTP
	return nil
}

// DenseBytes is the size of the resident dense weights.
func (m *Model) DenseBytes() int64 { return m.Manifest.DenseBytes }
