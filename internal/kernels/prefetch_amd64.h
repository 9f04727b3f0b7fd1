// Software prefetch runs for the decode kernels. A kernel that reads
// several interleaved row streams, which the hardware prefetchers follow
// poorly, walks a register over bytes it will read later and prefetches
// them a run of cache lines at a time, as one sequential stream.

// PF4LINES prefetches the 256 bytes (four cache lines) at r.
#define PF4LINES(r) \
	PREFETCHT0 (r) \
	PREFETCHT0 64(r) \
	PREFETCHT0 128(r) \
	PREFETCHT0 192(r)

// PF8LINES prefetches the 512 bytes (eight cache lines) at r.
#define PF8LINES(r) \
	PF4LINES(r) \
	PREFETCHT0 256(r) \
	PREFETCHT0 320(r) \
	PREFETCHT0 384(r) \
	PREFETCHT0 448(r)
