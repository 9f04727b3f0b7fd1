package kernels

// AttendRing computes one query head's attention over n consecutive
// positions starting at position first, held in a ring of rows rows
// (position p at row p % rows; rows equal to the context is a plain
// cache), with an optional sink: a learned logit per head that joins the
// softmax, takes its share of the weight and contributes no value
// (gpt-oss). Keys and values are rows stride floats apart in kc and vc,
// starting at their first element; s is scratch of at least n floats.
//
// Every sum runs in position order, whatever the ring's wrap, so the
// result depends on the positions only: the same alone, in a batch, or
// after the ring wrapped.
func AttendRing(o, q, kc, vc []float32, stride, rows, first, n int, scale float32, sink []float32, s []float32) {
	hd := len(q)
	s = s[:n]
	row := func(j int) int { return (first + j) % rows * stride }
	for j := range s {
		at := row(j)
		s[j] = Dot(q, kc[at:at+hd]) * scale
	}
	mx := Max(s)
	if len(sink) > 0 {
		mx = max(mx, sink[0])
	}
	var sum float32
	for j := range s {
		e := Exp(s[j] - mx)
		s[j] = e
		sum += e
	}
	if len(sink) > 0 {
		sum += Exp(sink[0] - mx)
	}
	o = o[:hd]
	clear(o)
	for j, p := range s {
		at := row(j)
		Axpy(o, p, vc[at:at+hd])
	}
	Scale(o, 1/sum)
}
