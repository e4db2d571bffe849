#!/usr/bin/env bash
# The cluster benchmark (issue 17), one run on one throwaway PostgreSQL 15 (fsync on, 127.0.0.1, password auth):
#
#   floor      pgbench of the bare claim/complete statements (FOR UPDATE SKIP LOCKED on a partial index), every
#              statement its own commit, then claims and completions by the hundred; 2 clients
#   anchors    PGQueuer and Procrastinate (PyPI, in .build-bench/venv, made here): no-op jobs already in the
#              database with 1 and 2 worker processes (jobs/s, commits per job), enqueue -> start on an idle worker;
#              then PGQueuer's jobs each doing the file work opqueued does for a job (anchor-files: anchors.py --files)
#   opqueued   1 and 2 nodes, JOBS single-`sleep 0` manifests dropped into node A's inbox: jobs/s end to end and
#              commits per job; pickup latency from an idle cluster (rename into A's inbox -> executing on B);
#              kill -9 of the node running a job -> running on the other (Benchmarks/cluster/opqueued.py); and the
#              database part alone (opqueue-bench store: the nodes' claim and completion statements, no-op, 1 and 2
#              workers), the figure of the same kind as the anchors' no-op ones
#
#   statements a node's claim round and completion alone, pgbench sending them as the node does, against the schema up to
#              each version given and a bare floor, in turns (Benchmarks/cluster/statements.py; STATEMENTS_ARGS="--rounds
#              5 --clients 2 --batch 20 --schemas 10,10-merged": 10-merged sends each claim with the last round's ends)
#
#   beat       one node's heartbeat as the backlog grows: the full beat (every live job read) against the beat by ids
#              (Benchmarks/cluster/beat.py; BEAT_ARGS="--waiting 100000,1000000 --running 20 --beats 40")
#
#   Benchmarks/cluster/run.sh [PARTS...]      PARTS: floor anchors opqueued statements beat (default: the first three)
#   BENCH_FS=journalled Benchmarks/cluster/run.sh     the server's data and every spool on a journalled ext4 (a 16 GB
#              sparse image under .build-bench, loop-mounted for the run, removed after); by default both are under
#              /tmp, on whatever file system that is (on the machines these figures come from: ext4 without a
#              journal, where an inode allocation skips every inode of its group freed in the last minutes, which
#              the cluster's end-to-end parts pay for and the spool alone does not: docs/cluster.md)
#   BENCH_FS=apart Benchmarks/cluster/run.sh     as on separate hosts: the server's data on one journalled ext4 and each
#              node's spool on one of its own (three images): a node's syncfs writes out only what that node wrote,
#              not the other node's files or the server's pages
#   JOBS=10000 SAMPLES=200 BIN=.build/release OPQUEUED_ARGS=--spool-alone Benchmarks/cluster/run.sh opqueued
#   OPQUEUED_ARGS=--parts=spool,2,spool,2,spool,2 Benchmarks/cluster/run.sh opqueued   rounds in turn; the run ends with a
#              `ratio` line: each round's 2-node figure over its spool-alone figure, and their median
#   OPQUEUED_ARGS=--parts=2,pickup Benchmarks/cluster/run.sh opqueued     (spool, 1, 2, database, scale, store, pickup, takeover;
#              also limited: 2 nodes, every operation on a queue limited to 2 cluster-wide)
#   OPQUEUED_ARGS="--log-target=journal --parts=spool,2" Benchmarks/cluster/run.sh opqueued   the nodes log to journald as
#              under systemd, not to a file each (journald must be listening: without systemd, as root,
#              `mkdir -p /run/systemd/journal && /lib/systemd/systemd-journald &`)
#   OPQUEUED_ARGS=--parts=scale Benchmarks/cluster/run.sh opqueued   the scale model: jobs already in the database, the
#              server pinned to CPU 0 (taskset), 1, 2 and 3 nodes on the other CPUs: the server core's busy share per
#              1,000 jobs a second, and how many nodes at the 1-node rate one server core would carry
#   BIN=.build-bench/before:.build/release OPQUEUED_ARGS=--parts=scale Benchmarks/cluster/run.sh opqueued   the parts
#              with each build in turn (a `bin` line before each): two versions side by side in one run
#   PG_STATEMENTS=1 OPQUEUED_ARGS=--parts=2 Benchmarks/cluster/run.sh opqueued   the server loads pg_stat_statements, and
#              at the end prints, per statement, its calls, rows (and per call: a claim round's size), milliseconds of
#              execution and of planning over the whole run (nested statements too: the claim function's own)
#   TIMELINE=1 OPQUEUED_ARGS=--parts=2 Benchmarks/cluster/run.sh opqueued   every 0.25 s of an end-to-end part: node 0's
#              inbox and active/.submissions, the rows by state, each outbox (for diagnosis: it slows the part)
#
# Prints one JSON line per figure; the whole output is also kept in .build-bench/cluster-<time>.txt. The throughput
# parts also give `busyBefore`: how busy the machine was in the half second before the part while its nodes were
# idle (near 0 on a quiet machine; more marks a run whose figures something else disturbed). Needs root
# (initdb runs as the `postgres` user) and Debian's postgresql (make deps).

set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1   # no __pycache__ beside the scripts
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PARTS=${*:-floor anchors opqueued}
JOBS=${JOBS:-10000}
SAMPLES=${SAMPLES:-200}
BIN=${BIN:-$ROOT/.build/release}
PGBIN=/usr/lib/postgresql/15/bin
VENV=$ROOT/.build-bench/venv
mkdir -p "$ROOT/.build-bench"
OUT="$ROOT/.build-bench/cluster-$(date -u +%Y%m%dT%H%M%S).txt"
exec > >(tee "$OUT") 2>&1

say() { printf '%s\n' "$*"; }

# --- the file system -----------------------------------------------------------------------------------------------
BASE_TMP=/tmp
FS_MOUNTS=()
mount_journalled() {   # a new journalled ext4 image under .build-bench, loop-mounted; prints where
  local image mount
  image="$ROOT/.build-bench/journalled-ext4-${#FS_MOUNTS[@]}.img"
  mount=$(mktemp -d /tmp/opq-bench-fs-XXXXXX)
  rm -f "$image"
  truncate -s 16G "$image"
  mkfs.ext4 -q -F "$image"
  mount -o loop "$image" "$mount"
  chmod 1777 "$mount"
  FS_MOUNTS+=("$mount:$image")
}
case "${BENCH_FS:-}" in
  journalled)
    mount_journalled
    BASE_TMP=${FS_MOUNTS[0]%%:*}
    export TMPDIR=$BASE_TMP ;;
  apart)
    # As on separate hosts: the server's data on one journalled ext4, each node's spool on another of its own
    # (a node's syncfs then writes out only what that node wrote).
    mount_journalled; mount_journalled; mount_journalled
    BASE_TMP=${FS_MOUNTS[0]%%:*}
    export TMPDIR=$BASE_TMP BENCH_NODE_FOLDERS="${FS_MOUNTS[1]%%:*}:${FS_MOUNTS[2]%%:*}" ;;
  "") ;;
  *) say "BENCH_FS: journalled, apart or unset"; exit 64 ;;
esac
unmount_fs() {
  local entry
  for entry in "${FS_MOUNTS[@]}"; do
    umount "${entry%%:*}" && rmdir "${entry%%:*}" && rm -f "${entry#*:}"
  done
}

# --- the server ---------------------------------------------------------------------------------------------------
DIR=$(mktemp -d "$BASE_TMP/opq-bench-pg-XXXXXX")
chown postgres: "$DIR"
chmod 700 "$DIR"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
PW="bench-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')"
printf '%s\n' "$PW" > "$DIR/pw"
chown postgres: "$DIR/pw"
stop_server() {
  runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$DIR"
  unmount_fs
}
trap stop_server EXIT
runuser -u postgres -- "$PGBIN/initdb" -D "$DIR/data" -U postgres --auth=scram-sha-256 --pwfile="$DIR/pw" \
  --encoding=UTF8 --locale=C --no-instructions >/dev/null
runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -c port=$PORT -c unix_socket_directories=$DIR -c max_connections=200${PG_STATEMENTS:+ -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all -c pg_stat_statements.track_planning=on}" start >/dev/null
export PGPASSWORD="$PW" PGHOST=127.0.0.1 PGPORT=$PORT PGUSER=postgres
BASE="postgresql://postgres:$PW@127.0.0.1:$PORT"
say "{\"server\": \"$("$PGBIN/postgres" --version)\", \"fsync\": \"$(psql -XAtq -d postgres -c 'SHOW fsync')\", \"cores\": $(nproc), \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"fileSystem\": \"$(findmnt -n -o FSTYPE,OPTIONS -T "$DIR")\", \"journal\": \"$(dumpe2fs -h "$(findmnt -n -o SOURCE -T "$DIR")" 2>/dev/null | grep -q has_journal && echo yes || echo no)\", \"spools\": \"$([ -n "${BENCH_NODE_FOLDERS:-}" ] && echo "each node's on a journalled ext4 of its own" || echo "beside the server's data")\"}"

commits() { psql -XAtq -d postgres -c "SELECT xact_commit FROM pg_stat_database WHERE datname = '$1'"; }

# --- floor: pgbench -----------------------------------------------------------------------------------------------
floor() {
  local db=floor rows=600000 seconds=10
  psql -XAtq -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
  psql -XAtq -d $db -f - <<'SQL'
CREATE TABLE q (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, state text NOT NULL DEFAULT 'waiting',
                qos smallint NOT NULL DEFAULT 0, node text, fence bigint, payload bytea);
CREATE INDEX q_claimable ON q (qos DESC, id) WHERE state = 'waiting';
CREATE SEQUENCE fence;
SQL
  local scripts
  scripts=$(mktemp -d)
  # One job per claim, every statement its own commit (what a naive queue does).
  cat > "$scripts/single.sql" <<'SQL'
UPDATE q SET state = 'running', node = 'bench', fence = nextval('fence')
 WHERE id = (SELECT id FROM q WHERE state = 'waiting' ORDER BY qos DESC, id FOR UPDATE SKIP LOCKED LIMIT 1)
 RETURNING id AS claimed \gset
UPDATE q SET state = 'finished' WHERE id = :claimed AND fence IS NOT NULL;
SQL
  # A hundred per claim and per completion (what opqueued's claim round and publication batch do).
  cat > "$scripts/batch.sql" <<'SQL'
WITH c AS (SELECT id FROM q WHERE state = 'waiting' ORDER BY qos DESC, id FOR UPDATE SKIP LOCKED LIMIT 100),
     u AS (UPDATE q SET state = 'running', node = 'bench', fence = nextval('fence') FROM c WHERE q.id = c.id RETURNING q.id)
SELECT quote_literal(array_agg(id)::text) AS claimed FROM u \gset
UPDATE q SET state = 'finished' WHERE id = ANY (:claimed::bigint[]) AND fence IS NOT NULL;
SQL
  for mode in single batch; do
    psql -XAtq -d $db -c "TRUNCATE q" -c "INSERT INTO q (payload) SELECT '\\x00'::bytea FROM generate_series(1, $rows)" -c "VACUUM ANALYZE q"
    sleep 1.1
    local before after tps per
    before=$(commits $db)
    tps=$("$PGBIN/pgbench" -n -c 2 -j 2 -T $seconds -f "$scripts/$mode.sql" $db 2>"$scripts/$mode.err" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' || true)
    sleep 1.1
    after=$(commits $db)
    [ -n "$tps" ] || { say "pgbench $mode failed: $(tail -3 "$scripts/$mode.err")"; continue; }
    per=$([ $mode = single ] && echo 1 || echo 100)
    python3 -c "import json; t=float('$tps'); j=t*$per; print(json.dumps({'part': 'floor', 'mode': '$mode', 'clients': 2, 'jobsPerSecond': round(j), 'commitsPerJob': round(($after-$before)/(j*$seconds), 3), 'includes': 'claim (UPDATE .. FOR UPDATE SKIP LOCKED) + complete, no payload read, no NOTIFY, no heartbeat'}))"
  done
  rm -rf "$scripts"
}

# --- anchors: PGQueuer, Procrastinate -----------------------------------------------------------------------------
anchors() {
  if [ ! -x "$VENV/bin/python" ]; then python3 -m venv "$VENV"; fi
  "$VENV/bin/pip" install -q 'pgqueuer==1.6.0' 'procrastinate==3.10.0' 'psycopg[binary]>=3.2' 'asyncpg>=0.29' >/dev/null
  local work
  work=$(mktemp -d)
  for system in pgqueuer procrastinate; do
    local jobs=$JOBS
    # Procrastinate is an order of magnitude slower: a fifth of the jobs keeps the run short.
    [ $system = procrastinate ] && jobs=$((JOBS / 5))
    for workers in 1 2; do
      "$VENV/bin/python" "$ROOT/Benchmarks/cluster/anchors.py" throughput $system --base "$BASE" --admin "$BASE/postgres" \
        --work "$work" --jobs $jobs --workers $workers | sed 's/^{/{"part": "anchor", /'
    done
    "$VENV/bin/python" "$ROOT/Benchmarks/cluster/anchors.py" latency $system --base "$BASE" --admin "$BASE/postgres" \
      --work "$work" --samples "$SAMPLES" | sed 's/^{/{"part": "anchor-latency", /'
  done
  # PGQueuer again, each job doing the file work opqueued does for a job already in the database (anchors.py --files);
  # the folders stay until the run ends (under $DIR), as the spools do: removing them would slow the next parts'
  # file creation on ext4 without a journal (docs/cluster.md).
  for workers in 1 2; do
    "$VENV/bin/python" "$ROOT/Benchmarks/cluster/anchors.py" throughput pgqueuer --base "$BASE" --admin "$BASE/postgres" \
      --work "$work" --jobs $JOBS --workers $workers --files "$DIR/anchor-files-$workers" | sed 's/^{/{"part": "anchor-files", /'
  done
  rm -rf "$work"
}

# --- opqueued -----------------------------------------------------------------------------------------------------
opqueued() {
  local bin
  for bin in ${BIN//:/ }; do
    [ "$BIN" = "$bin" ] || say "{\"bin\": \"$bin\"}"
    python3 "$ROOT/Benchmarks/cluster/opqueued.py" --bin "$bin" --base "$BASE" --admin "$BASE/postgres" --jobs "$JOBS" \
      --samples "$SAMPLES" --pgbin "$PGBIN" ${OPQUEUED_ARGS:-}
  done
}

# Between parts: the previous part's databases dropped and its dirty pages written (CHECKPOINT), so that no part
# pays for another's background writes — the spool-alone figure touches no database and would not.
settle() {
  local db
  for db in $(psql -XAtq -d postgres -c "SELECT datname FROM pg_database WHERE datname NOT IN ('postgres', 'template0', 'template1')"); do
    psql -XAtq -d postgres -c "DROP DATABASE \"$db\" WITH (FORCE)" >/dev/null
  done
  psql -XAtq -d postgres -c CHECKPOINT >/dev/null
  sleep 1
}

for part in $PARTS; do
  settle
  case $part in
    floor) floor ;;
    anchors) anchors ;;
    opqueued) opqueued || say "{\"part\": \"opqueued\", \"error\": \"failed (exit $?)\"}" ;;
    statements) python3 "$ROOT/Benchmarks/cluster/statements.py" --admin "$BASE/postgres" --jobs "$JOBS" ${STATEMENTS_ARGS:-} ;;
    beat) python3 "$ROOT/Benchmarks/cluster/beat.py" --admin "$BASE/postgres" ${BEAT_ARGS:-} ;;
    *) say "unknown part $part (floor, anchors, opqueued, statements, beat)"; exit 64 ;;
  esac
done
if [ -n "${PG_STATEMENTS:-}" ]; then
  say "statements over the whole run (calls | rows | rows a call | ms executing | ms planning | sent by a client | statement):"
  psql -XAtq -d postgres -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" \
    -c "SELECT calls, rows, round(rows::numeric / greatest(calls, 1), 1), round(total_exec_time::numeric, 1),
               round(total_plan_time::numeric, 1), toplevel, left(regexp_replace(query, '[[:space:]]+', ' ', 'g'), 100)
        FROM pg_stat_statements WHERE calls > 0 ORDER BY total_exec_time + total_plan_time DESC LIMIT 40"
fi
say "{\"kept\": \"$OUT\"}"
