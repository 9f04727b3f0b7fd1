package kernels

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestNoLegacySSE checks the amd64 assembly for a legacy-encoded (non-VEX)
// SSE instruction on an X register while the upper halves of the Y
// registers may hold data. Such an instruction must merge into the full
// register, and on the 2-core development machine one MOVQ GPR→X0 per
// chunk of 8 groups doubled the decode kernel's time (q4Rows: 31 against
// 15 ns a group of 8 rows from L1 cache, BenchmarkQ4DecodeDRAM 13 against
// 16-18 GB/s). The VEX form (VMOVQ) has no such dependency. Legacy SSE is
// allowed before a function's first Y or Z register and after VZEROUPPER
// (returning a float through MOVSS); a macro, which may be expanded
// anywhere, may not hold it at all.
func TestNoLegacySSE(t *testing.T) {
	files, err := filepath.Glob("*_amd64.s")
	if err != nil || len(files) == 0 {
		t.Fatalf("no amd64 assembly found: %v", err)
	}
	wide := regexp.MustCompile(`\b[YZ]([0-9]|1[0-9]|2[0-9]|3[01])\b`)
	xreg := regexp.MustCompile(`\bX([0-9]|1[0-9]|2[0-9]|3[01])\b`)
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dirty, inMacro := false, false
		for i, line := range strings.Split(string(b), "\n") {
			code := line
			if k := strings.Index(code, "//"); k >= 0 {
				code = code[:k]
			}
			code = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(code), `\`))
			macroLine := inMacro || strings.HasPrefix(code, "#define")
			inMacro = strings.HasSuffix(strings.TrimSpace(line), `\`) && macroLine
			if strings.HasPrefix(code, "TEXT") {
				dirty = false
				continue
			}
			if strings.HasPrefix(code, "#define") {
				code = strings.TrimSpace(strings.TrimPrefix(code, "#define"))
				if k := strings.IndexAny(code, " \t"); k >= 0 {
					code = strings.TrimSpace(code[k:]) // drop the macro's name
				} else {
					code = ""
				}
			}
			if code == "" || strings.HasSuffix(code, ":") {
				continue
			}
			op := strings.Fields(code)[0]
			if strings.Contains(op, "(") {
				continue // a macro's use: its body is checked where defined
			}
			if op == "VZEROUPPER" {
				dirty = false
				continue
			}
			if wide.MatchString(code) {
				dirty = true
			}
			if !strings.HasPrefix(op, "V") && xreg.MatchString(code) {
				checked++
				if dirty || macroLine {
					t.Errorf("%s:%d: legacy SSE %q with the upper halves possibly in use: use the VEX form", f, i+1, code)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("found no legacy SSE instruction at all: the scan is broken")
	}
}
