-- Legacy migration 0011_fingerprint_whole_numbers: finishes a database made before 0016_baseline. Never edit.

CREATE OR REPLACE FUNCTION dygo_error_fingerprint(error text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT regexp_replace(regexp_replace(regexp_replace(
    left(split_part(coalesce(error, ''), E'\n', 1), 300),
    '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<id>', 'gi'),
    '(^|[^[:alnum:]_])0x[0-9a-f]+', '\1<hex>', 'gi'),
    '(^|[^[:alnum:]_])[0-9]+', '\1<n>', 'g')
$$;

UPDATE dygo_jobs SET dead_fingerprint = dygo_error_fingerprint(last_error)
WHERE state = 'dead' AND dead_fingerprint IS DISTINCT FROM dygo_error_fingerprint(last_error);
