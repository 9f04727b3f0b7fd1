package testutil

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
)

// tarGz builds a gzip'd tar of files, in name order.
func tarGz(t *testing.T, files map[string][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n]))}); err != nil {
			t.Fatal(err)
		}
		tw.Write(files[n])
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

// checkSafetensors checks that b is a whole safetensors file: the header's
// tensors cover the data section exactly.
func checkSafetensors(b []byte) error {
	if len(b) < 8 {
		return fmt.Errorf("%d bytes", len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > uint64(len(b)-8) {
		return fmt.Errorf("header of %d bytes in a file of %d", n, len(b))
	}
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &hdr); err != nil {
		return err
	}
	end := uint64(0)
	for k, v := range hdr {
		if k == "__metadata__" {
			continue
		}
		var ti struct {
			Offsets [2]uint64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(v, &ti); err != nil {
			return fmt.Errorf("%s: %v", k, err)
		}
		end = max(end, ti.Offsets[1])
	}
	if 8+n+end != uint64(len(b)) {
		return fmt.Errorf("tensors end at %d, the file at %d", 8+n+end, len(b))
	}
	return nil
}
