-- Undoes 0005_node_lease.up.sql.
ALTER TABLE opq_nodes DROP COLUMN IF EXISTS lease_seconds;
DELETE FROM opq_schema_version WHERE version = 5;
