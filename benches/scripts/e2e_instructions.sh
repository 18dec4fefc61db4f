#!/usr/bin/env bash
# Instructions per request of the axum server's connection task (benches/http_server.rs:
# hyper, axum, the layer, writing the response) under `valgrind --tool=callgrind`, which unlike
# requests per second does not move with CPU steal. `curl` sends N and then 2N sequential
# requests over one keep-alive connection; per request = (refs at 2N − refs at N) / N, which
# cancels start-up and shutdown. Repeated REPEAT times; prints the median and min-max, and the
# ratio of bare's count to each side's (the throughput ratio if time followed instructions).
#
#   bash benches/scripts/e2e_instructions.sh
#   SIDES="bare tollgate" N=2000 REPEAT=1 bash benches/scripts/e2e_instructions.sh
#   BIN=path/to/a/saved/http_server bash benches/scripts/e2e_instructions.sh  # a saved build (before/after)
#   BEFORE_BIN=path SIDES="bare tollgate before_tollgate" bash …  # before_<side>: run by that build
#   OUT=benches/results/http_instructions.txt bash …   # also append raw results
set -euo pipefail
cd "$(dirname "$0")/../.."
SIDES=${SIDES:-"bare tollgate tollgate_no_headers tower_governor"}
N=${N:-5000}
REPEAT=${REPEAT:-3}
PORT=${PORT:-38129}
FEATURES=${FEATURES:-}
command -v valgrind >/dev/null || { echo "valgrind is not installed"; exit 1; }
target=${CARGO_TARGET_DIR:-target}
if [ -n "${BIN:-}" ]; then
  bin=$BIN
else
  cargo bench --bench http_server --no-run ${FEATURES:+--features "$FEATURES"} 2>/dev/null
  bin=$(ls -t "$target"/release/deps/http_server-* | grep -v '\.d$' | head -1)
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
OUT=${OUT:-}
# Only the connection's work is counted (hyper's dispatcher: parsing, the service stack,
# writing the response); the rest — start-up, above all the clock's calibration, which runs
# for a stretch of time rather than a number of instructions and moved counts by ±2 000 per
# request — is not. TOGGLE= counts the whole process.
TOGGLE=${TOGGLE-'*Dispatcher*poll_catch*'}
refs() { # side requests
  local b=$bin side=$1
  if [[ $side == before_* ]]; then b=$BEFORE_BIN; side=${side#before_}; fi
  valgrind --tool=callgrind ${TOGGLE:+--toggle-collect="$TOGGLE"} --callgrind-out-file=/dev/null \
    "$b" "$side" "$PORT" 3600 2>"$log" &
  local server=$!
  for _ in $(seq 1 300); do
    curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break
    sleep 0.2
  done
  curl -s "http://127.0.0.1:$PORT/?[1-$2]" >/dev/null
  kill -TERM "$server"
  wait "$server" || true
  awk '/refs/ {gsub(",", "", $4); print $4}' "$log"
}
bare=
for side in $SIDES; do
  vals=()
  for _ in $(seq 1 "$REPEAT"); do
    a=$(refs "$side" "$N"); b=$(refs "$side" $((2 * N)))
    vals+=($(( (b - a) / N )))
    [ -n "$OUT" ] && echo "http_instructions $side ${#vals[@]} $(( (b - a) / N ))" >>"$OUT"
  done
  sorted=$(printf '%s\n' "${vals[@]}" | sort -n)
  med=$(echo "$sorted" | sed -n "$(( (REPEAT + 1) / 2 ))p")
  [ "$side" = bare ] && bare=$med
  ratio=$( [ -n "$bare" ] && awk -v a="$bare" -v b="$med" 'BEGIN {printf "%.3f", a/b}' || echo -)
  printf '%-22s %8s instr/request  (%s-%s)  bare/side %s\n' "$side" "$med" \
    "$(echo "$sorted" | head -1)" "$(echo "$sorted" | tail -1)" "$ratio"
done
