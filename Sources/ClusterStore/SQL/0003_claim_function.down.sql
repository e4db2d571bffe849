-- Undoes 0003_claim_function.up.sql.
DROP FUNCTION IF EXISTS opq_claim_jobs(text, bigint, text[], text[]);
DELETE FROM opq_schema_version WHERE version = 3;
