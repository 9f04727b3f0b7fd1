//go:build linux

package cuda

import (
	"strings"
	"testing"
)

// TestPTXFresh fails when a kernel source changed after its PTX was
// generated: every embedded PTX file must carry the hash of the current
// sources, which scripts/gpu-ptx.sh writes. It needs no GPU.
func TestPTXFresh(t *testing.T) {
	want := SourcesHash()
	for _, m := range modules {
		for _, f := range []string{m + ".ptx", m + ".sm90.ptx"} {
			b, err := ptxFS.ReadFile("kernels/" + f)
			if err != nil {
				t.Fatal(err)
			}
			if got := ptxHash(b); got != want {
				t.Errorf("kernels/%s was generated from sources with sha256 %q; the sources now hash to %s: run scripts/gpu-ptx.sh on a machine with nvcc", f, got, want)
			}
		}
	}
}

// TestPTXPDL checks that every kernel of the sm_90 set waits for its
// predecessor (PDL_ENTRY's griddepcontrol.wait): the host launches all of
// them with programmatic dependent launch, and one that did not wait could
// read its input before the kernel ahead of it wrote it. The sm_80 set
// must not wait (it is PTX for GPUs without the instruction). It needs no
// GPU.
func TestPTXPDL(t *testing.T) {
	for _, m := range modules {
		for _, pdl := range []bool{false, true} {
			b, err := PTX(m, pdl)
			if err != nil {
				t.Fatal(err)
			}
			entries := strings.Split(string(b), ".entry ")[1:]
			if len(entries) == 0 {
				t.Fatalf("%s (pdl %v): no kernels", m, pdl)
			}
			for _, e := range entries {
				name, _, _ := strings.Cut(e, "(")
				if waits := strings.Contains(e, "griddepcontrol.wait"); waits != pdl {
					t.Errorf("%s: kernel %s: griddepcontrol.wait %v, want %v", m, name, waits, pdl)
				}
			}
		}
	}
}
