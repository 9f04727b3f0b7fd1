#!/bin/bash
# Runs the sluice CLI on the GPU machine with the bundled model: device
# selection, the run summary and JSON stats, score, bench on the GPU
# (graphs on and off, the phase profile) and on the CPU, and the refusals.
#
#	scripts/gpu-cli.sh stage DIR    # with Go: build sluice into DIR
#	bash DIR/gpu-cli.sh run DIR      # on the GPU machine; the log goes to $OUT
set -uo pipefail
mode=${1:-}
dir=${2:-.gpu}
case "$mode" in
stage)
	cd "$(dirname "$0")/.."
	mkdir -p "$dir"
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -ldflags=-s -o "$dir/sluice" ./cmd/sluice || exit 1
	cp scripts/gpu-cli.sh "$dir/"
	;;
run)
	out=${OUT:-$dir/out}
	mkdir -p "$out"
	export SLUICE_CACHE=${SLUICE_CACHE:-/tmp/sluice-cache}
	S=$dir/sluice
	p="def fibonacci(n):"
	{
		set -x
		$S run -p "$p" -n 48 --temp 0 --device cuda
		$S run -p "$p" -n 48 --temp 0 --device cpu
		$S run -p "$p" -n 16 --temp 0 --json
		$S run -p "$p" -n 16 --temp 0.8 --seed 7 --device cuda
		$S run -p "$p" -n 16 --temp 0.8 --seed 7 --device cpu
		$S score --device cuda --text-file "$dir/gpu-cli.sh" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print("score", d["device"], d["n"], d["nll"])'
		$S score --device cpu --text-file "$dir/gpu-cli.sh" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print("score", d["device"], d["n"], d["nll"])'
		$S bench --device cuda --json
		$S bench --device cuda --gpu-graphs=false --json
		$S bench --device cpu --json
		$S bench --device cuda --prompt 64 --gen 64 --repeat 1 --gpu-phases
		$S bench --device cuda --prompt 64 --gen 64 --repeat 1 --gpu-phases --gpu-graphs=false
		$S run -p "$p" -n 4 --device cuda --drafts 2
		$S serve --device cuda --cache-mb 8
		$S run -p "$p" -n 4 --device cuda:3
	} >"$out/cli.txt" 2>&1
	cat "$out/cli.txt" | cut -c1-600
	;;
diverge)
	# Where greedy decoding on the GPU and on the CPU part, and how close
	# the two best logits are there on each device.
	export SLUICE_CACHE=${SLUICE_CACHE:-/tmp/sluice-cache}
	S=$dir/sluice
	python3 - "$S" <<'PY'
import json, subprocess, sys
S = sys.argv[1]
def js(*a):
    return json.loads(subprocess.run([S, *a], capture_output=True, text=True, check=True).stdout)
for prompt in ["def fibonacci(n):", "The quick brown fox", "import numpy as np\n"]:
    ids = js("tokenize", "--text", prompt)["ids"]
    gen = {d: js("run", "--tokens", ",".join(map(str, ids)), "-n", "64", "--temp", "0", "--ignore-eos", "--json", "--device", d)["tokens"] for d in ("cuda", "cpu")}
    d = next((i for i, (a, b) in enumerate(zip(gen["cuda"], gen["cpu"])) if a != b), None)
    print(repr(prompt), "greedy tokens identical for 64" if d is None else f"first difference at generated token {d}: cuda {gen['cuda'][d]} cpu {gen['cpu'][d]}")
    if d is None:
        continue
    seq = ids + gen["cpu"][:d]
    for dev in ("cuda", "cpu"):
        ll = js("score", "--tokens", ",".join(map(str, seq)), "--json", "--device", dev)["last_logits"]
        top = sorted(range(len(ll)), key=lambda i: -ll[i])[:2]
        print(f"  {dev}: top two {top[0]} {ll[top[0]]:.6f}, {top[1]} {ll[top[1]]:.6f}, gap {ll[top[0]] - ll[top[1]]:.2e}")
PY
	;;
serve)
	# sluice serve on the GPU: two concurrent chat requests and a
	# completion, greedy; each answer against the CPU's serve.
	export SLUICE_CACHE=${SLUICE_CACHE:-/tmp/sluice-cache}
	S=$dir/sluice
	for dev in cuda cpu; do
		$S serve --device $dev --addr 127.0.0.1:18080 --slots 2 &
		pid=$!
		python3 - $dev <<'PY'
import json, sys, time, urllib.request, threading
def post(path, body):
    req = urllib.request.Request("http://127.0.0.1:18080" + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=60))
for _ in range(100):
    try:
        urllib.request.urlopen("http://127.0.0.1:18080/health", timeout=1); break
    except Exception:
        time.sleep(0.2)
out = {}
def chat(i):
    r = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Write a function number %d" % i}], "max_tokens": 24, "temperature": 0})
    out[i] = r["choices"][0]["message"]["content"]
threads = [threading.Thread(target=chat, args=(i,)) for i in range(2)]
[t.start() for t in threads]; [t.join() for t in threads]
c = post("/v1/completions", {"prompt": "def fibonacci(n):", "max_tokens": 24, "temperature": 0})
print(sys.argv[1], json.dumps(out), json.dumps(c["choices"][0]["text"]))
PY
		kill $pid
		wait $pid
	done
	;;
*)
	echo "usage: scripts/gpu-cli.sh stage DIR | run DIR | diverge DIR | serve DIR" >&2
	exit 2
	;;
esac
