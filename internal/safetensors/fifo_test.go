//go:build unix

package safetensors

import (
	"path/filepath"
	"syscall"
	"testing"
)

// TestIndexShardFIFO: a shard that is a FIFO is an error, not a hang on
// open (unix only: Windows has no FIFOs in the file system).
func TestIndexShardFIFO(t *testing.T) {
	dir := twoShards(t)
	if err := syscall.Mkfifo(filepath.Join(dir, "c.safetensors"), 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	writeIndex(t, dir, map[string]string{"x": "a.safetensors", "y": "c.safetensors"})
	openErr(t, dir, "c.safetensors", "not a regular file")
}
