// The order saga on Restate (bench/run.sh's Restate phase): the service `orders`, handler
// `place`, called at the Restate ingress as `POST /orders/place` with an `Idempotency-Key`
// header (Restate's own ingress deduplication) and the same key in `X-Order-Key`. Reserve
// stock, then charge; when the charge is refused for good, release the stock (the
// compensation) and fail with the participant's status. Every participant call is a `ctx.run`
// (journaled by the Restate server before the handler goes on), retried by Restate while it
// fails transiently; the derived keys make each retry and each replay after a crash safe at
// the participant.
//
// Served over HTTP/2 on PEER_PORT (default 9080) for the Restate server to invoke.
import * as restate from '@restatedev/restate-sdk';

import { charge, completed, refusal, release, reserve } from '../participants.mjs';

const orders = restate.service({
  name: 'orders',
  handlers: {
    place: async (ctx, order) => {
      // Restate 1.7.12's ingress keeps the Idempotency-Key header to itself (the SDK's
      // idempotencyKey is filled only by newer servers), so the load generator sends the same
      // key in X-Order-Key too (loadgen --key-header); the ingress deduplicates on the first.
      const req = ctx.request();
      const key = req.idempotencyKey || req.headers.get('x-order-key');
      if (!key) {
        throw new restate.TerminalError('Idempotency-Key and X-Order-Key are required', {
          errorCode: 400,
        });
      }
      const reserved = await ctx.run('reserve', () => reserve(key, order));
      if (!reserved.ok) {
        throw new restate.TerminalError(JSON.stringify(refusal('inventory', reserved, [])), {
          errorCode: reserved.status,
        });
      }
      const charged = await ctx.run('charge', () => charge(key, order));
      if (!charged.ok) {
        await ctx.run('release', () => release(key));
        throw new restate.TerminalError(
          JSON.stringify(refusal('payment', charged, ['inventory'])),
          { errorCode: charged.status },
        );
      }
      return completed(reserved, charged);
    },
  },
});

const port = Number(process.env.PEER_PORT || 9080);
restate.serve({ services: [orders], port }).then((p) => console.log(`restate peer ready on ${p}`));
