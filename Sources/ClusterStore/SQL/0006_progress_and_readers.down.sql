-- Undoes 0006_progress_and_readers.up.sql.
DROP TABLE IF EXISTS opq_schema_readers;
ALTER TABLE opq_nodes DROP COLUMN IF EXISTS progress;
ALTER TABLE opq_nodes DROP COLUMN IF EXISTS schema;
DELETE FROM opq_schema_version WHERE version = 6;
