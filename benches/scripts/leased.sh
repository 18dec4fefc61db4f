#!/usr/bin/env bash
# Leased quotas end to end: benches/leased_server.rs on core 0 (one tokio worker), wrk on
# core 1 (1 thread, 32 connections), a private redis-server (unpinned) for INFO commandstats.
# Sides run interleaved for ROUNDS rounds of SECS seconds, on one hot key (the peer IP), on 64
# keys (each request one of 64 at random: each key warm enough to lease) and on cold keys (each
# request a random key out of COLD_KEYS, so no key is hot enough to lease). The sides: bare
# axum, the memory store (the ceiling a layer in front of axum allows), the exact RedisStore
# and LeasedStore<RedisStore>, all with the same policy and the default layer.
# Prints req/s and p99 per run, the median per side, the ratio to bare, the server's CPU time
# per request (user + system from /proc), and script calls (EVALSHA + EVAL) per request and
# Redis's microseconds in them per request, from INFO commandstats.
#
#   bash benches/scripts/leased.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-5}
CONNS=${CONNS:-32}
PORT=${PORT:-38231}
RPORT=${RPORT:-38232}
COLD_KEYS=${COLD_KEYS:-1000000}
LOADS=${LOADS:-"hot keys64 cold"}
SIDES=${SIDES:-"bare memory exact leased"}
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)"; exit 1; }
target=${CARGO_TARGET_DIR:-target}
cargo bench --bench leased_server --features redis --no-run 2>/dev/null
bin=$(ls -t "$target"/release/deps/leased_server-* | grep -v '\.d$' | head -1)
dir=$(mktemp -d)
redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --daemonize no >/dev/null &
redis=$!
trap 'kill $redis 2>/dev/null || true; wait $redis 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 1 50); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
export REDIS_URL="redis://127.0.0.1:$RPORT"
for keys in 64 "$COLD_KEYS"; do
  cat >"$dir/keys$keys.lua" <<LUA
request = function()
  return wrk.format("GET", "/", { ["x-key"] = tostring(math.random(1, $keys)) })
end
LUA
done
calls() { # script calls and Redis microseconds in them, so far
  redis-cli -p "$RPORT" info commandstats |
    awk -F'[=,:]' '/^cmdstat_(evalsha|eval):/ {n += $3; u += $5} END {print n + 0, u + 0}'
}
declare -A rps p99 cpr cpu rcpu
for round in $(seq 1 "$ROUNDS"); do
  for load in $LOADS; do
    for side in $SIDES; do
      taskset -c 0 "$bin" "$side" "$PORT" $((SECS + 3)) &
      server=$!
      for _ in $(seq 1 50); do
        curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break
        sleep 0.1
      done
      read -r before ubefore < <(calls)
      script=()
      [ "$load" = keys64 ] && script=(-s "$dir/keys64.lua")
      [ "$load" = cold ] && script=(-s "$dir/keys$COLD_KEYS.lua")
      t0=$(awk '{print $14 + $15}' "/proc/$server/stat")
      out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${SECS}s" --latency "${script[@]}" "http://127.0.0.1:$PORT/")
      read -r after uafter < <(calls)
      t1=$(awk '{print $14 + $15}' "/proc/$server/stat")
      kill "$server" 2>/dev/null || true
      wait "$server" 2>/dev/null || true
      r=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
      total=$(awk '/requests in/ {print $1}' <<<"$out")
      l=$(awk '$1 == "99%" {print $2}' <<<"$out")
      c=$(awk -v a="$before" -v b="$after" -v n="$total" 'BEGIN {printf "%.4f", (b - a) / n}')
      u=$(awk -v t="$((t1 - t0))" -v n="$total" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}')
      ru=$(awk -v a="$ubefore" -v b="$uafter" -v n="$total" 'BEGIN {printf "%.2f", (b - a) / n}')
      echo "round $round $load $side $r req/s p99 $l server CPU $u µs/request Redis $ru µs/request script calls/request $c"
      cpu[$load.$side]="${cpu[$load.$side]:-} $u"
      rcpu[$load.$side]="${rcpu[$load.$side]:-} $ru"
      rps[$load.$side]="${rps[$load.$side]:-} $r"
      p99[$load.$side]="${p99[$load.$side]:-} $l"
      cpr[$load.$side]="${cpr[$load.$side]:-} $c"
    done
  done
done
echo
printf '%-14s %12s %8s %12s %14s %10s %14s\n' side "median req/s" ratio "CPU µs/req" "Redis µs/req" "p99s" "calls/request"
for load in $LOADS; do
  bare=
  for side in $SIDES; do
    med=$(echo "${rps[$load.$side]}" | tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
    [ "$side" = bare ] && bare=$med
    ratio=$(awk -v a="$med" -v b="$bare" 'BEGIN {printf "%.3f", a/b}')
    c=$(echo "${cpu[$load.$side]}" | tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
    rc=$(echo "${rcpu[$load.$side]}" | tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
    printf '%-14s %12s %8s %12s %14s %10s %14s\n' "$load.$side" "$med" "$ratio" "$c" "$rc" "$(echo ${p99[$load.$side]} | tr ' ' ',')" "$(echo ${cpr[$load.$side]} | tr ' ' ',')"
  done
done
