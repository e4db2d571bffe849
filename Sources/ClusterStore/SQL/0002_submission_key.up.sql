-- opqueued cluster schema, version 2: idempotent submission, and what each node's commands take.

-- A submission's key (node, local folder, reception time): a node that crashed between the insert's commit and the
-- removal of its local copy submits it again at its next start, and the insert then finds the row it made instead
-- of making a second one. NULL for rows inserted without one (UNIQUE lets NULLs repeat).
ALTER TABLE opq_jobs ADD COLUMN submission_key text;
CREATE UNIQUE INDEX opq_jobs_submission_key ON opq_jobs (submission_key);

-- Per declared command, "name<TAB>signature" (its queue and parameters, as the node's configuration says), so that
-- a node that does not declare a command itself can still check a manifest's arguments for it at submission.
ALTER TABLE opq_nodes ADD COLUMN command_signatures text[] NOT NULL DEFAULT '{}';
