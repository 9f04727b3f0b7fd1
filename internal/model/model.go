// Package model loads a packed model and runs its forward pass over a batch
// of consecutive token rows. The family (package family) gives the blocks
// and their order; the Runner is the CPU implementation of block.Backend,
// running each block over the worker pool, and State is one sequence's
// memory as the family's StateSpecs describe it.
package model

import (
	"fmt"
	"path/filepath"

	"github.com/sluicelm/sluice/internal/block"
	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
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

	dense []byte
}

// DefaultMaxBatch is MaxBatch before any runner asks for more.
const DefaultMaxBatch = 256

// Load maps dir/dense.bin and builds the layer views. Experts are served by
// a Provider the caller sets (NewResidentProvider maps experts.bin whole).
func Load(dir string) (*Model, error) {
	man, err := format.ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	dense, err := mapFile(filepath.Join(dir, "dense.bin"))
	if err != nil {
		return nil, fmt.Errorf("packed model %s: %v", dir, err)
	}
	m := &Model{Dir: dir, Manifest: man, Config: man.Config, dense: dense, MaxBatch: DefaultMaxBatch}
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

func mapFile(path string) ([]byte, error) { return platform.MapFile(path) }

// Close releases the mapped weights and the expert provider.
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
