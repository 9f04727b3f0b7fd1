// Package jsonfile reads and writes the JSON files that tests build model
// directories from. It imports nothing of sluice's, so that the packages
// testutil itself depends on (hf, through the packer) can use it in their
// own tests, where importing testutil would be a cycle.
package jsonfile

import (
	"encoding/json"
	"os"
	"testing"
)

// Read decodes the JSON object in the file at path, failing t if it cannot.
func Read(t testing.TB, path string) map[string]any {
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

// Write writes v to path as indented JSON, failing t if it cannot.
func Write(t testing.TB, path string, v any) {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
