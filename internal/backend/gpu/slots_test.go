//go:build linux

package gpu

import (
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/kernels"
	"github.com/sluicelm/sluice/internal/model"
)

// TestSlotTable drives the device pool's slot choice (no GPU needed):
// free slots first, then the least recently used one, never a slot the
// current wave holds, and a record found again is a hit in its old slot.
func TestSlotTable(t *testing.T) {
	tab := newSlotTable(10, 3)
	tab.begin()
	for rec, want := range []int{0, 1, 2} {
		if tab.lookup(rec) != -1 {
			t.Fatalf("record %d: hit in an empty table", rec)
		}
		if s := tab.take(rec); s != want {
			t.Fatalf("record %d took slot %d, want free slot %d", rec, s, want)
		}
	}
	tab.begin()
	if tab.lookup(1) != 1 { // 1 is now the most recent
		t.Fatal("record 1 not found in slot 1")
	}
	if s := tab.take(5); s != 0 { // 0 and 2 are older; 0 first
		t.Fatalf("record 5 took slot %d, want 0 (least recently used)", s)
	}
	if tab.lookup(0) != -1 {
		t.Fatal("record 0 still found after its slot was taken")
	}
	if s := tab.take(6); s != 2 {
		t.Fatalf("record 6 took slot %d, want 2", s)
	}
	// Every slot is held by this wave now: nothing may be evicted.
	if s := tab.take(7); s != -1 {
		t.Fatalf("record 7 took slot %d of a wave that holds all three", s)
	}
	tab.begin()
	if tab.lookup(6) != 2 || tab.lookup(5) != 0 {
		t.Fatal("records 5 and 6 lost their slots")
	}
	if s := tab.take(7); s != 1 { // the only slot this wave does not hold
		t.Fatalf("record 7 took slot %d, want 1", s)
	}
	for rec, s := range tab.slotOf {
		if s >= 0 && tab.owner[s] != int32(rec) {
			t.Fatalf("record %d maps to slot %d, owned by %d", rec, s, tab.owner[s])
		}
	}
}

// TestFillRecord stages an expert the way a slot holds it: each matrix's
// codes row-major (untiled when the host tiled them), scales and biases,
// at the offsets of the slot layout; a matrix of another shape is refused.
func TestFillRecord(t *testing.T) {
	const rows, cols = 16, 128
	mk := func(seed byte) kernels.Mat {
		m := kernels.Mat{Kind: format.Q4, Rows: rows, Cols: cols, Q: make([]byte, rows*cols/2),
			Scales: make([]uint16, rows*cols/format.GroupSize), Biases: make([]uint16, rows*cols/format.GroupSize)}
		for i := range m.Q {
			m.Q[i] = seed + byte(i*7)
		}
		for i := range m.Scales {
			m.Scales[i], m.Biases[i] = uint16(seed)<<8|uint16(i), uint16(i)*3
		}
		return m
	}
	ex := &model.Expert{Gate: mk(1), Up: mk(2), Down: mk(3)}
	var a arena
	lay := [3]matOffsets{putMat(&a, &ex.Gate), putMat(&a, &ex.Up), putMat(&a, &ex.Down)}
	flat := make([]byte, a.size)
	if err := fillRecord(flat, lay, ex); err != nil {
		t.Fatal(err)
	}
	for i, km := range []*kernels.Mat{&ex.Gate, &ex.Up, &ex.Down} {
		o := lay[i]
		if string(flat[o.q:o.q+len(km.Q)]) != string(km.Q) || string(flat[o.s:o.s+2*len(km.Scales)]) != string(bytesOf(km.Scales)) ||
			string(flat[o.b:o.b+2*len(km.Biases)]) != string(bytesOf(km.Biases)) {
			t.Fatalf("matrix %d not staged at its offsets", i)
		}
	}
	tiled := *ex
	for _, km := range []*kernels.Mat{&tiled.Gate, &tiled.Up, &tiled.Down} {
		km.Q = append([]byte(nil), km.Q...)
		kernels.TileQ4(km.Q, km.Rows, km.Cols, nil)
		km.Tiled = true
	}
	if string(tiled.Gate.Q) == string(ex.Gate.Q) {
		t.Fatal("tiling left the codes in place: the test would prove nothing")
	}
	got := make([]byte, a.size)
	if err := fillRecord(got, lay, &tiled); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(flat) {
		t.Fatal("a tiled host record staged differently from its row-major copy")
	}
	bad := *ex
	bad.Down.Rows, bad.Down.Cols = cols, rows
	if err := fillRecord(flat, lay, &bad); err == nil {
		t.Fatal("a matrix of another shape was staged")
	}
}
