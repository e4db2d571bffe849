-- Undoes 0012_claim_as_one_query.up.sql: opq_claim of schema 11 (its rows by a PL/pgSQL loop).
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
DELETE FROM opq_schema_readers WHERE version = 12;
DELETE FROM opq_schema_version WHERE version = 12;
