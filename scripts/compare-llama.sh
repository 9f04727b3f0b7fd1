#!/usr/bin/env bash
# Compare sluice with llama.cpp on the shared tiny models, back to back,
# alternating runs so that machine noise hits both engines alike.
#
#   LLAMA_BENCH=/path/to/llama-bench scripts/compare-llama.sh [ROUNDS]
#
# llama.cpp is built outside this repository from its public source; this
# script only runs the binary it is given. It runs `llama-bench -t 2 -p 512
# -n 128` on ../shared/gguf/*-Q4_0.gguf and `sluice bench --prompt 512 --gen
# 128 --threads 2` on 4-bit packs of the same checkpoints (tg128 decodes from
# an empty context in both), then the decode again after 512 tokens of
# context (`llama-bench -p 0 -n 128 -d 512`, `sluice bench --depth 512`),
# and prints the medians of each and their ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_BENCH:?set LLAMA_BENCH to the llama-bench binary}"
rounds=${1:-3}
shared=../shared
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/sluice" ./cmd/sluice
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
# llama <out-prefix> <llama-bench args...>: appends pp and tg figures.
llama() {
  local out=$1
  shift
  "$LLAMA_BENCH" -m "$gguf" -t 2 -r 1 -o json "$@" 2>/dev/null >"$work/l.json"
  python3 - "$work/l.json" "$out" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    kind = "pp" if r["n_prompt"] else "tg"
    open(sys.argv[2] + kind, "a").write("%s\n" % r["avg_ts"])
PY
}
# sluice <out-prefix> <sluice bench args...>: appends pp and tg figures.
sluice() {
  local out=$1
  shift
  "$work/sluice" bench -m "$work/$m" --prompt 512 --gen 128 --threads 2 --repeat 1 --json "$@" >"$work/s.json"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); open(sys.argv[2]+"pp","a").write("%s\n" % d["prefill_tok_s"]); open(sys.argv[2]+"tg","a").write("%s\n" % d["decode_tok_s"])' "$work/s.json" "$out"
}
printf '%-18s %11s %11s %11s %11s %11s %11s %8s %8s %8s\n' model llama_pp512 sluice_pp512 llama_tg128 sluice_tg128 llama_tg@512 sluice_tg@512 pp_ratio tg_ratio tg@512
for m in tiny-qwen3-5-moe tiny-qwen3-moe; do
  gguf="$shared/gguf/$m-Q4_0.gguf"
  "$work/sluice" pack --bits 4 "$shared/models/$m" "$work/$m" >/dev/null
  rm -f "$work"/[ls][0d]*
  for r in $(seq "$rounds"); do
    llama "$work/l0" -p 512 -n 128
    sluice "$work/s0"
    llama "$work/ld" -p 0 -n 128 -d 512
    sluice "$work/sd" --depth 512
  done
  lp=$(median <"$work/l0pp"); lt=$(median <"$work/l0tg"); ld=$(median <"$work/ldtg")
  sp=$(median <"$work/s0pp"); st=$(median <"$work/s0tg"); sd=$(median <"$work/sdtg")
  printf '%-18s %11.1f %11.1f %11.1f %11.1f %11.1f %11.1f %8.2f %8.2f %8.2f\n' "$m" "$lp" "$sp" "$lt" "$st" "$ld" "$sd" \
    "$(echo "$sp / $lp" | bc -l)" "$(echo "$st / $lt" | bc -l)" "$(echo "$sd / $ld" | bc -l)"
done
