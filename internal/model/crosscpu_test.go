package model

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/testutil"
)

// crossLogits is the last-position logits of the reference cases of both
// shared models, exact (16) and 4-bit, in a fixed order: what
// TestCrossCPULogits compares between kernel paths and CPUs. cases lists
// the case indices to run (nil: all).
func crossLogits(t *testing.T, cases map[int]bool) (keys []string, logits [][]float32) {
	for _, name := range testutil.Models {
		for _, bits := range []int{16, 4} {
			m := load(t, name, bits)
			refs := testutil.LoadRefs(t, name)
			r := NewRunner(m, 2, 64)
			for ci, c := range refs.Cases {
				if cases != nil && !cases[ci] {
					continue
				}
				st, err := m.NewState(len(c.Prompt))
				if err != nil {
					t.Fatal(err)
				}
				out := make([]float32, m.Config.Vocab)
				if err := r.Forward(st, c.Prompt, out, false); err != nil {
					t.Fatal(err)
				}
				keys = append(keys, fmt.Sprintf("%s/bits%d/case%d", name, bits, ci))
				logits = append(logits, out)
			}
			r.Close()
		}
	}
	return keys, logits
}

// encodeLogits is the file form: per case its key's length and bytes, the
// logit count and the float32 bits, little-endian.
func encodeLogits(keys []string, logits [][]float32) []byte {
	var b bytes.Buffer
	for i, k := range keys {
		binary.Write(&b, binary.LittleEndian, uint32(len(k)))
		b.WriteString(k)
		binary.Write(&b, binary.LittleEndian, uint32(len(logits[i])))
		binary.Write(&b, binary.LittleEndian, logits[i])
	}
	return b.Bytes()
}

func decodeLogits(data []byte) (keys []string, logits [][]float32, err error) {
	r := bytes.NewReader(data)
	for r.Len() > 0 {
		var n uint32
		if err := binary.Read(r, binary.LittleEndian, &n); err != nil || int(n) > r.Len() {
			return nil, nil, fmt.Errorf("truncated key")
		}
		k := make([]byte, n)
		r.Read(k)
		if err := binary.Read(r, binary.LittleEndian, &n); err != nil || int(n)*4 > r.Len() {
			return nil, nil, fmt.Errorf("truncated logits of %s", k)
		}
		l := make([]float32, n)
		binary.Read(r, binary.LittleEndian, l)
		keys, logits = append(keys, string(k)), append(logits, l)
	}
	return keys, logits, nil
}

// compareLogits requires every case of got (a subset of want's, by key) to
// have want's bits.
func compareLogits(t *testing.T, what string, keys []string, want [][]float32, gotKeys []string, got [][]float32) {
	t.Helper()
	index := map[string]int{}
	for i, k := range keys {
		index[k] = i
	}
	if len(gotKeys) == 0 {
		t.Fatalf("%s: no cases", what)
	}
	for i, k := range gotKeys {
		w, ok := index[k]
		if !ok || len(got[i]) != len(want[w]) {
			t.Fatalf("%s: case %s with %d logits is not one of this run's", what, k, len(got[i]))
		}
		for j, v := range want[w] {
			if math.Float32bits(got[i][j]) != math.Float32bits(v) {
				t.Errorf("%s: %s logit %d is %v (%#08x), here %v (%#08x)", what, k, j,
					got[i][j], math.Float32bits(got[i][j]), v, math.Float32bits(v))
				break
			}
		}
	}
}

// TestCrossCPULogits requires the last-position logits of every reference
// case (both models, exact and 4-bit) to be the same bits with the
// assembly kernels as with their pure-Go twins (a second run of this test
// binary with SLUICE_NOSIMD=1), and as in every file of logits in the
// directory SLUICE_CROSSCPU_PEERS (CI puts there the logits of the
// linux/arm64 build, run under emulation). With SLUICE_CROSSCPU_OUT set it
// only writes its logits to that file, for the cases listed in
// SLUICE_CROSSCPU_CASES (comma-separated indices; all when unset), since
// emulation runs the whole set slowly.
func TestCrossCPULogits(t *testing.T) {
	if raceEnabled {
		t.Skip("numerics, not synchronisation: the run without -race checks them")
	}
	var cases map[int]bool
	if list := os.Getenv("SLUICE_CROSSCPU_CASES"); list != "" {
		cases = map[int]bool{}
		for _, f := range strings.Split(list, ",") {
			i, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				t.Fatalf("SLUICE_CROSSCPU_CASES=%q: %v", list, err)
			}
			cases[i] = true
		}
	}
	keys, logits := crossLogits(t, cases)
	if out := os.Getenv("SLUICE_CROSSCPU_OUT"); out != "" {
		if err := os.WriteFile(out, encodeLogits(keys, logits), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %d cases (SIMD kernels: %v) to %s", len(keys), kernels.SIMD(), out)
		return
	}
	if kernels.SIMD() {
		twin := filepath.Join(t.TempDir(), "twins.logits")
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrossCPULogits$", "-test.count=1")
		cmd.Env = append(os.Environ(), "SLUICE_NOSIMD=1", "SLUICE_CROSSCPU_OUT="+twin)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("the run with SLUICE_NOSIMD=1 failed: %v\n%s", err, b)
		}
		data, err := os.ReadFile(twin)
		if err != nil {
			t.Fatal(err)
		}
		k2, l2, err := decodeLogits(data)
		if err != nil {
			t.Fatal(err)
		}
		compareLogits(t, "SLUICE_NOSIMD=1", keys, logits, k2, l2)
	}
	dir := os.Getenv("SLUICE_CROSSCPU_PEERS")
	if dir == "" {
		t.Log("SLUICE_CROSSCPU_PEERS not set: no other CPU's logits to compare")
		return
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.logits"))
	sort.Strings(files)
	if len(files) == 0 {
		t.Fatalf("SLUICE_CROSSCPU_PEERS=%s holds no .logits files", dir)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		k2, l2, err := decodeLogits(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		compareLogits(t, filepath.Base(f), keys, logits, k2, l2)
		t.Logf("%s: %d cases, every logit the same bits", filepath.Base(f), len(k2))
	}
}
