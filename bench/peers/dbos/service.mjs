// The order saga on DBOS Transact (bench/run.sh's DBOS phase): `POST /orders` with an
// `Idempotency-Key` header starts the workflow `placeOrder` with that key as its workflow ID
// (DBOS's own deduplication: a second request with the key gets the first one's result) and
// answers when it ends: 201 and the order, or the refused participant's status and the
// failure. Reserve stock, then charge; when the charge is refused for good, release the stock
// (the compensation). Each participant call is a DBOS step (its outcome checkpointed in the
// system database before the workflow goes on), retried while it fails transiently; the
// derived keys make each retry and each recovery after a crash safe at the participant.
//
// Env: PEER_PORT (default 3000), DBOS_SYSTEM_DATABASE_URL (required), DBOS_POOL_SIZE (20).
import http from 'node:http';

import { DBOS } from '@dbos-inc/dbos-sdk';

import { charge, completed, refusal, release, reserve } from '../participants.mjs';

// Transient failures (Transient, thrown by the calls) are retried with backoff, for as long
// as idemsaga's step deadline would ride out a participant restart.
const STEP = { retriesAllowed: true, intervalSeconds: 0.05, backoffRate: 2, maxAttempts: 20 };

async function placeOrderImpl(order) {
  const key = DBOS.workflowID;
  const reserved = await DBOS.runStep(() => reserve(key, order), { name: 'reserve', ...STEP });
  if (!reserved.ok) return { http: reserved.status, body: refusal('inventory', reserved, []) };
  const charged = await DBOS.runStep(() => charge(key, order), { name: 'charge', ...STEP });
  if (!charged.ok) {
    // A compensation is retried until it succeeds.
    await DBOS.runStep(() => release(key), { name: 'release', ...STEP, maxAttempts: 1e9 });
    return { http: charged.status, body: refusal('payment', charged, ['inventory']) };
  }
  return { http: 201, body: completed(reserved, charged) };
}
const placeOrder = DBOS.registerWorkflow(placeOrderImpl, { name: 'placeOrder' });

function answer(res, status, body) {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'Content-Type': 'application/json',
    'Content-Length': Buffer.byteLength(text),
  });
  res.end(text);
}

async function handle(req, res) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  if (req.method !== 'POST' || req.url !== '/orders') {
    return answer(res, 404, { code: 'not_found' });
  }
  const key = req.headers['idempotency-key'];
  if (!key || key.length > 255) {
    return answer(res, 400, { code: 'idempotency_key_invalid' });
  }
  let order;
  try {
    order = JSON.parse(Buffer.concat(chunks).toString('utf8'));
  } catch {
    return answer(res, 400, { code: 'invalid_json' });
  }
  if (order === null || typeof order !== 'object' || !Array.isArray(order.items)) {
    return answer(res, 400, { code: 'invalid_order' });
  }
  try {
    const h = await DBOS.startWorkflow(placeOrder, { workflowID: key })(order);
    const out = await h.getResult();
    answer(res, out.http, out.body);
  } catch (e) {
    answer(res, 500, { code: 'internal', detail: String(e?.message || e) });
  }
}

DBOS.setConfig({
  name: 'idemsaga-bench-peer',
  systemDatabaseUrl: process.env.DBOS_SYSTEM_DATABASE_URL,
  systemDatabasePoolSize: Number(process.env.DBOS_POOL_SIZE || 20),
  logLevel: 'warn',
});
await DBOS.launch();
const port = Number(process.env.PEER_PORT || 3000);
const server = http.createServer((req, res) => void handle(req, res));
server.keepAliveTimeout = 65000;
server.listen(port, '127.0.0.1', () => console.log(`dbos peer ready on ${port}`));
const stop = async () => {
  server.close();
  await DBOS.shutdown();
  process.exit(0);
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
