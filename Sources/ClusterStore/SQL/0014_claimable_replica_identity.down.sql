-- Undoes 0014_claimable_replica_identity.up.sql: opq_claimable's replica identity back to the default (none, since
-- it has no primary key).
ALTER TABLE opq_claimable REPLICA IDENTITY DEFAULT;
DELETE FROM opq_schema_readers WHERE version = 14;
DELETE FROM opq_schema_version WHERE version = 14;
