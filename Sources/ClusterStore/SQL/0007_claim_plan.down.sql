-- Undoes 0007_claim_plan.up.sql.
ALTER FUNCTION opq_claim_jobs(text, bigint, text[], text[]) RESET enable_seqscan;
DELETE FROM opq_schema_readers WHERE version = 7;
DELETE FROM opq_schema_version WHERE version = 7;
