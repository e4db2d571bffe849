-- Undoes 0002_submission_key.up.sql.
ALTER TABLE opq_nodes DROP COLUMN IF EXISTS command_signatures;
DROP INDEX IF EXISTS opq_jobs_submission_key;
ALTER TABLE opq_jobs DROP COLUMN IF EXISTS submission_key;
DELETE FROM opq_schema_version WHERE version = 2;
