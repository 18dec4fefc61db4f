#!/usr/bin/env bash
# Server instructions per request under callgrind, benches/leased_server.rs against a private
# redis-server: each side runs twice under valgrind while wrk sends requests for SHORT and
# LONG seconds; (instructions of the long run − the short run) / (requests − requests) leaves
# out start-up and shutdown. Counts instructions, not time, so it holds on a busy machine.
# CONNS (default 8) is how many connections wrk keeps open: CONNS=1 sends one request at a
# time, so no decisions coalesce and the count does not move with batch sizes.
# LOAD=cold sends a random key out of 1 000 000 per request (no key leased), LOAD=keys64 one
# of 64 (each leased), LOAD=hot one key.
# WHO=redis counts the private redis-server's instructions per request instead (a fresh
# redis-server under valgrind per run; the limiter server runs natively).
#
#   bash benches/scripts/leased_instructions.sh
#   SIDES="exact leased" LOAD=hot bash benches/scripts/leased_instructions.sh
#   BIN=path/to/a/saved/leased_server bash benches/scripts/leased_instructions.sh
#   WHO=redis SIDES="exact leased" bash benches/scripts/leased_instructions.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
SIDES=${SIDES:-"bare exact leased"}
LOAD=${LOAD:-cold}
CONNS=${CONNS:-8}
SHORT=${SHORT:-4}
LONG=${LONG:-10}
WHO=${WHO:-server}
PORT=${PORT:-38241}
RPORT=${RPORT:-38242}
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)"; exit 1; }
target=${CARGO_TARGET_DIR:-target}
if [ -n "${BIN:-}" ]; then
  bin=$BIN
else
  cargo bench --bench leased_server --features redis --no-run 2>/dev/null
  bin=$(ls -t "$target"/release/deps/leased_server-* | grep -v '\.d$' | head -1)
fi
dir=$(mktemp -d)
redis=
trap 'kill $redis 2>/dev/null || true; wait $redis 2>/dev/null || true; rm -rf "$dir"' EXIT
start_redis() { # [valgrind...]
  "$@" redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
    --daemonize no >/dev/null 2>"$dir/rvg" &
  redis=$!
  for _ in $(seq 1 150); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.2; done
}
[ "$WHO" = server ] && start_redis
export REDIS_URL="redis://127.0.0.1:$RPORT"
for keys in 64 1000000; do
  cat >"$dir/keys$keys.lua" <<LUA
request = function()
  return wrk.format("GET", "/", { ["x-key"] = tostring(math.random(1, $keys)) })
end
LUA
done
script=()
[ "$LOAD" = keys64 ] && script=(-s "$dir/keys64.lua")
[ "$LOAD" = cold ] && script=(-s "$dir/keys1000000.lua")
run() { # side seconds -> "requests instructions"
  local vg n
  if [ "$WHO" = redis ]; then
    start_redis valgrind --tool=callgrind --callgrind-out-file=/dev/null
    "$bin" "$1" "$PORT" $(($2 + 15)) >/dev/null 2>&1 &
  else
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$PORT" $(($2 + 15)) >/dev/null 2>"$dir/vg" &
  fi
  vg=$!
  for _ in $(seq 1 150); do curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break; sleep 0.2; done
  n=$(wrk -t1 -c"$CONNS" -d"$2s" "${script[@]}" "http://127.0.0.1:$PORT/" | awk '/requests in/ {print $1}')
  if [ "$WHO" = redis ]; then
    kill "$vg" 2>/dev/null || true
    wait "$vg" 2>/dev/null || true
    redis-cli -p "$RPORT" shutdown nosave >/dev/null 2>&1 || true
    wait "$redis" 2>/dev/null || true
    echo "$n $(awk '/refs/ {gsub(",", "", $4); print $4}' "$dir/rvg")"
  else
    wait "$vg" || true
    echo "$n $(awk '/refs/ {gsub(",", "", $4); print $4}' "$dir/vg")"
  fi
}
for side in $SIDES; do
  read -r n1 i1 < <(run "$side" "$SHORT")
  read -r n2 i2 < <(run "$side" "$LONG")
  printf '%-8s %-5s %-6s %8s instructions/request  (%s and %s requests)\n' "$side" "$LOAD" "$WHO" $(( (i2 - i1) / (n2 - n1) )) "$n1" "$n2"
done
