package experts

// LookGate decides which of lookahead's predictions are fetched ahead: the
// host's pool reads them from disk (Stream.Prefetch), the GPU's copies
// them over the link. A prediction is the next layer's router applied to
// this layer's input (or, for the first layer, the Markov policy's
// estimate of the next token's choice); it comes best first, and the
// first ranks are right far more often than the last. So the gate keeps, per layer
// and per rank, the running share of would-be fetches (predictions not
// resident) that the layer's step then used, over about LookWindow
// predictions, whether or not they were fetched; a rank is fetched only
// while that share is at least the gate's least share. A wasted fetch
// costs a read (or a copy that holds up the misses queued behind it) and
// evicts a record that might have hit: for the host's reads, below one
// useful fetch in two (LookMinPrecision) it costs more than it hides. A
// rank that stops paying stops fetching and resumes once it would. The
// shares are rounded the same on every CPU; which predictions are would-be
// fetches depends on what is resident, which may depend on timing (reads
// in flight, the GPU's hybrid split), but the logits never depend on what
// was fetched ahead.
type LookGate struct {
	min   float32   // the least share for a rank to be fetched
	k     int       // ranks kept apart; later positions share the last
	prec  []float32 // [layer*k + rank] the running share of would-be fetches used
	layer int       // the layer pred is for, or -1
	pred  []int     // its would-be fetches (expert ids)
	rank  []int     // their ranks
	on    []int     // of them, those fetched (Predict's result)
	used  []int     // [rank] Score's scratch: would-be fetches used
	n     []int     // [rank] and would-be fetches
}

// Lookahead's gate for the host's reads: the least share of a rank's
// would-be fetches used for it to be read, and the predictions a share
// averages over, about.
const (
	LookMinPrecision = 0.5
	LookWindow       = 8
)

// LookAheadMinPrecision is the least share for predictions made two or
// more layers ahead (Options.LookDepth): such a guess, when right, is
// mostly one the next layer's prediction would also have made a layer
// later, so what it gains is the time of one layer, while a wrong one
// costs a whole read and holds its slot for longer. On the 40-layer
// qwen3.5-35b-a3b synth under a 22% pool (2.2 GB/s disk), with the second
// layer's gate at one half, depth 2 decoded slower than depth 1 in each
// of three alternating pairs (0.90-0.99x), reading 0.34 wasted records a
// useful one; at 0.6 and 0.7, faster in each of four rounds (means 4.30
// and 4.24 against 3.96 tok/s; 0.30 and 0.27 wasted a useful one).
const LookAheadMinPrecision = 0.7

// NewLookGate returns a gate for layers layers whose routers choose k
// experts (a prefill's union of rows ranks past k in the last rank), that
// fetches a rank while its share is at least least (LookMinPrecision for
// the host's reads).
func NewLookGate(layers, k int, least float32) *LookGate {
	k = max(k, 1)
	g := &LookGate{min: least, k: k, prec: make([]float32, layers*k), layer: -1, used: make([]int, k), n: make([]int, k)}
	for i := range g.prec {
		g.prec[i] = 1 // fetch until the predictions prove poor
	}
	return g
}

// Predict records layer's would-be fetches: those of ids (the router's
// choice, best first) that need reports true for; a negative id is a rank
// the caller needs nothing for. It returns those whose rank is fetched,
// in rank order, valid until the next call. Out-of-range layers record
// nothing.
func (g *LookGate) Predict(layer int, ids []int, need func(e int) bool) []int {
	g.layer, g.pred, g.rank, g.on = -1, g.pred[:0], g.rank[:0], g.on[:0]
	if layer < 0 || layer*g.k >= len(g.prec) {
		return g.on
	}
	g.layer = layer
	for i, e := range ids {
		if e < 0 || !need(e) {
			continue
		}
		r := min(i, g.k-1)
		g.pred, g.rank = append(g.pred, e), append(g.rank, r)
		if g.On(layer, r) {
			g.on = append(g.on, e)
		}
	}
	return g.on
}

// WouldFetch is how many fetches the last prediction would have made with
// every rank on: Predict's result less this is what the gate skipped.
func (g *LookGate) WouldFetch() int { return len(g.pred) }

// Score updates layer's shares with what its step uses, once the step
// begins (used reports whether it needs expert e), when the last
// prediction was for layer; a step of any other layer scores nothing. The
// prediction is spent either way.
func (g *LookGate) Score(layer int, used func(e int) bool) {
	if g.layer == layer {
		clear(g.used)
		clear(g.n)
		for i, e := range g.pred {
			g.n[g.rank[i]]++
			if used(e) {
				g.used[g.rank[i]]++
			}
		}
		// One step each rank: the last rank's share of a prefill's
		// union is the step's fraction used, as a decode's is.
		for r, n := range g.n {
			if n > 0 {
				p := &g.prec[layer*g.k+r]
				// Rounded before the add: arm64 would fuse it, and
				// which experts are fetched must not depend on the
				// CPU.
				*p += float32((float32(g.used[r])/float32(n) - *p) / LookWindow)
			}
		}
	}
	g.layer, g.pred, g.rank = -1, g.pred[:0], g.rank[:0]
}

// On reports whether layer's predictions of rank r are fetched.
func (g *LookGate) On(layer, r int) bool {
	return g.prec[layer*g.k+min(r, g.k-1)] >= g.min
}

// LayerOn reports whether any rank of layer's predictions is fetched.
func (g *LookGate) LayerOn(layer int) bool {
	if layer < 0 || layer*g.k >= len(g.prec) {
		return false
	}
	for r := range g.k {
		if g.On(layer, r) {
			return true
		}
	}
	return false
}

// Share is the running share of layer's would-be fetches of rank r used.
func (g *LookGate) Share(layer, r int) float32 { return g.prec[layer*g.k+min(r, g.k-1)] }
