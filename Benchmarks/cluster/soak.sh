#!/usr/bin/env bash
# A soak of the cluster's end-to-end part: runs it again and again (each time a fresh PostgreSQL and fresh nodes,
# through Benchmarks/cluster/run.sh) and watches every node's outbox; when no job ends for STALL seconds while jobs are
# still missing, it dumps every node's thread stacks (gdb), each spool's folder counts and logs, and stops with 1.
# For what a timed test cannot catch: a rare stall under a flood.
#
#   Benchmarks/cluster/soak.sh [RUNS]                   (default 10; needs root, gdb, `swift build -c release` first)
#   JOBS=4000 PARTS=1,2 STALL=20 Benchmarks/cluster/soak.sh 50
#
# Every run's figures go to .build-bench/soak-<time>/run-N.txt; a stall's evidence to .build-bench/soak-<time>/stall/.

set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RUNS=${1:-10}
JOBS=${JOBS:-4000}
PARTS=${PARTS:-2}
STALL=${STALL:-20}
OUT="$ROOT/.build-bench/soak-$(date -u +%Y%m%dT%H%M%S)"
mkdir -p "$OUT"

count_outboxes() {
  local n=0 d
  for d in /tmp/opq-bench-cluster-*/*-n*/outbox; do
    [ -d "$d" ] && n=$((n + $(find "$d" -mindepth 1 -maxdepth 1 ! -name '.*' | wc -l)))
  done
  echo "$n"
}

for run in $(seq 1 "$RUNS"); do
  OPQ_KEEP=1 JOBS=$JOBS OPQUEUED_ARGS=--parts=$PARTS timeout 900 "$ROOT/Benchmarks/cluster/run.sh" opqueued > "$OUT/run-$run.txt" 2>&1 &
  bench=$!
  last=-1 still=0
  while kill -0 "$bench" 2>/dev/null; do
    sleep 2
    n=$(count_outboxes)
    if [ "$n" -eq "$last" ] && [ "$n" -gt 0 ]; then still=$((still + 2)); else still=0; last=$n; fi
    if [ "$still" -ge "$STALL" ]; then
      echo "run $run: no job ended for $STALL s at $n of $JOBS; evidence in $OUT/stall" >&2
      mkdir -p "$OUT/stall"
      for pid in $(pgrep -f "release/opqueued --spool"); do
        gdb -p "$pid" -batch -ex "thread apply all bt 30" > "$OUT/stall/stacks-$pid.txt" 2>&1
      done
      for d in /tmp/opq-bench-cluster-*/*-n*; do
        [ -d "$d" ] || continue
        echo "$d: inbox $(ls "$d/inbox" | wc -l), submissions $(ls "$d/active/.submissions" 2>/dev/null | wc -l)," \
             "active $(ls "$d/active" | wc -l), outbox $(ls "$d/outbox" | wc -l)" >> "$OUT/stall/folders.txt"
        cp "$d.log" "$OUT/stall/" 2>/dev/null
      done
      pkill -f "Benchmarks/cluster/opqueued.py"; pkill -f "release/opqueued --spool"
      wait "$bench"
      exit 1
    fi
  done
  wait "$bench"
  echo "run $run: $(grep -h '"part"' "$OUT/run-$run.txt" | cut -c1-150 | tr '\n' ' ')"
  rm -rf /tmp/opq-bench-cluster-*
done
echo "$RUNS runs, no stall (figures in $OUT)"
