#!/usr/bin/env bash
# Instructions executed inside Redis per decision, from `valgrind --tool=callgrind` on a
# private redis-server: repeatable where decisions per second on a shared 2-core machine are
# not. benches/scripts/redis_instructions.py sends B and then 2B batches (EVALSHA of REQUESTS
# sliding-window-counter requests, on distinct keys or one hot key); per decision =
# (refs at 2B - refs at B) / (B * REQUESTS), which cancels start-up and shutdown. The
# `trivial` row sends the same keys and arguments to `return 1`.
#
#   bash benches/scripts/redis_instructions.sh
#   REQUESTS="1 64" MODES=hot B=50 bash benches/scripts/redis_instructions.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
REQUESTS=${REQUESTS:-"1 64"}
MODES=${MODES:-"distinct hot"}
B=${B:-100}
PORT=${PORT:-38131}
command -v valgrind >/dev/null || { echo "valgrind is not installed"; exit 1; }
command -v redis-server >/dev/null || { echo "redis-server is not installed"; exit 1; }
script=$(mktemp)
log=$(mktemp)
trap 'rm -f "$script" "$log"' EXIT
for f in prelude sliding_window_counter sliding_window_log token_bucket fixed_window gcra decide; do
  cat "lua/$f.lua"
  echo
done >"$script"
refs() { # script batches requests mode
  valgrind --tool=callgrind --callgrind-out-file=/dev/null redis-server --port "$PORT" \
    --save '' --appendonly no >/dev/null 2>"$log" &
  local server=$!
  for _ in $(seq 1 100); do
    redis-cli -p "$PORT" ping >/dev/null 2>&1 && break
    sleep 0.2
  done
  python3 benches/scripts/redis_instructions.py "$PORT" "$1" "$2" "$3" "$4"
  redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
  wait "$server" || true
  awk '/refs/ {gsub(",", "", $4); print $4}' "$log"
}
for n in $REQUESTS; do
  for mode in $MODES; do
    [ "$n" = 1 ] && [ "$mode" = hot ] && continue
    for side in trivial "$script"; do
      a=$(refs "$side" "$B" "$n" "$mode")
      b=$(refs "$side" $((2 * B)) "$n" "$mode")
      name=$([ "$side" = trivial ] && echo "return 1" || echo "decision script")
      printf '%-16s requests=%-4s %-9s %8s instr/decision\n' "$name" "$n" "$mode" \
        $(( (b - a) / (B * n) ))
    done
  done
done
