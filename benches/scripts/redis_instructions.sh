#!/usr/bin/env bash
# Instructions executed inside Redis per uncoalesced decision, from `valgrind --tool=callgrind`
# on a private redis-server: repeatable where times on a shared 2-core machine are not. The
# clients are those of redis_cpu.sh (redis_cpu.py for tollgate's script and `trivial`,
# rlf/bench.js for rate-limiter-flexible), sending N and then 2N sequential decisions on 16
# keys; per decision = (refs at 2N - refs at N) / N, which cancels start-up, shutdown and the
# warm-up. BEFORE=<commit> adds before_fixed, before_swc, before_gcra (that commit's script,
# with its argument layout). OUT=<file> appends `redis_instructions <side> <ROUND> <value>`
# lines (ROUND defaults to 1) for charts.py. BATCH=<b> sends each call as a batch of b requests
# on b distinct keys (decide.lua's general path, see redis_cpu.py): per decision is then
# divided by b too.
#
#   bash benches/scripts/redis_instructions.sh
#   SIDES="trivial tollgate_swc rlf_fixed" N=500 bash benches/scripts/redis_instructions.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
SIDES=${SIDES:-"trivial tollgate_fixed tollgate_swc tollgate_gcra tollgate_bucket rlf_fixed"}
N=${N:-500}
PORT=${PORT:-38131}
OUT=${OUT:-}
ROUND=${ROUND:-1}
command -v valgrind >/dev/null || { echo "valgrind is not installed"; exit 1; }
command -v redis-server >/dev/null || { echo "redis-server is not installed"; exit 1; }
script=$(mktemp)
before=$(mktemp)
log=$(mktemp)
trap 'rm -f "$script" "$before" "$log"' EXIT
# The decision script as src/store/redis/script.rs joins it (single.lua first, decide.lua last),
# with the values of lua/constants.lua written in.
for f in single integers prelude sliding_window_counter_math sliding_window_counter sliding_window_log token_bucket fixed_window gcra in_flight decide; do
  cat "lua/$f.lua"
  echo
done | python3 benches/scripts/inline_constants.py >"$script"
if [ -n "${BEFORE:-}" ]; then
  for f in prelude sliding_window_counter sliding_window_log token_bucket fixed_window gcra in_flight decide; do
    git show "$BEFORE:lua/$f.lua"
    echo
  done >"$before"
  SIDES="$SIDES before_fixed before_swc before_gcra"
fi
refs() { # side decisions
  valgrind --tool=callgrind --callgrind-out-file=/dev/null redis-server --port "$PORT" \
    --save '' --appendonly no >/dev/null 2>"$log" &
  local server=$!
  for _ in $(seq 1 100); do
    redis-cli -p "$PORT" ping >/dev/null 2>&1 && break
    sleep 0.2
  done
  if [ "$1" = rlf_fixed ]; then
    (cd benches/scripts/rlf && node bench.js "$PORT" "$2" 16 1 >/dev/null)
  else
    TOLLGATE_SCRIPT=$script BEFORE_SCRIPT=$before python3 benches/scripts/redis_cpu.py "$PORT" "$1" "$2" 16 >/dev/null
  fi
  redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
  wait "$server" || true
  awk '/refs/ {gsub(",", "", $4); print $4}' "$log"
}
for side in $SIDES; do
  a=$(refs "$side" "$N")
  b=$(refs "$side" $((2 * N)))
  per=$(( (b - a) / (N * ${BATCH:-1}) ))
  printf '%-16s %8s instr/decision\n' "$side" "$per"
  [ -n "$OUT" ] && echo "redis_instructions $side $ROUND $per" >>"$OUT"
done
