#!/usr/bin/env python3
# The opqueued part of the cluster benchmark (Benchmarks/cluster/run.sh opqueued), on the server run.sh started:
#
#   throughput  the file spool alone (no cluster: today's single-node figure), then 1 and 2 nodes; JOBS single-`sleep 0` manifests written hidden into node A's inbox, then renamed in
#               (the clock starts at the first rename and stops when the last outbox entry appears on any node);
#               commits per job from pg_stat_database.xact_commit over the same span (inserts, claims,
#               heartbeats, completions: everything the nodes did)
#   store       opqueued's database part alone (opqueue-bench store): the ClaimJobs and CompleteJobs statements a
#               node sends for jobs already in the database, from 1 and 2 workers, nothing between claim and
#               completion: what PGQueuer's and Procrastinate's no-op figures measure
#   pickup      an idle 2-node cluster, a queue declared on node B only: manifest renamed into node A's inbox ->
#               its operation's startedAt in B's result.plist; SAMPLES samples, p50/p99
#   takeover    kill -9 of the node running a 4 s job -> the operation's startedAt on the other node
#
# Nodes log in as a role with only the README's GRANTs (CONNECT; USAGE, CREATE on public), through a password
# file, with full durability (the server's fsync on, the spool's own fsyncs). Prints one JSON line per figure.
# They log to a file each (`--log-target console`); `--log-target journal` sends their entries to journald, as a
# node under systemd does (journald must be listening; its CPU then counts in machineBusy, not in the nodes').

import argparse
import json
import os
import plistlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import urllib.parse


def psql_command(admin, database):
    """psql's arguments and environment for `database` on the run's server, as its administrator."""
    url = urllib.parse.urlparse(admin)
    return (["psql", "-XAtq", "-v", "ON_ERROR_STOP=1", "-h", url.hostname, "-p", str(url.port), "-U", url.username,
             "-d", database], dict(os.environ, PGPASSWORD=url.password or ""))


def psql(admin, database, sql):
    command, env = psql_command(admin, database)
    return subprocess.run(command + ["-c", sql], env=env, check=True, capture_output=True, text=True).stdout.strip()


class psql_session:
    """One psql connection that runs `sql` and stays open until `close`, which returns the CPU seconds its backend
    spent on it (read while the backend lives: once it ends, the postmaster counts it as a reaped child)."""

    def __init__(self, admin, database, sql):
        command, env = psql_command(admin, database)
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.backend = int(self.ask("SELECT pg_backend_pid();"))
        before = cpu_seconds(self.backend)
        self.process.stdin.write(sql + "\n")
        self.ask("SELECT 'done';")
        self.spent = cpu_seconds(self.backend) - before

    def ask(self, sql):
        self.process.stdin.write(sql + "\n")
        self.process.stdin.flush()
        while True:  # past the empty lines of statements that return nothing (pg_notify)
            line = self.process.stdout.readline()
            if not line:
                raise SystemExit(f"psql failed (exit {self.process.wait()})")
            if line.strip():
                return line.strip()

    def close(self):
        self.process.stdin.close()
        if self.process.wait() != 0:
            raise SystemExit(f"psql failed (exit {self.process.returncode})")
        return self.spent


def commits(admin, database):
    return int(psql(admin, "postgres", f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{database}'"))


# Spools are removed when the whole run ends, never between parts. This machine's root file system is ext4 without a
# journal, where allocating an inode skips every inode of its group freed in the last 1-6 minutes, reading each one's
# inode-table block to see when (fs/ext4/ialloc.c, recently_deleted): after a part removed 30,000 files, the next
# part's nodes spent over a third of their CPU in mkdir and open. Removing them at the end keeps every part alike.
SPENT = []


class Cluster:
    def __init__(self, args, count, lease=15, settings=lambda k: {}, cluster=True):
        self.args = args
        url = urllib.parse.urlparse(args.admin)
        self.port = url.port
        self.folder = tempfile.mkdtemp(prefix="opq-bench-cluster-")
        tag = uuid.uuid4().hex[:8]
        self.cluster = cluster
        self.database = f"bench_{tag}"
        self.role = f"bench_{tag}"
        self.nodes = []
        apart = [f for f in os.environ.get("BENCH_NODE_FOLDERS", "").split(":") if f]
        if cluster:
            self.make_database(tag)
        for k in range(count):
            name = f"{tag}-n{k}"
            # BENCH_FS=apart: node k's spool on file system k of its own.
            holder = tempfile.mkdtemp(prefix="opq-bench-node-", dir=apart[k]) if k < len(apart) else self.folder
            spool = os.path.join(holder, name)
            os.makedirs(spool + "/inbox")
            configuration = dict(settings(k))
            if cluster:
                configuration["cluster"] = {
                    "database": f"postgresql://{self.role}@127.0.0.1:{self.port}/{self.database}?sslmode=disable",
                    "passwordFile": self.password_file, "node": name, "leaseSeconds": lease}
            with open(spool + ".plist", "wb") as f:
                plistlib.dump(configuration, f)
            self.nodes.append({"name": name, "spool": spool, "config": spool + ".plist", "log": spool + ".log", "process": None})
        for k in range(count):
            self.start(k)
        for k in range(count):
            self.wait_ready(k)

    def make_database(self, tag):
        args = self.args
        password = f"pw-{uuid.uuid4().hex}"
        psql(args.admin, "postgres", f"CREATE ROLE {self.role} LOGIN PASSWORD '{password}'")
        psql(args.admin, "postgres", f"CREATE DATABASE {self.database}")
        psql(args.admin, "postgres", f"REVOKE ALL ON DATABASE {self.database} FROM PUBLIC")
        psql(args.admin, "postgres", f"GRANT CONNECT ON DATABASE {self.database} TO {self.role}")
        psql(args.admin, self.database, "REVOKE ALL ON SCHEMA public FROM PUBLIC")
        psql(args.admin, self.database, f"GRANT USAGE, CREATE ON SCHEMA public TO {self.role}")
        self.password_file = os.path.join(self.folder, "password")
        with open(self.password_file, "w") as f:
            f.write(password + "\n")
        os.chmod(self.password_file, 0o600)

    def start(self, k):
        node = self.nodes[k]
        log = open(node["log"], "a")
        node["process"] = subprocess.Popen([self.args.bin + "/opqueued", "--spool", node["spool"], "--config", node["config"],
                                            "--log-target", self.args.log_target], stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    def wait_ready(self, k, timeout=60):
        node = self.nodes[k]
        deadline = time.time() + timeout
        while time.time() < deadline:
            if node["process"].poll() is not None:
                break
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(node["spool"] + "/opqueued.sock")
                return
            except OSError:
                time.sleep(0.05)
            finally:
                s.close()
        with open(node["log"]) as f:
            tail = f.read()[-600:]
        self.close()
        raise SystemExit(f"node {node['name']} not ready (exit {node['process'].poll()}); its log ends: {tail}")

    def kill9(self, k):
        process = self.nodes[k]["process"]
        process.kill()
        process.wait()

    def outbox(self, k):
        try:
            return [x for x in os.listdir(self.nodes[k]["spool"] + "/outbox") if not x.startswith(".")]
        except FileNotFoundError:
            return []

    def outbox_count(self, k):
        """How many entries node k's outbox holds, from the folder's link count (each entry is a folder: 2 + one per
        entry), so that polling costs the nodes measured nothing; listed when the count is unknown (ext4 sets 1 past
        65,000 sub-folders)."""
        try:
            links = os.stat(self.nodes[k]["spool"] + "/outbox").st_nlink
        except FileNotFoundError:
            return 0
        return links - 2 if links >= 2 else len(self.outbox(k))

    def cpu(self):
        """CPU seconds used so far by the nodes (in user space, in the kernel) and by this run's server (server_cpu)."""
        nodes = [n["process"].pid for n in self.nodes if n["process"]]
        server = server_cpu(self.args.admin)
        return (sum(cpu_seconds(p, "user") for p in nodes), sum(cpu_seconds(p, "system") for p in nodes), server,
                machine_ticks())

    def result(self, k, job):
        try:
            with open(f"{self.nodes[k]['spool']}/outbox/{job}/result.plist", "rb") as f:
                return plistlib.load(f)
        except (FileNotFoundError, plistlib.InvalidFileException):
            return None

    def close(self):
        for node in self.nodes:
            if node["process"] and node["process"].poll() is None:
                node["process"].send_signal(signal.SIGTERM)
        for node in self.nodes:
            if node["process"]:
                try:
                    node["process"].wait(30)
                except subprocess.TimeoutExpired:
                    node["process"].kill()
        if os.environ.get("OPQ_KEEP"):
            print(f"kept {self.folder} (OPQ_KEEP)", file=sys.stderr)
        else:
            SPENT.append(self.folder)
            SPENT.extend(os.path.dirname(n["spool"]) for n in self.nodes if os.path.dirname(n["spool"]) != self.folder)
        if not self.cluster:
            return
        psql(self.args.admin, "postgres", f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")
        psql(self.args.admin, "postgres", f"DROP ROLE IF EXISTS {self.role}")


def cpu_seconds(pid, kind="both"):
    """A process's CPU seconds so far: user, system or both."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = {"user": int(fields[11]), "system": int(fields[12])}
        return (ticks["user"] + ticks["system"] if kind == "both" else ticks[kind]) / os.sysconf("SC_CLK_TCK")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0.0


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def machine_ticks():
    """The whole machine's busy and total clock ticks so far (/proc/stat's first line; iowait counts as idle)."""
    with open("/proc/stat") as f:
        ticks = [int(t) for t in f.readline().split()[1:9]]  # user … steal (guest time is inside user)
    idle = ticks[3] + ticks[4]
    return sum(ticks) - idle, sum(ticks)


def busy_while_idle(seconds):
    """How busy the machine is over `seconds` while the nodes wait for a part to begin (they are idle then): near 0 on
    a quiet machine; more says something else ran beside the part's set-up, and its figures may be disturbed."""
    before = machine_ticks()
    time.sleep(seconds)
    after = machine_ticks()
    busy = round((after[0] - before[0]) / max(after[1] - before[1], 1), 2)
    if busy > 0.1:
        # A process left running (a busy loop of an earlier experiment) skews every figure that follows.
        print(f"warning: the machine was {busy:.0%} busy while the nodes idled: the figures of this part are disturbed; "
              f"busiest now: {busiest()}", file=sys.stderr, flush=True)
    return busy


def busiest():
    """The three processes with the most CPU over their lifetimes, as ps shows them: who disturbed a part."""
    ps = subprocess.run(["ps", "-eo", "pid,pcpu,comm", "--sort=-pcpu", "--no-headers"], capture_output=True, text=True)
    return "; ".join(" ".join(line.split()) for line in ps.stdout.splitlines()[:3])


def cpu_per_job(before, after, done):
    """ms of CPU per job over a part's measured span: the nodes' in user space and in the kernel (file system work,
    which on a journal-less ext4 grows with the files removed in the last minutes), and the server's; and how busy
    the whole machine was (1.0: every core all the time), which says whether a part was bound by CPU."""
    per_job = [round(1000 * (a - b) / max(done, 1), 3) for a, b in zip(after[:3], before[:3])]
    busy = (after[3][0] - before[3][0]) / max(after[3][1] - before[3][1], 1)
    return {"nodeUserCpuMsPerJob": per_job[0], "nodeKernelCpuMsPerJob": per_job[1], "serverCpuMsPerJob": per_job[2],
            "machineBusy": round(busy, 2)}


def manifest(job, queue=None):
    operation = {"id": "a", "kind": "sleep", "seconds": 0}
    if queue:
        operation["queue"] = queue
    return plistlib.dumps({"job": job, "operations": [operation]})


def timeline(cluster, count, elapsed):
    """TIMELINE=1: where the jobs are, for finding what holds a part up (it lists node 0's inbox and asks the
    server, which costs the nodes measured: never with figures meant to be kept)."""
    def entries(folder):
        try:
            return len(os.listdir(cluster.nodes[0]["spool"] + folder))
        except FileNotFoundError:
            return 0
    rows = psql(cluster.args.admin, cluster.database, "SELECT string_agg(state || '=' || n, ' ' ORDER BY state) FROM "
                "(SELECT state, count(*) AS n FROM opq_job_states GROUP BY state) AS s") if cluster.cluster else ""
    print(f"t={elapsed:.2f} s: node 0 inbox {entries('/inbox')}, active/.submissions {entries('/active/.submissions')}; "
          f"rows {rows or '-'}; outboxes {[cluster.outbox_count(k) for k in range(count)]}", flush=True)


def wait_for_outboxes(cluster, count, jobs, start):
    """Polls every node's outbox until `jobs` entries (or 600 s); returns how many and the seconds since `start`.
    Every 50 ms, by the outbox folders' link counts (a stat each: listing 10,000 entries as often would take a
    tenth of a core from the nodes measured)."""
    done = 0
    shown = 0
    while time.monotonic() < start + 600:
        done = sum(cluster.outbox_count(k) for k in range(count))
        if done >= jobs:
            break
        if os.environ.get("TIMELINE") and time.monotonic() - shown >= 0.25:
            shown = time.monotonic()
            timeline(cluster, count, shown - start)
        time.sleep(0.05)
    return done, time.monotonic() - start


def throughput(args, count, with_cluster=True, limit=None):
    """`limit`: every job's operation on queue `api`, limited to `limit` at once cluster-wide (and on each node)."""
    settings = {"maxActiveJobs": args.active_jobs}
    if limit:
        settings["queues"] = {"api": {"maxConcurrentOperationCount": limit, "clusterMaxConcurrentOperationCount": limit}}
    cluster = Cluster(args, count, settings=lambda k: settings, cluster=with_cluster)
    try:
        inbox = cluster.nodes[0]["spool"] + "/inbox"
        names = [f"t{i:06d}" for i in range(args.jobs)]
        for name in names:
            with open(f"{inbox}/.{name}.plist", "wb") as f:
                f.write(manifest(name, "api" if limit else None))
        time.sleep(0.6)
        quiet = busy_while_idle(0.5)
        before = commits(args.admin, cluster.database) if with_cluster else 0
        cpu_before = cluster.cpu()
        start = time.monotonic()
        for name in names:
            os.rename(f"{inbox}/.{name}.plist", f"{inbox}/{name}.plist")
        done, elapsed = wait_for_outboxes(cluster, count, args.jobs, start)
        cpu = cpu_per_job(cpu_before, cluster.cpu(), done)
        time.sleep(1.1)
        after = commits(args.admin, cluster.database) if with_cluster else 0
        per_node = [len(cluster.outbox(k)) for k in range(count)]
        part = "opqueued-cluster-limit" if limit else "opqueued" if with_cluster else "opqueued-spool-alone"
        print(json.dumps({"part": part, "nodes": count, "limit": limit, "jobs": args.jobs, "ended": done, "perNode": per_node,
                          "seconds": round(elapsed, 3), "jobsPerSecond": round(done / elapsed, 1),
                          "commitsPerJob": round((after - before) / max(done, 1), 3) if with_cluster else None, **cpu,
                          "busyBefore": quiet,
                          "includes": ("inbox rename -> validate -> insert -> claim -> run -> publish, fsyncs on" if with_cluster
                                       else "inbox rename -> claim -> validate -> run -> publish, fsyncs on")}), flush=True)
        return done / elapsed
    finally:
        cluster.close()


def already_in_database(args, count=2, pinned=False):
    """No-op jobs already in the database (as PGQueuer's and Procrastinate's figures are), run by `count` nodes:
    one INSERT of args.jobs rows (analysed, its server CPU left out and given apart as insertCpuMsPerJob) and one
    NOTIFY, the clock from that commit to the last outbox entry. `pinned`: the
    scale model (part `scale`): every postgres process on CPU 0, the nodes on the others; returns the figures."""
    if pinned:
        pin(server_pids(args.admin), "0")
    cluster = Cluster(args, count, settings=lambda k: {"maxActiveJobs": args.active_jobs})
    try:
        if pinned:
            pin([n["process"].pid for n in cluster.nodes], f"1-{os.cpu_count() - 1}")
            pin(server_pids(args.admin), "0")  # the nodes' backends, forked by the pinned postmaster: already there
        time.sleep(2.5)  # migrated and registered
        quiet = busy_while_idle(0.5)
        body = plistlib.dumps({"operations": [{"id": "a", "kind": "sleep", "seconds": 0}]}).hex()
        before = commits(args.admin, cluster.database)
        cpu_before = cluster.cpu()
        start = time.monotonic()
        inserting = psql_session(args.admin, cluster.database,
             "INSERT INTO opq_jobs (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands) "
             f"SELECT 'd' || g, 'd' || g, '\\x{body}'::bytea, 'd' || g || '.plist', 'bench', 2, 2, '{{default}}', '{{}}' "
             f"FROM generate_series(1, {args.jobs}) g; "
             # From schema 11, a job's state in opq_live, as the node's insert makes it (a build of 10 has none).
             "DO $$ BEGIN IF to_regclass('opq_live') IS NOT NULL THEN EXECUTE 'INSERT INTO opq_live (id, qos_rank, "
             "priority_rank, seq, queues, commands) SELECT id, qos_rank, priority_rank, seq, queues, commands FROM opq_jobs'"
             "; END IF; END $$; "
             # From schema 13, a job claimable now has its opq_claimable row too.
             "DO $$ BEGIN IF to_regclass('opq_claimable') IS NOT NULL THEN EXECUTE 'INSERT INTO opq_claimable (qos_rank, "
             "priority_rank, seq, id, queues, commands) SELECT qos_rank, priority_rank, seq, id, queues, commands FROM opq_live'"
             "; END IF; END $$; "
             # Analysed, as tables that held their jobs a while would be: else autovacuum's first ANALYZE of the new
             # rows falls inside the part and is counted as the nodes' work.
             "ANALYZE opq_jobs; DO $$ BEGIN IF to_regclass('opq_live') IS NOT NULL THEN ANALYZE opq_live; END IF; "
             "IF to_regclass('opq_claimable') IS NOT NULL THEN ANALYZE opq_claimable; END IF; END $$; "
             "SELECT pg_notify('opqueued', 'jobs');")
        done, elapsed = wait_for_outboxes(cluster, count, args.jobs, start)
        # The INSERT is the benchmark's, not the nodes': its backend's CPU is left out of the server's.
        cpu_after = cluster.cpu()
        insert_cpu = inserting.close()
        cpu = cpu_per_job(cpu_before, (*cpu_after[:2], cpu_after[2] - insert_cpu, cpu_after[3]), done)
        cpu["insertCpuMsPerJob"] = round(1000 * insert_cpu / max(done, 1), 3)
        time.sleep(1.1)
        after = commits(args.admin, cluster.database)
        figures = {"part": "opqueued-scale" if pinned else "opqueued-already-in-database", "nodes": count, "jobs": args.jobs,
                   "ended": done, **cpu, "busyBefore": quiet, "perNode": [len(cluster.outbox(k)) for k in range(count)],
                   "seconds": round(elapsed, 3), "jobsPerSecond": round(done / elapsed, 1),
                   "commitsPerJob": round((after - before - 1) / max(done, 1), 3),
                   "includes": "claim -> active/ copy -> validate -> run -> result.plist -> fenced completion -> outbox, fsyncs on"}
        if pinned:
            # The server's one core: how busy over the part, and per 1,000 jobs a second (its CPU ms per job).
            figures["serverCoreBusy"] = round(cpu["serverCpuMsPerJob"] * done / 1000 / elapsed, 3)
            figures["serverCoreBusyPer1000JobsPerSecond"] = round(cpu["serverCpuMsPerJob"], 3)
        print(json.dumps(figures), flush=True)
        return figures
    finally:
        cluster.close()
        if pinned:
            pin(server_pids(args.admin), f"0-{os.cpu_count() - 1}")


def postmaster(admin):
    """The pid of this run's server, from its data directory's postmaster.pid (other servers on the machine, such as
    tests' throwaway ones, are not counted)."""
    with open(os.path.join(psql(admin, "postgres", "SHOW data_directory"), "postmaster.pid")) as f:
        return int(f.readline())


def server_pids(admin):
    """The run's server's processes: the postmaster and its children."""
    master = POSTMASTER[admin] if admin in POSTMASTER else POSTMASTER.setdefault(admin, postmaster(admin))
    return [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and comm(pid) == "postgres"
            and (int(pid) == master or parent(pid) == master)]


POSTMASTER = {}


def parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def server_cpu(admin):
    """CPU seconds so far of this run's server: its live processes, and through the postmaster's counts of its reaped
    children those that ended (autovacuum workers, the connections of psql)."""
    master = POSTMASTER[admin] if admin in POSTMASTER else POSTMASTER.setdefault(admin, postmaster(admin))
    try:
        with open(f"/proc/{master}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        reaped = (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError):
        reaped = 0.0
    return reaped + sum(cpu_seconds(pid) for pid in server_pids(admin))


def pin(pids, cpus):
    """Every thread of each process onto `cpus` (taskset's list); processes forked later inherit it."""
    for pid in pids:
        subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def scale(args):
    """The scale model: how many nodes one server core carries. Jobs already in the database, the server pinned to
    CPU 0 (the nodes on the others), 1, 2 and 3 nodes; then one line: the server core's busy share per 1,000 jobs a
    second (the median of the three parts), and how many nodes at the 1-node part's rate one core would carry."""
    if os.cpu_count() < 2:
        raise SystemExit("scale: needs 2 CPUs at least (the server on one, the nodes on the others)")
    parts = [already_in_database(args, count, pinned=True) for count in (1, 2, 3)]
    per_1000 = statistics.median(p["serverCoreBusyPer1000JobsPerSecond"] for p in parts)
    single = parts[0]["jobsPerSecond"]
    print(json.dumps({"part": "scale", "serverCoreBusyPer1000JobsPerSecond": per_1000,
                      "jobsPerSecondOneCoreCarries": round(1000 / max(per_1000, 1e-9)),
                      "nodesOneCoreCarries": round(1000 / max(per_1000, 1e-9) / max(single, 1), 1),
                      "atTheRateOf": f"the 1-node part, {single} jobs/s"}), flush=True)


def store_only(args, workers):
    """opqueue-bench store: the node's claim and completion statements alone, JOBS jobs inserted first (the drain is
    timed by the program; the commits around it are read here)."""
    cluster = Cluster(args, 0)
    try:
        url = f"postgresql://{cluster.role}@127.0.0.1:{cluster.port}/{cluster.database}?sslmode=disable"
        bench = subprocess.Popen([args.bin + "/opqueue-bench", "store", "--database", url, "--password-file", cluster.password_file,
                                  "--jobs", str(args.jobs), "--workers", str(workers), "--batch", str(args.active_jobs)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if bench.stdout.readline().strip() != "ready":
            raise SystemExit(f"opqueue-bench store: no ready line (exit {bench.wait()})")
        psql(args.admin, "postgres", "CHECKPOINT")
        before = commits(args.admin, cluster.database)
        bench.stdin.write("go\n")
        bench.stdin.flush()
        line = bench.stdout.readline()
        if bench.wait() != 0 or not line:
            raise SystemExit(f"opqueue-bench store failed (exit {bench.returncode})")
        time.sleep(1.1)
        after = commits(args.admin, cluster.database)
        figures = json.loads(line)
        figures["commitsPerJob"] = round((after - before) / max(figures["ended"], 1), 3)
        print(json.dumps(figures), flush=True)
    finally:
        cluster.close()


def pickup(args):
    cluster = Cluster(args, 2, settings=lambda k: {"queues": {"pinned": {"maxConcurrentOperationCount": 4}}} if k == 1 else {})
    try:
        inbox = cluster.nodes[0]["spool"] + "/inbox"
        time.sleep(3)
        delays = []
        for i in range(args.samples):
            job = f"p{i:05d}"
            with open(f"{inbox}/.{job}.plist", "wb") as f:
                f.write(manifest(job, "pinned"))
            sent = time.time()
            os.rename(f"{inbox}/.{job}.plist", f"{inbox}/{job}.plist")
            deadline = time.time() + 30
            result = None
            while time.time() < deadline and result is None:
                result = cluster.result(1, job)
                time.sleep(0.005)
            if result is None:
                raise SystemExit(f"{job} never ran on node B")
            delays.append((result["operations"][0]["startedAt"] - sent) * 1000)
            time.sleep(0.2)  # idle again
        delays.sort()
        print(json.dumps({"part": "opqueued-pickup", "samples": len(delays), "p50ms": round(statistics.median(delays), 2),
                          "p99ms": round(delays[min(len(delays) - 1, int(len(delays) * 0.99))], 2),
                          "includes": "rename into A's inbox -> A validates, inserts, NOTIFY -> B claims, writes active/, starts"}),
              flush=True)
    finally:
        cluster.close()


def executing_on(cluster, job):
    for k, node in enumerate(cluster.nodes):
        try:
            with open(node["log"]) as f:
                for line in f:
                    if f"OPQ_JOB={job}" in line and "OPQ_STATE=executing" in line:
                        return k
        except FileNotFoundError:
            pass
    return None


def takeover(args, lease):
    cluster = Cluster(args, 2, lease=lease)
    try:
        time.sleep(2)
        job = "takeover"
        with open(cluster.nodes[0]["spool"] + "/inbox/.t.plist", "wb") as f:
            f.write(plistlib.dumps({"job": job, "operations": [{"id": "a", "kind": "sleep", "seconds": 4}]}))
        os.rename(cluster.nodes[0]["spool"] + "/inbox/.t.plist", cluster.nodes[0]["spool"] + "/inbox/t.plist")
        deadline = time.time() + 30
        victim = None
        while victim is None and time.time() < deadline:
            victim = executing_on(cluster, job)
            time.sleep(0.01)
        if victim is None:
            raise SystemExit("the job never started")
        cluster.kill9(victim)
        killed = time.time()
        other = 1 - victim
        deadline = time.time() + lease + 60
        result = None
        while result is None and time.time() < deadline:
            result = cluster.result(other, job)
            time.sleep(0.05)
        if result is None:
            raise SystemExit("the job never ran elsewhere")
        print(json.dumps({"part": "opqueued-takeover", "leaseSeconds": lease,
                          "secondsToRunningElsewhere": round(result["operations"][0]["startedAt"] - killed, 3)}), flush=True)
    finally:
        cluster.close()


def process_figures(pid):
    """A node's resident memory (kB), open descriptors and threads, from /proc."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        return {"rssKiB": int(status["VmRSS"].split()[0]), "fds": len(os.listdir(f"/proc/{pid}/fd")),
                "threads": int(status["Threads"])}
    except (OSError, KeyError, ValueError):
        return None


def endurance(args):
    """Long-lived nodes under a steady load, for what a short run cannot show (memory, descriptors, threads or
    connections that grow; a job that never ends): 2 nodes for args.minutes, args.rate single-`sleep 0`
    manifests a second into the two inboxes in turn, a consumer that reads each outbox entry's result.plist and
    removes the entry (as users do). Every minute one line: per node resident memory, descriptors and threads;
    the server's connections to the database; jobs not yet finished (opq_live); jobs ended. At the end every
    job is checked: ended exactly once, succeeded."""
    cluster = Cluster(args, 2, settings=lambda k: {"maxActiveJobs": 64})
    seen = {}
    statuses = {}

    def consume():
        for k in range(2):
            outbox = cluster.nodes[k]["spool"] + "/outbox"
            for name in cluster.outbox(k):
                result = cluster.result(k, name)
                if result is None:
                    continue  # not whole yet? entries arrive by rename, whole; try again next time
                seen[name] = seen.get(name, 0) + 1
                statuses[result.get("status")] = statuses.get(result.get("status"), 0) + 1
                shutil.rmtree(f"{outbox}/{name}", ignore_errors=True)

    def sample(minute, submitted):
        nodes = [process_figures(n["process"].pid) for n in cluster.nodes]
        connections = int(psql(args.admin, "postgres", f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{cluster.database}'"))
        unfinished = int(psql(args.admin, cluster.database, "SELECT count(*) FROM opq_live"))
        print(json.dumps({"part": "opqueued-endurance", "minute": minute, "submitted": submitted, "ended": len(seen),
                          "nodes": nodes, "serverConnections": connections, "unfinishedRows": unfinished}), flush=True)
        return nodes

    try:
        start = time.monotonic()
        end = start + 60 * args.minutes
        submitted = 0
        next_minute = start + 60
        minute = 0
        first = sample(0, 0)
        while time.monotonic() < end:
            tick = time.monotonic()
            due = int((tick - start) * args.rate)
            while submitted < due:
                name = f"e{submitted:08d}"
                inbox = cluster.nodes[submitted % 2]["spool"] + "/inbox"
                with open(f"{inbox}/.{name}.plist", "wb") as f:
                    f.write(manifest(name))
                os.rename(f"{inbox}/.{name}.plist", f"{inbox}/{name}.plist")
                submitted += 1
            consume()
            if time.monotonic() >= next_minute:
                minute += 1
                next_minute += 60
                sample(minute, submitted)
            time.sleep(max(0, 0.1 - (time.monotonic() - tick)))
        deadline = time.monotonic() + 120
        while len(seen) < submitted and time.monotonic() < deadline:
            consume()
            time.sleep(0.2)
        last = sample(minute + 1, submitted)
        missing = [f"e{i:08d}" for i in range(submitted) if f"e{i:08d}" not in seen]
        twice = [name for name, n in seen.items() if n > 1]
        print(json.dumps({"part": "opqueued-endurance-summary", "minutes": args.minutes, "rate": args.rate,
                          "submitted": submitted, "ended": len(seen), "missing": len(missing), "endedTwice": len(twice),
                          "statuses": statuses, "firstMissing": missing[:5],
                          "rssKiB": [[f and f["rssKiB"] for f in first], [f and f["rssKiB"] for f in last]],
                          "fds": [[f and f["fds"] for f in first], [f and f["fds"] for f in last]],
                          "threads": [[f and f["threads"] for f in first], [f and f["threads"] for f in last]]}), flush=True)
        if missing or twice or set(statuses) != {"succeeded"}:
            raise SystemExit("endurance: not every job ended exactly once, succeeded")
    finally:
        cluster.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--admin", required=True)
    parser.add_argument("--base")
    parser.add_argument("--pgbin")
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--lease", type=int, default=5)
    parser.add_argument("--log-target", default="console", choices=["console", "journal"],
                        help="where the nodes log: console (a file per node, the default) or journal (journald, as in "
                             "production; it must be listening)")
    parser.add_argument("--active-jobs", type=int, default=64, help="each node's maxActiveJobs (and so jobSlots)")
    parser.add_argument("--spool-alone", action="store_true", help="only the figure without a cluster")
    parser.add_argument("--minutes", type=float, default=10, help="endurance: how long")
    parser.add_argument("--rate", type=int, default=200, help="endurance: manifests a second")
    parser.add_argument("--parts", default="spool,1,2,database,store,pickup,takeover",
                        help="which figures, comma-separated: spool (alone), 1 and 2 (nodes end to end), database, store "
                             "(the database part alone, 1 and 2 workers), scale (jobs already in the database, the server pinned "
                             "to one core, 1, 2 and 3 nodes: the nodes one server core carries; scale-N: its N-node part alone), "
                             "pickup, "
                             "takeover; also limited (2 nodes end to end, every operation on a queue limited to 2 "
                             "cluster-wide: the price of clusterMaxConcurrentOperationCount); endurance (2 long-lived "
                             "nodes under --rate manifests a second for --minutes: memory, descriptors, every job once)")
    args = parser.parse_args()
    if not os.path.exists(args.bin + "/opqueued"):
        raise SystemExit(f"no {args.bin}/opqueued: swift build -c release first")
    parts = ["spool"] if args.spool_alone else args.parts.split(",")
    try:
        run_parts(args, parts)
    finally:
        for folder in SPENT:
            shutil.rmtree(folder, ignore_errors=True)


def ratios(figures):
    """After parts repeated in turn (`--parts=spool,2,spool,2,...`): each end-to-end figure over the spool alone's of
    the same round (the i-th of each), and their median: one figure that a single disturbed part does not make."""
    for nodes in ("1", "2"):
        pairs = [round(c / s, 2) for s, c in zip(figures["spool"], figures[nodes])]
        if pairs:
            print(json.dumps({"part": "ratio", "nodes": int(nodes), "of": f"{nodes} node{'s' if nodes == '2' else ''} "
                              "end to end / the spool alone, round by round", "rounds": pairs,
                              "median": statistics.median(pairs)}), flush=True)


def run_parts(args, parts):
    figures = {"spool": [], "1": [], "2": []}
    try:
        run_each(args, parts, figures)
    finally:
        ratios(figures)


def run_each(args, parts, figures):
    for part in parts:
        # Each part from a quiet machine: the server's dirty pages written first (see run.sh's settle), and every file
        # system's (the previous part's, or the anchors' files: left to the kernel's writeback, they would be written
        # while the next part runs).
        psql(args.admin, "postgres", "CHECKPOINT")
        os.sync()
        time.sleep(1)
        if part == "spool":
            figures["spool"].append(throughput(args, 1, with_cluster=False))
        elif part in ("1", "2"):
            figures[part].append(throughput(args, int(part)))
        elif part == "limited":
            throughput(args, 2, limit=2)
        elif part == "database":
            already_in_database(args, 2)
        elif part == "scale":
            scale(args)
        elif part.startswith("scale-"):
            already_in_database(args, int(part[len("scale-"):]), pinned=True)
        elif part == "store":
            store_only(args, 1)
            store_only(args, 2)
        elif part == "pickup":
            pickup(args)
        elif part == "takeover":
            takeover(args, args.lease)
        elif part == "endurance":
            endurance(args)
        else:
            raise SystemExit(f"unknown part {part}")


if __name__ == "__main__":
    sys.exit(main())
