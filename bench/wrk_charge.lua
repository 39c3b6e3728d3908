-- wrk script for the instrument check (bench/run.sh): the same guarded charge loadgen sends,
-- POST /v1/charges with a unique Idempotency-Key per request: <prefix>-<thread id>-<counter>.
--   wrk -t1 -c16 -d10s -s bench/wrk_charge.lua http://127.0.0.1:8082 -- <prefix>
-- done() prints one JSON line (prefixed "wrk-json ") for run.sh to read.
local next_id = 1

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
end

function init(args)
  prefix = (args[1] or "wrk") .. "-" .. id .. "-"
  counter = 0
  wrk.method = "POST"
  wrk.path = "/v1/charges"
  wrk.headers["Authorization"] = "Bearer dev-service-token"
  wrk.headers["X-Tenant-ID"] = "bench"
  wrk.headers["Content-Type"] = "application/json"
  wrk.body = '{"amount_cents":2500,"currency":"USD","customer_id":"cust_1","payment_method":"pm_card_visa"}'
end

function request()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = prefix .. counter
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
