#!/usr/bin/env bash
# Instructions per check (or per request, for the layer_* sides) under callgrind, from
# benches/decision_cost.rs: (refs at 2N − refs at N) / N, repeated REPEAT times; prints the
# median and min-max. Only the checks are counted (--toggle-collect, see decision_cost.rs);
# counts still move a little between runs (the clock is read for real, so windows roll over).
#
#   bash benches/scripts/callgrind.sh                                  # memory store vs governor
#   SIDES="layer_bare layer_tollgate layer_tower_governor" N=20000 bash benches/scripts/callgrind.sh
#   BIN=path/to/a/saved/decision_cost bash benches/scripts/callgrind.sh  # count a saved build (before/after)
#   OUT=benches/results/check_instructions.txt bash benches/scripts/callgrind.sh
#       # also appends `check_instructions_<keys> <side> <round> <instr>` lines for charts.py
set -euo pipefail
cd "$(dirname "$0")/../.."
SIDES=${SIDES:-"governor tollgate_gcra tollgate_counter"}
KEYS=${KEYS:-"1 10000"}
N=${N:-100000}
REPEAT=${REPEAT:-3}
target=${CARGO_TARGET_DIR:-target}
if [ -n "${BIN:-}" ]; then
  bin=$BIN
else
  CARGO_PROFILE_BENCH_DEBUG=true cargo bench --bench decision_cost --no-run 2>/dev/null
  bin=$(ls -t "$target"/release/deps/decision_cost-* | grep -v '\.d$' | head -1)
fi
refs() { valgrind --tool=callgrind --toggle-collect='*measured*' --callgrind-out-file=/dev/null "$bin" "$@" 2>&1 | awk '/refs/ {gsub(",", "", $4); print $4}'; }
for keys in $KEYS; do
  for side in $SIDES; do
    vals=()
    for _ in $(seq 1 "$REPEAT"); do
      a=$(refs "$side" "$keys" "$N"); b=$(refs "$side" "$keys" $((2 * N)))
      vals+=($(( (b - a) / N )))
      if [ -n "${OUT:-}" ]; then
        echo "check_instructions_$keys $side ${#vals[@]} ${vals[-1]}" >> "$OUT"
      fi
    done
    sorted=$(printf '%s\n' "${vals[@]}" | sort -n)
    med=$(echo "$sorted" | sed -n "$(( (REPEAT + 1) / 2 ))p")
    printf '%-30s keys=%-6s %6s instr  (%s-%s)\n' "$side" "$keys" "$med" "$(echo "$sorted" | head -1)" "$(echo "$sorted" | tail -1)"
  done
done
