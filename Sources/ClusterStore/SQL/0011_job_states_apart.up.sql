-- opqueued cluster schema, version 11: a job's state apart from its submission, so that a claim and a completion each
-- write one narrow row instead of rewriting the job's.
--
-- Until 10, a claim and a completion each rewrote the whole job row (its manifest, and at the end its result) outside
-- HOT, with three index entries each (primary key, submission key, the running or finished index). From here
-- opq_jobs holds what a submission gave, written once (not_before: as submitted); opq_live has one narrow row per
-- waiting or running job (claim order, holder, fence), the row a claim updates; opq_ended one row per ended job (where
-- it ran, its status and result.plist), inserted by the completion that deletes the job's opq_live row. A job is in
-- exactly one of the two. Neither refers to opq_jobs (a reference is checked at each insert: 10 µs a job here); pruning
-- deletes from both, and a trigger deletes the opq_live rows of jobs deleted by hand (they never run), one statement
-- per DELETE. Rows in flight move over as they are.
-- Older code reads and writes opq_jobs' state columns, which go: only code of 11 runs against this schema.
CREATE TABLE opq_live (
    id            text COLLATE "C" PRIMARY KEY,
    state         text NOT NULL DEFAULT 'waiting' CHECK (state IN ('waiting', 'running')),
    qos_rank      smallint NOT NULL,
    priority_rank smallint NOT NULL,
    seq           bigint NOT NULL,
    queues        text[] NOT NULL,
    commands      text[] NOT NULL,
    not_before    timestamptz,
    node          text,
    fence         bigint,
    from_node     text,
    claimed_at    timestamptz,
    CHECK ((state = 'running') = (node IS NOT NULL AND fence IS NOT NULL)),
    CHECK (state = 'waiting' OR not_before IS NULL)
);
CREATE INDEX opq_live_claimable ON opq_live (qos_rank DESC, priority_rank DESC, seq)
    WHERE state = 'waiting' AND not_before IS NULL;
CREATE INDEX opq_live_delayed ON opq_live (not_before) WHERE state = 'waiting' AND not_before IS NOT NULL;
CREATE INDEX opq_live_running ON opq_live (node) WHERE state = 'running';

CREATE TABLE opq_ended (
    id          text COLLATE "C" PRIMARY KEY,
    node        text NOT NULL,
    fence       bigint NOT NULL,
    from_node   text,
    status      text,
    result      bytea,
    finished_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX opq_ended_finished ON opq_ended (finished_at);

INSERT INTO opq_live (id, state, qos_rank, priority_rank, seq, queues, commands, not_before, node, fence, from_node, claimed_at)
SELECT id, state, qos_rank, priority_rank, seq, queues, commands, CASE WHEN state = 'waiting' THEN not_before END, node,
       fence, from_node, claimed_at
FROM opq_jobs WHERE state <> 'finished';
INSERT INTO opq_ended (id, node, fence, from_node, status, result, finished_at)
SELECT id, node, fence, from_node, status, result, finished_at FROM opq_jobs WHERE state = 'finished';
DROP INDEX opq_jobs_claimable;
DROP INDEX opq_jobs_delayed;
DROP INDEX opq_jobs_running;
DROP INDEX opq_jobs_finished;
ALTER TABLE opq_jobs DROP COLUMN state, DROP COLUMN node, DROP COLUMN fence, DROP COLUMN from_node,
    DROP COLUMN claimed_at, DROP COLUMN status, DROP COLUMN result, DROP COLUMN finished_at;

CREATE FUNCTION opq_jobs_deleted() RETURNS trigger LANGUAGE plpgsql AS '
BEGIN
    DELETE FROM opq_live AS l USING gone WHERE l.id = gone.id
    ; RETURN NULL
; END';
CREATE TRIGGER opq_jobs_deleted AFTER DELETE ON opq_jobs REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION opq_jobs_deleted();

-- Each job with its state as schema 10 kept it in opq_jobs, for operators and tests (no node reads it); state is NULL
-- for a job in neither table (a prune under way).
CREATE VIEW opq_job_states AS
SELECT j.id, j.requested_id, j.manifest_name, j.submitted_on, j.submitted_at, j.queues, j.commands,
       CASE WHEN l.id IS NOT NULL THEN l.state WHEN e.id IS NOT NULL THEN 'finished' END AS state,
       coalesce(l.node, e.node) AS node, coalesce(l.fence, e.fence) AS fence, coalesce(l.from_node, e.from_node) AS from_node,
       l.claimed_at, l.not_before, e.status, e.result, e.finished_at
FROM opq_jobs AS j
     LEFT JOIN opq_live AS l ON l.id = j.id
     LEFT JOIN opq_ended AS e ON l.id IS NULL AND e.id = j.id;

-- The claim round and the completions, as in 10 (same signatures and rows), on opq_live: a claim reads each claimed
-- job's submission by its primary key, and its cancels in the same statement.
CREATE OR REPLACE FUNCTION opq_claim(claimer text, wanted bigint, node_queues text[], node_commands text[], budget bigint,
                                     max_manifest bigint)
RETURNS TABLE (id text, requested_id text, manifest bytea, manifest_name text, submitted_on text, submitted_at float8,
               qos_rank smallint, priority_rank smallint, seq bigint, fence bigint, from_node text, bytes bigint,
               cancels text[])
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS '
DECLARE
    held bigint := 0
; BEGIN
    UPDATE opq_live AS u SET not_before = NULL
    WHERE u.id IN (SELECT d.id FROM opq_live AS d WHERE d.state = ''waiting'' AND d.not_before <= now()
                   FOR UPDATE SKIP LOCKED)
    ; FOR id, requested_id, manifest, manifest_name, submitted_on, submitted_at, qos_rank, priority_rank, seq, fence,
        from_node, bytes, cancels IN
        WITH picked AS (
            SELECT l.id FROM opq_live AS l
            WHERE l.state = ''waiting'' AND l.not_before IS NULL AND l.queues <@ node_queues AND l.commands <@ node_commands
            ORDER BY l.qos_rank DESC, l.priority_rank DESC, l.seq
            LIMIT wanted
            FOR UPDATE SKIP LOCKED
        ), claimed AS (
            UPDATE opq_live AS l
            SET state = ''running'', node = claimer, fence = nextval(''opq_fence''), claimed_at = now()
            FROM picked
            WHERE l.id = picked.id
            RETURNING l.id, l.qos_rank, l.priority_rank, l.seq, l.fence, l.from_node
        )
        SELECT c.id, j.requested_id, j.manifest, j.manifest_name, j.submitted_on, extract(epoch FROM j.submitted_at)::float8,
               c.qos_rank, c.priority_rank, c.seq, c.fence, c.from_node, octet_length(j.manifest)::bigint,
               ARRAY(SELECT coalesce(r.operation, '''') FROM opq_cancel_requests AS r WHERE r.job = c.id ORDER BY r.id)
        FROM claimed AS c JOIN opq_jobs AS j ON j.id = c.id
        ORDER BY 7 DESC, 8 DESC, 9
    LOOP
        IF bytes > max_manifest OR held >= budget THEN manifest := ''''::bytea
        ; END IF
        ; IF bytes <= max_manifest THEN held := held + bytes
        ; END IF
        ; RETURN NEXT
    ; END LOOP
; END';

CREATE OR REPLACE FUNCTION opq_complete(ids text[], fences bigint[], statuses text[], results bytea[])
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS '
BEGIN
    RETURN QUERY
    WITH ended AS (
        DELETE FROM opq_live AS l
        USING unnest(ids, fences, statuses, results) AS c (id, fence, status, result)
        WHERE l.id = c.id AND l.fence = c.fence AND l.state = ''running''
        RETURNING l.id, l.node, l.fence, l.from_node, c.status, c.result
    )
    INSERT INTO opq_ended AS e (id, node, fence, from_node, status, result)
    SELECT * FROM ended
    RETURNING e.id
; END';
-- What nodes of 6 to 9 claimed with, on the columns that went.
DROP FUNCTION opq_claim_jobs(text, bigint, text[], text[]);
INSERT INTO opq_schema_readers (version, oldest_reader) VALUES (11, 11);
