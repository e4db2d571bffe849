-- opqueued cluster schema, version 10: a node's claim round and its completions each one call of a PL/pgSQL
-- function whose plans the server keeps per connection.
--
-- A node sends its statements unnamed (a pooler in transaction mode keeps no prepared statement), so the server
-- parsed and planned the claim (ClaimJobs around opq_claim_jobs, whose SQL body is planned again at each call) and
-- the completion at every round: about a third of the claiming backend's CPU, for rounds of some twenty jobs.
-- PL/pgSQL keeps each statement's plan for the connection's life; plan_cache_mode pins the generic plan, which the
-- enable_* settings (schema 3 and 7) keep on the claim-order index. opq_claim does what ClaimJobs did around
-- opq_claim_jobs (a manifest only within the budget, the cancels asked while the job waited); opq_complete is
-- CompleteJobs. (Migrations are split at lines ending in ';': no line of the bodies ends in one.)
-- Code of schema 6 to 9 keeps calling opq_claim_jobs and its own CompleteJobs, both unchanged: it may still run.
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
INSERT INTO opq_schema_readers (version, oldest_reader) VALUES (10, 6);
