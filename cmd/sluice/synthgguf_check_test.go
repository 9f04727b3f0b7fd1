package main

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/gguf"
)

// ggufFile is a synth model of a small config written as GGUF and read
// back, for the GGUF writers' tests: the sources (dense.bin, the records)
// beside what llama.cpp will read.
type ggufFile struct {
	t     *testing.T
	m     *format.Manifest
	dense []byte
	recs  []byte
	src   map[string]*format.Tensor
	raw   []byte
	g     *gguf.File
	got   map[string]*gguf.Tensor
}

// writeGGUF packs a random model of cfg, lets tweak change dense.bin's
// values (where synth writes constants, so that orders and transforms
// show), and writes and reads back its GGUF.
func writeGGUF(t *testing.T, cfg format.Config, tweak func(dense []byte, src map[string]*format.Tensor)) *ggufFile {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	m, err := synthPack(context.Background(), cfg, format.Q4, dir)
	if err != nil {
		t.Fatal(err)
	}
	f := &ggufFile{t: t, m: m, src: map[string]*format.Tensor{}, got: map[string]*gguf.Tensor{}}
	for i := range m.Dense {
		f.src[m.Dense[i].Name] = &m.Dense[i]
	}
	if f.dense, err = os.ReadFile(filepath.Join(dir, "dense.bin")); err != nil {
		t.Fatal(err)
	}
	if tweak != nil {
		tweak(f.dense, f.src)
		if err := os.WriteFile(filepath.Join(dir, "dense.bin"), f.dense, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if f.recs, err = os.ReadFile(filepath.Join(dir, m.Stores[0].File)); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "m.gguf")
	if err := synthGGUF(m, dir, path, gguf.Q4_0); err != nil {
		t.Fatal(err)
	}
	if f.raw, err = os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if f.g, err = gguf.Read(r, int64(len(f.raw))); err != nil {
		t.Fatal(err)
	}
	for i := range f.g.Tensors {
		f.got[f.g.Tensors[i].Name] = &f.g.Tensors[i]
	}
	return f
}

// dims is a GGUF shape.
func dims(x ...int) []uint64 {
	r := make([]uint64, len(x))
	for i, v := range x {
		r[i] = uint64(v)
	}
	return r
}

// keys checks metadata values, types included.
func (f *ggufFile) keys(want map[string]any) {
	f.t.Helper()
	for k, w := range want {
		if got := f.g.Get(k); got != w {
			f.t.Errorf("%s = %v (%T), want %v (%T)", k, got, got, w, w)
		}
	}
}

// tensors checks that the file holds exactly the tensors of want, with
// their dims, and that those named in f32 are F32.
func (f *ggufFile) tensors(want map[string][]uint64, f32 ...string) {
	f.t.Helper()
	for n, tt := range f.got {
		if _, ok := want[n]; !ok {
			f.t.Errorf("unexpected tensor %s %v", n, tt.Dims)
		}
	}
	for n, d := range want {
		if tt := f.got[n]; tt == nil {
			f.t.Errorf("missing tensor %s %v", n, d)
		} else if !slices.Equal(tt.Dims, d) {
			f.t.Errorf("%s: dims %v, want %v", n, tt.Dims, d)
		}
	}
	for _, n := range f32 {
		if tt := f.got[n]; tt != nil && tt.Type != gguf.F32 {
			f.t.Errorf("%s is %s, want F32", n, tt.Type)
		}
	}
}

// rows is a GGUF tensor's values as rows of its first dimension.
func (f *ggufFile) rows(name string) [][]float32 {
	f.t.Helper()
	tt := f.got[name]
	if tt == nil {
		f.t.Fatalf("no tensor %s", name)
	}
	cols, n := int(tt.Dims[0]), 1
	for _, x := range tt.Dims[1:] {
		n *= int(x)
	}
	sz, _ := tt.Size()
	v := make([]float32, cols*n)
	b := f.raw[tt.Offset : tt.Offset+sz]
	switch tt.Type {
	case gguf.F32:
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case gguf.Q4_0:
		gguf.DequantizeQ4_0(v, b)
	default:
		f.t.Fatalf("%s: type %s", name, tt.Type)
	}
	r := make([][]float32, n)
	for i := range r {
		r[i] = v[i*cols : (i+1)*cols]
	}
	return r
}

// srcRows is tensor st of buf (F32, or q4 as synth writes it) as rows.
func srcRows(buf []byte, st *format.Tensor) [][]float32 {
	f32 := func(off int64) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(buf[off:])) }
	rows, cols := st.Rows(), st.Cols()
	r := make([][]float32, rows)
	for i := range r {
		r[i] = make([]float32, cols)
		for c := range r[i] {
			if st.Kind == format.F32 {
				r[i][c] = f32(st.Offset + int64(4*(i*cols+c)))
				continue
			}
			gi := i*(cols/format.GroupSize) + c/format.GroupSize
			j := c % format.GroupSize
			q := buf[st.Offset+int64((i*cols+c-j)/2+j%32)]
			if j >= 32 {
				q >>= 4
			}
			r[i][c] = f32(st.ScaleOffset+int64(4*gi))*float32(q&15) + f32(st.BiasOffset+int64(4*gi))
		}
	}
	return r
}

// source is dense tensor name's values as rows.
func (f *ggufFile) source(name string) [][]float32 {
	f.t.Helper()
	st := f.src[name]
	if st == nil {
		f.t.Fatalf("no source tensor %s", name)
	}
	return srcRows(f.dense, st)
}

// same checks that GGUF tensor name holds dense tensor srcName's values
// in the same order, mapped by fn (nil: unchanged).
func (f *ggufFile) same(name, srcName string, fn func(float32) float32) {
	f.t.Helper()
	f.mapped(name, srcName, nil, nil, fn)
}

// mapped checks that GGUF tensor name is dense tensor srcName rearranged,
// of the same shape: its [r][c] is the source's [srcRow(r)][srcCol(c)]
// (nil: the same index), mapped by fn (nil: unchanged).
func (f *ggufFile) mapped(name, srcName string, srcRow, srcCol func(int) int, fn func(float32) float32) {
	f.t.Helper()
	sr := f.source(srcName)
	if srcRow != nil || srcCol != nil {
		id := func(i int) int { return i }
		if srcRow == nil {
			srcRow = id
		}
		if srcCol == nil {
			srcCol = id
		}
		p := make([][]float32, len(sr))
		for r := range p {
			p[r] = make([]float32, len(sr[r]))
			for c := range p[r] {
				p[r][c] = sr[srcRow(r)][srcCol(c)]
			}
		}
		sr = p
	}
	f.match(name, srcName, f.rows(name), sr, fn)
}

// match checks rows gr of GGUF tensor name against rows sr of source src.
func (f *ggufFile) match(name, src string, gr, sr [][]float32, fn func(float32) float32) {
	f.t.Helper()
	if len(gr) != len(sr) {
		f.t.Fatalf("%s: %d rows, source %s %d", name, len(gr), src, len(sr))
	}
	for r := range gr {
		if len(gr[r]) != len(sr[r]) {
			f.t.Fatalf("%s: rows of %d, source %s %d", name, len(gr[r]), src, len(sr[r]))
		}
		for c, v := range gr[r] {
			want := sr[r][c]
			if fn != nil {
				want = fn(want)
			}
			if v != want {
				f.t.Fatalf("%s[%d][%d] = %v, want %v (from %s)", name, r, c, v, want, src)
			}
		}
	}
}

// experts checks that GGUF tensor name stacks, expert after expert, the
// tensor of each record of layer l that pick chooses.
func (f *ggufFile) experts(name string, l int, pick func(*format.ExpertStore) *format.Tensor) {
	f.t.Helper()
	st := &f.m.Stores[0]
	gr := f.rows(name)
	per := len(gr) / f.m.Config.Experts
	for e := 0; e < f.m.Config.Experts; e++ {
		rec := f.recs[int64(l*f.m.Config.Experts+e)*st.Stride:][:st.Stride]
		f.match(name, "records", gr[e*per:(e+1)*per], srcRows(rec, pick(st)), nil)
	}
}

// setVec gives dense vector name the values 0.25·i − 0.5, distinct where
// synth writes constants.
func setVec(dense []byte, src map[string]*format.Tensor, name string) {
	st := src[name]
	for i := 0; i < st.Rows()*st.Cols(); i++ {
		binary.LittleEndian.PutUint32(dense[st.Offset+int64(4*i):], math.Float32bits(0.25*float32(i)-0.5))
	}
}
