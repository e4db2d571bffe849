-- Undoes 0006_node_progress.up.sql.
ALTER TABLE opq_nodes DROP COLUMN IF EXISTS progress;
DELETE FROM opq_schema_version WHERE version = 6;
