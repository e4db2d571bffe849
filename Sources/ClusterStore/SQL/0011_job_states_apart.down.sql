-- Undoes 0011_job_states_apart.up.sql: the state columns back in opq_jobs, filled from opq_live and opq_ended, and
-- schema 10's indexes and functions.
ALTER TABLE opq_jobs ADD COLUMN state text NOT NULL DEFAULT 'waiting' CHECK (state IN ('waiting', 'running', 'finished')),
    ADD COLUMN node text, ADD COLUMN fence bigint, ADD COLUMN from_node text, ADD COLUMN claimed_at timestamptz,
    ADD COLUMN status text, ADD COLUMN result bytea, ADD COLUMN finished_at timestamptz;
UPDATE opq_jobs AS j
SET state = l.state, node = l.node, fence = l.fence, from_node = l.from_node, claimed_at = l.claimed_at,
    not_before = l.not_before
FROM opq_live AS l WHERE l.id = j.id;
UPDATE opq_jobs AS j
SET state = 'finished', node = e.node, fence = e.fence, from_node = e.from_node, status = e.status, result = e.result,
    finished_at = e.finished_at
FROM opq_ended AS e WHERE e.id = j.id;
ALTER TABLE opq_jobs ADD CHECK (state <> 'running' OR (node IS NOT NULL AND fence IS NOT NULL)),
    ADD CHECK (state <> 'waiting' OR (node IS NULL AND fence IS NULL)),
    ADD CHECK ((state = 'finished') = (finished_at IS NOT NULL));
CREATE INDEX opq_jobs_claimable ON opq_jobs (qos_rank DESC, priority_rank DESC, seq)
    WHERE state = 'waiting' AND not_before IS NULL;
CREATE INDEX opq_jobs_delayed ON opq_jobs (not_before) WHERE state = 'waiting' AND not_before IS NOT NULL;
CREATE INDEX opq_jobs_running ON opq_jobs (node) WHERE state = 'running';
CREATE INDEX opq_jobs_finished ON opq_jobs (finished_at) WHERE state = 'finished';
DROP TRIGGER opq_jobs_deleted ON opq_jobs;
DROP FUNCTION opq_jobs_deleted();
DROP VIEW opq_job_states;
DROP TABLE opq_ended;
DROP TABLE opq_live;
DROP FUNCTION opq_complete(text[], bigint[], text[], bytea[]);
DROP FUNCTION opq_claim(text, bigint, text[], text[], bigint, bigint);
CREATE FUNCTION opq_claim(claimer text, wanted bigint, node_queues text[], node_commands text[], budget bigint,
                          max_manifest bigint)
RETURNS TABLE (id text, requested_id text, manifest bytea, manifest_name text, submitted_on text, submitted_at float8,
               qos_rank smallint, priority_rank smallint, seq bigint, fence bigint, from_node text, bytes bigint,
               cancels text[])
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS '
DECLARE
    held bigint := 0
; BEGIN
    UPDATE opq_jobs AS u SET not_before = NULL
    WHERE u.id IN (SELECT d.id FROM opq_jobs AS d WHERE d.state = ''waiting'' AND d.not_before <= now()
                   FOR UPDATE SKIP LOCKED)
    ; FOR id, requested_id, manifest, manifest_name, submitted_on, submitted_at, qos_rank, priority_rank, seq, fence,
        from_node, bytes IN
        WITH picked AS (
            SELECT j.id FROM opq_jobs AS j
            WHERE j.state = ''waiting'' AND j.not_before IS NULL AND j.queues <@ node_queues AND j.commands <@ node_commands
            ORDER BY j.qos_rank DESC, j.priority_rank DESC, j.seq
            LIMIT wanted
            FOR UPDATE SKIP LOCKED
        ), claimed AS (
            UPDATE opq_jobs AS j
            SET state = ''running'', node = claimer, fence = nextval(''opq_fence''), claimed_at = now()
            FROM picked
            WHERE j.id = picked.id
            RETURNING j.id, j.requested_id, j.manifest, j.manifest_name, j.submitted_on,
                      extract(epoch FROM j.submitted_at)::float8, j.qos_rank, j.priority_rank, j.seq, j.fence,
                      j.from_node, octet_length(j.manifest)::bigint
        )
        SELECT * FROM claimed ORDER BY 7 DESC, 8 DESC, 9
    LOOP
        IF bytes > max_manifest OR held >= budget THEN manifest := ''''::bytea
        ; END IF
        ; IF bytes <= max_manifest THEN held := held + bytes
        ; END IF
        ; cancels := ARRAY(SELECT coalesce(r.operation, '''') FROM opq_cancel_requests AS r
                           WHERE r.job = opq_claim.id ORDER BY r.id)
        ; RETURN NEXT
    ; END LOOP
; END';

CREATE FUNCTION opq_complete(ids text[], fences bigint[], statuses text[], results bytea[])
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS '
BEGIN
    RETURN QUERY
    UPDATE opq_jobs AS j
    SET state = ''finished'', status = c.status, result = c.result, finished_at = now()
    FROM unnest(ids, fences, statuses, results) AS c (id, fence, status, result)
    WHERE j.id = c.id AND j.fence = c.fence AND j.state = ''running''
    RETURNING j.id
; END';
CREATE FUNCTION opq_claim_jobs(claimer text, wanted bigint, node_queues text[], node_commands text[])
RETURNS TABLE (id text, requested_id text, manifest bytea, manifest_name text, submitted_on text, submitted_at float8,
               qos_rank smallint, priority_rank smallint, seq bigint, fence bigint, from_node text)
LANGUAGE sql VOLATILE SET enable_bitmapscan = off SET enable_seqscan = off AS '
UPDATE opq_jobs SET not_before = NULL
WHERE id IN (SELECT d.id FROM opq_jobs AS d WHERE d.state = ''waiting'' AND d.not_before <= now()
             FOR UPDATE SKIP LOCKED); WITH picked AS (
    SELECT j.id FROM opq_jobs AS j
    WHERE j.state = ''waiting'' AND j.not_before IS NULL AND j.queues <@ node_queues AND j.commands <@ node_commands
    ORDER BY j.qos_rank DESC, j.priority_rank DESC, j.seq
    LIMIT wanted
    FOR UPDATE SKIP LOCKED
)
UPDATE opq_jobs AS j
SET state = ''running'', node = claimer, fence = nextval(''opq_fence''), claimed_at = now()
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.requested_id, j.manifest, j.manifest_name, j.submitted_on,
          extract(epoch FROM j.submitted_at)::float8, j.qos_rank, j.priority_rank, j.seq, j.fence, j.from_node
';
DELETE FROM opq_schema_readers WHERE version = 11;
DELETE FROM opq_schema_version WHERE version = 11;
