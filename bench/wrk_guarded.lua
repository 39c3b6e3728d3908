-- wrk script for a participant's guarded action (bench/run.sh): POST PATH with BODY and a unique
-- Idempotency-Key per request (<prefix>-<thread id>-<counter>: every request a claim and an
-- effect), or one key for all (`same`: every request but the first a replay).
--   wrk -t1 -c16 -d10s -s bench/wrk_guarded.lua http://127.0.0.1:8082 -- <prefix> unique|same PATH BODY
-- e.g. the instrument check's charge: ... -- chk unique /v1/charges '{"amount_cents":2500,...}'
-- done() prints one JSON line (prefixed "wrk-json ") for run.sh to read; non-2xx answers count
-- as errors.status.
local next_id = 1

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
end

function init(args)
  prefix = (args[1] or "wrk") .. "-" .. id .. "-"
  same = args[2] == "same" and ((args[1] or "wrk") .. "-same") or nil
  counter = 0
  wrk.method = "POST"
  wrk.path = args[3]
  wrk.headers["Authorization"] = "Bearer dev-service-token"
  wrk.headers["X-Tenant-ID"] = "bench"
  wrk.headers["Content-Type"] = "application/json"
  wrk.body = args[4]
end

function request()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = same or (prefix .. counter)
  return wrk.format()
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'wrk-json {"requests":%d,"seconds":%.3f,"per_second":%.1f,"p50_ms":%.3f,"p99_ms":%.3f,' ..
    '"max_ms":%.3f,"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}}\n',
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1e3, latency:percentile(99) / 1e3, latency.max / 1e3,
    e.connect, e.read, e.write, e.status, e.timeout))
end
