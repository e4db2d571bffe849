-- opqueued cluster schema, version 1 (SPEC §8).
-- Applied by migrate() inside one transaction holding pg_advisory_xact_lock, so that nodes starting together
-- create it once. Statements end with ';' at the end of a line: the generator splits them there, because the
-- extended query protocol takes one statement at a time. No dollar-quoted bodies here for that reason.

CREATE TABLE opq_schema_version (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- One row per node that ever started. A node's lease on its jobs and its cluster slots IS this row's
-- last_heartbeat: one UPDATE per node per beat renews them all. Times are the database's clock only.
CREATE TABLE opq_nodes (
    node           text PRIMARY KEY CHECK (node ~ '^[A-Za-z0-9._-]{1,64}$'),
    queues         text[] NOT NULL,
    commands       text[] NOT NULL,
    job_slots      integer NOT NULL CHECK (job_slots >= 0),
    last_heartbeat timestamptz NOT NULL DEFAULT now(),
    registered_at  timestamptz NOT NULL DEFAULT now(),
    info           text NOT NULL DEFAULT ''
);

-- Fencing tokens for job claims and cluster slots: strictly increasing across the cluster.
CREATE SEQUENCE opq_fence AS bigint;

-- Every job the cluster knows: waiting, running, then finished until pruned after keepFinishedDays.
CREATE TABLE opq_jobs (
    -- Byte order ("C"), whatever the database's collation: InsertJob finds `id.N` siblings by a range scan.
    id            text COLLATE "C" PRIMARY KEY,
    requested_id  text NOT NULL,
    manifest      bytea NOT NULL,
    manifest_name text NOT NULL,
    submitted_on  text NOT NULL,
    submitted_at  timestamptz NOT NULL DEFAULT now(),
    state         text NOT NULL DEFAULT 'waiting' CHECK (state IN ('waiting', 'running', 'finished')),
    qos_rank      smallint NOT NULL,
    priority_rank smallint NOT NULL,
    seq           bigint GENERATED ALWAYS AS IDENTITY,
    queues        text[] NOT NULL,
    commands      text[] NOT NULL,
    node          text,
    fence         bigint,
    from_node     text,
    claimed_at    timestamptz,
    status        text,
    result        bytea,
    finished_at   timestamptz,
    -- A running job has a holder and a fence; a finished one keeps them (show says where it ran).
    CHECK (state <> 'running' OR (node IS NOT NULL AND fence IS NOT NULL)),
    CHECK (state <> 'waiting' OR (node IS NULL AND fence IS NULL)),
    CHECK ((state = 'finished') = (finished_at IS NOT NULL))
);

-- The claim scans only claimable rows, already in claim order: highest QoS, then priority, then FIFO.
CREATE INDEX opq_jobs_claimable ON opq_jobs (qos_rank DESC, priority_rank DESC, seq) WHERE state = 'waiting';
-- Heartbeats, takeovers and status look up the jobs a node runs.
CREATE INDEX opq_jobs_running ON opq_jobs (node) WHERE state = 'running';
-- Pruning walks finished rows oldest first.
CREATE INDEX opq_jobs_finished ON opq_jobs (finished_at) WHERE state = 'finished';

-- clusterMaxConcurrentOperationCount: a queue limited to N has rows 1..N; a slot is held while holder is set.
CREATE TABLE opq_queue_slots (
    queue       text NOT NULL,
    slot        integer NOT NULL CHECK (slot >= 1),
    holder      text,
    job         text,
    operation   text,
    fence       bigint,
    acquired_at timestamptz,
    PRIMARY KEY (queue, slot),
    CHECK ((holder IS NULL) = (fence IS NULL))
);

-- opqueuectl suspend/resume: kept across restarts, for every node.
CREATE TABLE opq_suspended_queues (
    queue        text PRIMARY KEY,
    suspended_at timestamptz NOT NULL DEFAULT now()
);

-- opqueuectl cancel JOB [OPERATION]: kept until the job's row goes (the node running it acts on them).
CREATE TABLE opq_cancel_requests (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job          text NOT NULL REFERENCES opq_jobs (id) ON DELETE CASCADE,
    operation    text,
    requested_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX opq_cancel_requests_job ON opq_cancel_requests (job);
