#!/usr/bin/env python3
# The beat part of the cluster benchmark (Benchmarks/cluster/run.sh beat): what one node's heartbeat costs the server
# as the backlog grows. Since schema 13 no index finds a node's running jobs (a claim writes no index entry), so the
# full beat (Heartbeat) reads every live job; the beat by ids (HeartbeatHeld, what a node sends while nothing may have
# given it a job it does not know of) finds the node's jobs by their primary key. Both are taken from queries.sql,
# their parameters written in, and sent by pgbench (extended protocol, as the node does) BEATS times each, in turns,
# against the schema migrated to the newest version with WAITING jobs waiting and RUNNING held by the node.
# Per backlog: each statement's mean latency and server CPU per beat, and full ÷ by ids.

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from opqueued import psql, server_cpu  # noqa: E402
from statements import SQL, make_database  # noqa: E402


def named_query(name):
    """The statement `-- name: NAME` of queries.sql, its comments dropped."""
    text = open(os.path.join(SQL, "queries.sql")).read()
    block = text.split(f"-- name: {name}\n", 1)[1].split("-- name: ", 1)[0]
    return "\n".join(line for line in block.splitlines() if not line.startswith("--")).strip()


def newest_schema():
    return max(int(f[:4]) for f in os.listdir(SQL) if re.match(r"^\d{4}_.*\.up\.sql$", f))


def run_beats(args, database, sql):
    """pgbench sends `sql` BEATS times on one connection: (mean ms, server CPU µs a beat)."""
    url = urllib.parse.urlparse(args.admin)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(sql.replace("\n", " ") + "\n")
    try:
        cpu = server_cpu(args.admin)
        run = subprocess.run(["pgbench", "-n", "-M", "extended", "-h", url.hostname, "-p", str(url.port), "-U", url.username,
                              "-c", "1", "-t", str(args.beats), "-f", f.name, database],
                             env=dict(os.environ, PGPASSWORD=url.password or ""), capture_output=True, text=True)
        time.sleep(0.5)  # pgbench's backend reaped: its CPU is in the postmaster's count
        cpu = server_cpu(args.admin) - cpu
        if run.returncode != 0:
            raise SystemExit(f"pgbench: {run.stderr[-600:]}")
        latency = float(re.search(r"latency average = ([\d.]+) ms", run.stdout).group(1))
        return latency, 1e6 * cpu / args.beats
    finally:
        os.unlink(f.name)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--admin", required=True)
    parser.add_argument("--waiting", default="100000,1000000", help="backlogs to measure, comma-separated")
    parser.add_argument("--running", type=int, default=20, help="jobs the beating node holds")
    parser.add_argument("--beats", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    version = newest_schema()
    for waiting in (int(w) for w in args.waiting.split(",")):
        name = f"bench_beat_{waiting}"
        make_database(args.admin, name, waiting + args.running, f"schema-{version}", args.running)
        try:
            psql(args.admin, name, "INSERT INTO opq_nodes (node, queues, commands, job_slots) VALUES ('ghost', '{default}', '{}', 64)")
            held = psql(args.admin, name, "SELECT string_agg(id, ',') FROM opq_live WHERE node = 'ghost'")
            binds = {"$1": "'ghost'", "$2": "''", "$3": "NULL", "$4": "'{" + held + "}'"}
            statements = {}
            for statement in ("Heartbeat", "HeartbeatHeld"):
                sql = named_query(statement)
                for key in sorted(binds, reverse=True):
                    sql = sql.replace(key, binds[key])
                statements[statement] = sql
            for round_ in range(1, args.rounds + 1):
                figures = {"part": "beat", "schema": version, "waiting": waiting, "running": args.running, "round": round_}
                for statement, sql in statements.items():
                    ms, cpu = run_beats(args, name, sql)
                    figures[statement] = {"ms": round(ms, 3), "serverCpuUsPerBeat": round(cpu)}
                figures["fullOverByIds"] = round(figures["Heartbeat"]["ms"] / figures["HeartbeatHeld"]["ms"], 1)
                print(json.dumps(figures), flush=True)
        finally:
            psql(args.admin, "postgres", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


if __name__ == "__main__":
    main()
