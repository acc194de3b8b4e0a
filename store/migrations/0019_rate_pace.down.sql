-- Undo 0019: rate limits count starts in their window again; bursts set on limits are forgotten.
DROP FUNCTION dygo_queue_limits_use(bigint[], text[], boolean[], boolean[]);
DROP TABLE dygo_limit_pace;
ALTER TABLE dygo_limits DROP COLUMN rate_burst, DROP COLUMN file_burst;
