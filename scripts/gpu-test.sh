#!/bin/bash
# Runs the GPU test suite and the GPU benchmarks of internal/cuda in one
# call on a machine with an NVIDIA GPU and nvcc but no Go. Two steps:
#
#	scripts/gpu-test.sh stage [DIR]   # where Go is: cross-build the test
#	                                  # binary (CGO_ENABLED=0) and copy it,
#	                                  # the kernel sources and these scripts
#	                                  # into DIR (default .gpu)
#	bash DIR/gpu-test.sh run [DIR]    # on the GPU machine, from the directory
#	                                  # above DIR
#
# run compiles the kernels to PTX with gpu-ptx.sh, runs every test against
# that fresh PTX ($SLUICE_PTX_DIR), then the benchmarks (SLUICE_GPU_BENCH=1),
# and writes ptx files, logs and ptxas's register report to $OUT (default
# DIR/out). Copy the .ptx files back into internal/cuda/kernels to commit
# them: TestPTXFresh checks they match the sources.
set -uo pipefail
mode=${1:-}
dir=${2:-.gpu}
case "$mode" in
stage)
	cd "$(dirname "$0")/.."
	mkdir -p "$dir/kernels"
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go test -c -o "$dir/cuda.test" ./internal/cuda || exit 1
	cp internal/cuda/kernels/*.cu internal/cuda/kernels/*.cuh "$dir/kernels/"
	cp scripts/gpu-ptx.sh scripts/gpu-test.sh "$dir/"
	echo "staged in $dir: run 'bash $dir/gpu-test.sh run $dir' on the GPU machine"
	;;
run)
	out=${OUT:-$dir/out}
	mkdir -p "$out"
	export PATH=$PATH:/usr/local/cuda/bin
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >"$out/test.log" 2>&1
	if ! bash "$dir/gpu-ptx.sh" "$dir/kernels" "$out" >>"$out/test.log" 2>&1; then
		cat "$out/test.log"
		echo "gpu-test: PTX compile failed"
		exit 1
	fi
	for f in "$out"/*.ptx; do
		echo "== $(basename "$f")"
		ptxas -arch=sm_90 -v -o /dev/null "$f" 2>&1 | grep -E "Compiling|registers|spill|stack" | sed 's/ptxas info *: //'
	done >"$out/ptxas.log"
	export SLUICE_PTX_DIR=$out
	"$dir/cuda.test" -test.v -test.count=1 -test.timeout=300s 2>&1 | grep -v "^=== RUN" >>"$out/test.log"
	rc=${PIPESTATUS[0]}
	SLUICE_GPU_BENCH=1 "$dir/cuda.test" -test.run 'TestGPUBench' -test.v -test.count=1 -test.timeout=300s >"$out/bench.log" 2>&1
	grep -E "^(--- |FAIL|ok|PASS)|cuda_test.go|bench_test.go" "$out/test.log" | grep -v -- "--- PASS" | tail -n 60
	grep -E "^bench:|FAIL|panic" "$out/bench.log"
	echo "gpu-test: tests exit $rc"
	exit "$rc"
	;;
*)
	echo "usage: scripts/gpu-test.sh stage [DIR] | run [DIR]" >&2
	exit 2
	;;
esac
