-- Undoes 0013_claimable_apart.up.sql: no opq_claimable, the indexes of schema 11 (state in their predicates, the
-- running rows by node), full pages for rows inserted from here on, 11's trigger and 12's claim.
DROP TABLE opq_claimable;
ALTER TABLE opq_live RESET (fillfactor);
DROP INDEX opq_live_delayed;
CREATE INDEX opq_live_claimable ON opq_live (qos_rank DESC, priority_rank DESC, seq)
    WHERE state = 'waiting' AND not_before IS NULL;
CREATE INDEX opq_live_delayed ON opq_live (not_before) WHERE state = 'waiting' AND not_before IS NOT NULL;
CREATE INDEX opq_live_running ON opq_live (node) WHERE state = 'running';
CREATE OR REPLACE FUNCTION opq_jobs_deleted() RETURNS trigger LANGUAGE plpgsql AS '
BEGIN
    DELETE FROM opq_live AS l USING gone WHERE l.id = gone.id
    ; RETURN NULL
; END';
-- 12's claim.
CREATE OR REPLACE FUNCTION opq_claim(claimer text, wanted bigint, node_queues text[], node_commands text[], budget bigint,
                                     max_manifest bigint)
RETURNS TABLE (id text, requested_id text, manifest bytea, manifest_name text, submitted_on text, submitted_at float8,
               qos_rank smallint, priority_rank smallint, seq bigint, fence bigint, from_node text, bytes bigint,
               cancels text[])
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS '
BEGIN
    UPDATE opq_live AS u SET not_before = NULL
    WHERE u.id IN (SELECT d.id FROM opq_live AS d WHERE d.state = ''waiting'' AND d.not_before <= now()
                   FOR UPDATE SKIP LOCKED)
    ; RETURN QUERY
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
        ), got AS (
            SELECT c.id, j.requested_id, j.manifest, j.manifest_name, j.submitted_on,
                   extract(epoch FROM j.submitted_at)::float8 AS at, c.qos_rank, c.priority_rank, c.seq, c.fence, c.from_node,
                   octet_length(j.manifest)::bigint AS size
            FROM claimed AS c JOIN opq_jobs AS j ON j.id = c.id
        )
        SELECT g.id, g.requested_id,
               CASE WHEN g.size > max_manifest
                      OR coalesce(sum(CASE WHEN g.size <= max_manifest THEN g.size ELSE 0 END)
                                  OVER (ORDER BY g.qos_rank DESC, g.priority_rank DESC, g.seq
                                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) >= budget
                    THEN ''''::bytea ELSE g.manifest END,
               g.manifest_name, g.submitted_on, g.at, g.qos_rank, g.priority_rank, g.seq, g.fence, g.from_node, g.size,
               CASE WHEN EXISTS (SELECT 1 FROM opq_cancel_requests)
                    THEN ARRAY(SELECT coalesce(r.operation, '''') FROM opq_cancel_requests AS r
                               WHERE r.job = g.id ORDER BY r.id)
                    ELSE ''{}''::text[] END
        FROM got AS g
        ORDER BY g.qos_rank DESC, g.priority_rank DESC, g.seq
; END';
DELETE FROM opq_schema_readers WHERE version = 13;
DELETE FROM opq_schema_version WHERE version = 13;
