-- opqueued cluster schema, version 9: clusterRateLimit (SPEC §3.7 "At a rate"), start grants.
--
-- At most N of a queue's operations start in any window of S seconds across the cluster. A node starts one only on
-- a grant from here, which it uses within `use_within` seconds of asking (by its own monotonic clock) or drops. A
-- grant counts against the queue's N from its time g (the granting transaction's, so no later than the node's use)
-- until g + use_within + S; once the node reports it used, until (the report's time) + S, and once it reports it
-- unused, not at all — a report only shortens the count, never extends it. So every start in a window [a, a+S)
-- comes from a grant still counted at a+S−ε: at most N, whichever nodes die (a dead node's grants expire).
-- Grants are counted and made with the queue's row of opq_rate_queues locked, in one transaction: the function's
-- second statement sees what every earlier grant of the queue committed. (Statements split at ';' line ends.)
-- Older code never touches these: nodes of 6 to 8 may run against it (they know no clusterRateLimit).
CREATE TABLE opq_rate_queues (
    queue text PRIMARY KEY
);
CREATE TABLE opq_rate_grants (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        text NOT NULL,
    node         text NOT NULL,
    granted_at   timestamptz NOT NULL,
    counts_until timestamptz NOT NULL,
    seconds      float8 NOT NULL
);
CREATE INDEX opq_rate_grants_counted ON opq_rate_grants (queue, counts_until);

-- Up to `wanted` grants of queue `q` for `requester`, within `lim` per `window_seconds`; returns them, the time the
-- next one frees (seconds since the epoch, the database's clock; NULL when one is free now) and that clock's now.
-- Grants that stopped counting a while ago are pruned on the way.
CREATE FUNCTION opq_grant_starts(q text, requester text, wanted integer, lim integer, window_seconds float8,
                                 use_within float8)
RETURNS TABLE (ids bigint[], next_free float8, db_now float8)
LANGUAGE sql VOLATILE AS '
INSERT INTO opq_rate_queues AS r (queue) VALUES (q) ON CONFLICT (queue) DO UPDATE SET queue = r.queue; DELETE
FROM opq_rate_grants WHERE queue = q AND counts_until < now() - interval ''1 minute''; WITH counted AS (
    SELECT count(*)::integer AS n, min(counts_until) AS first FROM opq_rate_grants WHERE queue = q AND counts_until > now()
), granted AS (
    INSERT INTO opq_rate_grants (queue, node, granted_at, counts_until, seconds)
    SELECT q, requester, now(), now() + make_interval(secs => use_within + window_seconds), window_seconds
    FROM counted, generate_series(1, LEAST(wanted, lim - counted.n))
    RETURNING id, counts_until
)
SELECT coalesce((SELECT array_agg(id ORDER BY id) FROM granted), ''{}''::bigint[]),
       CASE WHEN (SELECT n FROM counted) + (SELECT count(*) FROM granted) >= lim
            THEN extract(epoch FROM LEAST((SELECT first FROM counted), (SELECT min(counts_until) FROM granted)))::float8
       END,
       extract(epoch FROM now())::float8
';
INSERT INTO opq_schema_readers (version, oldest_reader) VALUES (9, 6);
