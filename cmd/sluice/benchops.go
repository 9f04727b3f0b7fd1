package main

import (
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/sluicelm/sluice/internal/block"
)

// opsSummary is where the timed trials' decode steps went, by operation
// (bench --ops): every trial's times summed, over every trial's steps.
type opsSummary struct {
	// Ops lists the operations that ran, the longest first.
	Ops []opFigure `json:"ops"`
	// MSPerToken is the decode's wall time a token; OpsShare the share of
	// it the operations took (the rest: sampling, the embedding, the
	// MTP head, the engine's bookkeeping).
	MSPerToken float64 `json:"decode_ms_per_token"`
	OpsShare   float64 `json:"ops_share"`
}

// opFigure is one operation's time and calls a token.
type opFigure struct {
	Op            string  `json:"op"`
	MSPerToken    float64 `json:"ms_per_token"`
	CallsPerToken float64 `json:"calls_per_token"`
	Share         float64 `json:"share"` // of the decode's wall time
}

// summariseOps adds up the trials' operation times (runTrial with ops).
func summariseOps(trials []benchTrial) *opsSummary {
	var sum block.OpTimes
	var wall time.Duration
	steps := 0
	for _, t := range trials {
		if t.ops == nil {
			continue
		}
		for o := range block.NumOps {
			sum.Time[o] += t.ops.Time[o]
			sum.Calls[o] += t.ops.Calls[o]
		}
		wall += t.wall
		steps += max(t.stats.GeneratedTokens-1, 1)
	}
	s := &opsSummary{}
	if steps == 0 || wall <= 0 {
		return s
	}
	ms := func(d time.Duration) float64 { return d.Seconds() * 1e3 / float64(steps) }
	for o := range block.NumOps {
		if sum.Calls[o] == 0 {
			continue
		}
		s.Ops = append(s.Ops, opFigure{Op: o.String(), MSPerToken: ms(sum.Time[o]),
			CallsPerToken: float64(sum.Calls[o]) / float64(steps), Share: sum.Time[o].Seconds() / wall.Seconds()})
	}
	slices.SortStableFunc(s.Ops, func(a, b opFigure) int {
		switch {
		case a.MSPerToken > b.MSPerToken:
			return -1
		case a.MSPerToken < b.MSPerToken:
			return 1
		}
		return 0
	})
	s.MSPerToken = ms(wall)
	s.OpsShare = sum.Total().Seconds() / wall.Seconds()
	return s
}

// print writes the table of bench's text output.
func (s *opsSummary) print(w io.Writer) {
	fmt.Fprintf(w, "decode by operation, a token (%.2f ms in all):\n", s.MSPerToken)
	fmt.Fprintf(w, "  %-14s %9s %7s %8s\n", "op", "ms", "share", "calls")
	for _, f := range s.Ops {
		fmt.Fprintf(w, "  %-14s %9.3f %6.1f%% %8.1f\n", f.Op, f.MSPerToken, 100*f.Share, f.CallsPerToken)
	}
	fmt.Fprintf(w, "  %-14s %9.3f %6.1f%%\n", "other", s.MSPerToken*(1-s.OpsShare), 100*(1-s.OpsShare))
}
