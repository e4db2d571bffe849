-- opqueued cluster schema, version 7: the claim keeps to the claim-order index once the table is analysed, too.
--
-- Schema 3 turned bitmap scans off for opq_claim_jobs, for a table without statistics. With statistics (autovacuum
-- analyses opq_jobs as it fills) the planner estimates from the array columns' statistics that a single row matches
-- `queues <@ node_queues AND commands <@ node_commands`, and may then prefer reading the whole table and sorting
-- what matches to walking the index for that one row (which plan wins depends on the backlog's size): each claim
-- then read and sorted every row (22 ms for a claim of 20 with 20,000 waiting here) instead of reading the index in
-- order and stopping after `wanted` (0.8 ms). Sequential scans are turned off for the function's statement as well. The function's signature and rows are unchanged, so code of schema 6 runs against this one as before.
ALTER FUNCTION opq_claim_jobs(text, bigint, text[], text[]) SET enable_seqscan = off;
INSERT INTO opq_schema_readers (version, oldest_reader) VALUES (7, 6);
