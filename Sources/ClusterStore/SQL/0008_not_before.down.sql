-- Undoes 0008_not_before.up.sql. Jobs still delayed become claimable at once.
CREATE OR REPLACE FUNCTION opq_claim_jobs(claimer text, wanted bigint, node_queues text[], node_commands text[])
RETURNS TABLE (id text, requested_id text, manifest bytea, manifest_name text, submitted_on text, submitted_at float8,
               qos_rank smallint, priority_rank smallint, seq bigint, fence bigint, from_node text)
LANGUAGE sql VOLATILE SET enable_bitmapscan = off SET enable_seqscan = off AS '
WITH picked AS (
    SELECT j.id FROM opq_jobs AS j
    WHERE j.state = ''waiting'' AND j.queues <@ node_queues AND j.commands <@ node_commands
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
DROP INDEX opq_jobs_delayed;
DROP INDEX opq_jobs_claimable;
ALTER TABLE opq_jobs DROP COLUMN not_before;
CREATE INDEX opq_jobs_claimable ON opq_jobs (qos_rank DESC, priority_rank DESC, seq) WHERE state = 'waiting';
DELETE FROM opq_schema_readers WHERE version = 8;
DELETE FROM opq_schema_version WHERE version = 8;
