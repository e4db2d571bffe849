-- opqueued cluster schema, version 14: opq_claimable, the one table without a primary key, is identified by its whole
-- row for logical replication. A publication of every table (CREATE PUBLICATION … FOR ALL TABLES: a move to a new
-- server or major version by logical replication, change data capture) refuses deletes from a table with no replica
-- identity, and every claim deletes from opq_claimable: the whole cluster would stop claiming. FULL costs nothing
-- unless wal_level is logical, and then a deleted row is logged whole (some fifty bytes). Code of 13 runs against it.
ALTER TABLE opq_claimable REPLICA IDENTITY FULL;
INSERT INTO opq_schema_readers (version, oldest_reader) VALUES (14, 13);
