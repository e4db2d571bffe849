#!/usr/bin/env python3
# The statements part of the cluster benchmark (Benchmarks/cluster/run.sh statements): a node's claim round and
# completion alone, as pgbench sends them (the extended protocol, unnamed statements, as the node does), against the
# schema migrated up to a given version, on run.sh's server. No Swift build needed: for trying a change of the SQL.
#
#   variants  floor     run.sh's floor: the bare claim and completion (a table of ids and states, no payload)
#             floor-rows (--rows) the same with a job's bytes: its manifest from the start, its result.plist at the end
#             schema-N  (--schemas 10) the migrations up to N (the jobs inserted before N's, which moves them), and
#                       the node's ClaimJobs and CompleteJobs: opq_claim and opq_complete (schema 10 on), whose plans
#                       the server keeps per connection, each its own statement and commit; a version not yet among
#                       the migrations is its draft, prototype-NNNN.sql beside this script
#             schema-N-merged  the same, each round's claim and the previous round's completion in one statement
#                       and one commit (what a node sending its ends with its next claim would cost)
#   --running N: N more jobs, the first in claim order, held by a node that never ends them (other nodes' running
#   jobs, which a claim must not step over); each round: JOBS waiting jobs inserted (a real manifest, and a result.plist
#   of a `sleep 0` job at completion),
#   then CLIENTS pgbench clients claim BATCH at a time and complete them until none is left; the variants take turns,
#   ROUNDS times. Per variant and round: server CPU µs per job (this server's processes, from /proc), commits, WAL
#   bytes and HOT updates per job; then each round's ratios of server CPU, the last schema over the first and over
#   the floor, and their medians.

import argparse
import json
import os
import plistlib
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from opqueued import pin, psql, server_cpu, server_pids  # noqa: E402

SQL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "Sources", "ClusterStore", "SQL")

# What a schema variant claims with (wrapped so that pgbench keeps the ids and fences) and completes with: the
# functions of each schema version from FUNCTIONS's on.
CLAIM = """
SELECT id, requested_id, manifest, manifest_name, submitted_on, submitted_at, qos_rank, priority_rank, seq, fence, from_node,
       bytes, cancels
FROM {claim}('n' || :client_id, :batch, '{default}'::text[], '{}'::text[], :budget::bigint, :most::bigint)"""
COMPLETE = """
SELECT id FROM {complete}(:ids::text[], :fences::bigint[], array_fill('succeeded'::text, ARRAY[cardinality(:ids::text[])]),
                            array_fill((SELECT b FROM bench_result), ARRAY[cardinality(:ids::text[])])) AS c (id);"""
FUNCTIONS = {10: ("opq_claim", "opq_complete"), 11: ("opq_claim", "opq_complete"), 12: ("opq_claim", "opq_complete")}
# The jobs are inserted at the version before the one drained, whose migration then moves them (rows in flight); a
# version not yet among the migrations is its draft beside this script (prototype-NNNN.sql).
PROTOTYPE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prototype-{:04d}.sql")


# The floor (run.sh's): the bare claim and completion on a table of ids and states, one partial index, no payload.
FLOOR_TABLE = """
CREATE TABLE q (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, state text NOT NULL DEFAULT 'waiting',
                qos smallint NOT NULL DEFAULT 0, node text, fence bigint, payload bytea);
CREATE INDEX q_claimable ON q (qos DESC, id) WHERE state = 'waiting';
CREATE SEQUENCE fence;"""
FLOOR = """WITH c AS (SELECT id FROM q WHERE state = 'waiting' ORDER BY qos DESC, id FOR UPDATE SKIP LOCKED LIMIT :batch),
     u AS (UPDATE q SET state = 'running', node = 'n' || :client_id, fence = nextval('fence') FROM c WHERE q.id = c.id RETURNING q.id)
SELECT coalesce(array_agg(id), '{}')::text AS claimed FROM u \\gset
UPDATE q SET state = 'finished' WHERE id = ANY (:claimed::bigint[]) AND fence IS NOT NULL;
"""


# The floor with a job's bytes: the manifest in the row from the start, the result.plist written at completion.
FLOOR_ROWS = FLOOR.replace("SET state = 'finished'", "SET state = 'finished', result = (SELECT b FROM bench_result)")


def script(variant):
    if variant in ("floor", "floor-rows"):
        return FLOOR if variant == "floor" else FLOOR_ROWS
    claim, complete = FUNCTIONS[min(int(variant.split("-")[1]), max(FUNCTIONS))]
    claim_round = CLAIM.replace("{claim}", claim)
    if variant.endswith("-merged"):
        # The previous round's completion and this round's claim in one statement, one commit (ids and fences start
        # empty: pgbench -D).
        ended = COMPLETE.replace("{complete}", complete).strip().rstrip(";").replace("SELECT id FROM", "SELECT count(*) AS n FROM", 1)
        return ("\\set budget 67108864\n\\set most 1048576\n"
                f"SELECT coalesce(array_agg(x.id), '{{}}')::text AS ids, coalesce(array_agg(x.fence), '{{}}')::text AS fences "
                f"FROM ({ended}) AS e, LATERAL ({claim_round} WHERE e.n >= 0) AS x \\gset\n")
    return ("\\set budget 67108864\n\\set most 1048576\n"
            f"SELECT coalesce(array_agg(id), '{{}}')::text AS ids, coalesce(array_agg(fence), '{{}}')::text AS fences FROM ({claim_round}) AS x \\gset\n"
            + COMPLETE.replace("{complete}", complete).strip() + "\n")


def result_plist():
    """A `sleep 0` job's result.plist, as a node records it (1.3 kB)."""
    operation = {"attempts": 1, "durationSeconds": 0.000326, "finishedAt": 1795892723.440232, "id": "a", "kind": "sleep",
                 "outputs": [], "qualityOfService": "default", "queue": "default", "queuePriority": "normal",
                 "startedAt": 1795892723.439906, "state": "succeeded"}
    return plistlib.dumps({"durationSeconds": 0.004301, "finishedAt": 1795892723.444206, "job": "t000001",
                           "manifest": "t000001.plist", "node": "bench-n0", "operations": [operation],
                           "receivedAt": 1795892723.428686, "startedAt": 1795892723.439906, "status": "succeeded",
                           "submittedOn": "bench-n0"})


def make_database(admin, name, jobs, variant, running=0):
    psql(admin, "postgres", f"CREATE DATABASE {name}")
    if variant in ("floor", "floor-rows"):
        payload = "00" if variant == "floor" else plistlib.dumps(
            {"job": "t000001", "operations": [{"id": "a", "kind": "sleep", "seconds": 0}]}).hex()
        psql(admin, name, FLOOR_TABLE + "ALTER TABLE q ADD COLUMN result bytea; CREATE TABLE bench_result (b bytea);"
             f"INSERT INTO bench_result VALUES ('\\x{result_plist().hex()}');"
             f"INSERT INTO q (payload) SELECT '\\x{payload}'::bytea FROM generate_series(1, {jobs})")
        if running:
            psql(admin, name, f"UPDATE q SET state = 'running', node = 'ghost', fence = nextval('fence') WHERE id <= {running}")
        psql(admin, name, "VACUUM ANALYZE q")
        return
    url = urllib.parse.urlparse(admin)
    env = dict(os.environ, PGPASSWORD=url.password or "")
    version = int(variant.split("-")[1])  # schema-10-merged: 10
    files = sorted(f for f in os.listdir(SQL) if f.endswith(".up.sql") and int(f[:4]) < version)
    last = [os.path.join(SQL, f) for f in os.listdir(SQL) if f.endswith(".up.sql") and int(f[:4]) == version]
    def apply(path):
        subprocess.run(["psql", "-XAtq", "-v", "ON_ERROR_STOP=1", "-h", url.hostname, "-p", str(url.port), "-U", url.username,
                        "-d", name, "-f", path], env=env, check=True, capture_output=True)
    for f in files:
        apply(os.path.join(SQL, f))
    manifest = plistlib.dumps({"job": "t000001", "operations": [{"id": "a", "kind": "sleep", "seconds": 0}]}).hex()
    psql(admin, name, f"CREATE TABLE bench_result (b bytea); INSERT INTO bench_result VALUES ('\\x{result_plist().hex()}');"
         "INSERT INTO opq_jobs (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, "
         f"commands, submission_key) SELECT 't' || g, 't' || g, '\\x{manifest}'::bytea, 't' || g || '.plist', 'bench-n0', 2, 2, "
         "'{default}', '{}', 'bench-n0/t' || g || '/1795892723.428686' "
         f"FROM generate_series(1, {jobs}) AS g;"
         # From schema 11 on, a waiting job has its opq_live row too (migration 11 moves those inserted before it).
         "DO $$ BEGIN IF to_regclass('opq_live') IS NOT NULL THEN EXECUTE 'INSERT INTO opq_live (id, qos_rank, "
         "priority_rank, seq, queues, commands) SELECT id, qos_rank, priority_rank, seq, queues, commands FROM opq_jobs'"
         "; END IF; END $$;"
         # From schema 13 on, its opq_claimable row too (migration 13 moves those inserted before it).
         "DO $$ BEGIN IF to_regclass('opq_claimable') IS NOT NULL THEN EXECUTE 'INSERT INTO opq_claimable (qos_rank, "
         "priority_rank, seq, id, queues, commands) SELECT qos_rank, priority_rank, seq, id, queues, commands FROM opq_live'"
         "; END IF; END $$")
    apply(last[0] if last else PROTOTYPE.format(version))
    if running:
        table = "opq_jobs" if version < 11 else "opq_live"
        psql(admin, name, f"UPDATE {table} SET state = 'running', node = 'ghost', fence = nextval('opq_fence') "
             f"WHERE id IN (SELECT id FROM {table} ORDER BY seq LIMIT {running})")
        # From schema 13 a running job is not among the claimable ones (a claim deletes it there).
        psql(admin, name, "DO $$ BEGIN IF to_regclass('opq_claimable') IS NOT NULL THEN EXECUTE 'DELETE FROM opq_claimable "
             "WHERE id IN (SELECT id FROM opq_live WHERE state = ''running'')'; END IF; END $$")
    psql(admin, name, "VACUUM ANALYZE")


def hot_updates(admin, name, table):
    """The table's row updates so far, and how many of them were HOT (the new version on the row's page, no index entry)."""
    time.sleep(0.6)  # the backends' counts reach the statistics within a second
    row = psql(admin, name, f"SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = '{table}'")
    return [int(v) for v in row.split("|")]


def drain(args, variant, round_):
    name = f"bench_statements_{variant.replace('-', '_')}_{round_}"
    make_database(args.admin, name, args.jobs + args.running, variant, args.running)
    url = urllib.parse.urlparse(args.admin)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script(variant))
    try:
        psql(args.admin, "postgres", "CHECKPOINT")
        time.sleep(0.5)
        lsn = psql(args.admin, name, "SELECT pg_current_wal_lsn()")
        commits = int(psql(args.admin, "postgres", f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{name}'"))
        # The table a claim updates: from schema 11 on, opq_live (a job's state apart from its submission).
        table = "q" if variant.startswith("floor") else "opq_jobs" if int(variant.split("-")[1]) < 11 else "opq_live"
        updates = hot_updates(args.admin, name, table)
        cpu = server_cpu(args.admin)
        start = time.monotonic()
        # The last ones find nothing left. Merged, a client ends its claims only in its next round: a few more, and
        # a client that claimed more than its share may leave its last claim unended (`left`).
        rounds = args.jobs // (args.batch * args.clients) + (6 if variant.endswith("-merged") else 2)
        run = subprocess.run(["pgbench", "-n", "-M", args.protocol, "-h", url.hostname, "-p", str(url.port), "-U", url.username,
                              "-c", str(args.clients), "-j", str(args.clients), "-t", str(rounds), "-D", f"batch={args.batch}", "-D", "ids={}", "-D", "fences={}",
                              "-f", f.name, name], env=dict(os.environ, PGPASSWORD=url.password or ""), capture_output=True, text=True)
        seconds = time.monotonic() - start
        time.sleep(0.5)  # pgbench's backends reaped: their CPU is in the postmaster's count
        cpu = server_cpu(args.admin) - cpu
        if run.returncode != 0:
            raise SystemExit(f"pgbench ({variant}): {run.stderr[-600:]}")
        wal = int(psql(args.admin, name, f"SELECT pg_current_wal_lsn() - '{lsn}'::pg_lsn"))
        commits = int(psql(args.admin, "postgres", f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{name}'")) - commits
        updates = [after - before for after, before in zip(hot_updates(args.admin, name, table), updates)]
        left = int(psql(args.admin, name, f"SELECT count(*) FROM {table}" + ("" if table == "opq_live" else " WHERE state <> 'finished'")))
        figures = {"part": "statements", "variant": variant, "round": round_, "jobs": args.jobs, "running": args.running,
                   "left": left,
                   "clients": args.clients, "batch": args.batch, "protocol": args.protocol, "serverCpuUsPerJob": round(1e6 * cpu / args.jobs, 1),
                   "commitsPerJob": round(commits / args.jobs, 3), "walBytesPerJob": round(wal / args.jobs),
                   "jobRowUpdatesInPlace": f"{updates[1]} of {updates[0]}",
                   "jobsPerSecond": round(args.jobs / seconds)}
        print(json.dumps(figures), flush=True)
        return figures
    finally:
        os.unlink(f.name)
        psql(args.admin, "postgres", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--admin", required=True)
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=2, help="pgbench clients: nodes")
    parser.add_argument("--batch", type=int, default=20, help="jobs per claim (a node's rounds under load: about 20)")
    parser.add_argument("--protocol", default="extended", choices=["extended", "prepared"],
                        help="pgbench's: extended sends unnamed statements (as a node does), prepared named ones, parsed and "
                             "planned once per connection (what named statements would save)")
    parser.add_argument("--running", type=int, default=0, help="jobs held throughout by a node that never ends them")
    parser.add_argument("--rows", action="store_true", help="also the floor with a job's bytes (variant floor-rows)")
    parser.add_argument("--schemas", default="10,10-merged", help="the schema versions to drain, in turn")
    parser.add_argument("--pinned", action="store_true",
                        help="as in the scale model: the server on CPU 0, this script and pgbench on the other CPUs")
    args = parser.parse_args()
    if args.pinned:
        # Backends forked later by the pinned postmaster start on CPU 0 too; pgbench inherits this process's CPUs.
        pin(server_pids(args.admin), "0")
        os.sched_setaffinity(0, set(range(1, os.cpu_count())))
    schemas = [f"schema-{v}" for v in args.schemas.split(",")]  # 10-merged: a round's claim with the last one's ends
    ratios, floors = [], []
    for round_ in range(1, args.rounds + 1):
        floor = drain(args, "floor", round_)
        if args.rows:
            drain(args, "floor-rows", round_)
        drained = [drain(args, schema, round_) for schema in schemas]
        ratios.append(round(drained[-1]["serverCpuUsPerJob"] / drained[0]["serverCpuUsPerJob"], 2))
        floors.append(round(drained[-1]["serverCpuUsPerJob"] / floor["serverCpuUsPerJob"], 2))
    print(json.dumps({"part": "statements-ratio", "of": f"server CPU per job, {schemas[-1]} / {schemas[0]}, round by round",
                      "rounds": ratios, "median": statistics.median(ratios)}), flush=True)
    print(json.dumps({"part": "statements-ratio", "of": f"server CPU per job, {schemas[-1]} / the floor, round by round",
                      "rounds": floors, "median": statistics.median(floors)}), flush=True)
    if args.pinned:
        pin(server_pids(args.admin), f"0-{os.cpu_count() - 1}")


if __name__ == "__main__":
    sys.exit(main())
