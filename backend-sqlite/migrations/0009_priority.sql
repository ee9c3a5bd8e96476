-- Priorities (`Job::priority`): a claim takes the ready jobs of the highest priority first, and
-- oldest first within one. Every row before this is 0.
ALTER TABLE redrive_jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100);

-- Every priority a job was inserted with, 0 always, kept by the trigger below whatever inserts the
-- job: a claim reads the ready index at each of these, highest first, as a range of its own that
-- ends at the first job not yet due. Kept (a priority no job has any more costs a claim one empty
-- look into the index).
CREATE TABLE redrive_priorities (priority INTEGER PRIMARY KEY);
INSERT INTO redrive_priorities (priority) VALUES (0);
CREATE TRIGGER redrive_jobs_priority AFTER INSERT ON redrive_jobs WHEN NEW.priority <> 0
BEGIN
    INSERT OR IGNORE INTO redrive_priorities (priority) VALUES (NEW.priority);
END;

-- The ready index by priority, then as before (with the order key, so that a claim reads nothing
-- else of a job it passes over).
DROP INDEX redrive_jobs_ready;
CREATE INDEX redrive_jobs_ready ON redrive_jobs (priority DESC, ready_at, id, order_key) WHERE status = 'queued';
