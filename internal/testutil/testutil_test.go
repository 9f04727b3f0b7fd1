package testutil

import (
	"bytes"
	"crypto/sha256"
	"os"
	"path/filepath"
	"testing"
)

// The repository's own test models unpack to the checkpoint scripts/tiny
// trained: every safetensors file is whole (its JSON header parses to the
// tensors' byte ranges, which end exactly at the file's end) and the
// references load with all their cases.
func TestExtraModels(t *testing.T) {
	for _, name := range Extra {
		dir := ModelDir(t, name)
		files, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no safetensors in %s (%v)", name, dir, err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkSafetensors(b); err != nil {
				t.Errorf("%s: %v", f, err)
			}
		}
		r := LoadRefs(t, name)
		if len(r.Cases) == 0 || len(r.Long) == 0 || len(r.Cases[0].Greedy) != 48 {
			t.Errorf("%s: refs have %d cases, %d long", name, len(r.Cases), len(r.Long))
		}
		// A second call finds the unpacked copy.
		if again := ModelDir(t, name); again != dir {
			t.Errorf("%s unpacked twice: %s then %s", name, dir, again)
		}
	}
}

// unpack joins even and odd halves back into the bytes they came from, for
// odd and even lengths.
func TestUnpackJoinsHalves(t *testing.T) {
	for _, n := range []int{0, 1, 2, 7, 4096} {
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(i*31 + 7)
		}
		var even, odd []byte
		for i, b := range data {
			if i%2 == 0 {
				even = append(even, b)
			} else {
				odd = append(odd, b)
			}
		}
		dir := t.TempDir()
		if err := unpack(bytes.NewReader(tarGz(t, map[string][]byte{"m/x.safetensors.even": even, "m/x.safetensors.odd": odd, "m.json": []byte("{}")})), dir); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, "m", "x.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(got) != sha256.Sum256(data) {
			t.Errorf("length %d: joined bytes differ", n)
		}
	}
}
