-- Undoes 0001_initial.up.sql: every table and sequence of schema version 1, history included.
DROP TABLE IF EXISTS opq_cancel_requests;
DROP TABLE IF EXISTS opq_suspended_queues;
DROP TABLE IF EXISTS opq_queue_slots;
DROP TABLE IF EXISTS opq_jobs;
DROP SEQUENCE IF EXISTS opq_fence;
DROP TABLE IF EXISTS opq_nodes;
DROP TABLE IF EXISTS opq_schema_version;
