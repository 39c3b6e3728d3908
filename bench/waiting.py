#!/usr/bin/env python3
"""Many sagas waiting at once (bench/waiting.sh): submits N orders paid by a card that needs
3-D Secure (each parks, waiting for its confirmation), or delivers their confirmations, from
C keep-alive connections, and prints one JSON line: statuses, p50/p99 and the wall time.

  waiting.py orders|confirm URL N [C] [PREFIX]
"""
import http.client
import json
import sys
import threading
import time
from urllib.parse import urlparse

ORDER = ('{"customer_id":"cust_1","items":[{"sku":"widget","quantity":1}],"amount_cents":2500,'
         '"currency":"USD","payment_method":"pm_card_3ds"}')


def main():
    what, url, n = sys.argv[1], urlparse(sys.argv[2]), int(sys.argv[3])
    conns = int(sys.argv[4]) if len(sys.argv) > 4 else 32
    prefix = sys.argv[5] if len(sys.argv) > 5 else "wait"
    statuses, latencies, lock, nxt = {}, [], threading.Lock(), iter(range(n))

    def worker():
        c = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            key = f"{prefix}-{i}"
            headers = {"Authorization": "Bearer dev-key-demo", "Content-Type": "application/json"}
            if what == "orders":
                path, body = "/v1/orders", ORDER
                headers["Idempotency-Key"] = key
            else:
                path, body = f"/v1/runs/place_order/{key}/events/payment_confirmed", "{}"
                headers["Idempotency-Key"] = key + "-confirmed"
            t = time.monotonic()
            try:
                c.request("POST", path, body, headers)
                r = c.getresponse()
                r.read()
                status = r.status
            except Exception:  # noqa: BLE001 - counted as no answer, and reconnect
                status = 0
                c.close()
                c = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
            with lock:
                statuses[status] = statuses.get(status, 0) + 1
                latencies.append((time.monotonic() - t) * 1000)

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    latencies.sort()
    print(json.dumps({"what": what, "n": n, "connections": conns,
                      "wall_s": round(time.monotonic() - started, 2),
                      "statuses": {str(k): v for k, v in sorted(statuses.items())},
                      "p50_ms": round(latencies[len(latencies) // 2], 1),
                      "p99_ms": round(latencies[int(len(latencies) * 0.99)], 1)}))


if __name__ == "__main__":
    main()
