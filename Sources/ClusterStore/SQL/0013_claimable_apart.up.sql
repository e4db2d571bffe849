-- opqueued cluster schema, version 13: the claimable jobs in a table of their own, which a claim deletes from, so that
-- its opq_live row is rewritten in place (a HOT update: no index entry) and a claim reads only what it takes (issue 45).
--
-- Until 12 a claim changed state and node, which opq_live's claimable, delayed and running indexes name: each claimed
-- row became a new version with new entries in the primary key and the running index, the largest part of the
-- server's work a job. Here opq_claimable holds one row per job claimable now (waiting, not delayed), in claim order,
-- with the queues and commands a claim matches: a submission inserts it, a claim deletes it (leaving that index by
-- removal, so that running jobs are never stepped over), and a hand-back, a takeover or a delayed job becoming due
-- inserts it again. No index of opq_live names state, node or fence and its pages keep half their room (fillfactor
-- 50; the table is rewritten so that rows already there have it too): a claim, a takeover and a hand-back write each
-- row's new version beside the old one. A node's running rows (its beat, a takeover, status) are found by reading
-- opq_live, which holds only the jobs waiting and running. Whoever moves a job out of opq_claimable locks its row there
-- before its opq_live row (a claim, ClaimCancelledJob, the trigger below), so that two never wait for each other.
-- Code of 12 would submit jobs no claim finds: only code of 13 runs against this schema.
CREATE TABLE opq_claimable (
    qos_rank      smallint NOT NULL,
    priority_rank smallint NOT NULL,
    seq           bigint NOT NULL,
    id            text COLLATE "C" NOT NULL,
    queues        text[] NOT NULL,
    commands      text[] NOT NULL
);
CREATE INDEX opq_claimable_order ON opq_claimable (qos_rank DESC, priority_rank DESC, seq);
INSERT INTO opq_claimable (qos_rank, priority_rank, seq, id, queues, commands)
SELECT qos_rank, priority_rank, seq, id, queues, commands FROM opq_live WHERE state = 'waiting' AND not_before IS NULL;
ALTER TABLE opq_live SET (fillfactor = 50);
DROP INDEX opq_live_claimable;
DROP INDEX opq_live_delayed;
DROP INDEX opq_live_running;
CREATE INDEX opq_live_delayed ON opq_live (not_before) WHERE not_before IS NOT NULL;
CLUSTER opq_live USING opq_live_pkey;
ALTER TABLE opq_live SET WITHOUT CLUSTER;

-- A job deleted by hand leaves opq_claimable too (found by its claim order), before its opq_live row.
CREATE OR REPLACE FUNCTION opq_jobs_deleted() RETURNS trigger LANGUAGE plpgsql AS '
BEGIN
    DELETE FROM opq_claimable AS c USING opq_live AS l, gone
    WHERE l.id = gone.id AND c.qos_rank = l.qos_rank AND c.priority_rank = l.priority_rank AND c.seq = l.seq
    ; DELETE FROM opq_live AS l USING gone WHERE l.id = gone.id
    ; RETURN NULL
; END';

-- The claim as 12's (same signature, rows and order), on opq_claimable: the delayed jobs now due become claimable, then
-- up to `wanted` rows are deleted there (found by their ctid, locked first) and their opq_live rows updated by the
-- primary key's index condition (a plan kept from a first claim at an empty table must not walk the whole key).
CREATE OR REPLACE FUNCTION opq_claim(claimer text, wanted bigint, node_queues text[], node_commands text[], budget bigint,
                                     max_manifest bigint)
RETURNS TABLE (id text, requested_id text, manifest bytea, manifest_name text, submitted_on text, submitted_at float8,
               qos_rank smallint, priority_rank smallint, seq bigint, fence bigint, from_node text, bytes bigint,
               cancels text[])
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS '
BEGIN
    WITH due AS (
        UPDATE opq_live AS u SET not_before = NULL
        WHERE u.id = ANY (ARRAY(SELECT d.id FROM opq_live AS d WHERE d.not_before <= now() FOR UPDATE SKIP LOCKED))
        RETURNING u.qos_rank, u.priority_rank, u.seq, u.id, u.queues, u.commands
    )
    INSERT INTO opq_claimable (qos_rank, priority_rank, seq, id, queues, commands)
    SELECT d.qos_rank, d.priority_rank, d.seq, d.id, d.queues, d.commands FROM due AS d
    ; RETURN QUERY
        WITH picked AS (
            DELETE FROM opq_claimable AS c
            WHERE c.ctid = ANY (ARRAY(SELECT p.ctid FROM opq_claimable AS p
                                      WHERE p.queues <@ node_queues AND p.commands <@ node_commands
                                      ORDER BY p.qos_rank DESC, p.priority_rank DESC, p.seq
                                      LIMIT wanted
                                      FOR UPDATE SKIP LOCKED))
            RETURNING c.id
        ), claimed AS (
            UPDATE opq_live AS l
            SET state = ''running'', node = claimer, fence = nextval(''opq_fence''), claimed_at = now()
            WHERE l.id = ANY (ARRAY(SELECT picked.id FROM picked)) AND l.state = ''waiting''
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
INSERT INTO opq_schema_readers (version, oldest_reader) VALUES (13, 13);
