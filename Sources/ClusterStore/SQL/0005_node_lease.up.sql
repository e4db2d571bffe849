-- opqueued cluster schema, version 5: each node's own leaseSeconds, recorded at registration.
--
-- A node is lost once it has been silent for its own lease, not for the lease of whichever node looks: a node with
-- leaseSeconds = 60 beats every 20 s, and a node configured with 15 took its jobs over between two of its beats,
-- again and again (every job of the first ran several times). Liveness for status and for slot waits is judged
-- the same way. NULL (a node registered by an older opqueued): the looking node's lease, as before.
ALTER TABLE opq_nodes ADD COLUMN lease_seconds float8 CHECK (lease_seconds IS NULL OR lease_seconds > 0);
