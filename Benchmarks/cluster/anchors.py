#!/usr/bin/env python3
# The anchors of the cluster benchmark (issue 17): the same trivial work through PGQueuer and Procrastinate on the
# server Benchmarks/cluster/run.sh started, so that opqueued's figures stand beside theirs from the same run.
#
#   anchors.py throughput SYSTEM --dsn DSN --jobs N --workers W   jobs already in the database, no-op, W worker
#                                                                 processes: jobs/s and commits per job
#   anchors.py latency SYSTEM --dsn DSN --samples N                enqueue -> start on an idle worker: p50/p99 ms
#   anchors.py worker SYSTEM --dsn DSN --mode drain|latency --go FILE --out FILE   (internal: one worker process)
#
# `throughput pgqueuer --files DIR` runs jobs that do, each, the file work opqueued does for a job already in the
# database, with the same durability: the manifest (its payload, the bench's trivial manifest) written into
# DIR/active/<id>/, result.plist written and fsynced, the folder renamed into DIR/outbox/, that rename fsynced — in a
# thread (asyncio.to_thread), so that the jobs of a batch overlap their syncs. opqueued groups its syncs (one syncfs
# for every job that waits); a PGQueuer job cannot, as its completion is recorded after the job function returns.
#
# SYSTEM is pgqueuer or procrastinate. Each run gets a fresh database (dropped and created through --admin, the
# throwaway server's superuser), the system's own schema installed, its defaults otherwise (one asyncpg connection and
# batch_size 10 for PGQueuer; concurrency 1 and LISTEN/NOTIFY for Procrastinate). The clock starts when every worker
# process is connected and waiting, so interpreter start-up is not counted.

import argparse
import asyncio
import json
import os
import plistlib
import statistics
import subprocess
import sys
import time

import psycopg


def commits(admin_dsn, database):
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        return c.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database,)).fetchone()[0]


def reset_database(admin_dsn, database):
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{database}"')


def fresh_install(args, database):
    """A new database with the system's schema in it; returns its DSN and the system's enqueue function."""
    install, enqueue, _ = SYSTEMS[args.system]
    reset_database(args.admin, database)
    dsn = dsn_for(args.base, database)
    asyncio.run(install(dsn))
    return dsn, enqueue


# --- PGQueuer -----------------------------------------------------------------------------------------------------

async def pgqueuer_install(dsn):
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries
    connection = await asyncpg.connect(dsn)
    await Queries(AsyncpgDriver(connection)).install()
    await connection.close()


# What each job carries with --files: the trivial manifest opqueued's benchmark submits (Benchmarks/cluster/opqueued.py).
MANIFEST = plistlib.dumps({"job": "j", "operations": [{"id": "a", "kind": "sleep", "seconds": 0}]})
RESULT = plistlib.dumps({"job": "j", "status": "succeeded", "operations": [{"id": "a", "state": "succeeded", "attempts": 1}]})


def spool_work(root, job, manifest):
    """One job's file work, as opqueued's: active/<job>/ with its manifest and a durable result.plist, then the
    folder renamed into outbox/ and the rename made durable."""
    folder = f"{root}/active/{job}"
    os.mkdir(folder)
    with open(f"{folder}/manifest.plist", "wb") as f:
        f.write(manifest)
    fd = os.open(f"{folder}/result.plist", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, RESULT)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(folder, f"{root}/outbox/{job}")
    fd = os.open(f"{root}/outbox", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def pgqueuer_enqueue(dsn, n, samples=0, payload=None):
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries
    connection = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(connection))
    for start in range(0, n, 1000):
        k = min(1000, n - start)
        await queries.enqueue(["noop"] * k, [payload] * k, [0] * k)
    # Latency samples: one job at a time on the open connection, stamped just before the insert.
    for _ in range(samples):
        await queries.enqueue("noop", str(time.time()).encode())
        await asyncio.sleep(0.05)
    await connection.close()


async def pgqueuer_worker(dsn, mode, go, out, files=None):
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode
    connection = await asyncpg.connect(dsn)
    manager = QueueManager(Queries(AsyncpgDriver(connection)))
    delays = []

    @manager.entrypoint("noop")
    async def noop(job):
        if files:
            await asyncio.to_thread(spool_work, files, job.id, job.payload)
        elif mode == "latency" and job.payload:
            delays.append(time.time() - float(job.payload.decode()))
            with open(out, "a") as f:
                f.write(f"{delays[-1]}\n")

    open(go + ".ready." + str(os.getpid()), "w").close()
    while not os.path.exists(go):
        await asyncio.sleep(0.005)
    execution = QueueExecutionMode.drain if mode == "drain" else QueueExecutionMode.continuous
    await manager.run(mode=execution)


# --- Procrastinate ------------------------------------------------------------------------------------------------

def procrastinate_app(dsn):
    import procrastinate
    import logging
    logging.getLogger("procrastinate").setLevel(logging.ERROR)  # its warning about an App in __main__, per process
    return procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))


async def procrastinate_install(dsn):
    app = procrastinate_app(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def procrastinate_enqueue(dsn, n, samples=0):
    app = procrastinate_app(dsn)

    @app.task(name="noop")
    async def noop(sent=None):
        pass

    async with app.open_async():
        for start in range(0, n, 1000):
            k = min(1000, n - start)
            await noop.batch_defer_async(*([{}] * k))
        for _ in range(samples):
            await noop.defer_async(sent=str(time.time()))
            await asyncio.sleep(0.05)


async def procrastinate_worker(dsn, mode, go, out):
    app = procrastinate_app(dsn)

    @app.task(name="noop")
    async def noop(sent=None):
        if mode == "latency" and sent is not None:
            with open(out, "a") as f:
                f.write(f"{time.time() - float(sent)}\n")

    async with app.open_async():
        open(go + ".ready." + str(os.getpid()), "w").close()
        while not os.path.exists(go):
            await asyncio.sleep(0.005)
        await app.run_worker_async(wait=(mode != "drain"), install_signal_handlers=(mode != "drain"))


# Jobs not done after a run (a run that did nothing must not look fast).
LEFT = {
    "pgqueuer": "SELECT count(*) FROM pgqueuer",
    "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'",
}

SYSTEMS = {
    "pgqueuer": (pgqueuer_install, pgqueuer_enqueue, pgqueuer_worker),
    "procrastinate": (procrastinate_install, procrastinate_enqueue, procrastinate_worker),
}


def dsn_for(base, database):
    # base: postgresql://user:password@host:port  (no database)
    return f"{base}/{database}"


def start_workers(system, dsn, mode, count, go, out, files=None):
    procs = [subprocess.Popen([sys.executable, __file__, "worker", system, "--dsn", dsn, "--mode", mode, "--go", go, "--out", out]
                              + (["--files", files] if files else []),
                              stdout=subprocess.DEVNULL, stderr=open(go + ".err", "a")) for _ in range(count)]
    deadline = time.time() + 60
    while time.time() < deadline:
        ready = [p for p in procs if os.path.exists(go + ".ready." + str(p.pid))]
        if len(ready) == count:
            return procs
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.01)
    for p in procs:
        p.kill()
    raise SystemExit(f"{system} workers did not start; see {go}.err")


def throughput(args):
    database = f"anchor_{args.system}"
    dsn, enqueue = fresh_install(args, database)
    if args.files:
        if args.system != "pgqueuer":
            raise SystemExit("--files: pgqueuer only")
        for sub in ("active", "outbox"):
            os.makedirs(f"{args.files}/{sub}", exist_ok=True)
        asyncio.run(enqueue(dsn, args.jobs, payload=MANIFEST))
    else:
        asyncio.run(enqueue(dsn, args.jobs))
    go = f"{args.work}/go-{args.system}-{args.workers}"
    procs = start_workers(args.system, dsn, "drain", args.workers, go, "/dev/null", files=args.files)
    time.sleep(1.1)  # let the backends' statistics of the set-up reach pg_stat_database
    before = commits(args.admin, database)
    start = time.monotonic()
    open(go, "w").close()
    for p in procs:
        p.wait()
    elapsed = time.monotonic() - start
    time.sleep(1.1)
    after = commits(args.admin, database)
    with psycopg.connect(dsn, autocommit=True) as c:
        left = c.execute(LEFT[args.system]).fetchone()[0]
    if left or any(p.returncode for p in procs):
        raise SystemExit(f"{args.system}: {left} jobs left, worker exits {[p.returncode for p in procs]}; see {go}.err")
    if args.files:
        placed = len(os.listdir(f"{args.files}/outbox"))
        if placed != args.jobs:
            raise SystemExit(f"{args.system}: {placed} outbox folders for {args.jobs} jobs; see {go}.err")
    print(json.dumps({"system": args.system, "workers": args.workers, "jobs": args.jobs, "seconds": round(elapsed, 3),
                      "jobsPerSecond": round(args.jobs / elapsed, 1),
                      "commitsPerJob": round((after - before) / args.jobs, 3),
                      "includes": "claim -> active/ folder, manifest, result.plist fsynced -> outbox rename fsynced -> completion"
                      if args.files else "claim -> no-op -> completion"}))


def latency(args):
    dsn, enqueue = fresh_install(args, f"anchor_{args.system}_latency")
    go = f"{args.work}/go-{args.system}-latency"
    out = f"{args.work}/latency-{args.system}.txt"
    if os.path.exists(out):
        os.unlink(out)
    procs = start_workers(args.system, dsn, "latency", 1, go, out)
    open(go, "w").close()
    time.sleep(2)  # the worker is listening and idle
    asyncio.run(enqueue(dsn, 0, samples=args.samples))
    deadline = time.time() + 30
    while time.time() < deadline:
        if os.path.exists(out) and len(open(out).read().split()) >= args.samples:
            break
        time.sleep(0.1)
    for p in procs:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
    delays = sorted(float(x) * 1000 for x in open(out).read().split()) if os.path.exists(out) else []
    if not delays:
        raise SystemExit(f"{args.system}: no job started; see {go}.err")
    p99 = delays[min(len(delays) - 1, int(len(delays) * 0.99))]
    print(json.dumps({"system": args.system, "samples": len(delays), "p50ms": round(statistics.median(delays), 2),
                      "p99ms": round(p99, 2)}))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["throughput", "latency", "worker"])
    parser.add_argument("system", choices=sorted(SYSTEMS))
    parser.add_argument("--dsn")
    parser.add_argument("--base", help="postgresql://user:password@host:port (no database)")
    parser.add_argument("--admin", help="a DSN that may create databases and read pg_stat_database")
    parser.add_argument("--work", default="/tmp")
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--mode", default="drain")
    parser.add_argument("--go")
    parser.add_argument("--out")
    parser.add_argument("--files", help="each job does opqueued's file work in this folder (pgqueuer only)")
    args = parser.parse_args()
    if args.action == "worker":
        if args.files:
            asyncio.run(SYSTEMS[args.system][2](args.dsn, args.mode, args.go, args.out, files=args.files))
        else:
            asyncio.run(SYSTEMS[args.system][2](args.dsn, args.mode, args.go, args.out))
    elif args.action == "throughput":
        throughput(args)
    else:
        latency(args)


if __name__ == "__main__":
    main()
