-- The dead-letter fingerprint normalised every run of digits, inside words too: `Abort: e2e says no`
-- grouped as `Abort: e<n>e says no`, and `Http2Error`, `S3`, `IPv4` were mangled the same way (issue 14,
-- point 17). Now only whole numbers (digits not preceded by a letter, a digit or `_`: `30`, `30s`, `id=42`),
-- uuids and 0x-hex are replaced. Still the only definition (see 0005).
CREATE OR REPLACE FUNCTION dygo_error_fingerprint(error text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT regexp_replace(regexp_replace(regexp_replace(
    left(split_part(coalesce(error, ''), E'\n', 1), 300),
    '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<id>', 'gi'),
    '(^|[^[:alnum:]_])0x[0-9a-f]+', '\1<hex>', 'gi'),
    '(^|[^[:alnum:]_])[0-9]+', '\1<n>', 'g')
$$;

-- Dead jobs keep the fingerprint they died with; regroup those the old rule mangled. Only rows whose
-- fingerprint changes are written (the dead set is bounded by dead_retention).
UPDATE dygo_jobs SET dead_fingerprint = dygo_error_fingerprint(last_error)
WHERE state = 'dead' AND dead_fingerprint IS DISTINCT FROM dygo_error_fingerprint(last_error);
