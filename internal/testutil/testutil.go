// Package testutil finds the shared test models and references and packs
// them once per test binary.
package testutil

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/pack"
	"github.com/sluicelm/sluice/internal/testutil/jsonfile"
)

// Models are the shared test checkpoints, one per family.
var Models = []string{"tiny-qwen3-5-moe", "tiny-qwen3-moe", "tiny-gpt-oss", "tiny-deepseek-v32", "tiny-qwen3-next", "tiny-glm4-moe"}

// FirstDiff is the first index where the token sequences a and b differ
// (the shorter one's length where one is a prefix of the other), or -1
// when they are equal.
func FirstDiff(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// LogitTol is how far a model's exact-mode logits may sit from its
// references: 1e-3, except tiny-qwen3-next, up to 8.3e-3 from its
// references because transformers computed them with its rotary inverse
// frequencies rounded to bf16 (the model had been cast to bf16 for export,
// buffers included; scripts/tiny). With sluice's frequencies rounded the
// same way the logits agree within 1e-5 (model.TestQwen3NextReferenceRope);
// every position's argmax agrees either way.
func LogitTol(name string) float64 {
	if name == "tiny-qwen3-next" {
		return 1e-2
	}
	return 1e-3
}

// Extra are the test checkpoints the repository keeps itself, trained by
// scripts/tiny/train_tiny.py, with their references from transformers:
// testdata/models/NAME.tar.gz as scripts/tiny/testdata.py writes it.
var Extra = []string{"tiny-glm4-moe", "tiny-qwen3-next"}

// repoRoot is the repository's root directory.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

var (
	extractMu sync.Mutex
	extracted = map[string]string{} // name → unpacked directory, once per test binary
)

// ExtraPresent reports whether the archive of the repository's model name
// (one of Extra) is on this machine: a test binary built elsewhere looks
// for it where the checkout was when it was built.
func ExtraPresent(name string) bool {
	_, err := os.Stat(filepath.Join(repoRoot(), "testdata", "models", name+".tar.gz"))
	return err == nil
}

// extra unpacks testdata/models/name.tar.gz once per archive content into
// the system's temporary directory (shared by every test binary, keyed by
// the archive's hash, so a changed archive is unpacked afresh) and returns
// the directory that holds name/ and name.json.
func extra(t testing.TB, name string) string {
	extractMu.Lock()
	defer extractMu.Unlock()
	if d, ok := extracted[name]; ok {
		return d
	}
	d := unpackOnce(t, name)
	extracted[name] = d
	return d
}

// unpackOnce finds or makes the unpacked copy of name's archive.
func unpackOnce(t testing.TB, name string) string {
	archive := filepath.Join(repoRoot(), "testdata", "models", name+".tar.gz")
	f, err := os.Open(archive)
	if err != nil {
		t.Fatalf("test model %s: %v", name, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatalf("test model %s: %v", name, err)
	}
	dir := filepath.Join(os.TempDir(), "sluice-testdata", name+"-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(filepath.Join(dir, name+".json")); err == nil {
		return dir
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	// Unpack beside the final place and rename, so that a test binary of
	// another package running at the same time never sees half a model.
	tmp, err := os.MkdirTemp(filepath.Dir(dir), name+"-partial-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if err := unpack(f, tmp); err != nil {
		t.Fatalf("test model %s: %v", name, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, name+".json")); serr != nil {
			t.Fatalf("test model %s: %v", name, err)
		}
	}
	return dir
}

// unpack extracts a testdata.py archive into dir, joining each
// NAME.even/NAME.odd pair back into NAME.
func unpack(r io.Reader, dir string) error {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return err
	}
	tr := tar.NewReader(zr)
	halves := map[string][2][]byte{}
	for {
		hd, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if strings.Contains(hd.Name, "..") || filepath.IsAbs(hd.Name) {
			return fmt.Errorf("bad archive entry %q", hd.Name)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		name, half := hd.Name, -1
		if n, ok := strings.CutSuffix(name, ".even"); ok {
			name, half = n, 0
		} else if n, ok := strings.CutSuffix(name, ".odd"); ok {
			name, half = n, 1
		}
		if half >= 0 {
			p := halves[name]
			p[half] = b
			halves[name] = p
			continue
		}
		if err := writeFile(filepath.Join(dir, name), b); err != nil {
			return err
		}
	}
	names := make([]string, 0, len(halves))
	for n := range halves {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		p := halves[n]
		even, odd := p[0], p[1]
		if len(even) != len(odd) && len(even) != len(odd)+1 {
			return fmt.Errorf("%s: even and odd halves of %d and %d bytes", n, len(even), len(odd))
		}
		b := make([]byte, len(even)+len(odd))
		for i := range even {
			b[2*i] = even[i]
		}
		for i := range odd {
			b[2*i+1] = odd[i]
		}
		if err := writeFile(filepath.Join(dir, n), b); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// Shared returns the path of ../shared beside the repository root, or
// $SLUICE_SHARED when set.
func Shared(t testing.TB) string {
	p := filepath.Join(repoRoot(), "..", "shared")
	if d := os.Getenv("SLUICE_SHARED"); d != "" {
		p = d // a test binary run away from its checkout (the GPU machine)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("shared test data not found at %s: %v", p, err)
	}
	return p
}

// ModelDir is the Hugging Face directory of a shared model, or of one of
// the repository's own (Extra).
func ModelDir(t testing.TB, name string) string {
	if slices.Contains(Extra, name) {
		return filepath.Join(extra(t, name), name)
	}
	return filepath.Join(Shared(t), "models", name)
}

// Case is one reference case of refs/<model>.json.
type Case struct {
	Prompt       []int       `json:"prompt"`
	Argmax       []int       `json:"argmax"`
	Top5IDs      [][]int     `json:"top5_ids"`
	Top5Logprobs [][]float64 `json:"top5_logprobs"`
	LastLogits   []float64   `json:"last_logits"`
	Greedy       []int       `json:"greedy"`
	MTPArgmax    []int       `json:"mtp_argmax"`
}

// Refs is refs/<model>.json.
type Refs struct {
	Arch      string    `json:"arch"`
	Cases     []Case    `json:"cases"`
	Long      []Case    `json:"long"`
	Routes    [][][]int `json:"routes_long0"`
	Tokenizer []struct {
		Text string `json:"text"`
		IDs  []int  `json:"ids"`
	} `json:"tokenizer"`
}

var (
	refsMu sync.Mutex
	refs   = map[string]*Refs{}
)

// LoadRefs reads and caches refs/<name>.json.
func LoadRefs(t testing.TB, name string) *Refs {
	refsMu.Lock()
	defer refsMu.Unlock()
	if r, ok := refs[name]; ok {
		return r
	}
	var path string
	if slices.Contains(Extra, name) {
		path = filepath.Join(extra(t, name), name+".json")
	} else {
		path = filepath.Join(Shared(t), "refs", name+".json")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := &Refs{}
	if err := json.Unmarshal(b, r); err != nil {
		t.Fatal(err)
	}
	refs[name] = r
	return r
}

var (
	packMu sync.Mutex
	packed = map[string]string{}
	tmpDir string
)

// Packed packs a shared model at bits once per test binary and returns the
// packed directory (its q4 expert records row-major, pack's default).
func Packed(t testing.TB, name string, bits int) string {
	return PackedLayout(t, name, bits, pack.LayoutRows)
}

// PackedManifest is Packed and the packed directory's manifest, read and
// checked (format.ReadManifest).
func PackedManifest(t testing.TB, name string, bits int) (string, *format.Manifest) {
	t.Helper()
	dir := Packed(t, name, bits)
	man, err := format.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, man
}

// PackedLayout is Packed with the q4 expert records in the layout given
// (pack.Options.Layout).
func PackedLayout(t testing.TB, name string, bits int, layout string) string {
	packMu.Lock()
	defer packMu.Unlock()
	key := name + "-" + itoa(bits)
	if layout != pack.LayoutRows {
		key += "-" + layout
	}
	if d, ok := packed[key]; ok {
		return d
	}
	if tmpDir == "" {
		d, err := os.MkdirTemp("", "sluice-test-")
		if err != nil {
			t.Fatal(err)
		}
		tmpDir = d
	}
	dst := filepath.Join(tmpDir, key)
	if err := pack.Pack(context.Background(), ModelDir(t, name), dst, pack.Options{Bits: bits, Layout: layout}); err != nil {
		t.Fatalf("pack %s at %d bits (%s): %v", name, bits, layout, err)
	}
	packed[key] = dst
	return dst
}

// GPURefused is a variant of tiny-deepseek-v32 that the GPU backend
// refuses whatever the machine (top-33 routing, over all four groups;
// the GPU's routers keep at most 32): the tests of device auto's fallback
// to the CPU use it.
var GPURefused = map[string]any{"num_experts_per_tok": 33, "topk_group": 4}

// DeepSeekV3 makes tiny-deepseek-v32 a deepseek_v3 config: the same
// weights, no indexer (every row attends to every position).
var DeepSeekV3 = map[string]any{"model_type": "deepseek_v3", "architectures": []string{"DeepseekV3ForCausalLM"},
	"index_topk": nil, "index_head_dim": nil, "index_n_heads": nil, "layer_types": nil}

// PackedVariant packs, at bits, a copy of the test model name whose
// config.json has edits applied (a nil value deletes the key; its other
// files are linked), and returns the packed directory, under t.TempDir.
func PackedVariant(t testing.TB, name string, bits int, edits map[string]any) string {
	t.Helper()
	src, dir := ModelDir(t, name), t.TempDir()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if n := e.Name(); n != "config.json" {
			Link(t, filepath.Join(src, n), filepath.Join(dir, n))
		}
	}
	cfg := ReadJSON(t, filepath.Join(src, "config.json"))
	for k, v := range edits {
		if v == nil {
			delete(cfg, k)
		} else {
			cfg[k] = v
		}
	}
	WriteJSON(t, filepath.Join(dir, "config.json"), cfg)
	dst := filepath.Join(t.TempDir(), name+"-variant")
	if err := pack.Pack(context.Background(), dir, dst, pack.Options{Bits: bits}); err != nil {
		t.Fatalf("pack a variant of %s at %d bits: %v", name, bits, err)
	}
	return dst
}

// Cleanup removes the packed models; call it from TestMain.
func Cleanup() {
	if tmpDir != "" {
		os.RemoveAll(tmpDir)
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	s := ""
	for n > 0 {
		s = string(rune('0'+n%10)) + s
		n /= 10
	}
	return s
}

// ReadJSON decodes a JSON object file (jsonfile.Read).
func ReadJSON(t testing.TB, path string) map[string]any {
	t.Helper()
	return jsonfile.Read(t, path)
}

// WriteJSON writes v as indented JSON (jsonfile.Write).
func WriteJSON(t testing.TB, path string, v any) {
	t.Helper()
	jsonfile.Write(t, path, v)
}

// Link makes dst name the file src, as a symbolic link where the system
// allows one that can be read through, else as a copy: Windows grants
// symbolic links only to administrators or in developer mode, and Wine 8
// creates links it cannot open.
func Link(t testing.TB, src, dst string) {
	t.Helper()
	if err := os.Symlink(src, dst); err == nil {
		if f, err := os.Open(dst); err == nil {
			f.Close()
			return
		}
		// Wine reports its dangling link as missing, to Remove too; Create
		// below still replaces it.
		if err := os.Remove(dst); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// CopyDir copies the flat directory src (a packed model) into a fresh
// temporary one, for tests that damage or change its files.
func CopyDir(t testing.TB, src string) string {
	t.Helper()
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// Prompt is n token ids spread over a vocabulary of vocab (its last 8
// ids, where special tokens sit, left out), the same for every test that
// needs a long prompt of no particular text.
func Prompt(n, vocab int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = (i*7919 + 13) % (vocab - 8)
	}
	return p
}

// ProcStatus reads a size field of /proc/self/status (VmRSS, VmHWM) in
// bytes, for tests of the memory budget (Linux only).
func ProcStatus(t testing.TB, key string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/self/status", key)
	return 0
}
