// Package testutil finds the shared test models and references and packs
// them once per test binary.
package testutil

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/sluicelm/sluice/internal/pack"
)

// Models are the shared test checkpoints, one per family.
var Models = []string{"tiny-qwen3-5-moe", "tiny-qwen3-moe", "tiny-gpt-oss", "tiny-deepseek-v32"}

// Shared returns the path of ../shared beside the repository root.
func Shared(t testing.TB) string {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	p := filepath.Join(root, "..", "shared")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("shared test data not found at %s: %v", p, err)
	}
	return p
}

// ModelDir is the Hugging Face directory of a shared model.
func ModelDir(t testing.TB, name string) string {
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
	b, err := os.ReadFile(filepath.Join(Shared(t), "refs", name+".json"))
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
// packed directory.
func Packed(t testing.TB, name string, bits int) string {
	packMu.Lock()
	defer packMu.Unlock()
	key := name + "/" + itoa(bits)
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
	dst := filepath.Join(tmpDir, name+"-"+itoa(bits))
	if err := pack.Pack(context.Background(), ModelDir(t, name), dst, pack.Options{Bits: bits}); err != nil {
		t.Fatalf("pack %s at %d bits: %v", name, bits, err)
	}
	packed[key] = dst
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

// ReadJSON decodes a JSON object file.
func ReadJSON(t testing.TB, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// WriteJSON writes v as indented JSON.
func WriteJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
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
