// Package pack converts a Hugging Face checkpoint into a packed model
// directory (see package format). The directory is built under a temporary
// name beside the destination and renamed into place only when complete, so
// an interrupted pack never leaves a half-written model behind.
package pack

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicelm/sluice/internal/family"
	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/hf"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/quant"
)

// Options control a pack.
type Options struct {
	Bits    int   // 16 (bf16, exact), 8 or 4
	Force   bool  // replace an existing destination
	LowBits []int // also write low-bit expert stores (3, 2) for lossy miss reads
	// Experts overrides the kind of the main expert store (default: the
	// kind of Bits, or MXFP4 for MXFP4 experts at 4 bits; see expertKind).
	Experts  format.Kind
	Progress io.Writer // nil: silent
	Log      io.Writer // notices (how MLX-quantised tensors were carried over); nil: os.Stderr
	// Layout is how q4 expert records are stored (TileStore): LayoutRows
	// (or empty), LayoutTiled or LayoutAuto.
	Layout string
}

// CopiedFiles are the checkpoint files a packed directory carries along.
var CopiedFiles = []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}

// The layouts of q4 expert records (Options.Layout).
const (
	// LayoutRows stores them row after row, as format 3 did: the
	// default, the same bytes whatever CPU packs them.
	LayoutRows = "rows"
	// LayoutTiled stores them tiled (format.Tensor.Tiled), the layout
	// the decode kernel of AVX2 and AMD's AVX-512 CPUs reads.
	LayoutTiled = "tiled"
	// LayoutAuto stores them as this CPU's decode kernel reads them
	// (kernels.TiledQ4): tiled where it reads tiles, else row-major.
	LayoutAuto = "auto"
)

// TileStore marks the matrices of st that the layout stores tiled
// (kernels.StoreTiles picks them). Whichever it is, every CPU computes
// the same bits from the records. A streamed pool computes a record in
// the layout the disk gave it, since rearranging it as it lands costs a
// pass over it; a CPU holding the whole store in memory lays it out its
// own way when it loads it (model.OpenResident). Stored tiled, the q4
// records of a 48-layer qwen3-30b-a3b synth decoded through a 25% pool
// as fast as row-major ones on a 2-core Zen 5 (within 1-3%, the
// machine's noise), which is why rows stay the default.
func TileStore(st *format.ExpertStore, layout string) error {
	tiled, err := LayoutTiles(layout)
	if err != nil {
		return err
	}
	for _, t := range []*format.Tensor{&st.Gate, &st.Up, &st.Down} {
		t.Tiled = tiled && kernels.StoreTiles(t)
	}
	return nil
}

// LayoutTiles reports whether a layout (Options.Layout) stores q4 expert
// records tiled on this CPU, or why the name is not one.
func LayoutTiles(layout string) (bool, error) {
	switch layout {
	case "", LayoutRows:
		return false, nil
	case LayoutTiled:
		return true, nil
	case LayoutAuto:
		return kernels.TiledQ4(), nil
	}
	return false, fmt.Errorf("layout %q: want %s, %s or %s", layout, LayoutRows, LayoutTiled, LayoutAuto)
}

// Pack writes the packed form of the checkpoint at src into dst.
func Pack(ctx context.Context, src, dst string, o Options) (err error) {
	kind, err := format.KindForBits(o.Bits)
	if err != nil {
		return fmt.Errorf("pack: %v", err)
	}
	if _, err := LayoutTiles(o.Layout); err != nil {
		return fmt.Errorf("pack: %v", err)
	}
	// Replacing dst deletes it, and the packed files land in it: when it
	// is the checkpoint or holds it, that would delete the checkpoint,
	// and a destination inside the checkpoint would mix the two.
	if err := checkApart(src, dst); err != nil {
		return err
	}
	if _, err := os.Stat(dst); err == nil {
		if _, err := CheckReplace(dst); err != nil {
			return fmt.Errorf("pack: %v", err)
		}
		if !o.Force {
			return fmt.Errorf("pack: %s already exists (use --force to replace it)", dst)
		}
	}
	// A packed directory holds a copy of config.json, so hf.Open would
	// take it for a checkpoint and blame its missing safetensors.
	if _, err := os.Stat(filepath.Join(src, format.ManifestFile)); err == nil {
		return fmt.Errorf("pack: %s is already a packed model", src)
	}
	if err := format.CheckComplete(src); err != nil {
		return fmt.Errorf("pack: %v", err)
	}
	ck, err := hf.Open(src)
	if err != nil {
		return err
	}
	defer ck.Close()
	cfg := ck.Config
	if ck.NoMTP {
		w := o.Log
		if w == nil {
			w = os.Stderr
		}
		fmt.Fprintf(w, "pack: config.json declares an MTP layer but the checkpoint carries none of its tensors: packing without it (no speculative drafts)\n")
	}
	if cfg.Hidden%format.GroupSize != 0 || cfg.MoEInter%format.GroupSize != 0 {
		if kind.Quantised() {
			return fmt.Errorf("pack: hidden_size %d and moe_intermediate_size %d must be multiples of %d to quantise", cfg.Hidden, cfg.MoEInter, format.GroupSize)
		}
	}
	if err := os.MkdirAll(filepath.Dir(filepath.Clean(dst)), 0o755); err != nil {
		return fmt.Errorf("pack: %v", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(filepath.Clean(dst)), "."+filepath.Base(dst)+".packing-")
	if err != nil {
		return fmt.Errorf("pack: %v", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("pack: %v", err)
	}
	p := &progress{w: o.Progress, start: time.Now()}
	mx := newMLXNotes(ck, kind)
	m := &format.Manifest{Format: format.Version, Family: cfg.Family, Config: cfg, Bits: o.Bits, GroupSize: format.GroupSize,
		ExpertLayers: cfg.ExpertLayers(), Experts: cfg.Experts}
	if err := writeDense(ctx, ck, m, kind, filepath.Join(tmp, "dense.bin"), p, mx); err != nil {
		return err
	}
	ekind, err := expertKind(ck, o, kind)
	if err != nil {
		return err
	}
	st := format.ExpertRecordLayout(&cfg, ekind, "experts.bin")
	if err := TileStore(&st, o.Layout); err != nil {
		return fmt.Errorf("pack: %v", err)
	}
	if err := writeExperts(ctx, ck, &st, filepath.Join(tmp, st.File), p, mx); err != nil {
		return err
	}
	m.Stores = []format.ExpertStore{st}
	m.Format = format.VersionOf(m.Stores)
	for _, b := range o.LowBits {
		lk, err := format.LowKind(b)
		if err != nil {
			return fmt.Errorf("pack: --low-bits: %v", err)
		}
		if cfg.Hidden%format.GroupSize != 0 || cfg.MoEInter%format.GroupSize != 0 {
			return fmt.Errorf("pack: --low-bits needs hidden_size and moe_intermediate_size multiples of %d", format.GroupSize)
		}
		if cfg.ExpertBias {
			return fmt.Errorf("pack: --low-bits is not supported for experts with biases (%s)", cfg.Family)
		}
		ls := format.ExpertRecordLayout(&cfg, lk, format.LowStoreFile(b))
		if err := writeRecords(ctx, &cfg, ck.ExpertFull, &ls, filepath.Join(tmp, ls.File), p); err != nil {
			return err
		}
		m.Stores = append(m.Stores, ls)
	}
	// A tensor no reader asked for is weights the packed model would
	// silently lack: config.json then describes another model than the
	// checkpoint (num_hidden_layers 3 for 6 layers of weights packs half
	// the model, which runs and prints plausible nonsense).
	if un := unused(ck); len(un) > 0 {
		return unusedError(src, un)
	}
	for _, f := range CopiedFiles {
		if err := copyFile(filepath.Join(src, f), filepath.Join(tmp, f)); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("pack: %v", err)
		}
	}
	mb, _ := json.MarshalIndent(m, "", " ")
	if err := writeFileSync(filepath.Join(tmp, format.ManifestFile), mb); err != nil {
		return fmt.Errorf("pack: %v", err)
	}
	if err := Install(tmp, dst, o.Force); err != nil {
		return fmt.Errorf("pack: %v", err)
	}
	p.done(dst)
	mx.report(o.Log)
	return nil
}

// Tensors a checkpoint may carry that pack leaves out on purpose.
var (
	// invFreq are the rotary frequency buffers older transformers saved
	// with the weights: pack computes them from rope_theta instead.
	invFreq = regexp.MustCompile(`(^|\.)rotary_emb\.inv_freq$`)
	// mtpTensor is a multi-token-prediction head stored apart (Qwen3.5's
	// mtp.*). With mtp_num_hidden_layers 0 the config asks for none: the
	// model decodes the same without its drafts, so dropping it is a
	// choice, not a mismatch. (DeepSeek stores its head as layer
	// num_hidden_layers, which cannot be told from a surplus layer.)
	mtpTensor = regexp.MustCompile(`(^|\.)mtp\.`)
	// indexer is DeepSeek-V3.2's lightning indexer, which only picks the
	// positions each row attends to. A deepseek_v3 config for its weights
	// asks for attention over every position instead: the same weights
	// without the indexer, which is what such a config is for.
	indexer = regexp.MustCompile(`\.self_attn\.indexer\.`)
	// mtpCopy is the embedding and LM head that DeepSeek-V3 and GLM-4.5
	// store again in their MTP layer (layer num_hidden_layers): copies of
	// the trunk's, which the MTP head shares (see family.deepSeekMTP).
	mtpCopy = regexp.MustCompile(`(^|\.)layers\.(\d+)\.(embed_tokens|shared_head\.head)\.weight$`)
)

// isMTPCopy reports whether n is one of the MTP layer's copies of the
// trunk's embedding and LM head, in a config with that MTP layer.
func isMTPCopy(c *format.Config, n string) bool {
	m := mtpCopy.FindStringSubmatch(n)
	if m == nil || c.MTPLayers == 0 || (c.Family != family.NameDeepSeek && c.Family != family.NameGLM4MoE) {
		return false
	}
	l, err := strconv.Atoi(m[2])
	return err == nil && l >= c.Layers && l < c.Layers+c.MTPLayers
}

// unused is the checkpoint's tensors the pack did not read, less those
// it leaves out on purpose.
func unused(ck *hf.Checkpoint) []string {
	var names []string
	for _, n := range ck.Unused() {
		switch {
		case invFreq.MatchString(n): // left out on purpose: see above
		case ck.Config.MTPLayers == 0 && mtpTensor.MatchString(n):
		case ck.Config.Family == family.NameDeepSeek && indexer.MatchString(n):
		case isMTPCopy(&ck.Config, n):
		default:
			names = append(names, n)
		}
	}
	return names
}

// unusedError names the first few of the tensors pack did not use.
func unusedError(src string, names []string) error {
	const show = 5
	list := strings.Join(names[:min(show, len(names))], ", ")
	if len(names) > show {
		list += fmt.Sprintf(", ... (%d more)", len(names)-show)
	}
	count := fmt.Sprintf("%d tensors", len(names))
	if len(names) == 1 {
		count = "1 tensor"
	}
	return fmt.Errorf("pack: checkpoint %s has %s that the model its config.json describes does not use (does num_hidden_layers or another size match the weights?): %s", src, count, list)
}

// CheckReplace refuses to replace dst, an existing path, unless it is an
// empty directory or a packed model (a directory holding a manifest):
// replacing deletes it whole, and a mistyped destination (a home or a
// models directory, a checkpoint's parent) must not take what it holds
// with it, whatever --force says. empty reports an empty directory.
func CheckReplace(dst string) (empty bool, err error) {
	st, err := os.Stat(dst)
	if err != nil {
		return false, err
	}
	if !st.IsDir() {
		return false, fmt.Errorf("%s is not a directory, so not a packed model: not replaced, even with --force (remove it, or pick another destination)", dst)
	}
	ents, err := os.ReadDir(dst)
	if err != nil {
		return false, err
	}
	if len(ents) == 0 {
		return true, nil
	}
	if _, err := os.Stat(filepath.Join(dst, format.ManifestFile)); err != nil {
		what := fmt.Sprintf("%d entries", len(ents))
		if len(ents) == 1 {
			what = "1 entry"
		}
		return false, fmt.Errorf("%s holds %s but no %s, so it is not a packed model: not replaced, even with --force (remove it, or pick another destination)", dst, what, format.ManifestFile)
	}
	return false, nil
}

// Install renames the finished directory tmp, written beside dst, to
// dst. With replace, an existing dst is moved aside first, and back if the
// swap fails, and deleted only once tmp is in place, so that a failure in
// between still leaves one complete model.
func Install(tmp, dst string, replace bool) error {
	old, moved := tmp+".old", false
	if replace {
		moved = os.Rename(dst, old) == nil
	}
	if err := os.Rename(tmp, dst); err != nil {
		if moved {
			os.Rename(old, dst)
		}
		return err
	}
	if moved {
		os.RemoveAll(old)
	}
	return nil
}

// checkApart refuses a destination that is the source checkpoint, holds
// it or lies inside it. Paths are compared absolute and cleaned, with
// symbolic links resolved as far as the path exists, so that "ck/..",
// "./ck" or a link to ck are recognised too.
func checkApart(src, dst string) error {
	s, err := realPath(src)
	if err != nil {
		return fmt.Errorf("pack: %v", err)
	}
	d, err := realPath(dst)
	if err != nil {
		return fmt.Errorf("pack: %v", err)
	}
	switch {
	case s == d:
		return fmt.Errorf("pack: destination %s is the source checkpoint; pick another DST", dst)
	case within(s, d):
		return fmt.Errorf("pack: destination %s contains the source checkpoint %s, which replacing it would delete; pick another DST", dst, src)
	case within(d, s):
		return fmt.Errorf("pack: destination %s lies inside the source checkpoint %s; pick a DST outside it", dst, src)
	}
	return nil
}

// realPath is p absolute and cleaned, with the symbolic links of its
// longest existing prefix resolved (a destination need not exist yet).
func realPath(p string) (string, error) {
	p, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	var rest []string
	for {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Join(append([]string{r}, rest...)...), nil
		}
		parent := filepath.Dir(p)
		if parent == p {
			return filepath.Join(append([]string{p}, rest...)...), nil
		}
		rest = append([]string{filepath.Base(p)}, rest...)
		p = parent
	}
}

// within reports whether path lies strictly inside dir (both cleaned).
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// writeDense writes every dense tensor of the family's list, 64-byte
// aligned.
func writeDense(ctx context.Context, ck *hf.Checkpoint, m *format.Manifest, kind format.Kind, path string, p *progress, mx *mlxNotes) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("pack: %v", err)
	}
	defer f.Close()
	w := &alignedWriter{w: bufio.NewWriterSize(f, 1<<20)}
	specs, err := family.Specs(&m.Config)
	if err != nil {
		return fmt.Errorf("pack: %v", err)
	}
	for i, s := range specs {
		if err := ctx.Err(); err != nil {
			return err
		}
		p.step("dense", i+1, len(specs))
		k := format.F32
		if s.Quant {
			k = kind
		}
		t := format.Tensor{Name: s.Name, Kind: k, Shape: s.Shape}
		enc, err := mx.dense(ck, &m.Config, s, k)
		if err != nil {
			return err
		}
		if enc == nil {
			v, err := family.DenseOf(ck, &m.Config, s)
			if err != nil {
				return err
			}
			if enc, err = quant.Encode(v, t.Rows(), t.Cols(), t.Kind); err != nil {
				return fmt.Errorf("pack: %s: %v", s.Name, err)
			}
		}
		if err := w.put(&t, enc); err != nil {
			return fmt.Errorf("pack: %s: %v", s.Name, err)
		}
		m.Dense = append(m.Dense, t)
	}
	m.DenseBytes = w.off
	if err := w.w.Flush(); err != nil {
		return fmt.Errorf("pack: %v", err)
	}
	return f.Sync()
}

// writeExperts writes one fixed-stride record per (layer, expert).
func writeExperts(ctx context.Context, ck *hf.Checkpoint, st *format.ExpertStore, path string, p *progress, mx *mlxNotes) error {
	return writeRecordsExact(ctx, &ck.Config, ck.ExpertFull, mx.experts(ck, st.Kind), false, st, path, p)
}

// expertSource yields one expert's weights (and biases) as float32.
type expertSource func(layer, expert int) (family.Expert, error)

// writeRecords writes one fixed-stride record of st's layout per (layer,
// expert) of cfg, taking the weights from src.
func writeRecords(ctx context.Context, cfg *format.Config, src expertSource, st *format.ExpertStore, path string, p *progress) error {
	return writeRecordsExact(ctx, cfg, src, nil, false, st, path, p)
}

// exactSource yields one expert's gate, up and down already encoded in the
// store's kind (ok false: encode src's values instead).
type exactSource func(layer, expert int) (m [3]*quant.Encoded, ok bool, err error)

// writeRecordsExact is writeRecords taking each expert from exact when it
// has it. With conc, src may be called from several goroutines at once
// (and exact is nil): the sources of a batch are read as it is encoded.
func writeRecordsExact(ctx context.Context, cfg *format.Config, src expertSource, exact exactSource, conc bool, st *format.ExpertStore, path string, p *progress) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("pack: %v", err)
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 4<<20)
	// Encoding dominates (a real-size expert takes about 0.15 s), so the
	// records of a batch are encoded on up to 8 threads and written in
	// order: the bytes do not depend on the thread count. Their sources
	// are read one by one in order before, or with conc on those threads.
	// A batch holds its experts' float32 values at once.
	w := max(1, min(runtime.GOMAXPROCS(0), 8))
	batch := make([]recordJob, w)
	for i := range batch {
		batch[i].rec = make([]byte, st.Stride)
	}
	n := cfg.ExpertLayers() * cfg.Experts
	for l := 0; l < cfg.ExpertLayers(); l++ {
		if l < cfg.FirstDense {
			// A dense layer has no experts: leave a hole.
			if err := bw.Flush(); err != nil {
				return fmt.Errorf("pack: %v", err)
			}
			if _, err := f.Seek(int64(cfg.Experts)*st.Stride, io.SeekCurrent); err != nil {
				return fmt.Errorf("pack: %v", err)
			}
			continue
		}
		for e0 := 0; e0 < cfg.Experts; e0 += w {
			if err := ctx.Err(); err != nil {
				return err
			}
			jobs := batch[:min(w, cfg.Experts-e0)]
			for i := range jobs {
				j := &jobs[i]
				j.layer, j.expert, j.x, j.pre, j.ok = l, e0+i, family.Expert{}, [3]*quant.Encoded{}, false
				if exact != nil {
					if j.pre, j.ok, err = exact(l, e0+i); err != nil {
						return err
					}
				}
				if !j.ok && !conc {
					if j.x, err = src(l, e0+i); err != nil {
						return err
					}
				}
			}
			var wg sync.WaitGroup
			for i := range jobs {
				wg.Go(func() {
					j := &jobs[i]
					if !j.ok && conc {
						if j.x, j.err = src(j.layer, j.expert); j.err != nil {
							return
						}
					}
					j.err = j.encode(st)
				})
			}
			wg.Wait()
			for i := range jobs {
				if jobs[i].err != nil {
					return jobs[i].err
				}
				p.step(st.File, l*cfg.Experts+e0+i+1, n)
				if _, err := bw.Write(jobs[i].rec); err != nil {
					return fmt.Errorf("pack: %v", err)
				}
				jobs[i].x = family.Expert{} // let the values go
			}
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("pack: %v", err)
	}
	if err := f.Truncate(int64(n) * st.Stride); err != nil {
		return fmt.Errorf("pack: %v", err)
	}
	return f.Sync()
}

// recordJob is one expert of a batch of writeRecordsExact: its source
// values (x) or encoded matrices (pre, when ok), and the record it fills.
type recordJob struct {
	layer, expert int
	x             family.Expert
	pre           [3]*quant.Encoded
	ok            bool
	rec           []byte
	tmp           []byte // scratch of kernels.TileQ4
	err           error
}

// encode fills j.rec with the expert's record in st's layout.
func (j *recordJob) encode(st *format.ExpertStore) error {
	rec, x := j.rec, j.x
	clear(rec)
	for _, pr := range []struct {
		t *format.Tensor
		v []float32
	}{{st.GateBias, x.GateBias}, {st.UpBias, x.UpBias}, {st.DownBias, x.DownBias}} {
		if pr.t == nil {
			continue
		}
		if len(pr.v) != pr.t.Rows()*pr.t.Cols() {
			return fmt.Errorf("pack: layer %d expert %d: %d bias values, want %d", j.layer, j.expert, len(pr.v), pr.t.Rows()*pr.t.Cols())
		}
		putFloats(rec[pr.t.Offset:], pr.v)
	}
	for k, pr := range []struct {
		t *format.Tensor
		v []float32
	}{{&st.Gate, x.Gate}, {&st.Up, x.Up}, {&st.Down, x.Down}} {
		enc := j.pre[k]
		if enc == nil {
			var err error
			if enc, err = quant.Encode(pr.v, pr.t.Rows(), pr.t.Cols(), st.Kind); err != nil {
				return fmt.Errorf("pack: layer %d expert %d: %v", j.layer, j.expert, err)
			}
		}
		copy(rec[pr.t.Offset:], enc.Values)
		if pr.t.Tiled {
			j.tmp = kernels.TileQ4(rec[pr.t.Offset:pr.t.Offset+pr.t.Size], pr.t.Rows(), pr.t.Cols(), j.tmp)
		}
		quant.PutHalves(rec[pr.t.ScaleOffset:], enc.Scales)
		quant.PutHalves(rec[pr.t.BiasOffset:], enc.Biases)
	}
	return nil
}

func putFloats(dst []byte, v []float32) {
	for i, x := range v {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(x))
	}
}

// alignedWriter appends tensors, padding each part to format.DenseAlign.
type alignedWriter struct {
	w   *bufio.Writer
	off int64
}

func (a *alignedWriter) pad() error {
	n := format.AlignUp(a.off, format.DenseAlign) - a.off
	if n == 0 {
		return nil
	}
	_, err := a.w.Write(make([]byte, n))
	a.off += n
	return err
}

func (a *alignedWriter) write(b []byte) (int64, error) {
	if err := a.pad(); err != nil {
		return 0, err
	}
	at := a.off
	_, err := a.w.Write(b)
	a.off += int64(len(b))
	return at, err
}

func (a *alignedWriter) put(t *format.Tensor, enc *quant.Encoded) error {
	var err error
	if t.Offset, err = a.write(enc.Values); err != nil {
		return err
	}
	t.Size = int64(len(enc.Values))
	if t.Kind.Quantised() {
		b := make([]byte, 2*len(enc.Scales))
		quant.PutHalves(b, enc.Scales)
		if t.ScaleOffset, err = a.write(b); err != nil {
			return err
		}
		quant.PutHalves(b, enc.Biases)
		if t.BiasOffset, err = a.write(b); err != nil {
			return err
		}
	}
	return a.pad()
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return writeFileSync(dst, b)
}

func writeFileSync(path string, b []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// progress prints one updating line when w is set, at most every 100 ms.
type progress struct {
	w     io.Writer
	start time.Time
	last  time.Time
}

func (p *progress) step(what string, i, n int) {
	if p.w == nil || (i != n && time.Since(p.last) < 100*time.Millisecond) {
		return
	}
	p.last = time.Now()
	fmt.Fprintf(p.w, "\rpacking %-7s %6d/%-6d %5.1f%%  %5.1fs", what, i, n, 100*float64(i)/float64(n), time.Since(p.start).Seconds())
}

func (p *progress) done(dst string) {
	if p.w != nil {
		fmt.Fprintf(p.w, "\rpacked %s in %.1fs%30s\n", dst, time.Since(p.start).Seconds(), "")
	}
}

// AddLowBits adds the low-bit expert store of bits (3 or 2) to the packed
// model in dir, re-quantising its main store's records (so a model packed
// without --low-bits can use --miss-bits). The store is written under a
// temporary name and the manifest replaced atomically.
func AddLowBits(ctx context.Context, dir string, bits int, w io.Writer) error {
	lk, err := format.LowKind(bits)
	if err != nil {
		return err
	}
	m, err := format.ReadManifest(dir)
	if err != nil {
		return err
	}
	if _, ok := m.Store(lk); ok {
		return nil
	}
	if m.Config.ExpertBias {
		return fmt.Errorf("low-bit store: not supported for experts with biases (%s)", m.Family)
	}
	main := m.Stores[0]
	if main.Kind != format.BF16 && !main.Kind.Quantised() {
		return fmt.Errorf("low-bit store: main expert store is %s", main.Kind)
	}
	f, err := os.Open(filepath.Join(dir, main.File))
	if err != nil {
		return err
	}
	defer f.Close()
	cfg := m.Config
	// The source is called from the encoding threads: each call reads
	// into a buffer of its own (os.File.ReadAt is safe for that).
	bufs := sync.Pool{New: func() any { return make([]byte, main.Stride) }}
	// Each row as the kernels read it (kernels.Mat.Row: quant.Decode's
	// values, from either layout).
	dec := func(rec []byte, t *format.Tensor) ([]float32, error) {
		w, err := kernels.MatFrom(rec, t)
		if err != nil {
			return nil, err
		}
		out := make([]float32, w.Rows*w.Cols)
		for r := range w.Rows {
			w.Row(out[r*w.Cols:(r+1)*w.Cols], r)
		}
		return out, nil
	}
	src := func(l, e int) (family.Expert, error) {
		rec := bufs.Get().([]byte)
		defer bufs.Put(rec)
		if _, err := f.ReadAt(rec, int64(l*m.Experts+e)*main.Stride); err != nil {
			return family.Expert{}, err
		}
		var x family.Expert
		var err error
		for _, p := range []struct {
			dst *[]float32
			t   *format.Tensor
		}{{&x.Gate, &main.Gate}, {&x.Up, &main.Up}, {&x.Down, &main.Down}} {
			if *p.dst, err = dec(rec, p.t); err != nil {
				return family.Expert{}, err
			}
		}
		return x, nil
	}
	ls := format.ExpertRecordLayout(&cfg, lk, format.LowStoreFile(bits))
	tmp := filepath.Join(dir, "."+ls.File+".tmp")
	defer os.Remove(tmp)
	if err := writeRecordsExact(ctx, &cfg, src, nil, true, &ls, tmp, &progress{w: w, start: time.Now()}); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, ls.File)); err != nil {
		return err
	}
	m.Stores = append(m.Stores, ls)
	mb, _ := json.MarshalIndent(m, "", " ")
	mt := filepath.Join(dir, "."+format.ManifestFile+".tmp")
	if err := writeFileSync(mt, mb); err != nil {
		return err
	}
	return os.Rename(mt, filepath.Join(dir, format.ManifestFile))
}
