#!/usr/bin/env bash
# Redis CPU per uncoalesced decision: Redis's own usec_per_call for the script command
# (`INFO commandstats`), on a private redis-server pinned to core 0 with the client on core 1,
# sides interleaved (A B C … A B C …) for ROUNDS rounds; prints each run, then the median
# (min-max) per side and the ratio to rate-limiter-flexible's fixed window.
#
# Sides: `trivial` (`return 1` with tollgate's keys and arguments: the call itself),
# `tollgate_fixed`, `tollgate_swc`, `tollgate_gcra`, `tollgate_bucket` (tollgate's decision
# script, the arguments src/store/redis/wire.rs sends for one request of one policy, via
# redis_cpu.py), and `rlf_fixed` (rate-limiter-flexible's RateLimiterRedis with ioredis, via
# rlf/bench.js: run `npm install` in benches/scripts/rlf first). N sequential decisions per
# run on KEYS keys. BEFORE=<commit> adds before_fixed, before_swc, before_gcra: the script
# of that commit, with its argument layout.
#
#   bash benches/scripts/redis_cpu.sh
#   ROUNDS=3 SIDES="trivial tollgate_swc rlf_fixed" bash benches/scripts/redis_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
N=${N:-20000}
KEYS=${KEYS:-64}
PORT=${PORT:-38133}
SIDES=${SIDES:-"trivial tollgate_fixed tollgate_swc tollgate_gcra rlf_fixed"}
OUT=${OUT:-}
command -v redis-server >/dev/null || { echo "redis-server is not installed"; exit 1; }
script=$(mktemp)
trap 'rm -f "$script" "$before"; redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true' EXIT
# The order src/store/redis/script.rs joins them in, with the values of lua/constants.lua
# written in.
for f in single integers prelude sliding_window_counter_math sliding_window_counter sliding_window_log token_bucket fixed_window gcra in_flight decide; do
  cat "lua/$f.lua"
  echo
done | python3 benches/scripts/inline_constants.py >"$script"
before=$(mktemp)
if [ -n "${BEFORE:-}" ]; then
  for f in prelude sliding_window_counter sliding_window_log token_bucket fixed_window gcra in_flight decide; do
    git show "$BEFORE:lua/$f.lua"
    echo
  done >"$before"
  SIDES="$SIDES before_fixed before_swc before_gcra"
fi
taskset -c 0 redis-server --port "$PORT" --save '' --appendonly no >/dev/null &
for _ in $(seq 1 50); do
  redis-cli -p "$PORT" ping >/dev/null 2>&1 && break
  sleep 0.1
done
declare -A results
for round in $(seq 1 "$ROUNDS"); do
  for side in $SIDES; do
    if [ "$side" = rlf_fixed ]; then
      json=$(cd benches/scripts/rlf && taskset -c 1 node bench.js "$PORT" "$N" "$KEYS" 1)
    else
      json=$(TOLLGATE_SCRIPT=$script BEFORE_SCRIPT=$before taskset -c 1 python3 benches/scripts/redis_cpu.py "$PORT" "$side" "$N" "$KEYS")
    fi
    usec=$(echo "$json" | python3 -c 'import json,sys; print(json.load(sys.stdin)["usec_per_call"])')
    echo "round $round $side $usec usec/call  (load $(cut -d' ' -f1 /proc/loadavg))"
    results[$side]="${results[$side]:-} $usec"
    [ -n "$OUT" ] && echo "redis_cpu $side $round $usec" >>"$OUT"
  done
done
echo
printf '%-18s %14s %16s %10s\n' side "median usec" "min-max" "÷ rlf"
read -r ref _ < <(echo "${results[rlf_fixed]:-}" | tr ' ' '\n' | awk NF | sort -g |
  awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}') || true
for side in $SIDES; do
  read -r med lo hi < <(echo "${results[$side]}" | tr ' ' '\n' | awk NF | sort -g |
    awk '{v[NR]=$1} END {print v[int((NR+1)/2)], v[1], v[NR]}')
  ratio=$( [ -n "${ref:-}" ] && awk -v a="$med" -v b="$ref" 'BEGIN {printf "%.2f", a/b}' || echo -)
  printf '%-18s %14s %16s %10s\n' "$side" "$med" "$lo-$hi" "$ratio"
done
