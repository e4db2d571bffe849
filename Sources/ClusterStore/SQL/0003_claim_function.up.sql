-- opqueued cluster schema, version 3: the claim as a function that always walks the claim-order index.
--
-- A queue table filled faster than autovacuum analyses it (a flood of submissions, a bulk load, a fresh database)
-- has no statistics, and the planner then guesses a handful of waiting rows: it reads every claimable row through
-- a bitmap scan and sorts them all, per claim (27 ms at 30,000 waiting rows here, growing with the backlog),
-- instead of reading opq_jobs_claimable in order and stopping after `wanted` (0.3 ms at any backlog). The SET
-- clause applies to this function's statement alone and is undone when it returns; it needs no startup parameter
-- (a connection pooler in front of the server may refuse those). The body is one statement; the function is
-- VOLATILE (it updates rows and takes fences) and never inlined, so its plan is made at each call, as the bare
-- statement's was.
CREATE FUNCTION opq_claim_jobs(claimer text, wanted bigint, node_queues text[], node_commands text[])
RETURNS TABLE (id text, requested_id text, manifest bytea, manifest_name text, submitted_on text, submitted_at float8,
               qos_rank smallint, priority_rank smallint, seq bigint, fence bigint, from_node text)
LANGUAGE sql VOLATILE SET enable_bitmapscan = off AS '
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
