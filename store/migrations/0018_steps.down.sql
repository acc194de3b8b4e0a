-- Undo 0018: the recorded steps go; a job that used them runs its steps again on its next attempt.
DROP TABLE dygo_steps;
