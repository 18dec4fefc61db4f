#!/usr/bin/env bash
# End-to-end throughput: the axum hello-world of benches/http_server.rs on core 0 (one tokio
# worker), wrk on core 1 (1 thread, 32 connections), over loopback. Sides run interleaved
# (A B C … A B C …) for ROUNDS rounds of SECS seconds; prints requests/s per run, then the
# median (min-max) per side, the ratios to bare and to tower_governor, and the server's own CPU
# time per request (user + system from /proc, median of the runs).
#
#   bash benches/scripts/e2e.sh                      # bare, tollgate, tollgate_no_headers, tower_governor
#   SIDES="bare tollgate_redis" FEATURES=redis bash benches/scripts/e2e.sh
#   OUT=benches/results/http.txt bash benches/scripts/e2e.sh   # also append raw results for charts.py
#
# BIN=path runs a given build; BEFORE_BIN=path adds sides named before_<side>, run with that
# (earlier) build, e.g. SIDES="bare tollgate before_tollgate".
#
# Sides: see benches/http_server.rs. The load average is printed with each run: the machine
# is shared, so compare sides within one run only.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
SECS=${SECS:-5}
CONNS=${CONNS:-32}
PORT=${PORT:-38127}
SIDES=${SIDES:-"bare tollgate tower_governor tollgate_compact tower_governor_headers tollgate_every"}
OUT=${OUT:-}
FEATURES=${FEATURES:-}
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)"; exit 1; }
target=${CARGO_TARGET_DIR:-target}
if [ -n "${BIN:-}" ]; then
  bin=$BIN
else
  cargo bench --bench http_server --no-run ${FEATURES:+--features "$FEATURES"} 2>/dev/null
  bin=$(ls -t "$target"/release/deps/http_server-* | grep -v '\.d$' | head -1)
fi
declare -A results cpus
for round in $(seq 1 "$ROUNDS"); do
  for side in $SIDES; do
    if [[ $side == before_* ]]; then
      taskset -c 0 "$BEFORE_BIN" "${side#before_}" "$PORT" $((SECS + 3)) &
    else
      taskset -c 0 "$bin" "$side" "$PORT" $((SECS + 3)) &
    fi
    server=$!
    for _ in $(seq 1 50); do
      curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break
      sleep 0.1
    done
    t0=$(awk '{print $14 + $15}' "/proc/$server/stat")
    out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${SECS}s" "http://127.0.0.1:$PORT/")
    t1=$(awk '{print $14 + $15}' "/proc/$server/stat")
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    total=$(echo "$out" | awk '/requests in/ {print $1}')
    # The server's own CPU (user + system, clock ticks) per request, in µs.
    cpu=$(awk -v t="$((t1 - t0))" -v n="$total" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}')
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    echo "round $round $side $rps req/s, server CPU $cpu µs/request  (load $(cut -d' ' -f1 /proc/loadavg))"
    [ -n "$OUT" ] && echo "http $side $round $rps" >>"$OUT" && echo "http_cpu $side $round $cpu" >>"$OUT"
    cpus[$side]="${cpus[$side]:-} $cpu"
    results[$side]="${results[$side]:-} $rps"
  done
done
echo
median() { echo "${results[$1]:-}" | tr ' ' '\n' | awk NF | sort -g | awk '{v[NR]=$1} END {if (NR) print v[int((NR+1)/2)]}'; }
bare_median=$(median bare)
tg_median=$(median tower_governor)
printf '%-24s %12s %24s %8s %8s %10s\n' side "median req/s" "min-max" "÷ bare" "÷ t_g" "µs CPU/req"
for side in $SIDES; do
  read -r med lo hi < <(echo "${results[$side]}" | tr ' ' '\n' | awk NF | sort -g |
    awk '{v[NR]=$1} END {print v[int((NR+1)/2)], v[1], v[NR]}')
  r1=$( [ -n "$bare_median" ] && awk -v a="$med" -v b="$bare_median" 'BEGIN {printf "%.3f", a/b}' || echo -)
  r2=$( [ -n "$tg_median" ] && awk -v a="$med" -v b="$tg_median" 'BEGIN {printf "%.3f", a/b}' || echo -)
  c=$(echo "${cpus[$side]}" | tr ' ' '\n' | awk NF | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
  printf '%-24s %12s %24s %8s %8s %10s\n' "$side" "$med" "$lo-$hi" "$r1" "$r2" "$c"
done
