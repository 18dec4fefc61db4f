#!/usr/bin/env bash
# Compile weight: a clean debug build of a hello-world axum app alone, with tower_governor
# (default features, newest from crates.io) and with tollgate (default features, this
# checkout as a path dependency). The apps live in a temporary directory, each with its own
# target directory, which is deleted before every build; sides are built interleaved (the
# order rotates each round) for ROUNDS rounds. Prints per side the median and min-max seconds,
# the seconds added over axum alone, the crates in the dependency tree
# (`cargo tree -e normal`, the app itself not counted) and the units compiled (every package
# cargo compiles, build scripts' and proc macros' dependencies included).
#
#   bash benches/scripts/compile_weight.sh                 # 3 rounds, tollgate's default features
#   ROUNDS=5 bash benches/scripts/compile_weight.sh
#   VARIANTS="default axum default,redis" bash benches/scripts/compile_weight.sh
#       # one tollgate side per feature set: with `default` in it, the default features and
#       # those named; without, only those named (axum alone here); sides named tollgate[SET]
#   TOP=15 bash benches/scripts/compile_weight.sh          # also the 15 slowest units of the last
#                                                          # tollgate build (cargo --timings)
#   BEFORE=../old-checkout bash benches/scripts/compile_weight.sh  # one more side, tollgate_before:
#                                                          # default features, another checkout
#
# Besides wall-clock seconds it prints the CPU seconds (user + system) of each build, which
# depend less on what else the machine is running.
#
# Crates are downloaded (cargo fetch) before the first build, so no build is timed with a
# download. CARGO_BUILD_JOBS is left to cargo (all cores). The machine may be shared:
# compare sides within one run only.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
ROUNDS=${ROUNDS:-3}
VARIANTS=${VARIANTS:-default}
TOP=${TOP:-0}
BEFORE=${BEFORE:-}
SIDES=(axum tower_governor)
for variant in $VARIANTS; do
  if [ "$variant" = default ]; then SIDES+=(tollgate); else SIDES+=("tollgate[$variant]"); fi
done
[ -n "$BEFORE" ] && SIDES+=(tollgate_before) && BEFORE=$(cd "$BEFORE" && pwd)
unset CARGO_TARGET_DIR CARGO_BUILD_JOBS

tmp=$(mktemp -d "${TMPDIR:-/tmp}/compile_weight.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

write_app() { # side, extra dependency line, use lines, layer expression, setup lines
  local dir=$tmp/$1
  mkdir -p "$dir/src"
  cat >"$dir/Cargo.toml" <<EOF
[package]
name = "hello"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
axum = "0.8"
tokio = { version = "1", features = ["full"] }
$2

[workspace]
EOF
  cat >"$dir/src/main.rs" <<EOF
use axum::{routing::get, Router};
$3

#[tokio::main]
async fn main() {
$5
    let app = Router::new().route("/", get(|| async { "Hello, World!" }))$4;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await.unwrap();
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .await
    .unwrap();
}
EOF
}

write_app axum "" "" "" ""
write_app tower_governor 'tower_governor = "*"' \
  'use tower_governor::{governor::GovernorConfigBuilder, GovernorLayer};' \
  '.layer(GovernorLayer::new(config))' \
  '    let config = GovernorConfigBuilder::default().per_second(2).burst_size(5).finish().unwrap();'
write_tollgate_app() { # side, checkout, feature set
  local features="" set
  IFS=, read -ra set <<<"$3"
  for feature in "${set[@]}"; do
    [ "$feature" = default ] || features+="${features:+, }\"$feature\""
  done
  features=", features = [$features]"
  [[ ",$3," == *,default,* ]] || features+=", default-features = false"
  write_app "$1" "tollgate = { path = \"$2\"$features }" \
    'use tollgate::{Limiter, Policy, Rate, RateLimitLayer};' \
    '.layer(RateLimitLayer::new(limiter))' \
    '    let rate = Rate::new(5, std::time::Duration::from_secs(10));
    let limiter = Limiter::builder().policy(Policy::new("per-ip", rate).unwrap()).build().unwrap();'
}
for variant in $VARIANTS; do
  side=tollgate
  [ "$variant" = default ] || side="tollgate[$variant]"
  write_tollgate_app "$side" "$repo" "$variant"
done
[ -n "$BEFORE" ] && write_tollgate_app tollgate_before "$BEFORE" default

declare -A tree units times cpus
for side in "${SIDES[@]}"; do
  (cd "$tmp/$side" && cargo fetch -q)
  tree[$side]=$(cd "$tmp/$side" && cargo tree -q --offline -e normal --prefix none \
    | sed 's/ (\*)$//' | sort -u | grep -cv "^hello ")
done
describe() { git -C "$1" rev-parse --short HEAD 2>/dev/null || echo "?"; }
echo "tollgate: $(describe "$repo")${BEFORE:+, before: $(describe "$BEFORE")};" \
  "$(rustc --version); $(nproc) cores"

for round in $(seq 1 "$ROUNDS"); do
  n=${#SIDES[@]}
  for i in $(seq 0 $((n - 1))); do
    side=${SIDES[$(((i + round - 1) % n))]}
    dir=$tmp/$side
    rm -rf "$dir/target"
    timings=""
    [ "$TOP" -gt 0 ] && [ "$side" = tollgate ] && [ "$round" = "$ROUNDS" ] && timings=--timings
    load=$(cut -d' ' -f1 /proc/loadavg)
    # The shell's own `times` reports the CPU time of its finished children (cargo, rustc).
    times >"$tmp/times" # (a builtin: in $(...) it would see the subshell's children only)
    cpu_before=$(tail -1 "$tmp/times")
    start=$(date +%s.%N)
    out=$(cd "$dir" && cargo build --offline $timings 2>&1) || { echo "$out"; exit 1; }
    end=$(date +%s.%N)
    times >"$tmp/times"
    cpu_after=$(tail -1 "$tmp/times")
    secs=$(echo "$end - $start" | bc)
    cpu=$(python3 -c 'import re, sys
def s(t): return sum(float(m) * 60 + float(x) for m, x in re.findall(r"(\d+)m([\d.]+)s", t))
print(f"{s(sys.argv[2]) - s(sys.argv[1]):.1f}")' "$cpu_before" "$cpu_after")
    units[$side]=$(grep -c '^ *Compiling ' <<<"$out")
    times[$side]+="$secs "
    cpus[$side]+="$cpu "
    printf 'round %d  %-24s %6.1f s  cpu %6.1f s  (load %s)\n' "$round" "$side" "$secs" "$cpu" "$load"
  done
done

stats() { # prints "median min max" of the numbers given
  printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {
    m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2; printf "%.1f %.1f %.1f", m, a[1], a[NR] }'
}
read -r base _ _ <<<"$(stats ${times[axum]})"
read -r cpu_base _ _ <<<"$(stats ${cpus[axum]})"
echo
echo "wall-clock and CPU seconds: median (min-max) over $ROUNDS rounds, and added over axum alone"
printf '%-24s %-22s %-24s %-12s %s\n' side wall cpu "tree crates" "units compiled"
for side in "${SIDES[@]}"; do
  read -r med min max <<<"$(stats ${times[$side]})"
  read -r cmed cmin cmax <<<"$(stats ${cpus[$side]})"
  printf '%-24s %-22s %-24s %-12s %s\n' "$side" \
    "$(printf '%.1f (%.1f-%.1f) %+.1f' "$med" "$min" "$max" "$(echo "$med - $base" | bc)")" \
    "$(printf '%.1f (%.1f-%.1f) %+.1f' "$cmed" "$cmin" "$cmax" "$(echo "$cmed - $cpu_base" | bc)")" \
    "$(printf '%d %+d' "${tree[$side]}" $((tree[$side] - tree[axum])))" \
    "$(printf '%d %+d' "${units[$side]}" $((units[$side] - units[axum])))"
done
ratio() { # side, array name: the side's added median over tower_governor's
  local -n a=$2
  local b s g
  read -r b _ _ <<<"$(stats ${a[axum]})"
  read -r s _ _ <<<"$(stats ${a[$1]})"
  read -r g _ _ <<<"$(stats ${a[tower_governor]})"
  echo "scale=2; ($s - $b) / ($g - $b)" | bc
}
for side in "${SIDES[@]}"; do
  case $side in tollgate*)
    echo "$side adds $(ratio "$side" times)x (wall) and $(ratio "$side" cpus)x (cpu) what tower_governor adds"
  esac
done

if [ "$TOP" -gt 0 ] && [ -d "$tmp/tollgate" ]; then
  echo
  echo "slowest units of the last tollgate build (seconds, cargo --timings; units overlap on $(nproc) cores):"
  python3 - "$tmp/tollgate/target/cargo-timings/cargo-timing.html" "$TOP" <<'EOF'
import json, re, sys
html = open(sys.argv[1]).read()
units = json.loads(re.search(r"const UNIT_DATA = (\[.*?\]);\n", html, re.S).group(1))
for u in sorted(units, key=lambda u: -u["duration"])[: int(sys.argv[2])]:
    target = u.get("target", "").strip()
    print(f'  {u["duration"]:6.1f}  {u["name"]} {u["version"]}{" " + target if target else ""}')
EOF
fi
