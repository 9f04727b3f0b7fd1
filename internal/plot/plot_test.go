package plot

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// node is a parsed XML element.
type node struct {
	name  string
	attr  map[string]string
	text  string
	kids  []*node
	outer *node
}

func parseSVG(t *testing.T, b []byte) *node {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	root := &node{name: "#document"}
	cur := root
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v\n%s", err, b)
		}
		switch tk := tok.(type) {
		case xml.StartElement:
			n := &node{name: tk.Name.Local, attr: map[string]string{}, outer: cur}
			for _, a := range tk.Attr {
				n.attr[a.Name.Local] = a.Value
			}
			cur.kids = append(cur.kids, n)
			cur = n
		case xml.EndElement:
			cur = cur.outer
		case xml.CharData:
			cur.text += string(tk)
		}
	}
	if len(root.kids) != 1 || root.kids[0].name != "svg" {
		t.Fatalf("want one <svg> root element")
	}
	return root.kids[0]
}

func (n *node) all(pred func(*node) bool) []*node {
	var out []*node
	var walk func(*node)
	walk = func(m *node) {
		if pred(m) {
			out = append(out, m)
		}
		for _, k := range m.kids {
			walk(k)
		}
	}
	walk(n)
	return out
}

func (n *node) float(t *testing.T, key string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(n.attr[key], 64)
	if err != nil {
		t.Fatalf("<%s> attribute %s=%q: %v", n.name, key, n.attr[key], err)
	}
	return v
}

func sampleFigure(logX bool) *Figure {
	rng := rand.New(rand.NewPCG(3, 4))
	xs := []float64{5, 10, 25, 50, 100}
	var a, b, c []Point
	for _, x := range xs {
		a = append(a, Point{x, 100 * rng.Float64()})
		b = append(b, Point{x, 120 * rng.Float64()})
		c = append(c, Point{x, rng.Float64()})
	}
	b[2].Y = math.NaN() // a value missing at one x
	return &Figure{
		Title: "decode <speed> & pool", Notes: []string{"2 cores"}, XLabel: "pool (% of expert bytes)", LogX: logX,
		XFormat: func(v float64) string { return FormatNumber(v) + "%" },
		Panels: []Panel{
			{YLabel: "tok/s", Series: []Series{{Name: "measured", Points: a}, {Name: "limit <max>", Points: b, Dashed: true}}},
			{YLabel: "hit rate", Series: []Series{{Name: "hit rate", Points: c}}},
		},
	}
}

// Every series is drawn once, with one circle per finite point carrying
// its values, placed by the scales: x in order (evenly by ratio on a
// logarithmic axis), y inverted within its panel.
func TestWriteSVGSeries(t *testing.T) {
	for _, logX := range []bool{false, true} {
		f := sampleFigure(logX)
		var buf bytes.Buffer
		if err := f.WriteSVG(&buf); err != nil {
			t.Fatal(err)
		}
		svg := parseSVG(t, buf.Bytes())
		panels := svg.all(func(n *node) bool { return n.attr["class"] == "panel" })
		if len(panels) != len(f.Panels) {
			t.Fatalf("logX %v: %d panels drawn, want %d", logX, len(panels), len(f.Panels))
		}
		for pi, p := range f.Panels {
			if panels[pi].attr["data-ylabel"] != p.YLabel {
				t.Errorf("panel %d ylabel %q, want %q", pi, panels[pi].attr["data-ylabel"], p.YLabel)
			}
			for _, s := range p.Series {
				gs := panels[pi].all(func(n *node) bool { return n.attr["class"] == "series" && n.attr["data-name"] == s.Name })
				if len(gs) != 1 {
					t.Fatalf("series %q drawn %d times, want once", s.Name, len(gs))
				}
				var want []Point
				for _, pt := range s.Points {
					if finite(pt.Y) {
						want = append(want, pt)
					}
				}
				circles := gs[0].all(func(n *node) bool { return n.name == "circle" })
				if len(circles) != len(want) {
					t.Fatalf("series %q: %d points drawn, want %d", s.Name, len(circles), len(want))
				}
				lines := gs[0].all(func(n *node) bool { return n.name == "polyline" })
				if len(lines) != 1 || len(strings.Fields(lines[0].attr["points"])) != len(want) {
					t.Errorf("series %q: want one polyline through %d points", s.Name, len(want))
				}
				for i, c := range circles {
					if x, y := c.float(t, "data-x"), c.float(t, "data-y"); x != want[i].X || y != want[i].Y {
						t.Errorf("series %q point %d: data (%g, %g), want (%g, %g)", s.Name, i, x, y, want[i].X, want[i].Y)
					}
					if !strings.Contains(c.all(func(n *node) bool { return n.name == "title" })[0].text, s.Name) {
						t.Errorf("series %q point %d: tooltip lacks the name", s.Name, i)
					}
					for j := range i {
						cxi, cxj := c.float(t, "cx"), circles[j].float(t, "cx")
						if (want[i].X > want[j].X) != (cxi > cxj) {
							t.Errorf("series %q: x %g at cx %g, x %g at cx %g", s.Name, want[i].X, cxi, want[j].X, cxj)
						}
						cyi, cyj := c.float(t, "cy"), circles[j].float(t, "cy")
						if (want[i].Y > want[j].Y) != (cyi < cyj) {
							t.Errorf("series %q: y %g at cy %g, y %g at cy %g", s.Name, want[i].Y, cyi, want[j].Y, cyj)
						}
					}
				}
				if logX {
					// 5, 10 and 25, 50 and 50, 100 are each a doubling.
					cx := func(i int) float64 { return circles[i].float(t, "cx") }
					if len(want) == 5 && (math.Abs((cx(1)-cx(0))-(cx(4)-cx(3))) > 0.2 || math.Abs((cx(3)-cx(2))-(cx(4)-cx(3))) > 0.2) {
						t.Errorf("series %q: a doubling of x spans %g, %g and %g pixels", s.Name, cx(1)-cx(0), cx(3)-cx(2), cx(4)-cx(3))
					}
				}
			}
		}
		// The title's markup characters are escaped, not taken as markup.
		if texts := svg.all(func(n *node) bool { return n.name == "text" && n.text == f.Title }); len(texts) != 1 {
			t.Errorf("title %q not found as text", f.Title)
		}
	}
}

func TestWriteSVGErrors(t *testing.T) {
	f := sampleFigure(true)
	f.Panels[0].Series[0].Points[0].X = 0
	if err := f.WriteSVG(io.Discard); err == nil {
		t.Error("x = 0 on a logarithmic axis: no error")
	}
	if err := (&Figure{}).WriteSVG(io.Discard); err == nil {
		t.Error("a figure without panels: no error")
	}
	// A panel without finite points still draws (empty axes).
	var buf bytes.Buffer
	empty := &Figure{Panels: []Panel{{YLabel: "y", Series: []Series{{Name: "none", Points: []Point{{1, math.Inf(1)}}}}}}}
	if err := empty.WriteSVG(&buf); err != nil {
		t.Fatal(err)
	}
	parseSVG(t, buf.Bytes())
}

// The y ticks are round, evenly spaced and cover the data.
func TestNiceTicks(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 2000 {
		hi := math.Pow(10, 6*rng.Float64()-3) * rng.Float64()
		lo := 0.0
		if rng.IntN(4) == 0 {
			lo = -hi * rng.Float64()
		}
		tk := niceTicks(lo, hi)
		if len(tk) < 2 || len(tk) > 8 || tk[0] > lo || tk[len(tk)-1] < hi {
			t.Fatalf("niceTicks(%g, %g) = %v", lo, hi, tk)
		}
		step := tk[1] - tk[0]
		for i := 2; i < len(tk); i++ {
			if math.Abs(tk[i]-tk[i-1]-step) > 1e-9*math.Max(step, 1) {
				t.Fatalf("niceTicks(%g, %g) = %v: uneven", lo, hi, tk)
			}
		}
		m := step / math.Pow(10, math.Floor(math.Log10(step)+1e-12))
		if r := math.Round(m*10) / 10; r != 1 && r != 2 && r != 2.5 && r != 5 {
			t.Fatalf("niceTicks(%g, %g) = %v: step %g is not 1, 2, 2.5 or 5 times a power of ten", lo, hi, tk, step)
		}
	}
}
