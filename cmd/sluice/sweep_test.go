package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicelm/sluice/internal/testutil"
)

// sweepJSON is the part of sweep --json that the tests read.
type sweepJSON struct {
	Records       int     `json:"records"`
	DiskMBs       float64 `json:"disk_mb_s"`
	DiskSource    string  `json:"disk_source"`
	ComputeMSTok  float64 `json:"compute_ms_per_token"`
	ComputeSource string  `json:"compute_source"`
	Interrupted   bool    `json:"interrupted"`
	SVG           string  `json:"svg"`
	Pools         []struct {
		Arg        string  `json:"pool"`
		Percent    float64 `json:"pool_percent"`
		Slots      int     `json:"pool_slots"`
		DecodeTokS float64 `json:"decode_tok_s"`
		HitRate    float64 `json:"hit_rate"`
		MBPerToken float64 `json:"mb_per_token"`
		LimitTokS  float64 `json:"limit_tok_s"`
		SerialTokS float64 `json:"serial_tok_s"`
		Bound      string  `json:"bound"`
		Experts    struct {
			MSPerToken float64 `json:"decode_ms_per_token"`
		} `json:"experts"`
	} `json:"pools"`
}

// svgSeries reads sweep's SVG back: for each series name, the (x, y) of
// its points.
func svgSeries(t *testing.T, path string) map[string][][2]float64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(bytes.NewReader(b))
	out := map[string][][2]float64{}
	var series string
	depth, seriesDepth := 0, -1
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s is not well-formed XML: %v", path, err)
		}
		switch tk := tok.(type) {
		case xml.StartElement:
			depth++
			attr := map[string]string{}
			for _, a := range tk.Attr {
				attr[a.Name.Local] = a.Value
			}
			if depth == 1 && tk.Name.Local != "svg" {
				t.Fatalf("%s: root element <%s>, want <svg>", path, tk.Name.Local)
			}
			if attr["class"] == "series" {
				series, seriesDepth = attr["data-name"], depth
				out[series] = [][2]float64{}
			}
			if tk.Name.Local == "circle" && seriesDepth > 0 {
				x, err1 := strconv.ParseFloat(attr["data-x"], 64)
				y, err2 := strconv.ParseFloat(attr["data-y"], 64)
				if err1 != nil || err2 != nil {
					t.Fatalf("%s: circle of %q without numeric data-x/data-y: %v", path, series, attr)
				}
				out[series] = append(out[series], [2]float64{x, y})
			}
		case xml.EndElement:
			if depth == seriesDepth {
				seriesDepth = -1
			}
			depth--
		}
	}
	return out
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b)) }

// topK is the shared tiny Qwen3 model's experts per token, from its config.
func topK(t *testing.T) int {
	var c struct {
		TopK int `json:"num_experts_per_tok"`
	}
	b, err := os.ReadFile(filepath.Join(testutil.ModelDir(t, "tiny-qwen3-moe"), "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &c); err != nil || c.TopK < 1 {
		t.Fatalf("config.json: top-k %d, %v", c.TopK, err)
	}
	return c.TopK
}

func TestSweep(t *testing.T) {
	dir := testutil.Packed(t, "tiny-qwen3-moe", 4)
	tmp := t.TempDir()
	svg := filepath.Join(tmp, "s.svg")
	// LRU without lookahead is a stack policy: a larger pool holds what a
	// smaller one holds, so its hit rate cannot be lower on the same
	// (greedy, deterministic) requests.
	common := []string{"sweep", "-m", dir, "--prompt", "16", "--gen", "8", "--repeat", "1", "--threads", "2", "--evict", "lru", "--lookahead=false"}
	pools := []float64{10, 100, 60}
	var list []string
	for _, p := range pools {
		list = append(list, fmt.Sprint(p))
	}
	const disk = 1.0 // MB/s: slow enough that a pool that misses is disk-bound
	out, _ := ok(t, append(slices.Clone(common), "--pools", strings.Join(list, ","), "--json", "--svg", svg, "--disk-mbs", fmt.Sprint(disk))...)
	var r sweepJSON
	decode(t, out, &r)
	if len(r.Pools) != len(pools) || r.SVG != svg || r.DiskMBs != disk || r.DiskSource != "--disk-mbs" || r.Interrupted {
		t.Fatalf("sweep --json: %s", out)
	}
	want := slices.Clone(pools)
	slices.Sort(want)
	slices.Reverse(want) // largest first
	for i, p := range r.Pools {
		slots := int(want[i] / 100 * float64(r.Records))
		if p.Slots != slots || !near(p.Percent, 100*float64(slots)/float64(r.Records)) {
			t.Errorf("pool %d: %d slots (%g%%), want %d of %d records (the %g%% asked for)", i, p.Slots, p.Percent, slots, r.Records, want[i])
		}
		if !(p.DecodeTokS > 0) || p.HitRate < 0 || p.HitRate > 1 || p.MBPerToken < 0 {
			t.Errorf("pool %s: %+v", p.Arg, p)
		}
		if i > 0 && p.HitRate > r.Pools[i-1].HitRate {
			t.Errorf("pool %s hits %.4f, more than the larger pool %s (%.4f)", p.Arg, p.HitRate, r.Pools[i-1].Arg, r.Pools[i-1].HitRate)
		}
		// The limit, from the figures the JSON gives.
		diskMS := p.MBPerToken / disk * 1e3
		bound := "compute"
		if diskMS > r.ComputeMSTok {
			bound = "disk"
		}
		if !near(p.LimitTokS, 1e3/math.Max(r.ComputeMSTok, diskMS)) || !near(p.SerialTokS, 1e3/(r.ComputeMSTok+diskMS)) || p.Bound != bound {
			t.Errorf("pool %s: limit %g, serial %g, bound %s; want %g, %g, %s from compute %g ms and %g MB/token",
				p.Arg, p.LimitTokS, p.SerialTokS, p.Bound, 1e3/math.Max(r.ComputeMSTok, diskMS), 1e3/(r.ComputeMSTok+diskMS), bound, r.ComputeMSTok, p.MBPerToken)
		}
	}
	// The full pool, warmed by the identical warm-up trial, misses nothing,
	// and its decode time is the limit's compute term.
	full := r.Pools[0]
	if full.Slots != r.Records || full.HitRate != 1 || full.MBPerToken != 0 {
		t.Errorf("full pool: %d of %d slots, hit rate %g, %g MB/token", full.Slots, r.Records, full.HitRate, full.MBPerToken)
	}
	if r.ComputeSource != "full-residency decode" || r.ComputeMSTok != full.Experts.MSPerToken {
		t.Errorf("compute %g ms/token from %q; want the full pool's %g", r.ComputeMSTok, r.ComputeSource, full.Experts.MSPerToken)
	}

	// The plot: one point per pool in each series, at the pool's share and
	// the JSON's values.
	got := svgSeries(t, svg)
	for name, y := range map[string]func(i int) float64{
		"decode tok/s (measured)":        func(i int) float64 { return r.Pools[i].DecodeTokS },
		"physical limit":                 func(i int) float64 { return r.Pools[i].LimitTokS },
		"no overlap: 1000 / (C + reads)": func(i int) float64 { return r.Pools[i].SerialTokS },
		"pool hit rate":                  func(i int) float64 { return 100 * r.Pools[i].HitRate },
		"MB read from disk per token":    func(i int) float64 { return r.Pools[i].MBPerToken },
	} {
		pts, ok := got[name]
		if !ok || len(pts) != len(r.Pools) {
			t.Errorf("SVG series %q: %d points, want %d", name, len(pts), len(r.Pools))
			continue
		}
		for i := range r.Pools {
			j := len(r.Pools) - 1 - i // the plot runs from the smallest pool
			if pts[j][0] != r.Pools[i].Percent || !near(pts[j][1], y(i)) {
				t.Errorf("SVG series %q point %d: (%g, %g), want (%g, %g)", name, j, pts[j][0], pts[j][1], r.Pools[i].Percent, y(i))
			}
		}
	}

	// The table, with the disk measured and no full pool (the compute term
	// then comes from the memory's bandwidth), over two alternating rounds:
	// one row per pool, one progress line per pool and round.
	out, e := ok(t, append(slices.Clone(common), "--pools", "50,20%", "--rounds", "2", "--svg", filepath.Join(tmp, "t.svg"))...)
	var rows []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 9 && strings.HasSuffix(f[5], "%") {
			rows = append(rows, f[0])
		}
	}
	if len(rows) != 2 || !strings.Contains(out, "memory bandwidth") || !strings.Contains(out, "(measured)") {
		t.Errorf("table: pool rows %v, want 2; output:\n%s", rows, out)
	}
	for i := 1; i <= 4; i++ {
		if strings.Count(e, fmt.Sprintf("[%d/4]", i)) != 1 || strings.Count(e, "round ") != 4 {
			t.Errorf("progress: want one line per pool and round on stderr:\n%s", e)
			break
		}
	}
	if pts := svgSeries(t, filepath.Join(tmp, "t.svg"))["physical limit"]; len(pts) != 2 {
		t.Errorf("second SVG: %d limit points, want 2", len(pts))
	}
}

// TestSweepCompareLookahead: --compare-lookahead runs every pool twice,
// with the lookahead on and off, and reports and plots both: the off run's
// figures under without_lookahead, from a run whose lookahead saw no step,
// and its limit from its own reads.
func TestSweepCompareLookahead(t *testing.T) {
	dir := testutil.Packed(t, "tiny-qwen3-moe", 4)
	svg := filepath.Join(t.TempDir(), "c.svg")
	const disk = 1.0
	out, e := ok(t, "sweep", "-m", dir, "--prompt", "16", "--gen", "8", "--repeat", "1", "--threads", "2", "--pools", "10,100",
		"--rounds", "2", "--compare-lookahead", "--json", "--svg", svg, "--disk-mbs", fmt.Sprint(disk))
	type row struct {
		Slots      int     `json:"pool_slots"`
		DecodeTokS float64 `json:"decode_tok_s"`
		HitRate    float64 `json:"hit_rate"`
		MBPerToken float64 `json:"mb_per_token"`
		LimitTokS  float64 `json:"limit_tok_s"`
		Rounds     int     `json:"rounds"`
		Experts    struct {
			LookSteps int64 `json:"lookahead_steps"`
		} `json:"experts"`
	}
	var r struct {
		Compare      bool    `json:"compare_lookahead"`
		ComputeMSTok float64 `json:"compute_ms_per_token"`
		Pools        []struct {
			row
			Off *row `json:"without_lookahead"`
		} `json:"pools"`
	}
	decode(t, out, &r)
	if !r.Compare || len(r.Pools) != 2 {
		t.Fatalf("sweep --compare-lookahead --json: %s", out)
	}
	for i, p := range r.Pools {
		o := p.Off
		if o == nil {
			t.Fatalf("pool %d: no without_lookahead in %s", i, out)
		}
		if o.Slots != p.Slots || !(o.DecodeTokS > 0) || o.Rounds != 2 || p.Rounds != 2 || o.HitRate < 0 || o.HitRate > 1 {
			t.Errorf("pool %d: on %+v, off %+v", i, p.row, *o)
		}
		if o.Experts.LookSteps != 0 {
			t.Errorf("pool %d: the lookahead-off run's lookahead saw %d steps", i, o.Experts.LookSteps)
		}
		if want := 1e3 / math.Max(r.ComputeMSTok, o.MBPerToken/disk*1e3); !near(o.LimitTokS, want) {
			t.Errorf("pool %d: the off run's limit %g, want %g from its %g MB/token", i, o.LimitTokS, want, o.MBPerToken)
		}
	}
	if small := r.Pools[1]; small.Experts.LookSteps == 0 {
		t.Errorf("the 10%% pool's lookahead-on run: its lookahead saw no step")
	}
	// Two settings × two pools × two rounds, each announced once.
	if strings.Count(e, "lookahead on,") != 4 || strings.Count(e, "lookahead off,") != 4 || strings.Count(e, "[8/8]") != 1 {
		t.Errorf("progress lines:\n%s", e)
	}
	got := svgSeries(t, svg)
	for name, y := range map[string]func(i int) float64{
		"decode tok/s (measured)":                    func(i int) float64 { return r.Pools[i].DecodeTokS },
		"decode tok/s, lookahead off":                func(i int) float64 { return r.Pools[i].Off.DecodeTokS },
		"pool hit rate, lookahead off":               func(i int) float64 { return 100 * r.Pools[i].Off.HitRate },
		"MB read from disk per token, lookahead off": func(i int) float64 { return r.Pools[i].Off.MBPerToken },
	} {
		pts := got[name]
		if len(pts) != 2 {
			t.Errorf("SVG series %q: %d points, want 2", name, len(pts))
			continue
		}
		for i := range r.Pools {
			if j := 1 - i; !near(pts[j][1], y(i)) {
				t.Errorf("SVG series %q point %d: %g, want %g", name, j, pts[j][1], y(i))
			}
		}
	}
	// The table puts the off run beside.
	out, _ = ok(t, "sweep", "-m", dir, "--prompt", "16", "--gen", "8", "--repeat", "1", "--threads", "2", "--pools", "10",
		"--compare-lookahead", "--svg", "", "--disk-mbs", "1")
	if !strings.Contains(out, "on ÷ off") || !strings.Contains(out, "--lookahead=false") {
		t.Errorf("table:\n%s", out)
	}
}

func TestSweepErrors(t *testing.T) {
	dir := testutil.Packed(t, "tiny-qwen3-moe", 4)
	k := topK(t)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"not a number", []string{"--pools", "10,abc"}, `"abc"`},
		{"empty entry", []string{"--pools", "10,,20"}, "empty"},
		{"zero", []string{"--pools", "0"}, "(0,100]"},
		{"over 100", []string{"--pools", "150"}, "(0,100]"},
		{"negative size", []string{"--pools", "-3MiB"}, "positive"},
		{"below the minimum", []string{"--pools", "50,0.5"}, fmt.Sprintf("at least %d", k)},
		{"size below the minimum", []string{"--pools", "0.01MiB"}, fmt.Sprintf("at least %d", k)},
		{"pool-mb", []string{"--pool-mb", "10%"}, "--pools"},
		{"host-cache-mb", []string{"--host-cache-mb", "10%"}, "not --pool-mb, --host-cache-mb"},
		{"gen 1", []string{"--gen", "1"}, "--gen"},
		{"rounds 0", []string{"--rounds", "0"}, "--rounds"},
		{"disk-mbs negative", []string{"--disk-mbs", "-5"}, "--disk-mbs"},
		{"compare without lookahead", []string{"--compare-lookahead", "--lookahead=false"}, "--compare-lookahead"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"sweep", "-m", dir, "--svg", ""}, c.args...)
			_, e, code := sluice(t, args...)
			if code == 0 || !strings.Contains(e, c.want) {
				t.Errorf("sluice %v: exit %d, stderr %q; want a message containing %q", args, code, e, c.want)
			}
		})
	}
	missing := filepath.Join(t.TempDir(), "missing")
	if _, e, code := sluice(t, "sweep", "-m", missing, "--svg", ""); code == 0 || !strings.Contains(e, missing) {
		t.Errorf("missing model: exit %d, stderr %q", code, e)
	}
}

// Ctrl-C between or during pools stops the sweep with status 130 after
// printing and plotting the pools that finished.
func TestSweepInterrupt(t *testing.T) {
	dir := testutil.Packed(t, "tiny-qwen3-moe", 4)
	svg := filepath.Join(t.TempDir(), "i.svg")
	cmd := exec.Command(bin, "sweep", "-m", dir, "--pools", "100,80,60,40,20", "--prompt", "8", "--gen", "1500", "--repeat", "1",
		"--threads", "2", "--disk-mbs", "100", "--json", "--svg", svg)
	cmd.Env = append(os.Environ(), "SLUICE_CACHE="+cache)
	var o bytes.Buffer
	cmd.Stdout = &o
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var e strings.Builder
	sc := bufio.NewScanner(errPipe)
	signalled := false
	for sc.Scan() {
		e.WriteString(sc.Text() + "\n")
		if !signalled && strings.Contains(sc.Text(), "[1/5]") {
			if err := cmd.Process.Signal(os.Interrupt); err != nil {
				t.Fatal(err)
			}
			signalled = true
		}
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatal("sweep did not stop within 60 s of SIGINT")
	}
	if !signalled {
		t.Fatalf("no progress line for the first pool:\n%s", e.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 130 || !strings.Contains(e.String(), "interrupted") {
		t.Fatalf("after SIGINT: exit %d, stderr %q; want 130 and 'interrupted'", code, e.String())
	}
	var r sweepJSON
	decode(t, o.String(), &r)
	if !r.Interrupted || len(r.Pools) < 1 || len(r.Pools) >= 5 {
		t.Errorf("interrupted sweep: interrupted %v with %d pools, want true with 1 to 4", r.Interrupted, len(r.Pools))
	}
	if want := fmt.Sprintf("interrupted after %d of 5 pool runs", len(r.Pools)); !strings.Contains(e.String(), want) {
		t.Errorf("stderr %q; want %q", e.String(), want)
	}
	if pts := svgSeries(t, svg)["decode tok/s (measured)"]; len(pts) != len(r.Pools) {
		t.Errorf("SVG after the interrupt: %d points, want %d", len(pts), len(r.Pools))
	}
}

// parsePools and resolvePools size pools as the engine will, and refuse
// those it cannot run.
func TestParsePools(t *testing.T) {
	ps, err := parsePools(" 5, 25% ,300MiB,2GiB,1.5M")
	if err != nil {
		t.Fatal(err)
	}
	type pm struct{ pct, mib float64 }
	var got []pm
	for _, p := range ps {
		got = append(got, pm{p.percent, p.mib})
	}
	if want := []pm{{5, 0}, {25, 0}, {0, 300}, {0, 2048}, {0, 1.5}}; !slices.Equal(got, want) {
		t.Errorf("parsed %v, want %v", got, want)
	}
	for _, bad := range []string{"", "x", "10,", "101", "0%", "NaN", "Inf", "-1", "0MiB", "5MiB%"} {
		if _, err := parsePools(bad); err == nil {
			t.Errorf("parsePools(%q): no error", bad)
		}
	}
	// 384 records of 1 MiB, top-4: the engine truncates share × records.
	const records, minSlots, stride = 384, 4, 1 << 20
	for _, c := range []struct {
		arg   string
		slots int
	}{{"10", 38}, {"100", 384}, {"50", 192}, {"7MiB", 7}, {"9999MiB", 384}, {"4MiB", 4}} {
		ps, _ := parsePools(c.arg)
		if err := resolvePools(ps, records, minSlots, stride); err != nil || ps[0].slots != c.slots {
			t.Errorf("%s: %d slots (%v), want %d", c.arg, ps[0].slots, err, c.slots)
		}
	}
	// The minimum the error gives is itself accepted, and just below it is not.
	ps, _ = parsePools("1")
	err = resolvePools(ps, records, minSlots, stride)
	if err == nil {
		t.Fatal("1% of 384 records (3 < top-4): no error")
	}
	var minPct float64
	if _, e := fmt.Sscanf(err.Error()[strings.Index(err.Error(), "): ")+3:], "%g%%", &minPct); e != nil {
		t.Fatalf("no minimum percentage in %q: %v", err, e)
	}
	atMin, _ := parsePools(fmt.Sprint(minPct))
	if err := resolvePools(atMin, records, minSlots, stride); err != nil {
		t.Errorf("the minimum %g%% the error names is refused: %v", minPct, err)
	}
	below, _ := parsePools(fmt.Sprint(minPct - 0.01))
	if err := resolvePools(below, records, minSlots, stride); err == nil {
		t.Errorf("%g%%, below the minimum %g%%, accepted", minPct-0.01, minPct)
	}
	if ps, _ := parsePools("3MiB"); resolvePools(ps, records, minSlots, stride) == nil {
		t.Error("3 MiB (3 records < top-4): no error")
	}
}
