-- opqueued cluster schema, version 8: delayed jobs (SPEC §3.7 "Later").
--
-- A job submitted with notBefore or delaySeconds waits in the database until then, claimable by any node from that
-- time on. It waits outside the claim-order index (a claim never walks past a backlog of delayed rows); each claim
-- first moves the rows whose time has come into it (not_before set to NULL), a probe of a small index of its own.
-- (Migrations are split at lines ending in ';': the function's two statements share a line.)
-- Code of schema 6 and 7 calls the same function and never sets not_before: it may still run against this schema.
ALTER TABLE opq_jobs ADD COLUMN not_before timestamptz;
DROP INDEX opq_jobs_claimable;
CREATE INDEX opq_jobs_claimable ON opq_jobs (qos_rank DESC, priority_rank DESC, seq)
    WHERE state = 'waiting' AND not_before IS NULL;
CREATE INDEX opq_jobs_delayed ON opq_jobs (not_before) WHERE state = 'waiting' AND not_before IS NOT NULL;

CREATE OR REPLACE FUNCTION opq_claim_jobs(claimer text, wanted bigint, node_queues text[], node_commands text[])
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
INSERT INTO opq_schema_readers (version, oldest_reader) VALUES (8, 6);
