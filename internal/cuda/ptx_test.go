//go:build linux

package cuda

import "testing"

// TestPTXFresh fails when a kernel source changed after its PTX was
// generated: every embedded PTX file must carry the hash of the current
// sources, which scripts/gpu-ptx.sh writes. It needs no GPU.
func TestPTXFresh(t *testing.T) {
	want := SourcesHash()
	for _, m := range modules {
		b, err := ptxFS.ReadFile("kernels/" + m + ".ptx")
		if err != nil {
			t.Fatal(err)
		}
		if got := ptxHash(b); got != want {
			t.Errorf("kernels/%s.ptx was generated from sources with sha256 %q; the sources now hash to %s: run scripts/gpu-ptx.sh on a machine with nvcc", m, got, want)
		}
	}
}
