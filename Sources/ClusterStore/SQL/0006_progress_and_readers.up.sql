-- opqueued cluster schema, version 6: each node's progress on the jobs it runs, written by its heartbeat; and which
-- opqueued may still run against each schema version, so that later additive versions need no stop of the cluster.
--
-- Nodes never talk to each other, so `opqueuectl show` of a job running on another node could say only `unknown`
-- for its operations. Each beat (already one UPDATE of the node's row) now also stores the states of the node's
-- running jobs' operations, an opaque property list the node writes and reads (bounded by the node, 64 KiB): no
-- statement more, one row per node, never a row per job. NULL: nothing sent (a node of an older opqueued).
ALTER TABLE opq_nodes ADD COLUMN progress bytea;

-- The newest schema version each node's code knows, written when it registers: `status` shows it, so that an operator
-- upgrading node by node sees which are left (NULL: a node registered by an opqueued from before this version).
ALTER TABLE opq_nodes ADD COLUMN schema integer;

-- Until version 5 a node refused any schema newer than it knew: every upgrade stopped the whole cluster. From here on
-- each migration also says the oldest schema version whose code may still run against it (itself when it changes
-- what older code reads or writes; an older one when it only adds what older code never touches): a node that knows
-- at least `oldest_reader` runs against a newer schema, and upgrading node by node works. Every migration from 6 on
-- inserts its row (a test checks it).
CREATE TABLE opq_schema_readers (
    version       integer PRIMARY KEY,
    oldest_reader integer NOT NULL CHECK (oldest_reader >= 6 AND oldest_reader <= version)
);
INSERT INTO opq_schema_readers (version, oldest_reader) VALUES (6, 6);
