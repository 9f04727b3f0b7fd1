#!/usr/bin/env bash
# Compare sluice with llama.cpp on the shared tiny models, back to back,
# alternating runs so that machine noise hits both engines alike.
#
#   LLAMA_BENCH=/path/to/llama-bench scripts/compare-llama.sh [ROUNDS]
#
# llama.cpp is built outside this repository from its public source; this
# script only runs the binary it is given. It runs `llama-bench -t 2 -p 512
# -n 128` on ../shared/gguf/*-Q4_0.gguf and `sluice bench --prompt 512 --gen
# 128 --threads 2` on 4-bit packs of the same checkpoints, and prints the
# medians of each and their ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_BENCH:?set LLAMA_BENCH to the llama-bench binary}"
rounds=${1:-3}
shared=../shared
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/sluice" ./cmd/sluice
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
printf '%-18s %12s %12s %12s %12s %8s %8s\n' model llama_pp512 sluice_pp512 llama_tg128 sluice_tg128 pp_ratio tg_ratio
for m in tiny-qwen3-5-moe tiny-qwen3-moe; do
  "$work/sluice" pack --bits 4 "$shared/models/$m" "$work/$m" >/dev/null
  : >"$work/lp"; : >"$work/lt"; : >"$work/sp"; : >"$work/st"
  for r in $(seq "$rounds"); do
    "$LLAMA_BENCH" -m "$shared/gguf/$m-Q4_0.gguf" -t 2 -p 512 -n 128 -r 1 -o json 2>/dev/null >"$work/l.json"
    python3 - "$work/l.json" >>"$work/l.txt" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    print("pp" if r["n_prompt"] else "tg", r["avg_ts"])
PY
    grep '^pp' "$work/l.txt" | tail -1 | cut -d' ' -f2 >>"$work/lp"
    grep '^tg' "$work/l.txt" | tail -1 | cut -d' ' -f2 >>"$work/lt"
    "$work/sluice" bench -m "$work/$m" --prompt 512 --gen 128 --threads 2 --repeat 1 --json >"$work/s.json"
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["prefill_tok_s"]); print(d["decode_tok_s"], file=sys.stderr)' "$work/s.json" >>"$work/sp" 2>>"$work/st"
  done
  lp=$(median <"$work/lp"); lt=$(median <"$work/lt"); sp=$(median <"$work/sp"); st=$(median <"$work/st")
  printf '%-18s %12.1f %12.1f %12.1f %12.1f %8.2f %8.2f\n' "$m" "$lp" "$sp" "$lt" "$st" \
    "$(echo "$sp / $lp" | bc -l)" "$(echo "$st / $lt" | bc -l)"
done
