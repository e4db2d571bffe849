-- Undoes 0004_slot_waiters.up.sql.
DROP TABLE IF EXISTS opq_slot_waiters;
DELETE FROM opq_schema_version WHERE version = 4;
