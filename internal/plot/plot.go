// Package plot draws small line charts as self-contained SVG: panels stacked
// over one shared x axis, each with its own y axis and legend. The output
// needs no JavaScript and no external font (generic sans-serif), so that it
// renders the same on GitHub, in a browser or in an image viewer.
//
// Every drawn series is a <g class="series" data-name="..."> holding one
// <polyline> and a <circle> per point with data-x and data-y attributes
// (the unscaled values) and a <title> tooltip, so that tools and tests can
// read the figures back without reversing the scales.
package plot

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Point is one sample of a series.
type Point struct{ X, Y float64 }

// Series is a named line through its points, in the order given.
type Series struct {
	Name   string
	Points []Point
	// Dashed draws the line dashed, for bounds and predictions beside
	// measurements.
	Dashed bool
}

// Panel is one chart: its own y axis over the figure's x axis.
type Panel struct {
	YLabel string
	Series []Series
	// YFormat labels the y ticks; nil uses FormatNumber.
	YFormat func(float64) string
}

// Figure is panels stacked vertically over one x axis.
type Figure struct {
	Title string
	// Notes are small lines under the title (the machine, the command).
	Notes  []string
	XLabel string
	// XTicks are the x values labelled on the axis; empty: every distinct x
	// of the data.
	XTicks []float64
	// XFormat labels the x ticks; nil uses FormatNumber.
	XFormat func(float64) string
	// LogX spaces x logarithmically (every x must then be positive).
	LogX   bool
	Panels []Panel
	// Width and PanelHeight are in pixels; 0 takes 760 and 200.
	Width, PanelHeight int
}

// Colours of the series in a panel, in order (Okabe and Ito's palette,
// distinguishable with the common colour-vision deficiencies).
var colours = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9"}

const (
	marginLeft   = 78
	marginRight  = 24
	titleHeight  = 34
	noteHeight   = 16
	legendHeight = 26
	panelGap     = 22
	xAxisHeight  = 52
)

// WriteSVG draws the figure. Points whose x or y is not finite are left
// out (a series may lack a value at some x); an x that LogX cannot place is
// an error.
func (f *Figure) WriteSVG(w io.Writer) error {
	if len(f.Panels) == 0 {
		return fmt.Errorf("plot: a figure needs at least one panel")
	}
	width, ph := f.Width, f.PanelHeight
	if width <= 0 {
		width = 760
	}
	if ph <= 0 {
		ph = 200
	}
	xf := f.XFormat
	if xf == nil {
		xf = FormatNumber
	}
	// The x range over every panel's finite points.
	var xs []float64
	for _, p := range f.Panels {
		for _, s := range p.Series {
			for _, pt := range s.Points {
				if finite(pt.X) && finite(pt.Y) {
					if f.LogX && pt.X <= 0 {
						return fmt.Errorf("plot: series %q has x = %g, which a logarithmic axis cannot place", s.Name, pt.X)
					}
					xs = append(xs, pt.X)
				}
			}
		}
	}
	ticks := f.XTicks
	if len(ticks) == 0 {
		ticks = distinct(xs)
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, x := range append(append([]float64(nil), xs...), ticks...) {
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	if len(xs)+len(ticks) == 0 {
		lo, hi = 0, 1
	}
	for _, x := range ticks {
		if f.LogX && x <= 0 {
			return fmt.Errorf("plot: x tick %g on a logarithmic axis", x)
		}
	}
	plotW := float64(width - marginLeft - marginRight)
	tx := func(v float64) float64 { return v }
	if f.LogX {
		tx = math.Log
	}
	x0, x1 := tx(lo), tx(hi)
	if x1 == x0 {
		x0, x1 = x0-1, x1+1
	}
	// A little room at both ends so that the end points are not on the frame.
	pad := float64((x1 - x0) * 0.04) // float64(): no fused multiply-add, same pixels on every architecture
	x0, x1 = x0-pad, x1+pad
	sx := func(v float64) float64 { return marginLeft + float64((tx(v)-x0)/(x1-x0)*plotW) }

	top := titleHeight + noteHeight*len(f.Notes) + 6
	height := top + len(f.Panels)*(legendHeight+ph) + (len(f.Panels)-1)*panelGap + xAxisHeight

	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="16" font-weight="bold">%s</text>`+"\n", marginLeft, esc(f.Title))
	for i, n := range f.Notes {
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11" fill="#555">%s</text>`+"\n", marginLeft, titleHeight+noteHeight*i+8, esc(n))
	}
	y := top
	for pi, p := range f.Panels {
		bottom := pi == len(f.Panels)-1
		f.panel(&b, &p, y, ph, plotW, sx, ticks, xf, bottom)
		y += legendHeight + ph + panelGap
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", marginLeft+float64(plotW/2), height-12, esc(f.XLabel))
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

// panel draws one panel whose legend row starts at y.
func (f *Figure) panel(b *bytes.Buffer, p *Panel, y, ph int, plotW float64, sx func(float64) float64, ticks []float64, xf func(float64) string, bottom bool) {
	yf := p.YFormat
	if yf == nil {
		yf = FormatNumber
	}
	fmt.Fprintf(b, `<g class="panel" data-ylabel="%s">`+"\n", esc(p.YLabel))
	// Legend: a short line sample and the name of each series.
	lx := float64(marginLeft)
	for i, s := range p.Series {
		c := colours[i%len(colours)]
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="2.5"%s/>`, lx, y+12, lx+22, y+12, c, dash(s.Dashed))
		fmt.Fprintf(b, `<text x="%.1f" y="%d">%s</text>`+"\n", lx+28, y+16, esc(s.Name))
		lx += 28 + float64(7*len([]rune(s.Name))) + 24
	}
	py := float64(y + legendHeight)
	// The y range: from 0 (or below, for negative data) to a round number
	// above the largest value.
	ylo, yhi := 0.0, 0.0
	for _, s := range p.Series {
		for _, pt := range s.Points {
			if finite(pt.X) && finite(pt.Y) {
				ylo, yhi = math.Min(ylo, pt.Y), math.Max(yhi, pt.Y)
			}
		}
	}
	yt := niceTicks(ylo, yhi)
	ylo, yhi = yt[0], yt[len(yt)-1]
	sy := func(v float64) float64 { return py + float64(ph) - float64((v-ylo)/(yhi-ylo)*float64(ph)) }
	// Grid, ticks and frame.
	for _, v := range yt {
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e3e3e3"/>`, marginLeft, sy(v), marginLeft+plotW, sy(v))
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", marginLeft-6, sy(v)+4, esc(yf(v)))
	}
	for _, v := range ticks {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e3e3e3"/>`, sx(v), py, sx(v), py+float64(ph))
		if bottom {
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, sx(v), py+float64(ph)+17, esc(xf(v)))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(b, `<rect x="%d" y="%.1f" width="%.1f" height="%d" fill="none" stroke="#333"/>`+"\n", marginLeft, py, plotW, ph)
	fmt.Fprintf(b, `<text transform="translate(%d %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", 16, py+float64(float64(ph)/2), esc(p.YLabel))
	for i, s := range p.Series {
		c := colours[i%len(colours)]
		fmt.Fprintf(b, `<g class="series" data-name="%s">`+"\n", esc(s.Name))
		var pts []string
		for _, pt := range s.Points {
			if finite(pt.X) && finite(pt.Y) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", sx(pt.X), sy(pt.Y)))
			}
		}
		if len(pts) > 1 {
			fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), c, dash(s.Dashed))
		}
		for _, pt := range s.Points {
			if !finite(pt.X) || !finite(pt.Y) {
				continue
			}
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s" data-x="%s" data-y="%s"><title>%s: %s, %s</title></circle>`+"\n",
				sx(pt.X), sy(pt.Y), c, num(pt.X), num(pt.Y), esc(s.Name), esc(xf(pt.X)), esc(yf(pt.Y)))
		}
		b.WriteString("</g>\n")
	}
	b.WriteString("</g>\n")
}

// niceTicks returns 3 to about 7 round values (steps of 1, 2 or 5 times a
// power of ten) from at or below lo to at or above hi.
func niceTicks(lo, hi float64) []float64 {
	if hi <= lo {
		hi = lo + 1
	}
	raw := (hi - lo) / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	start := float64(math.Floor(lo/step+1e-9) * step)
	var t []float64
	for v := start; ; v += step {
		// Round away the accumulated error so that labels are exact.
		v = float64(math.Round(v/step) * step)
		t = append(t, v)
		if v >= hi-float64(1e-9*step) {
			break
		}
	}
	if len(t) < 2 {
		t = append(t, t[0]+step)
	}
	return t
}

// FormatNumber labels a value with at most three significant digits (whole
// numbers from 1000 up in full, without an exponent) and no trailing zeros.
func FormatNumber(v float64) string {
	if math.Abs(v) >= 1000 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

func num(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

func distinct(xs []float64) []float64 {
	var d []float64
	for _, x := range xs {
		seen := false
		for _, y := range d {
			seen = seen || y == x
		}
		if !seen {
			d = append(d, x)
		}
	}
	return d
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func dash(d bool) string {
	if d {
		return ` stroke-dasharray="6 4"`
	}
	return ""
}

func esc(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s))
	return b.String()
}
