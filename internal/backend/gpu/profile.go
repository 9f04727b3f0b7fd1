//go:build linux

package gpu

import (
	"fmt"
	"sort"
	"strings"

	"github.com/sluicelm/sluice/internal/cuda"
)

// profile times the phases of each step with CUDA events: an event is
// recorded on the stream where a phase begins, and after the step the
// time between consecutive events is added to the phase's total. It
// serialises nothing but costs one event record per op, so it is off
// unless asked for. A replayed step is one phase, "graph"; with graphs
// off (SetGraphs) each op is timed, including the gaps in which the
// device waits for the host's next launch.
type profile struct {
	ev    []cuda.Event
	names []string
	n     int
	total map[string]float64 // ms per phase
	steps int
}

// EnableProfile starts timing the phases of every step (at most maxMarks
// ops a step); Profile reports the totals.
func (r *Runner) EnableProfile(maxMarks int) error {
	p := &profile{ev: make([]cuda.Event, maxMarks), names: make([]string, maxMarks), total: map[string]float64{}}
	err := r.Dev.Do(func() error {
		for i := range p.ev {
			var err error
			if p.ev[i], err = r.Dev.NewEvent(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	r.prof = p
	return nil
}

// ResetProfile clears the totals.
func (r *Runner) ResetProfile() {
	if r.prof != nil {
		r.prof.total = map[string]float64{}
		r.prof.steps = 0
	}
}

// mark begins phase name ("" ends the step).
func (r *Runner) mark(name string) {
	p := r.prof
	if p == nil || p.n >= len(p.ev) || r.graphing {
		return // a step being recorded is timed as one replay
	}
	r.check(r.Dev.Record(p.ev[p.n], r.s))
	p.names[p.n] = name
	p.n++
}

// collect adds the finished step's phase times (after the stream synced).
func (p *profile) collect(r *Runner) {
	if p == nil {
		return
	}
	for i := 0; i+1 < p.n; i++ {
		ms, err := r.Dev.Elapsed(p.ev[i], p.ev[i+1])
		if err == nil {
			p.total[p.names[i]] += float64(ms)
		}
	}
	p.n = 0
	p.steps++
}

// Profile returns the phase totals per step, largest first, one
// "phase ms-per-step share" line each.
func (r *Runner) Profile() string {
	p := r.prof
	if p == nil || p.steps == 0 {
		return ""
	}
	type kv struct {
		k string
		v float64
	}
	var all []kv
	var sum float64
	for k, v := range p.total {
		all = append(all, kv{k, v})
		sum += v
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v })
	var b strings.Builder
	fmt.Fprintf(&b, "phase profile over %d steps: %.3f ms per step on the device\n", p.steps, sum/float64(p.steps))
	for _, e := range all {
		fmt.Fprintf(&b, "  %-12s %8.4f ms %5.1f%%\n", e.k, e.v/float64(p.steps), 100*e.v/sum)
	}
	return b.String()
}
