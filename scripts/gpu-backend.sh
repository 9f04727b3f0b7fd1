#!/bin/bash
# Runs the GPU backend's tests and speed measurements on a machine with an
# NVIDIA GPU and nvcc but no Go (and no copy of ../shared). Two steps:
#
#	scripts/gpu-backend.sh stage DIR MODEL...  # where Go is: cross-build the
#	                                          # test binaries, copy the kernel
#	                                          # sources, and pack the shared
#	                                          # checkpoints and references of
#	                                          # MODEL... into DIR
#	bash DIR/gpu-backend.sh run DIR            # on the GPU machine
#
# The checkpoints travel as xz archives with each bf16 safetensors file
# split into its even and odd bytes (the exponent bytes compress, the
# mantissa bytes do not), which is what lets a model fit the transfer
# limit. run compiles the PTX into $OUT, runs internal/cuda's tests and the
# backend's tests against it (SLUICE_PTX_DIR), then TestGPUSpeed, and
# writes the PTX and one log to $OUT. SPEED=0 skips the speed run; TESTS
# selects the backend tests (a -test.run pattern).
set -uo pipefail
mode=${1:-}
dir=${2:-.gpu}
case "$mode" in
stage)
	shift 2
	cd "$(dirname "$0")/.."
	mkdir -p "$dir/kernels" "$dir/refs" "$dir/models"
	export CGO_ENABLED=0 GOOS=linux GOARCH=amd64
	go test -c -ldflags=-s -o "$dir/gpu.test" ./internal/backend/gpu || exit 1
	[ -n "${NOCUDATEST:-}" ] || go test -c -ldflags=-s -o "$dir/cuda.test" ./internal/cuda || exit 1
	cp internal/cuda/kernels/*.cu internal/cuda/kernels/*.cuh "$dir/kernels/"
	# internal/cuda's tests read the kernel sources (TestPTXFresh,
	# TestGemmEmulated) relative to the package, so run starts it in DIR.
	mkdir -p "$dir/testdata/emu"
	cp internal/cuda/testdata/emu/* "$dir/testdata/emu/"
	cp scripts/gpu-ptx.sh scripts/gpu-backend.sh "$dir/"
	for m in "$@"; do
		cp "../shared/refs/$m.json" "$dir/refs/"
		python3 - "../shared/models/$m" "$dir/models/$m.tar.xz" <<'PY' || exit 1
import io, os, sys, tarfile
src, dst = sys.argv[1], sys.argv[2]
name = os.path.basename(src.rstrip('/'))
with tarfile.open(dst, 'w:xz', preset=6) as t:
    for f in sorted(os.listdir(src)):
        b = open(os.path.join(src, f), 'rb').read()
        parts = [(f, b)]
        if f.endswith('.safetensors'):
            parts = [(f + '.even', b[0::2]), (f + '.odd', b[1::2])]
        for n, data in parts:
            ti = tarfile.TarInfo(name + '/' + n)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
PY
	done
	du -sh "$dir"
	;;
run)
	# Absolute, since gpu-ptx.sh and the tests change directory.
	dir=$(cd "$dir" && pwd)
	out=${OUT:-$dir/out}
	mkdir -p "$out"
	out=$(cd "$out" && pwd)
	log=$out/log.txt
	export PATH=$PATH:/usr/local/cuda/bin
	sh=${SLUICE_SHARED:-/tmp/sluice-shared}
	mkdir -p "$sh/models" "$sh/refs"
	cp "$dir"/refs/*.json "$sh/refs/" 2>/dev/null
	for a in "$dir"/models/*.tar.xz; do
		[ -e "$a" ] || continue
		python3 - "$a" "$sh/models" <<'PY' || exit 1
import os, sys, tarfile
src, dst = sys.argv[1], sys.argv[2]
with tarfile.open(src, 'r:xz') as t:
    files = {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}
for n, b in files.items():
    if n.endswith('.odd'):
        continue
    path = os.path.join(dst, n[:-5] if n.endswith('.even') else n)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if n.endswith('.even'):
        odd = files[n[:-5] + '.odd']
        buf = bytearray(len(b) + len(odd))
        buf[0::2], buf[1::2] = b, odd
        b = bytes(buf)
    open(path, 'wb').write(b)
PY
	done
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$log" 2>&1
	nproc >>"$log"
	if ! bash "$dir/gpu-ptx.sh" "$dir/kernels" "$out" >>"$log" 2>&1; then
		cat "$log"
		echo "gpu-backend: PTX compile failed"
		exit 1
	fi
	export SLUICE_PTX_DIR=$out SLUICE_SHARED=$sh SLUICE_GPU_PACKS=${SLUICE_GPU_PACKS:-/tmp/sluice-packs}
	mkdir -p "$SLUICE_GPU_PACKS"
	rc=0
	if [ -x "$dir/cuda.test" ]; then
		(cd "$dir" && exec ./cuda.test -test.count=1 -test.timeout=300s) >>"$log" 2>&1 || rc=1
		echo "== cuda.test rc $rc" >>"$log"
	fi
	"$dir/gpu.test" -test.v -test.count=1 -test.timeout=400s -test.run "${TESTS:-TestGPU(Conformance|BatchInvariance|QuantisedNLL|Refusals|DecodeAllocs|NonFiniteLogits)}" 2>&1 | grep -v "^=== RUN" >>"$log"
	r=${PIPESTATUS[0]}
	echo "== gpu.test rc $r" >>"$log"
	[ "$r" = 0 ] || rc=1
	if [ "${SPEED:-1}" != 0 ]; then
		SLUICE_GPU_BENCH=1 "$dir/gpu.test" -test.v -test.count=1 -test.timeout=400s -test.run TestGPUSpeed 2>&1 | grep -v "^=== RUN" >>"$log"
		echo "== speed rc ${PIPESTATUS[0]}" >>"$log"
	fi
	grep -E "^(--- |FAIL|ok|PASS|speed:|  )|_test.go|== |panic" "$log" | tail -n 120
	exit "$rc"
	;;
*)
	echo "usage: scripts/gpu-backend.sh stage DIR MODEL... | run DIR" >&2
	exit 2
	;;
esac
