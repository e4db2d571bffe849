-- Undoes 0010_cached_claim_plans.up.sql.
DROP FUNCTION opq_complete(text[], bigint[], text[], bytea[]);
DROP FUNCTION opq_claim(text, bigint, text[], text[], bigint, bigint);
DELETE FROM opq_schema_readers WHERE version = 10;
DELETE FROM opq_schema_version WHERE version = 10;
