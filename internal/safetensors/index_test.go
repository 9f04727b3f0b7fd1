package safetensors

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// twoShards writes a.safetensors (tensor x) and b.safetensors (tensor y)
// into a fresh directory, the smallest sharded checkpoint.
func twoShards(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	writeSafetensors(t, filepath.Join(dir, "a.safetensors"), map[string]rawTensor{"x": {DType: "F32", Shape: []int{1}, Data: f32s(1)}})
	writeSafetensors(t, filepath.Join(dir, "b.safetensors"), map[string]rawTensor{"y": {DType: "F32", Shape: []int{1}, Data: f32s(2)}})
	return dir
}

// TestIndexErrors: a broken model.safetensors.index.json is an error naming
// the index and what is wrong, never a read outside the directory nor a
// checkpoint whose tensors are not where the index says.
func TestIndexErrors(t *testing.T) {
	for _, c := range []struct {
		name  string
		index string // raw index; "" means write wm with writeIndex
		wm    map[string]string
		want  []string
	}{
		// A shard name outside the directory was opened as given.
		{"parent-dir", "", map[string]string{"x": "a.safetensors", "y": "../outside.safetensors"}, []string{IndexFile, "tensor y", "../outside.safetensors", "not a file inside"}},
		{"nested-parent", "", map[string]string{"x": "a.safetensors", "y": "sub/../../outside.safetensors"}, []string{"tensor y", "not a file inside"}},
		{"absolute", "", map[string]string{"x": "a.safetensors", "y": "/etc/passwd"}, []string{"tensor y", "/etc/passwd", "not a file inside"}},
		{"empty-name", "", map[string]string{"x": "a.safetensors", "y": ""}, []string{"tensor y", "not a file inside"}},
		// A tensor the index names in a shard that does not hold it was
		// silently absent (or read from another shard).
		{"tensor-not-in-shard", "", map[string]string{"x": "a.safetensors", "y": "b.safetensors", "z": "b.safetensors"}, []string{"tensor z", "b.safetensors", "does not hold it"}},
		{"tensor-in-unlisted-shard", "", map[string]string{"x": "b.safetensors", "y": "b.safetensors"}, []string{"tensor x", "b.safetensors", "does not hold it"}},
		{"tensors-swapped", "", map[string]string{"x": "b.safetensors", "y": "a.safetensors"}, []string{"tensor x", "maps it to shard b.safetensors", "in a.safetensors"}},
		{"missing-shard", "", map[string]string{"x": "a.safetensors", "y": "c.safetensors"}, []string{"c.safetensors", "tensor y", "missing"}},
		// The same shard spelt two ways was opened twice: "appears twice".
		{"dot-slash", "", map[string]string{"x": "./a.safetensors", "y": "b.safetensors"}, nil},
		// Malformed index files.
		{"not-json", "weights!", nil, []string{IndexFile, "not a JSON index"}},
		{"truncated", `{"weight_map": {"x": "a.safetensors"`, nil, []string{IndexFile}},
		{"array", `[]`, nil, []string{IndexFile, "not a JSON"}},
		{"null", `null`, nil, []string{IndexFile, "not a JSON"}},
		{"no-weight-map", `{"metadata": {}}`, nil, []string{IndexFile, "no weight_map"}},
		{"weight-map-null", `{"weight_map": null}`, nil, []string{IndexFile, "weight_map", "not a JSON object"}},
		{"weight-map-array", `{"weight_map": ["a.safetensors"]}`, nil, []string{IndexFile, "weight_map", "not a JSON object"}},
		{"weight-map-string", `{"weight_map": "a.safetensors"}`, nil, []string{IndexFile, "weight_map"}},
		{"shard-number", `{"weight_map": {"x": 1}}`, nil, []string{IndexFile, "tensor x", "not a file name"}},
		{"shard-null", `{"weight_map": {"x": null}}`, nil, []string{IndexFile, "tensor x", "not a file name"}},
		{"shard-object", `{"weight_map": {"x": {"file": "a.safetensors"}}}`, nil, []string{IndexFile, "tensor x", "not a file name"}},
		// json.Unmarshal kept the last of two entries for one tensor.
		{"duplicate-tensor", `{"weight_map": {"x": "a.safetensors", "x": "b.safetensors"}}`, nil, []string{IndexFile, `"x"`, "twice"}},
		{"duplicate-weight-map", `{"weight_map": {"x": "a.safetensors"}, "weight_map": {"y": "b.safetensors"}}`, nil, []string{IndexFile, "weight_map", "twice"}},
		{"empty-weight-map", `{"weight_map": {}}`, nil, []string{IndexFile, "empty weight_map"}},
		{"trailing-garbage", `{"weight_map": {"x": "a.safetensors"}} x`, nil, []string{IndexFile}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := twoShards(t)
			// A real shard outside the directory, so that reading it would
			// succeed if the name were followed.
			writeSafetensors(t, filepath.Join(filepath.Dir(dir), "outside.safetensors"), map[string]rawTensor{"y": {DType: "F32", Shape: []int{1}, Data: f32s(3)}})
			if c.index != "" {
				if err := os.WriteFile(filepath.Join(dir, IndexFile), []byte(c.index), 0o644); err != nil {
					t.Fatal(err)
				}
			} else {
				writeIndex(t, dir, c.wm)
			}
			if c.want == nil {
				ck, err := OpenDir(dir)
				if err != nil {
					t.Fatalf("OpenDir: %v", err)
				}
				defer ck.Close()
				if got := ck.Names(); !slices.Equal(got, []string{"x", "y"}) {
					t.Fatalf("Names() = %v, want [x y]", got)
				}
				return
			}
			openErr(t, dir, c.want...)
		})
	}
}

// TestIndexShardNotAFile: a shard that is a directory is an error, not a
// mapping failure (a FIFO's case, a hang on open, is in fifo_test.go).
func TestIndexShardNotAFile(t *testing.T) {
	t.Run("directory", func(t *testing.T) {
		dir := twoShards(t)
		if err := os.Mkdir(filepath.Join(dir, "c.safetensors"), 0o755); err != nil {
			t.Fatal(err)
		}
		writeIndex(t, dir, map[string]string{"x": "a.safetensors", "y": "c.safetensors"})
		openErr(t, dir, "c.safetensors", "not a regular file")
	})
}

// TestIndexUnreadable: an index that exists but cannot be read is an
// error, not a silent fallback to every *.safetensors file of the
// directory.
func TestIndexUnreadable(t *testing.T) {
	dir := twoShards(t)
	if err := os.Mkdir(filepath.Join(dir, IndexFile), 0o755); err != nil {
		t.Fatal(err)
	}
	openErr(t, dir, IndexFile)
}

// TestOpenDirPatternName: without an index, the directory's name is a
// path, not a glob pattern; a name with '*' once also read the shards of
// every sibling directory it matched.
func TestOpenDirPatternName(t *testing.T) {
	parent := t.TempDir()
	for _, d := range []string{"m*", "m[1]", "mb", "m1"} {
		if err := os.Mkdir(filepath.Join(parent, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeSafetensors(t, filepath.Join(parent, "m*", "model.safetensors"), map[string]rawTensor{"a": {DType: "F32", Shape: []int{1}, Data: f32s(1)}})
	writeSafetensors(t, filepath.Join(parent, "mb", "other.safetensors"), map[string]rawTensor{"b": {DType: "F32", Shape: []int{1}, Data: f32s(2)}})
	writeSafetensors(t, filepath.Join(parent, "m[1]", "model.safetensors"), map[string]rawTensor{"c": {DType: "F32", Shape: []int{1}, Data: f32s(3)}})
	writeSafetensors(t, filepath.Join(parent, "m1", "model.safetensors"), map[string]rawTensor{"d": {DType: "F32", Shape: []int{1}, Data: f32s(4)}})
	for d, want := range map[string][]string{"m*": {"a"}, "m[1]": {"c"}} {
		ck, err := OpenDir(filepath.Join(parent, d))
		if err != nil {
			t.Errorf("OpenDir(%s): %v", d, err)
			continue
		}
		if got := ck.Names(); !slices.Equal(got, want) {
			t.Errorf("OpenDir(%s) Names() = %v, want %v", d, got, want)
		}
		ck.Close()
	}
}

// TestSharedModelsOpen: the stricter index checks keep the shared
// checkpoints (sharded, with an index) opening, every indexed tensor
// found in its shard.
func TestSharedModelsOpen(t *testing.T) {
	root := filepath.Join("..", "..", "..", "shared", "models")
	for _, m := range []string{"tiny-deepseek-v32", "tiny-gpt-oss", "tiny-qwen3-5-moe", "tiny-qwen3-moe"} {
		t.Run(m, func(t *testing.T) {
			dir := filepath.Join(root, m)
			if _, err := os.Stat(filepath.Join(dir, IndexFile)); err != nil {
				t.Skipf("shared model not available: %v", err)
			}
			ck, err := OpenDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			if len(ck.Tensors) == 0 {
				t.Fatal("no tensors")
			}
		})
	}
}
