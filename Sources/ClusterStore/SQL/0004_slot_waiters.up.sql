-- opqueued cluster schema, version 4: cluster slots go by priority (SPEC §8), across nodes as within one.
--
-- A node whose operations of a cluster-limited queue wait for a slot records here the highest queuePriority among
-- them; it deletes its row once it waits for none. A node takes a free slot only while no other live node waits
-- with a higher priority, or with the same priority since longer: `since` is when the node began to wait at this
-- priority or was last given a slot, so that nodes waiting at one priority are served in turn.
CREATE TABLE opq_slot_waiters (
    queue    text NOT NULL,
    node     text NOT NULL,
    priority smallint NOT NULL,
    since    timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (queue, node)
);
