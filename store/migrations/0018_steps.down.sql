-- Undo 0018: the recorded steps and the events go; a job that used them runs its steps again on its next
-- attempt.
DROP FUNCTION dygo_lock_event(text);
DROP TABLE dygo_events;
DROP TABLE dygo_steps;
