package kernels

// DeltaRule runs one gated delta-rule step of one value head in place:
//
//	S = decay·S;  kv = Sᵀk;  kv = beta·(v − kv);  S += k⊗kv;  o = Sᵀq
//
// S is [dk][dv] row-major (dk = len(k) = len(q), dv = len(v) = len(o)); kv
// is scratch of dv floats. Each element's arithmetic depends only on its own
// head's inputs, so the result does not depend on batching or threads.
func DeltaRule(S, k, q, v, kv, o []float32, decay, beta float32) {
	DeltaRuleAhead(S, nil, k, q, v, kv, o, decay, beta)
}

// DeltaRuleAhead is DeltaRule that also brings next (the state the
// caller steps after this one, of S's size, or nil) into the cache while
// it computes, with the same results. The step reads S from memory a few
// lines a row in column blocks, then computes from the cache; without the
// next state on its way during that computation, a decode's delta rule
// moved its state at about half the memory's bandwidth.
func DeltaRuleAhead(S, next, k, q, v, kv, o []float32, decay, beta float32) {
	dk, dv := len(k), len(v)
	if useAVX2 && dv%8 == 0 && dk > 0 {
		_, _, _, _ = S[dk*dv-1], q[dk-1], kv[dv-1], o[dv-1]
		if dv%32 == 0 {
			// Each of the kernel's row steps prefetches one line: dv/32
			// blocks × 2 passes × dk rows cover dk·dv floats' lines.
			pf, step := &S[0], 0
			if len(next) >= dk*dv {
				pf, step = &next[0], 64
			}
			deltaRule32AVX2(&S[0], &k[0], &q[0], &v[0], &kv[0], &o[0], decay, beta, dk, dv, pf, step)
			return
		}
		deltaRuleAVX2(&S[0], &k[0], &q[0], &v[0], &kv[0], &o[0], decay, beta, dk, dv)
		return
	}
	deltaRuleGo(S, k, q, v, kv, o, decay, beta)
}

// deltaRuleGo is DeltaRule's pure-Go twin and canonical definition: the
// decay is a rounded product, and every update of kv, S and o a fused
// multiply-add (fma32) in row order a = 0..dk-1.
func deltaRuleGo(S, k, q, v, kv, o []float32, decay, beta float32) {
	dk, dv := len(k), len(v)
	kv = kv[:dv]
	o = o[:dv]
	clear(kv)
	for a := 0; a < dk; a++ {
		row := S[a*dv : (a+1)*dv]
		ka := k[a]
		for j := range row {
			row[j] *= decay
			kv[j] = fma32(row[j], ka, kv[j])
		}
	}
	for j := range kv {
		kv[j] = (v[j] - kv[j]) * beta
	}
	clear(o)
	for a := 0; a < dk; a++ {
		row := S[a*dv : (a+1)*dv]
		ka, qa := k[a], q[a]
		for j := range row {
			row[j] = fma32(ka, kv[j], row[j])
			o[j] = fma32(row[j], qa, o[j])
		}
	}
}
