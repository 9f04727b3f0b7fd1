package platform

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// TestReads reads pieces of a file through the kernel's asynchronous I/O,
// several in flight at once, and compares them with the file; a read that
// runs past the end reports the bytes it got. It collects from the ring in
// memory, and again through io_getevents alone.
func TestReads(t *testing.T) {
	for _, ring := range []bool{true, false} {
		t.Run(map[bool]string{true: "ring", false: "io_getevents"}[ring], func(t *testing.T) { testReads(t, ring) })
	}
}

func testReads(t *testing.T, ring bool) {
	const piece = 64 << 10
	data := make([]byte, 6*piece)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	path := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(path, data[:5*piece+piece/2], 0o644); err != nil {
		t.Fatal(err)
	}
	f, direct, why, err := OpenUncached(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	t.Logf("uncached: %v %s", direct, why)
	r, err := NewReads(8)
	if err != nil {
		t.Skipf("no asynchronous reads here: %v", err)
	}
	defer r.Close()
	if ring && r.ring == nil {
		t.Skip("the completion ring is not readable here")
	}
	if !ring {
		r.ring = nil
	}
	buf, err := Alloc(6 * piece)
	if err != nil {
		t.Fatal(err)
	}
	defer Free(buf)
	// Pieces 4, 1, 0 and 5 (which the file ends half-way into) at once,
	// then 2 and 3 after the first ones are collected.
	order := []int{4, 1, 0, 5, 2, 3}
	got := map[uint64]int64{}
	var out []ReadDone
	submit := func(p int) {
		if err := r.Submit(f, buf[p*piece:(p+1)*piece], int64(p*piece), uint64(100+p)); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range order[:4] {
		submit(p)
	}
	for next := 4; len(got) < len(order); {
		if out, err = r.Collect(out[:0], true); err != nil {
			t.Fatal(err)
		}
		for _, d := range out {
			if d.Err != nil {
				t.Fatalf("read %d: %v", d.Tag, d.Err)
			}
			if _, ok := got[d.Tag]; ok {
				t.Fatalf("read %d collected twice", d.Tag)
			}
			got[d.Tag] = d.N
		}
		for ; next < len(order) && len(got) >= 2*(next-3); next++ {
			submit(order[next])
		}
	}
	for p := range 6 {
		want := int64(piece)
		if p == 5 {
			want = piece / 2
		}
		if got[uint64(100+p)] != want {
			t.Errorf("piece %d: %d bytes, want %d", p, got[uint64(100+p)], want)
		}
		if !bytes.Equal(buf[p*piece:p*piece+int(want)], data[p*piece:p*piece+int(want)]) {
			t.Errorf("piece %d: bytes differ", p)
		}
	}
	// Nothing in flight: a collect that does not wait returns nothing.
	if out, err = r.Collect(out[:0], false); err != nil || len(out) != 0 {
		t.Errorf("idle collect: %v, %v", out, err)
	}
}
