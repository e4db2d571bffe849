-- opqueued cluster schema, version 12: opq_claim returns its rows as one query, not row by row.
--
-- Until 11 the claim's rows went through a PL/pgSQL loop (RETURN NEXT, each row's budget test evaluated by the
-- function) and each claimed row read its cancels by an index probe, with none recorded almost always. Here the budget
-- is a window sum over the rows before it in claim order (a manifest only while those before it, of at most
-- max_manifest bytes, hold fewer than budget bytes; none over max_manifest: as in 11), and the cancels are read only
-- when any is recorded (one probe a statement). Same signature, rows and order: code of 11 may still run against it.
-- (Migrations are split at lines ending in ';': no line of the body ends in one.)
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
INSERT INTO opq_schema_readers (version, oldest_reader) VALUES (12, 11);
