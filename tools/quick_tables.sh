#!/usr/bin/env bash
# Every experiment's --quick run, from checkout $1 into $2 (one run folder per experiment, its
# log and its wall time in $2/times.txt). Run it on two commits and compare, as a move that must
# not change a number is checked:
#   git worktree add /tmp/before <commit>; tools/quick_tables.sh /tmp/before /tmp/q-before
#   tools/quick_tables.sh . /tmp/q-after
#   for e in /tmp/q-before/*/; do n=$(basename "$e"); cmp "$e/table.md" "/tmp/q-after/$n/table.md"; done
set -uo pipefail
src=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd)
py=${PYTHON:-$src/.venv/bin/python}
cd "$src"
for e in async_workers async_bn constant_delay delay_cliff local_sgd pipeline_staleness sync_baseline; do
  start=$(date +%s)
  "$py" -m "experiments.$e" --quick --out "$out/$e" >"$out/$e.log" 2>&1
  echo "$e rc=$? $(($(date +%s) - start))s" >>"$out/times.txt"
done
