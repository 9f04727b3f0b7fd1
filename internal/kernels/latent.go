package kernels

import "math"

// AttendLatent computes one head's attention over a latent cache (MLA,
// absorbed): s_j = scale·(q·k_j) over full rows of kc, and o = Σ_j p_j ·
// k_j[:len(o)] (the values are the keys' prefix). It visits the rows at
// positions sel in order, or rows 0..n-1 when sel is nil; s is scratch of
// at least n floats. Every sum runs in position order, so the result does
// not depend on batching.
func AttendLatent(o, q, kc []float32, stride int, sel []int, n int, scale float32, s []float32) {
	w := len(q)
	if sel != nil {
		n = len(sel)
	}
	s = s[:n]
	row := func(j int) int {
		if sel != nil {
			return sel[j] * stride
		}
		return j * stride
	}
	// Every position in order: the scores four keys at a time and the
	// values each output's chain in registers (scoresAVX2, mixAVX2: the
	// bits of Dot·scale and of the Axpy chain from +0); selected
	// positions one by one.
	contiguous := sel == nil && useAVX2 && n > 0
	if contiguous && w%32 == 0 {
		_ = kc[(n-1)*stride+w-1]
		scoresAVX2(&q[0], &kc[0], 4*stride, n, w, scale, &s[0])
	} else {
		for j := range s {
			at := row(j)
			s[j] = Dot(q, kc[at:at+w]) * scale
		}
	}
	sum := expSum(s)
	if contiguous && len(o)%32 == 0 {
		_ = kc[(n-1)*stride+len(o)-1]
		mixAVX2(&o[0], &kc[0], 4*stride, n, len(o), &s[0])
	} else {
		clear(o)
		for j, p := range s {
			at := row(j)
			Axpy(o, p, kc[at:at+len(o)])
		}
	}
	Scale(o, 1/sum)
}

// LayerNorm writes (x − mean)/sqrt(var + eps)·w + b into dst (dst may
// alias x), with the mean and the biased variance summed in order in
// float32, as torch's LayerNorm computes them.
func LayerNorm(dst, x, w, b []float32, eps float32) {
	n := float32(len(x))
	var mean float32
	for _, v := range x {
		mean += v
	}
	mean /= n
	var vr float32
	for _, v := range x {
		d := v - mean
		vr += float32(d * d) // products rounded: Go would fuse them on arm64
	}
	vr /= n
	inv := float32(1 / math.Sqrt(float64(vr+eps)))
	for i, v := range x {
		dst[i] = float32((v-mean)*inv*w[i]) + b[i]
	}
}

// expSum replaces the scores s by their exponentials less the largest,
// returning their sum, in position order (the latent attention's softmax).
func expSum(s []float32) float32 {
	mx := Max(s)
	var sum float32
	for j := range s {
		e := Exp(s[j] - mx)
		s[j] = e
		sum += e
	}
	return sum
}

// latentBlock is the positions AttendLatentHeads takes at a time: 64
// latents of DeepSeek's 576 floats are 147 KB, which stay in a core's L2
// while every head of the group reads them.
const latentBlock = 64

// AttendLatentHeads is AttendLatent over every position for a group of
// heads of one row: head g's query at q[g·qStride:], its output at
// o[g·oStride:] (dv floats, the values' width), a block of positions at
// a time for all the heads, so that each latent is read from memory once
// a group rather than once a head. Each
// head's bits are AttendLatent's: the scores are the same dots, the sum
// the same chain, each output element the same fused chain continued
// from block to block. s is scratch of heads·n floats; sums of heads.
func AttendLatentHeads(o, q []float32, heads, qStride, oStride, dv int, kc []float32, stride, n int, scale float32, s, sums []float32) {
	w := qStride
	if !useAVX2 || n == 0 || w%32 != 0 || dv%32 != 0 {
		for g := 0; g < heads; g++ {
			AttendLatent(o[g*oStride:g*oStride+dv], q[g*qStride:g*qStride+w], kc, stride, nil, n, scale, s[:n])
		}
		return
	}
	_ = kc[(n-1)*stride+w-1]
	_ = q[(heads-1)*qStride+w-1] // the assembly reads what Go's checks see here
	_ = o[(heads-1)*oStride+dv-1]
	s = s[:heads*n]
	// The scores three heads a pass (each key loaded once for the three).
	for b0 := 0; b0 < n; b0 += latentBlock {
		b := min(latentBlock, n-b0)
		g := 0
		for ; g+3 <= heads; g += 3 {
			scores3AVX2(&q[g*qStride], 4*qStride, &kc[b0*stride], 4*stride, b, w, scale, &s[g*n+b0], 4*n)
		}
		for ; g < heads; g++ {
			scoresAVX2(&q[g*qStride], &kc[b0*stride], 4*stride, b, w, scale, &s[g*n+b0])
		}
	}
	for g := 0; g < heads; g++ {
		sums[g] = expSum(s[g*n : (g+1)*n])
	}
	// The values two heads a pass (eight chains in flight, each row
	// loaded once for both), each chain from +0.
	for g := 0; g < heads; g++ {
		clear(o[g*oStride : g*oStride+dv])
	}
	for b0 := 0; b0 < n; b0 += latentBlock {
		b := min(latentBlock, n-b0)
		g := 0
		for ; g+1 < heads; g += 2 {
			mixAcc2AVX2(&o[g*oStride], &o[(g+1)*oStride], &kc[b0*stride], 4*stride, b, dv, &s[g*n+b0], &s[(g+1)*n+b0])
		}
		if g < heads {
			mixAccAVX2(&o[g*oStride], &kc[b0*stride], 4*stride, b, dv, &s[g*n+b0])
		}
	}
	for g := 0; g < heads; g++ {
		Scale(o[g*oStride:g*oStride+dv], 1/sums[g])
	}
}

// mixAccGo is mixAccAVX2's twin: o[d] continues its fused chain over the
// n value rows (stride floats apart) in order.
func mixAccGo(o, v []float32, stride, n int, p []float32) {
	for j := 0; j < n; j++ {
		row := v[j*stride : j*stride+len(o)]
		for d := range o {
			o[d] = fma32(p[j], row[d], o[d])
		}
	}
}

// IndexScores writes the sparse-attention indexer's scores of n keys for
// one row: sc[t] = Σ_h float32(ws[h]·relu(Dot(q_h, k_t)·scale)), heads in
// order, where q is [heads][dim], k is [n][dim] and ws[h] is head h's
// weight (DeepSeek-V3.2's weights_proj output times heads^-½). Each
// product is rounded before its sum, so every CPU gives the same bits.
// The dots run a block of keys at a time, three heads a pass over each
// pair of keys (scores3AVX2: each score Dot·scale's bits), so the result
// is that of the formula taken a key and a head at a time; d is scratch
// (at least heads floats; a block is len(d)/heads keys, at most 64).
func IndexScores(sc, q []float32, heads, dim int, k []float32, n int, scale float32, ws, d []float32) {
	blk := min(len(d)/max(heads, 1), latentBlock)
	if !useAVX2 || dim%16 != 0 || blk == 0 || n == 0 || heads == 0 {
		for t := 0; t < n; t++ {
			kt := k[t*dim : (t+1)*dim]
			var v float32
			for h := 0; h < heads; h++ {
				x := Dot(q[h*dim:(h+1)*dim], kt) * scale
				v += float32(ws[h] * max(x, 0))
			}
			sc[t] = v
		}
		return
	}
	_ = k[n*dim-1]
	_ = q[heads*dim-1] // the assembly reads what Go's checks see here
	_ = d[heads*blk-1]
	ws, sc = ws[:heads], sc[:n]
	for b0 := 0; b0 < n; b0 += blk {
		b := min(blk, n-b0)
		h := 0
		for ; h+3 <= heads; h += 3 {
			scores3AVX2(&q[h*dim], 4*dim, &k[b0*dim], 4*dim, b, dim, scale, &d[h*blk], 4*blk)
		}
		for ; h < heads; h++ {
			scoresAVX2(&q[h*dim], &k[b0*dim], 4*dim, b, dim, scale, &d[h*blk])
		}
		for j := 0; j < b; j++ {
			var v float32
			for h, w := range ws {
				v += float32(w * max(d[h*blk+j], 0))
			}
			sc[b0+j] = v
		}
	}
}
