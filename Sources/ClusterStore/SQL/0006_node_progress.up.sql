-- opqueued cluster schema, version 6: each node's progress on the jobs it runs, written by its heartbeat.
--
-- Nodes never talk to each other, so `opqueuectl show` of a job running on another node could say only `unknown`
-- for its operations. Each beat (already one UPDATE of the node's row) now also stores the states of the node's
-- running jobs' operations, an opaque property list the node writes and reads (bounded by the node, 64 KiB): no
-- statement more, one row per node, never a row per job. NULL: nothing sent (a node of an older opqueued).
ALTER TABLE opq_nodes ADD COLUMN progress bytea;
