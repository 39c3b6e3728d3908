-- bench/run.sh's growth phases: N more finished keys in a service's idempotency_keys, copies of
-- one real finished row (the template key :tpl) whose unique columns get values of their own
-- (prefix :pfx), trace ids of their own and creation times spread over a day, expiring at now()
-- + :exp. Generated from the catalog, so it follows the table as migrations change it.
--   psql -v tpl=KEY -v n=N -v exp='30 days' -v pfx=PREFIX DATABASE_URL -f bench/grow_keys.sql
SELECT format('INSERT INTO idempotency_keys (%s) SELECT %s FROM idempotency_keys t, generate_series(1, %s) g WHERE t.idempotency_key = %L',
  string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum),
  string_agg(CASE
    WHEN a.attname = 'expires_at' THEN format('now() + interval %L', :'exp')
    -- as real keys have them: traces of their own (beginning with their second, as the
    -- orchestrator makes them), creation times spread over a day
    WHEN a.attname = 'trace_id' THEN format(
      'lpad(to_hex(extract(epoch FROM t.created_at - g * interval ''10 ms'')::bigint), 8, ''0'')'
      ' || left(md5(%L || g), 24)', :'pfx')
    WHEN a.attname = 'created_at' THEN 't.created_at - g * interval ''10 ms'''
    WHEN a.attname <> 'tenant_id' AND EXISTS (
           SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid AND i.indisunique
             AND a.attnum = ANY (i.indkey))
      THEN format('%L || g', :'pfx' || '-' || a.attname || '-')
    ELSE 't.' || quote_ident(a.attname) END, ', ' ORDER BY a.attnum),
  :n, :'tpl')
FROM pg_attribute a
WHERE a.attrelid = 'idempotency_keys'::regclass AND a.attnum > 0 AND NOT a.attisdropped
  AND a.attidentity = '' AND a.attgenerated = ''
  AND NOT EXISTS (SELECT 1 FROM pg_attrdef d WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum
                    AND pg_get_expr(d.adbin, d.adrelid) LIKE 'nextval(%')
\gexec
