// The order saga's calls to idemsaga's demo participants, shared by the Restate and DBOS peers
// so that both send what idemsaga's own saga sends (steps/place_order.cpp): the same paths,
// bodies, derived keys (<key>-inventory, <key>-payment, <key>-inventory-compensate), tenant
// header and bearer service token. Stateless; safe for any number of concurrent calls.
//
// Each call returns {ok, status, body} for a definite answer and throws on a transient one
// (no connection, 5xx, 429, the guard's 409 "in progress"), so the peer's engine retries it
// with the same key, as idemsaga's client does.

const env = process.env;
const INVENTORY = env.PEER_INVENTORY_URL || 'http://127.0.0.1:18081';
const PAYMENT = env.PEER_PAYMENT_URL || 'http://127.0.0.1:18082';
const TOKEN = env.PEER_SERVICE_TOKEN || 'dev-service-token';
const TENANT = env.PEER_TENANT || 'bench-peer';

export class Transient extends Error {}

async function post(base, path, key, body) {
  let res;
  try {
    res = await fetch(base + path, {
      method: 'POST',
      headers: {
        'Authorization': `Bearer ${TOKEN}`,
        'X-Tenant-ID': TENANT,
        'Idempotency-Key': key,
        'Content-Type': 'application/json',
      },
      body: JSON.stringify(body),
    });
  } catch (e) {
    throw new Transient(`${path}: ${e.cause?.code || e.message}`);
  }
  const text = await res.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {
    json = { text };
  }
  const inProgress = res.status === 409 && json?.code === 'idempotency_key_in_progress';
  if (res.status >= 500 || res.status === 429 || inProgress) {
    throw new Transient(`${path}: HTTP ${res.status} ${json?.code || ''}`);
  }
  return { ok: res.status >= 200 && res.status < 300, status: res.status, body: json };
}

export const reserve = (key, order) =>
  post(INVENTORY, '/v1/reservations', `${key}-inventory`, { items: order.items });

export const charge = (key, order) =>
  post(PAYMENT, '/v1/charges', `${key}-payment`, {
    amount_cents: order.amount_cents,
    currency: order.currency,
    customer_id: order.customer_id,
    payment_method: order.payment_method,
  });

// The compensation of a reservation the saga saw applied. Retried until it succeeds: a
// refusal here is not an answer the saga can act on, so it throws like a transient failure.
export async function release(key) {
  const r = await post(INVENTORY, '/v1/reservations/release', `${key}-inventory-compensate`, {
    action_key: `${key}-inventory`,
    action_applied: true,
  });
  if (!r.ok) throw new Transient(`release: HTTP ${r.status} ${r.body?.code || ''}`);
  return r;
}

// The saga's answer to a refused step: the participant's status and problem, as idemsaga's
// `failed` answer carries them.
export function refusal(step, r, compensated) {
  return {
    status: 'failed',
    step,
    participant_status: r.status,
    code: r.body?.code || 'refused',
    detail: r.body?.detail || '',
    compensated,
  };
}

export function completed(reservation, charged) {
  return {
    status: 'completed',
    reservation_id: reservation.body.reservation_id,
    charge_id: charged.body.charge_id,
  };
}
