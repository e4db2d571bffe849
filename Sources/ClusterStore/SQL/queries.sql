-- The named queries of PostgresClusterStore, one `-- name: X` block each (River's dbsqlc style).
-- Parameters are only ever bound ($1, $2, …); `make sql` embeds this file into Queries.generated.swift.

-- name: AdvisoryLockMigrations
-- Serialises migrators for the rest of their transaction (key: 'opqueued' as ASCII bytes).
SELECT pg_advisory_xact_lock(7993149263917557604);

-- name: SchemaExists
-- Whether the version table exists (a statement naming a missing table fails when planned, so ask first).
SELECT to_regclass('opq_schema_version') IS NOT NULL;

-- name: SchemaVersion
-- The newest applied version.
SELECT coalesce(max(version), 0)::integer AS version FROM opq_schema_version;

-- name: SchemaReadersExist
-- Whether the table of who may run against each version exists (migration 6).
SELECT to_regclass('opq_schema_readers') IS NOT NULL;

-- name: NewerSchemaReaders
-- Of the applied versions newer than $1 (the newest this code knows): how many do not say who may still run against
-- them, and the highest bound the others set. This code may run when none is silent and no bound is above $1.
SELECT (count(*) FILTER (WHERE r.version IS NULL))::integer, coalesce(max(r.oldest_reader), 0)::integer
FROM opq_schema_version AS v LEFT JOIN opq_schema_readers AS r ON r.version = v.version
WHERE v.version > $1;

-- name: RecordSchemaVersion
INSERT INTO opq_schema_version (version) VALUES ($1);

-- name: RegisterNode
-- $1 node, $2 queues, $3 commands, $4 job slots, $5 info (which process), $6 command signatures
-- ("name<TAB>signature"), $7 the node's leaseSeconds (recorded; <= 0: none), $8 an info the caller may replace
-- ('' for none: a process of this node on this machine that is gone), $9 the newest schema version its code knows,
-- $10 the holder's beat (NodeOwner's token) that the caller has seen unchanged for the holder's lease by its own
-- clock (NULL for none). Also renews the node's lease. A name another process holds (another info, not $8) is left
-- alone unless it has not beaten since $10 (no row returned): whether it lives is never judged by the database's
-- clock, which a step (NTP, a VM moved) would make call a beating holder silent.
INSERT INTO opq_nodes (node, queues, commands, job_slots, info, command_signatures, last_heartbeat, lease_seconds, schema)
VALUES ($1, $2, $3, $4, $5, $6, now(), CASE WHEN $7::float8 > 0 THEN $7::float8 END, $9)
ON CONFLICT (node) DO UPDATE
SET queues = EXCLUDED.queues, commands = EXCLUDED.commands, job_slots = EXCLUDED.job_slots,
    info = EXCLUDED.info, command_signatures = EXCLUDED.command_signatures, last_heartbeat = now(),
    lease_seconds = EXCLUDED.lease_seconds, schema = EXCLUDED.schema
WHERE opq_nodes.info = EXCLUDED.info OR opq_nodes.info = $8
   OR (extract(epoch FROM opq_nodes.last_heartbeat) * 1000000)::bigint = $10::bigint
RETURNING node;

-- name: NodeOwner
-- $1 node: which process holds the name (its info), how many seconds ago it last beat (by the database's clock: for
-- messages only), and that beat as NodeBeats' token with the holder's leaseSeconds (NULL: none recorded).
SELECT info, extract(epoch FROM now() - last_heartbeat)::float8, (extract(epoch FROM last_heartbeat) * 1000000)::bigint,
       lease_seconds
FROM opq_nodes WHERE node = $1;

-- name: EnsureQueueSlots
-- $1 queue, $2 limit: rows 1..limit exist (never removed: a lower limit just leaves the upper rows unused).
INSERT INTO opq_queue_slots (queue, slot)
SELECT $1, g FROM generate_series(1, $2::integer) AS g
ON CONFLICT (queue, slot) DO NOTHING;

-- name: InsertJobs
-- A batch of jobs in one statement, each under its requested id, in batch order (seq follows the ordinality).
-- A row whose id or submission key is already taken is skipped (ON CONFLICT DO NOTHING, on every unique
-- constraint) and absent from RETURNING: the caller inserts it by InsertJob (id.N) or finds it by SubmittedJob.
-- The caller passes each requested id and each key at most once. Queues and commands are one JSON array of
-- strings per row (arrays of arrays do not unnest). $1 requested ids, $2 manifests, $3 manifest names,
-- $4 submitted on, $5 qos ranks, $6 priority ranks, $7 queues, $8 commands, $9 submission keys ('' for none),
-- $10 not before (epoch seconds; 0 for none: claimable at once). Each job inserted also gets its opq_live row
-- (schema 11), waiting, and unless delayed its opq_claimable row (schema 13).
WITH inserted AS (
    INSERT INTO opq_jobs (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands,
                          submission_key, not_before)
    SELECT u.id, u.id, u.manifest, u.manifest_name, u.submitted_on, u.qos_rank, u.priority_rank,
           ARRAY(SELECT jsonb_array_elements_text(u.queues::jsonb)), ARRAY(SELECT jsonb_array_elements_text(u.commands::jsonb)),
           NULLIF(u.submission_key, ''), CASE WHEN u.not_before > 0 THEN to_timestamp(u.not_before) END
    FROM unnest($1::text[], $2::bytea[], $3::text[], $4::text[], $5::int2[], $6::int2[], $7::text[], $8::text[], $9::text[],
                $10::float8[])
         WITH ORDINALITY AS u(id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands,
                              submission_key, not_before, ord)
    ORDER BY u.ord
    ON CONFLICT DO NOTHING
    RETURNING id, qos_rank, priority_rank, seq, queues, commands, not_before
), live AS (
    INSERT INTO opq_live (id, qos_rank, priority_rank, seq, queues, commands, not_before)
    SELECT id, qos_rank, priority_rank, seq, queues, commands, not_before FROM inserted
), claimable AS (
    INSERT INTO opq_claimable (qos_rank, priority_rank, seq, id, queues, commands)
    SELECT qos_rank, priority_rank, seq, id, queues, commands FROM inserted WHERE not_before IS NULL
)
SELECT id FROM inserted;

-- name: InsertJob
-- One job, its id unique across the cluster: the requested id if free, else requested.N with N one more than
-- the largest taken (found by a range scan of the byte-ordered primary key: '/' follows '.').
-- A concurrent inserter may take the same candidate between the look and the insert: ON CONFLICT then waits
-- for it and returns no row, and the caller runs this again in the same transaction (a fresh snapshot).
-- No row also when the submission key ($9) is already there: the caller then looks it up (SubmittedJob).
-- $1 requested id, $2 manifest, $3 manifest name, $4 submitted on, $5 qos rank, $6 priority rank,
-- $7 queues, $8 commands, $9 submission key or NULL, $10 not before (epoch seconds, or NULL). With its opq_live
-- row, waiting, and unless delayed its opq_claimable row.
WITH inserted AS (
    INSERT INTO opq_jobs (id, requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands,
                          submission_key, not_before)
    SELECT candidate, $1, $2, $3, $4, $5, $6, $7, $8, $9, to_timestamp($10::float8)
    FROM (
        SELECT $1::text AS candidate, 0 AS rank
        UNION ALL
        SELECT $1::text || '.' || (coalesce(max(substring(id FROM length($1::text) + 2)::bigint), 0) + 1), 1
        FROM opq_jobs
        WHERE id > $1::text || '.' AND id < $1::text || '/'
          AND substring(id FROM length($1::text) + 2) ~ '^[0-9]{1,18}$'
    ) AS c
    WHERE NOT EXISTS (SELECT 1 FROM opq_jobs AS j WHERE j.id = c.candidate)
    ORDER BY rank
    LIMIT 1
    ON CONFLICT DO NOTHING
    RETURNING id, qos_rank, priority_rank, seq, queues, commands, not_before
), live AS (
    INSERT INTO opq_live (id, qos_rank, priority_rank, seq, queues, commands, not_before)
    SELECT id, qos_rank, priority_rank, seq, queues, commands, not_before FROM inserted
), claimable AS (
    INSERT INTO opq_claimable (qos_rank, priority_rank, seq, id, queues, commands)
    SELECT qos_rank, priority_rank, seq, id, queues, commands FROM inserted WHERE not_before IS NULL
)
SELECT id, seq FROM inserted;

-- name: SubmittedJob
-- The job a submission key already made (a submission repeated after a crash), if any.
SELECT id FROM opq_jobs WHERE submission_key = $1;

-- name: NotifyJobs
SELECT pg_notify('opqueued', 'jobs');

-- name: NotifyControl
SELECT pg_notify('opqueued', 'control');

-- name: NotifySlots
SELECT pg_notify('opqueued', 'slots');

-- name: NotifyNodes
-- A node registered: the others read what the cluster declares again (submissions validate against it).
SELECT pg_notify('opqueued', 'nodes');

-- name: NotifyProbe
-- A node's probe of its own wake-ups: its listener must hear 'probe <token>' (behind a pooler in transaction mode it
-- never does). $1 the token.
SELECT pg_notify('opqueued', 'probe ' || $1::text);

-- name: ClaimJobs
-- One claim round in one statement: up to $2 waiting jobs, in claim order, whose queues and commands are all
-- among the node's ($3, $4); rows another claimer holds are skipped, never waited for. Each gets a new fence.
-- $1 node, $2 limit, $3 node queues, $4 node commands. The statement is opq_claim (migration 10), whose plans the
-- server keeps per connection, on the claim-order index whatever the table's statistics say. Rows are input, and the
-- node's memory is bounded: a manifest comes back only while the manifests before it in claim order (those of at
-- most $6 bytes) hold fewer than $5 bytes (the first always does) and it holds at most $6; the others come back
-- empty, with their size (the node hands them back, or rejects one too big to be a manifest). Each comes with the
-- cancels asked for it while it waited, in order ('' for the whole job), which the node makes before any of its
-- operations starts.
SELECT id, requested_id, manifest, manifest_name, submitted_on, submitted_at, qos_rank, priority_rank, seq, fence, from_node,
       bytes, cancels
FROM opq_claim($1, $2, $3::text[], $4::text[], $5::bigint, $6::bigint);

-- name: Heartbeat
-- One statement per node per beat: renews the node's lease (and so those of all its jobs and slots) and
-- returns the jobs it still holds with their fences, so that it learns at once what it lost. $2: the process's
-- info ('' for any): a row another process registered since is not renewed (no row returned, as for no row).
-- $3: the node's progress on the jobs it runs (migration 6; NULL for none), for `show` on other nodes. From schema
-- 13 no index finds a node's rows (so that a claim writes none): the beat reads opq_live, the jobs waiting and running.
WITH beat AS (
    UPDATE opq_nodes SET last_heartbeat = now(), progress = $3 WHERE node = $1 AND ($2 = '' OR info = $2)
    RETURNING node, extract(epoch FROM last_heartbeat)::float8 AS at
)
SELECT beat.at, j.id, j.fence
FROM beat LEFT JOIN opq_live AS j ON j.node = beat.node AND j.state = 'running';

-- name: HeartbeatHeld
-- Heartbeat, asking only about the jobs $4 the node knows it holds, each found by its primary key: what it lost
-- among them. What the database may hold for the node beyond them (a claim whose answer never came) is left to
-- Heartbeat, which the node sends after anything that may have done that, and every minute.
WITH beat AS (
    UPDATE opq_nodes SET last_heartbeat = now(), progress = $3 WHERE node = $1 AND ($2 = '' OR info = $2)
    RETURNING node, extract(epoch FROM last_heartbeat)::float8 AS at
)
SELECT beat.at, j.id, j.fence
FROM beat LEFT JOIN opq_live AS j ON j.id = ANY($4::text[]) AND j.node = beat.node AND j.state = 'running';

-- name: NodeBeats
-- Every node's last beat as an exact token (microseconds of the database's clock, only ever compared for a change,
-- never read as a time) and its own leaseSeconds (NULL: the reader's): what a node watches to judge, by its own
-- monotonic clock, which nodes have gone silent (TakeOverSilent).
SELECT node, (extract(epoch FROM last_heartbeat) * 1000000)::bigint AS beat, lease_seconds FROM opq_nodes ORDER BY node;

-- name: TakeOverSilent
-- The nodes of $1 whose last beat is still exactly $2's (parallel arrays: none has beaten since the caller judged it
-- silent) lose their jobs (back to waiting, from_node set, claimable again), their cluster slots and their waits for
-- slots (each kind of wake-up notified once when any moved); returns the nodes taken over too. A node beating at this instant holds
-- its row lock: it is skipped, never half taken, and its new beat no longer matches.
WITH lost AS (
    SELECT n.node FROM opq_nodes AS n
    JOIN unnest($1::text[], $2::bigint[]) AS s (node, beat)
      ON n.node = s.node AND (extract(epoch FROM n.last_heartbeat) * 1000000)::bigint = s.beat
    FOR UPDATE OF n SKIP LOCKED
), freed AS (
    UPDATE opq_queue_slots AS s
    SET holder = NULL, job = NULL, operation = NULL, fence = NULL, acquired_at = NULL
    FROM lost WHERE s.holder = lost.node
    RETURNING s.queue
), waits AS (
    DELETE FROM opq_slot_waiters AS w USING lost WHERE w.node = lost.node
), moved AS (
    UPDATE opq_live AS j
    SET state = 'waiting', from_node = j.node, node = NULL, fence = NULL, claimed_at = NULL
    FROM lost WHERE j.state = 'running' AND j.node = lost.node
    RETURNING j.id, j.from_node, j.qos_rank, j.priority_rank, j.seq, j.queues, j.commands
), claimable AS (
    INSERT INTO opq_claimable (qos_rank, priority_rank, seq, id, queues, commands)
    SELECT qos_rank, priority_rank, seq, id, queues, commands FROM moved
)
SELECT 'job' AS kind, id, from_node FROM moved
UNION ALL
SELECT 'slot', queue, NULL FROM freed
UNION ALL
SELECT 'node', node, NULL FROM lost
UNION ALL
SELECT 'notify', '', NULL FROM (SELECT pg_notify('opqueued', 'jobs') FROM (SELECT 1 FROM moved LIMIT 1) AS m) AS n
UNION ALL
SELECT 'notify', '', NULL FROM (SELECT pg_notify('opqueued', 'slots') FROM (SELECT 1 FROM freed LIMIT 1) AS f) AS n;

-- name: CompleteJobs
-- Records the end of jobs, each only while the caller's fence still holds it: a node that lost a job gets no
-- row for it. Many in one statement, so that completions commit by the batch; opq_complete (migration 10) keeps
-- its plan per connection. $1 ids, $2 fences, $3 statuses, $4 result.plist bytes (parallel arrays).
SELECT id FROM opq_complete($1::text[], $2::bigint[], $3::text[], $4::bytea[]) AS c (id);

-- name: InsertFinishedJob
-- A job that ran to its end on the caller's node while the database had no row for it any more (restored from a
-- backup older than the job): recorded as finished there, under its id, so that show and wait on every node know
-- it and no later submission takes its id. No row returned when the id is taken meanwhile.
-- $1 requested id, $2 manifest, $3 manifest name, $4 submitted on, $5 qos rank, $6 priority rank, $7 queues,
-- $8 commands (as InsertJob's), $9 id, $10 node, $11 status, $12 result.plist bytes. Its end goes in opq_ended (over
-- one a row deleted by hand left there).
WITH inserted AS (
    INSERT INTO opq_jobs (requested_id, manifest, manifest_name, submitted_on, qos_rank, priority_rank, queues, commands, id)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
    ON CONFLICT DO NOTHING
    RETURNING id
), ended AS (
    INSERT INTO opq_ended AS e (id, node, fence, status, result)
    SELECT id, $10, nextval('opq_fence'), $11, $12 FROM inserted
    ON CONFLICT (id) DO UPDATE SET node = EXCLUDED.node, fence = EXCLUDED.fence, from_node = NULL, status = EXCLUDED.status,
                                   result = EXCLUDED.result, finished_at = now()
)
SELECT id FROM inserted;

-- name: AcquireSlots
-- Up to $4 free slots of queue $1 among 1..$2 for node $3, whose best waiting operation has priority $6 — unless
-- another node that beat within $5 seconds waits for one ahead of it (opq_slot_waiters: a higher priority, or the
-- same one since longer than $3 has waited at it, which without a recorded wait is from now). None when all are
-- held. Taking slots sends the node's turn to the back of its priority; when slots stay free and others wait, they
-- are woken to take them.
WITH mine AS (
    SELECT coalesce((SELECT since FROM opq_slot_waiters WHERE queue = $1 AND node = $3 AND priority = $6),
                    clock_timestamp()) AS since
), others AS (
    SELECT w.priority, w.since FROM opq_slot_waiters AS w JOIN opq_nodes AS n ON n.node = w.node
    WHERE w.queue = $1 AND w.node <> $3 AND n.last_heartbeat >= now() - make_interval(secs => coalesce(n.lease_seconds, $5::float8))
), ahead AS (
    SELECT 1 FROM others, mine
    WHERE others.priority > $6 OR (others.priority = $6 AND others.since < mine.since)
    LIMIT 1
), free AS (
    SELECT queue, slot FROM opq_queue_slots
    WHERE queue = $1 AND slot <= $2 AND holder IS NULL AND NOT EXISTS (SELECT 1 FROM ahead)
    ORDER BY slot
    LIMIT $4
    FOR UPDATE SKIP LOCKED
), taken AS (
    UPDATE opq_queue_slots AS s
    SET holder = $3, job = '', operation = '', fence = nextval('opq_fence'), acquired_at = now()
    FROM free
    WHERE s.queue = free.queue AND s.slot = free.slot
    RETURNING s.slot, s.fence
), served AS (
    UPDATE opq_slot_waiters SET since = clock_timestamp()
    WHERE queue = $1 AND node = $3 AND EXISTS (SELECT 1 FROM taken)
)
SELECT slot, fence,
       (SELECT pg_notify('opqueued', 'slots')
        WHERE EXISTS (SELECT 1 FROM others)
          AND (SELECT count(*) FROM opq_queue_slots WHERE queue = $1 AND slot <= $2 AND holder IS NULL)
              > (SELECT count(*) FROM taken)) AS notified
FROM taken;

-- name: KeepSlots
-- Node $3 holds slots $4 (fences $5) of queue $1 that its ended operations used, and would go on with an operation
-- of priority $6: it keeps them (its turn then goes to the back of its priority) unless another node that beat
-- within $2 seconds waits ahead of it — with a higher priority, or with the same one for 50 ms or more (nodes at
-- one priority take turns of at least that long: trading the slot after every short operation would cost four
-- statements each); then they are freed and the waiters woken. Returns the slots freed.
WITH ahead AS (
    SELECT 1 FROM opq_slot_waiters AS w JOIN opq_nodes AS n ON n.node = w.node
    WHERE w.queue = $1 AND w.node <> $3 AND n.last_heartbeat >= now() - make_interval(secs => coalesce(n.lease_seconds, $2::float8))
      AND (w.priority > $6 OR (w.priority = $6 AND w.since < clock_timestamp() - interval '50 milliseconds'))
    LIMIT 1
), freed AS (
    UPDATE opq_queue_slots AS s
    SET holder = NULL, job = NULL, operation = NULL, fence = NULL, acquired_at = NULL
    FROM unnest($4::integer[], $5::bigint[]) AS h (slot, fence)
    WHERE s.queue = $1 AND s.slot = h.slot AND s.fence = h.fence AND EXISTS (SELECT 1 FROM ahead)
    RETURNING s.slot
), served AS (
    UPDATE opq_slot_waiters SET since = clock_timestamp()
    WHERE queue = $1 AND node = $3 AND NOT EXISTS (SELECT 1 FROM ahead)
)
SELECT slot, (SELECT pg_notify('opqueued', 'slots')) FROM freed;

-- name: WaitForSlot
-- Node $2 waits for a slot of queue $1, its best waiting operation of priority $3: recorded, or its priority
-- changed (its turn at the new one starts now). Unchanged, nothing is written.
INSERT INTO opq_slot_waiters AS w (queue, node, priority) VALUES ($1, $2, $3)
ON CONFLICT (queue, node) DO UPDATE SET priority = EXCLUDED.priority, since = clock_timestamp()
WHERE w.priority <> EXCLUDED.priority;

-- name: StopWaitingForSlot
-- Node $2 waits for no slot of queue $1 any more; the nodes it held back are woken.
WITH gone AS (
    DELETE FROM opq_slot_waiters WHERE queue = $1 AND node = $2
    RETURNING queue
)
SELECT pg_notify('opqueued', 'slots') FROM gone;

-- name: ReleaseSlot
-- Frees a slot only while the caller's fence still holds it, and wakes the nodes waiting for one.
WITH released AS (
    UPDATE opq_queue_slots
    SET holder = NULL, job = NULL, operation = NULL, fence = NULL, acquired_at = NULL
    WHERE queue = $1 AND slot = $2 AND fence = $3
    RETURNING slot
)
SELECT slot, pg_notify('opqueued', 'slots') FROM released;

-- name: FreeNodeSlots
-- Frees every cluster slot held by node $1, whatever its fence, and wakes the nodes waiting for one. Run by a
-- node's process once, at its first registration and before it takes any slot: what its name holds then was held by
-- a process that is gone (kill -9 and a restart within the lease: takeover would never free them, since the new
-- process keeps the lease alive); its waits for slots are forgotten too. Returns the queues of the freed slots.
WITH freed AS (
    UPDATE opq_queue_slots
    SET holder = NULL, job = NULL, operation = NULL, fence = NULL, acquired_at = NULL
    WHERE holder = $1
    RETURNING queue
), waits AS (
    DELETE FROM opq_slot_waiters WHERE node = $1
)
SELECT queue, (SELECT pg_notify('opqueued', 'slots') FROM (SELECT 1 FROM freed LIMIT 1) AS f) FROM freed;

-- name: SlotHolders
SELECT slot, holder, job, operation, fence FROM opq_queue_slots
WHERE queue = $1 AND holder IS NOT NULL ORDER BY slot;

-- name: Suspend
-- Kept across restarts; every node is told at once (and polls anyway).
WITH done AS (
    INSERT INTO opq_suspended_queues (queue) VALUES ($1) ON CONFLICT (queue) DO NOTHING
)
SELECT pg_notify('opqueued', 'control');

-- name: Resume
WITH done AS (
    DELETE FROM opq_suspended_queues WHERE queue = $1
)
SELECT pg_notify('opqueued', 'control');

-- name: SuspendedQueues
SELECT queue FROM opq_suspended_queues ORDER BY queue;

-- name: RequestCancel
-- $1 job, $2 operation or NULL, $3 the asking node's deadline (seconds since the epoch). Returns the job's state
-- before ('' when unknown, 'late' when the statement reached the server after $3) and whether it was recorded. Late,
-- nothing is recorded: the node has told its client the cluster could not be asked (a server that was frozen, or a
-- statement queued behind an outage, must not make a cancel the client was told had not been made).
WITH target AS (
    SELECT id, state FROM opq_live WHERE id = $1 AND statement_timestamp() <= to_timestamp($3)
    UNION ALL
    SELECT id, 'finished' FROM opq_ended WHERE id = $1 AND statement_timestamp() <= to_timestamp($3)
), recorded AS (
    INSERT INTO opq_cancel_requests (job, operation)
    SELECT id, $2 FROM target WHERE state <> 'finished'
    RETURNING id
)
SELECT CASE WHEN statement_timestamp() > to_timestamp($3) THEN 'late' ELSE coalesce((SELECT state FROM target), '') END
       AS state, (SELECT count(*) FROM recorded)::integer AS recorded,
       (SELECT pg_notify('opqueued', 'control') FROM recorded LIMIT 1) AS notified;

-- name: ClaimCancelledJob
-- A waiting job whose whole-job cancel is recorded, claimed by the node that asked for it ($2) whatever the queues
-- and commands it needs: it runs nothing (the claim brings its cancels, made before any operation could start), so
-- it ends at once, published by that node, even when no live node could run it. No row when it no longer waits (its
-- claimer cancels it) or a claim under way holds it. $3: the most a manifest may hold (a bigger one comes back
-- empty, with its size, to be rejected). The columns are ClaimJobs'. A job not delayed leaves opq_claimable (schema
-- 13), its row there locked before its opq_live row, as a claim does (one a claim holds is skipped, never waited for).
WITH picked AS (
    SELECT l.id, l.qos_rank, l.priority_rank, l.seq FROM opq_live AS l
    WHERE l.id = $1 AND l.state = 'waiting'
      AND EXISTS (SELECT 1 FROM opq_cancel_requests AS r WHERE r.job = l.id AND r.operation IS NULL)
      AND (l.not_before IS NOT NULL
           OR EXISTS (SELECT 1 FROM opq_claimable AS c
                      WHERE c.qos_rank = l.qos_rank AND c.priority_rank = l.priority_rank AND c.seq = l.seq
                      FOR UPDATE SKIP LOCKED))
    FOR UPDATE SKIP LOCKED
), unlisted AS (
    DELETE FROM opq_claimable AS c USING picked
    WHERE c.qos_rank = picked.qos_rank AND c.priority_rank = picked.priority_rank AND c.seq = picked.seq
), claimed AS (
    UPDATE opq_live AS l
    SET state = 'running', node = $2, fence = nextval('opq_fence'), claimed_at = now(), not_before = NULL
    FROM picked
    WHERE l.id = picked.id
    RETURNING l.id, l.qos_rank, l.priority_rank, l.seq, l.fence, l.from_node
)
SELECT c.id, j.requested_id, CASE WHEN octet_length(j.manifest) <= $3::bigint THEN j.manifest ELSE ''::bytea END,
       j.manifest_name, j.submitted_on, extract(epoch FROM j.submitted_at)::float8, c.qos_rank, c.priority_rank, c.seq,
       c.fence, c.from_node, octet_length(j.manifest)::bigint,
       ARRAY(SELECT coalesce(r.operation, '') FROM opq_cancel_requests AS r WHERE r.job = c.id ORDER BY r.id) AS cancels
FROM claimed AS c JOIN opq_jobs AS j ON j.id = c.id;

-- name: PendingCancels
-- Cancels for the jobs node $1 runs now; then, without a fence, up to 64 waiting jobs cancelled as a whole that no
-- node has taken (the node that asked died before it could, or lost the database between the two statements): any
-- node takes them (ClaimCancelledJob), so that none waits for a node that may never come. Each request's job is
-- looked up by its id (a LATERAL subquery, kept apart by OFFSET 0): every node sends this every second, and a join
-- the planner may choose, with opq_cancel_requests never analysed, read every waiting and running job whenever a
-- single cancel was pending.
(SELECT c.job, c.operation, j.fence, c.id
 FROM opq_cancel_requests AS c
      CROSS JOIN LATERAL (SELECT l.fence FROM opq_live AS l WHERE l.id = c.job AND l.state = 'running' AND l.node = $1
                          OFFSET 0) AS j)
UNION ALL
(SELECT c.job, c.operation, NULL, c.id
 FROM opq_cancel_requests AS c
      CROSS JOIN LATERAL (SELECT FROM opq_live AS l WHERE l.id = c.job AND l.state = 'waiting' OFFSET 0) AS j
 WHERE c.operation IS NULL
 ORDER BY c.id LIMIT 64)
ORDER BY 4;

-- name: PendingCancelsForJob
SELECT operation FROM opq_cancel_requests WHERE job = $1 ORDER BY id;

-- name: LookupJob
-- One job, and while it runs the progress its node sent with its last beat (and that beat's time); a progress
-- larger than any node writes (64 KiB) is someone else's and not read. Its state is its opq_live row's, or finished
-- with its opq_ended row (schema 11).
SELECT j.id, j.requested_id, j.manifest, j.manifest_name, j.submitted_on, extract(epoch FROM j.submitted_at)::float8,
       coalesce(l.state, 'finished'), coalesce(l.node, e.node), coalesce(l.fence, e.fence), coalesce(l.from_node, e.from_node),
       e.status, e.result, extract(epoch FROM e.finished_at)::float8,
       CASE WHEN octet_length(n.progress) <= 65536 THEN n.progress END, extract(epoch FROM n.last_heartbeat)::float8,
       extract(epoch FROM l.not_before)::float8
FROM opq_jobs AS j
     LEFT JOIN opq_live AS l ON l.id = j.id
     LEFT JOIN opq_ended AS e ON l.id IS NULL AND e.id = j.id
     LEFT JOIN opq_nodes AS n ON l.state = 'running' AND n.node = l.node
WHERE j.id = $1 AND (l.id IS NOT NULL OR e.id IS NOT NULL);

-- name: FinishedJobs
-- opqueuectl list: one page of the finished jobs, newest first (finished_at, then id, both descending), those
-- before the cursor ($1: finished_at in microseconds since the epoch, exact; $2: id; NULL: from the newest) and
-- finished at $3 or later (NULL: any time), at most $4. The last column is the next page's cursor.
-- (Ended rows whose job was deleted by hand are left out.)
SELECT id, status, node, extract(epoch FROM finished_at)::float8, result, (extract(epoch FROM finished_at) * 1000000)::int8
FROM opq_ended AS e
WHERE EXISTS (SELECT 1 FROM opq_jobs AS j WHERE j.id = e.id)
  AND ($1::int8 IS NULL OR (finished_at, id) < ('epoch'::timestamptz + $1::int8 * interval '1 microsecond', $2::text))
  AND ($3::float8 IS NULL OR finished_at >= to_timestamp($3::float8))
ORDER BY finished_at DESC, id DESC
LIMIT $4;

-- name: Nodes
-- For status: every node, live when it beat within its lease ($1 seconds for one that recorded none), with the
-- jobs it runs now (when $2; else 0: the status thread counts them with LiveGroups) and the schema version its code
-- knows (NULL: from before migration 6). The running rows are counted in one read of opq_live (no index finds them
-- by node from schema 13), not one per node.
SELECT n.node, n.queues, n.commands, n.job_slots, extract(epoch FROM n.last_heartbeat)::float8,
       n.last_heartbeat >= now() - make_interval(secs => coalesce(n.lease_seconds, $1::float8)) AS live,
       coalesce(r.jobs, 0)::integer AS jobs, n.schema
FROM opq_nodes AS n
     LEFT JOIN (SELECT node, count(*) AS jobs FROM opq_live WHERE $2::boolean AND state = 'running' GROUP BY node) AS r
     ON r.node = n.node
ORDER BY n.node;

-- name: LiveGroups
-- For status, in one read of opq_live (the jobs waiting and running): how many jobs share a state, a node (running
-- ones) and the queues and commands they need. From these the status thread counts each node's jobs and each
-- queue's, and sees whether a waiting job needs what no live node declares (only then are such jobs read, by
-- JobsNoLiveNodeCanRun): one pass over the backlog where three were made.
SELECT state, CASE WHEN state = 'running' THEN node END, queues, commands, count(*)::integer
FROM opq_live
GROUP BY 1, 2, 3, 4;

-- name: JobsNoLiveNodeCanRun
-- Waiting jobs that no live node (beat within its lease, else $1 seconds) declares every queue and command of, with the
-- queues and commands that no live node declares at all (both empty: they are split across nodes).
WITH live AS (
    SELECT queues, commands FROM opq_nodes WHERE last_heartbeat >= now() - make_interval(secs => coalesce(lease_seconds, $1::float8))
), declared AS (
    SELECT coalesce((SELECT array_agg(DISTINCT q) FROM live, unnest(live.queues) AS q), '{}') AS queues,
           coalesce((SELECT array_agg(DISTINCT c) FROM live, unnest(live.commands) AS c), '{}') AS commands
)
SELECT j.id,
       ARRAY(SELECT unnest(j.queues) EXCEPT SELECT unnest(declared.queues) ORDER BY 1) AS missing_queues,
       ARRAY(SELECT unnest(j.commands) EXCEPT SELECT unnest(declared.commands) ORDER BY 1) AS missing_commands
FROM opq_live AS j, declared
WHERE j.state = 'waiting'
  AND NOT EXISTS (SELECT 1 FROM live WHERE j.queues <@ live.queues AND j.commands <@ live.commands)
ORDER BY j.seq
LIMIT $2;

-- name: DeclaredEverywhere
-- Every queue and command any node declares, down nodes included (submission validates against these).
-- The third column: every command signature ("name<TAB>signature"), sorted.
SELECT coalesce((SELECT array_agg(DISTINCT q ORDER BY q) FROM opq_nodes, unnest(queues) AS q), '{}'),
       coalesce((SELECT array_agg(DISTINCT c ORDER BY c) FROM opq_nodes, unnest(commands) AS c), '{}'),
       coalesce((SELECT array_agg(DISTINCT s ORDER BY s) FROM opq_nodes, unnest(command_signatures) AS s), '{}');

-- name: PruneFinished
-- One bounded batch: at most $2 ended jobs older than $1 days, their opq_ended rows and then their opq_jobs rows;
-- the caller repeats while a batch is full.
WITH ended AS (
    DELETE FROM opq_ended
    WHERE id IN (
        SELECT id FROM opq_ended
        WHERE finished_at < now() - make_interval(secs => $1::float8)
        ORDER BY finished_at
        LIMIT $2
    )
    RETURNING id
)
DELETE FROM opq_jobs AS j USING ended WHERE j.id = ended.id
RETURNING j.id;

-- name: PruneNodes
-- Nodes silent for more than $1 seconds that hold nothing (no running job, no cluster slot, no wait for one; a takeover
-- took them long ago): their rows go, and with them the queues and commands they declared, which submissions stop
-- accepting on their account. A node that comes back registers again. A node beating at this instant keeps its row
-- (the DELETE re-reads a row updated meanwhile). Notifies 'nodes' when any went.
WITH gone AS (
    DELETE FROM opq_nodes AS n
    WHERE n.last_heartbeat < now() - make_interval(secs => $1::float8)
      AND NOT EXISTS (SELECT 1 FROM opq_live AS j WHERE j.state = 'running' AND j.node = n.node)
      AND NOT EXISTS (SELECT 1 FROM opq_queue_slots AS s WHERE s.holder = n.node)
      AND NOT EXISTS (SELECT 1 FROM opq_slot_waiters AS w WHERE w.node = n.node)
    RETURNING n.node
)
SELECT node, (SELECT pg_notify('opqueued', 'nodes') FROM (SELECT 1 FROM gone LIMIT 1) AS g) FROM gone;

-- name: QueueCounts
-- For status: per queue, the jobs of the cluster that use it, waiting (claimable now or delayed) and running (a job
-- counts once in each of its queues). One read of opq_live, which holds only the jobs waiting and running (schema
-- 11), never the finished history.
SELECT q, count(*) FILTER (WHERE j.state = 'waiting')::integer, count(*) FILTER (WHERE j.state = 'running')::integer
FROM opq_live AS j, unnest(j.queues) AS q
GROUP BY q ORDER BY q;

-- name: ReleaseJobs
-- Hands jobs node $1 holds under the given fences back to waiting (from_node set): jobs whose lease the node
-- itself gave up (it stopped them at its own deadline, or did not find them at restart): claimable again. Notifies
-- when any moved.
-- $1 node, $2 ids, $3 fences (parallel arrays).
WITH moved AS (
    UPDATE opq_live AS j
    SET state = 'waiting', from_node = j.node, node = NULL, fence = NULL, claimed_at = NULL
    FROM unnest($2::text[], $3::bigint[]) AS r (id, fence)
    WHERE j.id = r.id AND j.fence = r.fence AND j.node = $1 AND j.state = 'running'
    RETURNING j.id, j.qos_rank, j.priority_rank, j.seq, j.queues, j.commands
), claimable AS (
    INSERT INTO opq_claimable (qos_rank, priority_rank, seq, id, queues, commands)
    SELECT qos_rank, priority_rank, seq, id, queues, commands FROM moved
)
SELECT id, (SELECT pg_notify('opqueued', 'jobs') FROM (SELECT 1 FROM moved LIMIT 1) AS m) FROM moved;

-- name: GrantStarts
-- clusterRateLimit (schema 9): up to $3 start grants of queue $1 for node $2, at most $4 counted per $5 seconds,
-- each to be used within $6 seconds; see opq_grant_starts. Returns the grants' ids, when the next one frees (NULL:
-- one is free now) and the database's now, both in seconds since the epoch.
SELECT ids, next_free, db_now FROM opq_grant_starts($1, $2, $3, $4, $5, $6);

-- name: SettleStarts
-- Node $1 used grants $2 (each then counts until now + its window, if that is sooner) and did not use grants $3
-- (they stop counting now): a report only shortens a grant's count. Wakes the nodes that wait for grants.
WITH settled AS (
    UPDATE opq_rate_grants
    SET counts_until = LEAST(counts_until,
                             now() + CASE WHEN id = ANY($2::bigint[]) THEN make_interval(secs => seconds) ELSE interval '0' END)
    WHERE node = $1 AND (id = ANY($2::bigint[]) OR id = ANY($3::bigint[]))
    RETURNING id
)
SELECT count(*)::integer, (SELECT pg_notify('opqueued', 'rates') FROM (SELECT 1 FROM settled LIMIT 1) AS s) FROM settled;
