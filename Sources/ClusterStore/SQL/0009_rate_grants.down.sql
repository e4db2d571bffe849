-- Undoes 0009_rate_grants.up.sql. Nodes of schema 8 know no clusterRateLimit.
DROP FUNCTION opq_grant_starts(text, text, integer, integer, float8, float8);
DROP TABLE opq_rate_grants;
DROP TABLE opq_rate_queues;
DELETE FROM opq_schema_readers WHERE version = 9;
DELETE FROM opq_schema_version WHERE version = 9;
