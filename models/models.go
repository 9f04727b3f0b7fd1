// Package models carries the bundled default model: a 4-bit packed copy of
// the tiny Qwen3.5-MoE test checkpoint, so `sluice run` works on a fresh
// clone with nothing downloaded. Regenerate it whenever the packed format
// changes with:
//
//	go run ./cmd/sluice pack --bits 4 --force ../shared/models/tiny-qwen3-5-moe models/default
//
// TestDefaultUpToDate fails when it is stale.
package models

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

//go:embed default
var bundled embed.FS

// DefaultName is how the bundled model is named in messages.
const DefaultName = "tiny-qwen3-5-moe (bundled, 4-bit)"

// DefaultDir returns a directory holding the bundled model, extracting it
// into cacheDir on first use. The weights are memory-mapped, so they must
// live in a real file; the directory name carries a hash of the manifest,
// so a rebuilt binary with a new model never reads an old extraction.
func DefaultDir(cacheDir string) (string, error) {
	man, err := bundled.ReadFile("default/manifest.json")
	if err != nil {
		return "", fmt.Errorf("bundled model: %v", err)
	}
	sum := sha256.Sum256(man)
	dst := filepath.Join(cacheDir, "default-"+hex.EncodeToString(sum[:6]))
	if _, err := os.Stat(filepath.Join(dst, "manifest.json")); err == nil {
		return dst, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("bundled model: %v", err)
	}
	tmp, err := os.MkdirTemp(cacheDir, ".default-")
	if err != nil {
		return "", fmt.Errorf("bundled model: %v", err)
	}
	defer os.RemoveAll(tmp)
	entries, err := fs.ReadDir(bundled, "default")
	if err != nil {
		return "", fmt.Errorf("bundled model: %v", err)
	}
	for _, e := range entries {
		b, err := bundled.ReadFile("default/" + e.Name())
		if err != nil {
			return "", fmt.Errorf("bundled model: %v", err)
		}
		if err := os.WriteFile(filepath.Join(tmp, e.Name()), b, 0o644); err != nil {
			return "", fmt.Errorf("bundled model: %v", err)
		}
	}
	// Rename is atomic: a concurrent extraction either wins or finds dst.
	if err := os.Rename(tmp, dst); err != nil {
		if _, serr := os.Stat(filepath.Join(dst, "manifest.json")); serr == nil {
			return dst, nil
		}
		return "", fmt.Errorf("bundled model: %v", err)
	}
	return dst, nil
}

// Files lists the bundled files and their contents, for the staleness test.
func Files() (map[string][]byte, error) {
	out := map[string][]byte{}
	entries, err := fs.ReadDir(bundled, "default")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		b, err := bundled.ReadFile("default/" + e.Name())
		if err != nil {
			return nil, err
		}
		out[e.Name()] = b
	}
	return out, nil
}
