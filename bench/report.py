#!/usr/bin/env python3
"""The arithmetic of bench/run.sh: phase lines, the instrument check, commits per order, and the
final report with its targets, which it also appends as one row to bench/RESULTS.md.

  report.py show FILE.json LABEL     one phase's line (loadgen's JSON)
  report.py check RESULTS_DIR        loadgen vs wrk on the participant baseline
  report.py commits RESULTS_DIR      write commits per order in the 16-connection phase
  report.py other-cpu RESULTS_DIR PHASE   % of the CPU other processes took during PHASE
  report.py inventory RESULTS_DIR    the inventory's guard on PostgreSQL and on Redis (wrk)
  report.py final RESULTS_DIR RESULTS.md
"""
import datetime
import json
import os
import re
import sys

MIB = 1024  # kB per MiB


def load(path):
    with open(path) as f:
        return json.load(f)


def values(res):
    out = {}
    with open(os.path.join(res, "values.env")) as f:
        for line in f:
            line = line.strip()
            if "=" in line:
                k, v = line.split("=", 1)
                out[k] = v
    return out


def num(v, key, default=None):
    try:
        return float(v[key])
    except (KeyError, ValueError):
        return default


INVENTORY_PHASES = ["inv_pg_claims", "inv_pg_replays", "inv_redis_claims", "inv_redis_replays",
                    "inv_redis_always", "inv_ff_claims", "inv_ff_replays"]
# bench/stores.sh: the library's mailer on each key store.
STORE_PHASES = ["st_pg_claims", "st_pg_replays", "st_redis_claims", "st_redis_replays",
                "st_dynamo_claims", "st_dynamo_replays"]
PHASES = ["check", "pgbench_w16", "orders16", "pgbench_w16_after", "pgbench_w64", "orders64",
          "pgbench_w64_after", "replays", "select"] + INVENTORY_PHASES + ["overload", "flood"]


def foreign_cpu(res, v, phases=None):
    """Per phase: the share of the machine's CPU (all cores) other processes used, and the
    busiest of them. None when cpuwatch saw nothing."""
    path = os.path.join(res, "cpuwatch.txt")
    if not os.path.exists(path):
        return None
    samples = []
    for line in open(path):
        parts = line.split()
        if len(parts) == 3:
            samples.append((float(parts[0]), float(parts[1]), parts[2]))
    cores = os.cpu_count() or 1
    out = {}
    for phase in phases or PHASES + ["run"]:
        a, b = num(v, f"t_{phase}_start"), num(v, f"t_{phase}_end")
        if a is None or b is None or b <= a:
            continue
        inside = [s for s in samples if a < s[0] <= b + 1.0]
        used = sum(s[1] for s in inside)
        top = {}
        for s in inside:
            if s[1] > 0:
                top[s[2]] = top.get(s[2], 0) + s[1]
        out[phase] = (100 * used / ((b - a) * cores), max(top, key=top.get) if top else "-")
    return out


def phase_line(r, label):
    st = " ".join(f"{k}:{v}" for k, v in sorted(r["statuses"].items()))
    extra = ""
    if r.get("no_answer"):
        extra += "  no answer " + " ".join(f"{k}:{v}" for k, v in r["no_answer"].items())
    if r.get("with_retry_after"):
        extra += "  Retry-After on " + " ".join(
            f"{k}:{v}" for k, v in r["with_retry_after"].items())
    if r.get("latency_by_status"):
        extra += "  latency by status " + "; ".join(
            f"{k}: p50 {x['p50_ms']:.1f} p99 {x['p99_ms']:.1f} max {x['max_ms']:.1f} ms"
            for k, x in r["latency_by_status"].items())
    tail = r["p99_ms"] / r["p50_ms"] if r["p50_ms"] else float("nan")
    return (f"{label:<16}: {r['per_second']:8.0f}/s  p50 {r['p50_ms']:7.2f}  p90 {r['p90_ms']:7.2f}"
            f"  p99 {r['p99_ms']:7.2f}  max {r['max_ms']:7.1f} ms  p99/p50 {tail:4.2f}"
            f"  n={r['requests']}  statuses {st}{extra}  (loadgen CPU {r['cpu_percent']:.0f}%,"
            f" {r['connects']} connects, connect p99 {r.get('connect_p99_ms', 0):.1f}"
            f" max {r.get('connect_max_ms', 0):.1f} ms)")


def wrk_result(path):
    text = open(path).read()
    m = re.search(r"^wrk-json (\{.*\})$", text, re.M)
    out = json.loads(m.group(1))
    t = re.search(r"^wrk-time ([0-9.]+) ([0-9.]+) ([0-9.]+)$", text, re.M)
    out["cpu_percent"] = (100 * (float(t.group(1)) + float(t.group(2))) / float(t.group(3))
                          if t else float("nan"))
    out["non_2xx"] = sum(out["errors"].values())
    return out


def inventory(res, phases=INVENTORY_PHASES):
    """reservations/s per store and mode (wrk), or None for a phase that did not run."""
    out = {}
    for name in phases:
        path = os.path.join(res, name + ".txt")
        out[name] = wrk_result(path) if os.path.exists(path) else None
    return out


def wrk_cell(r):
    if r is None:
        return "       -"
    bad = f" ({r['non_2xx']} non-2xx)" if r["non_2xx"] else ""
    return f"{r['per_second']:8.0f}/s p50 {r['p50_ms']:5.2f} p99 {r['p99_ms']:6.2f} ms{bad}"


def inventory_lines(res):
    inv = inventory(res)

    def cell(name):
        return wrk_cell(inv[name])

    return [
        "inventory c=16 (wrk)   PostgreSQL                           Redis (appendfsync everysec)",
        f"  claims/s   : {cell('inv_pg_claims')}   {cell('inv_redis_claims')}",
        f"  replays/s  : {cell('inv_pg_replays')}   {cell('inv_redis_replays')}",
        f"  claims/s, Redis appendfsync always: {cell('inv_redis_always')}",
        f"  PostgreSQL, --duplicates fail-fast: claims/s {cell('inv_ff_claims')}",
        f"                                      replays/s {cell('inv_ff_replays')}",
    ]


def store_lines(res):
    st = inventory(res, STORE_PHASES)

    def cell(name):
        return wrk_cell(st[name])

    return [
        "mailer c=16 (wrk, bench/stores.sh: the library's external effect on each key store)",
        f"  PostgreSQL claims/s {cell('st_pg_claims')}   replays/s {cell('st_pg_replays')}",
        f"  Redis      claims/s {cell('st_redis_claims')}   replays/s {cell('st_redis_replays')}",
        f"  dynalite   claims/s {cell('st_dynamo_claims')}   replays/s {cell('st_dynamo_replays')}",
    ]


def cmd_stores(res):
    for line in store_lines(res):
        print(line)


def cmd_inventory(res):
    for line in inventory_lines(res):
        print(line)


def instrument(res):
    n = len([f for f in os.listdir(res) if re.fullmatch(r"check_lg\d+\.json", f)])
    lg = [load(os.path.join(res, f"check_lg{i}.json")) for i in range(1, n + 1)]
    wk = [wrk_result(os.path.join(res, f"wrk{i}.txt")) for i in range(1, n + 1)]
    lg_rate = sum(r["requests"] for r in lg) / sum(r["seconds"] for r in lg)
    wrk_rate = sum(r["requests"] for r in wk) / sum(r["seconds"] for r in wk)
    return lg, wk, lg_rate, wrk_rate, lg_rate / wrk_rate


def cmd_check(res):
    lg, wk, lg_rate, wrk_rate, ratio = instrument(res)
    for i, r in enumerate(lg, 1):
        print(phase_line(r, f"check     lg #{i}"))
    for i, r in enumerate(wk, 1):
        print(f"{'check    wrk #' + str(i):<16}: {r['per_second']:8.0f}/s  p50 {r['p50_ms']:7.2f}"
              f"  p99 {r['p99_ms']:7.2f}  max {r['max_ms']:7.1f} ms  n={r['requests']}"
              f"  errors {r['errors']}  (wrk CPU {r['cpu_percent']:.0f}%)")
    flag = "" if abs(ratio - 1) <= 0.10 else "   <-- DIFFER BY MORE THAN 10%"
    print(f"instrument  loadgen {lg_rate:.0f}/s vs wrk {wrk_rate:.0f}/s: ratio {ratio:.3f}{flag}")


def commits(res):
    v = values(res)
    n = num(v, "orders_in_window", 0)
    out = {"orders": int(n)}
    if n <= 0:
        return out
    out["writes_per_order"] = num(v, "xids") / n
    wal = {k[4:-8]: int(val) for k, val in v.items() if k.startswith("wal_") and
           k.endswith("_commits") and k != "wal_span_commits"}
    xids = {k[4:-5]: int(val) for k, val in v.items() if k.startswith("wal_") and
            k.endswith("_xids")}
    out["wal_per_db"] = {db: c / n for db, c in sorted(wal.items())
                         if c or db in ("orchestrator", "inventory", "payment")}
    out["wal_total"] = sum(wal.values()) / n
    # Write transactions of the window that did not commit in it, by database (none expected).
    out["wal_uncommitted"] = {db: x - wal.get(db, 0) for db, x in sorted(xids.items())
                              if x != wal.get(db, 0)}
    out["wal_aborts"] = sum(int(val) for k, val in v.items()
                            if k.startswith("wal_") and k.endswith("_aborts"))
    out["wal_spans"] = int(v.get("wal_span_commits", 0)) / n
    stat = {}
    for k, val in v.items():
        if k.startswith("stat_after_"):
            db = k[len("stat_after_"):]
            before = v.get("stat_before_" + db)
            if before is not None:
                stat[db.replace("idemsaga_", "")] = (int(val) - int(before)) / n
    out["stat_per_db"] = dict(sorted(stat.items()))
    return out


def cmd_commits(res):
    c = commits(res)
    if "writes_per_order" not in c:
        print("commits   no orders in the window")
        return
    print(f"commits   c=16, {c['orders']} orders: write transactions (xid delta) "
          f"{c['writes_per_order']:.3f}/order")
    print("          from the WAL, committed writes per order: " +
          "  ".join(f"{db} {x:.3f}" for db, x in c["wal_per_db"].items()) +
          f"  total {c['wal_total']:.3f}  (of which span batches {c['wal_spans']:.3f};"
          f" aborted {c['wal_aborts']}" +
          (f"; not committed in the window {c['wal_uncommitted']}" if c["wal_uncommitted"] else "")
          + ")")
    print("          pg_stat_database xact_commit per order (reads too): " +
          "  ".join(f"{db} {x:.3f}" for db, x in c["stat_per_db"].items()) +
          f"  total {sum(c['stat_per_db'].values()):.3f}")


def cmd_final(res, results_md):
    v = values(res)
    o16, o64 = load(os.path.join(res, "orders16.json")), load(os.path.join(res, "orders64.json"))
    rep, ovl = load(os.path.join(res, "replays.json")), load(os.path.join(res, "overload.json"))
    fld = load(os.path.join(res, "flood.json"))
    _, _, lg_rate, wrk_rate, lg_wrk = instrument(res)
    c = commits(res)
    w16, w64 = num(v, "pgbench_w16_tps"), num(v, "pgbench_w64_tps")
    sel = num(v, "pgbench_s16_tps")
    b16, b64 = w16 / 4, w64 / 4
    states = open(os.path.join(res, "order_states.txt")).read().split()
    states_end = open(os.path.join(res, "order_states_end.txt")).read().split()
    all_completed = bool(states) and all(s.startswith("completed=") for s in states)
    rss = {k: num(v, k, 0) / MIB for k in ("rss16_peak_kb", "rss64_peak_kb", "rss1024_peak_kb",
                                          "rss_flood_peak_kb", "rss_after_flood_kb",
                                          "rss_before_flood_kb", "rss16_before_kb",
                                          "rss64_before_kb", "rss1024_before_kb")}
    unanswered = ovl["statuses"].get("0", 0)
    ovl_503 = ovl["statuses"].get("503", 0)
    ovl_503_ra = ovl["with_retry_after"].get("503", 0)
    ovl_ok = sum(n for s, n in ovl["statuses"].items() if s.startswith("2"))
    ovl_other = ovl["requests"] - ovl_ok - ovl_503 - unanswered
    fld_unanswered = fld["statuses"].get("0", 0)
    wpo = c.get("writes_per_order", float("nan"))
    foreign = foreign_cpu(res, v) or {}
    noisy = {p: f for p, f in foreign.items() if p != "run" and f[0] > 5}
    worst = max((f[0] for p, f in foreign.items() if p != "run"), default=float("nan"))

    def tail(r):
        return r["p99_ms"] / r["p50_ms"]

    targets = [
        ("orders/s >= 0.5 x bound, c=16", o16["per_second"] >= 0.5 * b16,
         f"{o16['per_second']:.0f}/s vs bound {b16:.0f}/s: x{o16['per_second'] / b16:.2f}"),
        ("orders/s >= 0.5 x bound, c=64", o64["per_second"] >= 0.5 * b64,
         f"{o64['per_second']:.0f}/s vs bound {b64:.0f}/s: x{o64['per_second'] / b64:.2f}"),
        ("p99 <= 2.5 x p50, c=16", tail(o16) <= 2.5,
         f"p50 {o16['p50_ms']:.1f} ms, p99 {o16['p99_ms']:.1f} ms: x{tail(o16):.2f}"),
        ("p99 <= 2.5 x p50, c=64", tail(o64) <= 2.5,
         f"p50 {o64['p50_ms']:.1f} ms, p99 {o64['p99_ms']:.1f} ms: x{tail(o64):.2f}"),
        ("replays/s >= 0.3 x select TPS", rep["per_second"] >= 0.3 * sel,
         f"{rep['per_second']:.0f}/s vs {sel:.0f} tps: x{rep['per_second'] / sel:.2f}"),
        ("write commits/order 4.00 +- 0.05", abs(wpo - 4.0) <= 0.05, f"{wpo:.3f}"),
        ("peak RSS <= 64 MiB, c=64", rss["rss64_peak_kb"] <= 64,
         f"{rss['rss64_peak_kb']:.1f} MiB ({rss['rss64_before_kb']:.1f} before the phase)"),
        ("peak RSS <= 128 MiB, c=1024", rss["rss1024_peak_kb"] <= 128,
         f"{rss['rss1024_peak_kb']:.1f} MiB ({rss['rss1024_before_kb']:.1f} before the phase)"),
        ("RSS <= 64 MiB after the flood", rss["rss_after_flood_kb"] <= 64,
         f"{rss['rss_after_flood_kb']:.1f} MiB (3 s idle; flood peak "
         f"{rss['rss_flood_peak_kb']:.1f} MiB)"),
        ("overload c=1024: 0 unanswered", unanswered == 0 and ovl_other == 0 and
         ovl_503 == ovl_503_ra,
         f"2xx {ovl_ok}, 503 {ovl_503} ({ovl_503_ra} with Retry-After), other {ovl_other},"
         f" unanswered {unanswered} {ovl['no_answer'] or ''}".rstrip()),
    ]
    checks = [
        ("instrument: loadgen vs wrk within 10%", abs(lg_wrk - 1) <= 0.10,
         f"{lg_rate:.0f}/s vs {wrk_rate:.0f}/s: x{lg_wrk:.3f}"),
        ("every order completed", all_completed, " ".join(states)),
        ("orders c=16 and c=64 all 2xx", o16["ok"] and o64["ok"],
         f"{o16['statuses']} {o64['statuses']}"),
        ("flood answered (400), none unanswered", fld["ok"] and fld_unanswered == 0,
         f"{fld['statuses']}"),
    ]
    quick = v.get("quick") == "1"
    print()
    print("=" * 100)
    print(f"idemsaga bench {'(QUICK: rough figures) ' if quick else ''}at {v.get('head')}")
    print(f"pgbench bound   : participant txn {w16:.0f} tps (c=16), {w64:.0f} tps (c=64) -> "
          f"{b16:.0f} / {b64:.0f} orders/s; select -S {sel:.0f} tps (c=16)")
    print(f"                  (before / after the orders phase: c=16 "
          f"{num(v, 'pgbench_w16_before_tps'):.0f} / {num(v, 'pgbench_w16_after_tps'):.0f} tps, "
          f"c=64 {num(v, 'pgbench_w64_before_tps'):.0f} / {num(v, 'pgbench_w64_after_tps'):.0f})")
    print(phase_line(o16, "orders    c=16"))
    print(phase_line(o64, "orders    c=64"))
    print(phase_line(rep, "replays   c=16"))
    print(phase_line(ovl, "overload c=1024"))
    print(phase_line(fld, "flood      c=512"))
    print("memory (dev process: orchestrator + participants; VmRSS before a phase -> VmHWM "
          "during it):")
    print(f"  orders c=16 {rss['rss16_before_kb']:.1f} -> {rss['rss16_peak_kb']:.1f} MiB,"
          f" orders c=64 {rss['rss64_before_kb']:.1f} -> {rss['rss64_peak_kb']:.1f} MiB,"
          f" overload c=1024 {rss['rss1024_before_kb']:.1f} -> {rss['rss1024_peak_kb']:.1f} MiB,"
          f" flood {rss['rss_before_flood_kb']:.1f} -> {rss['rss_flood_peak_kb']:.1f} MiB,"
          f" 3 s after it {rss['rss_after_flood_kb']:.1f} MiB")
    for line in inventory_lines(res) + store_lines(res):
        print(line)
    print(f"order states at the end: {' '.join(states_end)}")
    if foreign:
        print("other processes' share of the CPU: " + "  ".join(
            f"{p} {f[0]:.0f}%" + (f" ({f[1]})" if f[0] >= 1 else "")
            for p, f in foreign.items()))
    again = {k[len("attempts_"):]: int(x) for k, x in v.items()
             if k.startswith("attempts_") and int(x) > 1}
    if again:
        print("measured again because other processes took > 5% of the CPU: " + ", ".join(
            f"{p} ({n} attempts)" for p, n in again.items()))
    if noisy:
        print("NOISE: other processes used > 5% of the CPU during " + ", ".join(
            f"{p} ({f[0]:.0f}%, {f[1]})" for p, f in noisy.items()) +
            ": those figures are not comparable; run again on a quiet machine")
    print("-" * 100)
    for name, ok, detail in targets + checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name:<40} {detail}")
    passed = sum(1 for _, ok, _ in targets if ok)
    print(f"targets met: {passed}/{len(targets)}")
    print("=" * 100)

    header = """# Benchmark results

One row per run of `bench/run.sh`, appended by the script (`quick` runs are smoke tests: their
figures are rough). Every figure of a row comes from one run on one PostgreSQL cluster (the
dev stack's, fsync on), so the ratios compare like with like.

How to read a row: compare the ratios (`x bound`, `p99/p50`, `x select`, `writes/order`)
between rows, not the absolute rates, which move with the machine (2 shared cores). A row
whose `lg/wrk` is outside 0.90–1.10 measured the instrument, not the server: discard it. A row
whose `other CPU %` is above 5 had other processes (a compile, someone's test) competing for
the CPU during a phase that stayed noisy after 3 attempts: its rates are low for that reason.
`met` counts the 10 targets of the summary that `run.sh` prints.

| column | meaning |
|---|---|
| date (UTC), commit | when, and `git rev-parse --short HEAD` (`-dirty`: uncommitted changes) |
| mode | `full`, or `quick` (short phases: smoke test only) |
| bound16, bound64 | pgbench TPS of a participant-shaped transaction (INSERT a key row + UPDATE it, `-M prepared`) at 16 / 64 clients, divided by 4 (an order makes 4 write commits): the orders/s PostgreSQL alone allows. Since 2026-11-26 the mean of a run right before and one right after the orders phase at as many connections (the machine's speed drifts within minutes) |
| o/s 16, o/s 64 | orders/s through the whole saga (unique keys) at 16 / 64 connections |
| x bound | o/s ÷ bound; target ≥ 0.50: the server should use at least half of what the database allows |
| p50, p99 (ms) | order latency percentiles at that concurrency |
| p99/p50 | tail ratio; target ≤ 2.5 (a steady server has a short tail) |
| replays/s, select tps | replays of one stored key at 16 connections; `pgbench -S -M prepared -c 16` (a primary-key select) |
| x select | replays/s ÷ select tps; target ≥ 0.30 (a replay is one indexed read plus HTTP) |
| writes/order | cluster-wide write transactions (xid delta) per order in the c=16 phase, span storage included; target 4.00 ± 0.05 |
| lg/wrk | loadgen ÷ wrk on the participant's guarded charge at 16 connections: the instrument itself; must stay within 0.90–1.10 |
| RSS 64, RSS 1024 (MiB) | peak RSS (VmHWM) of the dev process during the c=64 order phase; during the c=1024 overload; targets ≤ 64, ≤ 128 |
| RSS flood (MiB) | VmRSS 3 s after a flood of 60 KiB malformed bodies; target ≤ 64 |
| unanswered | overload requests without an answer (timeouts, resets); target 0. Answers are 2xx or 503 + Retry-After |
| met | targets met of 10 |
| other CPU % | the largest share of the machine's CPU that processes outside the benchmark took during a measured phase (bench/cpuwatch.py); above 5 the row is noisy |
| inv pg claims/s, inv pg replays/s | the inventory participant on PostgreSQL (the dev stack's), wrk at 16 connections: reservations with unique keys (each a claim and an effect), and of one key (replays) |
| inv redis claims/s, inv redis replays/s | the same against `idemsaga inventory --store redis` (Redis with appendonly yes, appendfsync everysec) in the same run |
| redis always claims/s | claims again with Redis at appendfsync always (every write on disk before the answer) |
| ff claims/s, ff replays/s | the PostgreSQL inventory again (same database), started with `--duplicates fail-fast`: the advisory lock's cost per request |
| st pg, st redis, st dynamo claims/s, replays/s | `bench/stores.sh`: a participant built only from the library (`bench/bench_mailer`, one external effect that only answers) with its keys in PostgreSQL (the dev stack's cluster), Redis (appendfsync everysec) and DynamoDB's API on dynalite (in memory; not AWS: our client plus a JavaScript emulator), wrk at 16 connections, unique keys and one key |

| date (UTC) | commit | mode | bound16 | o/s 16 | x bound | p50 | p99 | p99/p50 | bound64 | o/s 64 | x bound | p50 | p99 | p99/p50 | replays/s | select tps | x select | writes/order | lg/wrk | RSS 64 | RSS 1024 | RSS flood | unanswered | met | other CPU % | inv pg claims/s | inv pg replays/s | inv redis claims/s | inv redis replays/s | redis always claims/s | ff claims/s | ff replays/s | st pg claims/s | st pg replays/s | st redis claims/s | st redis replays/s | st dynamo claims/s | st dynamo replays/s |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
"""
    row = [
        datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        v.get("head", "?"), "quick" if quick else "full",
        f"{b16:.0f}", f"{o16['per_second']:.0f}", f"{o16['per_second'] / b16:.2f}",
        f"{o16['p50_ms']:.1f}", f"{o16['p99_ms']:.1f}", f"{tail(o16):.2f}",
        f"{b64:.0f}", f"{o64['per_second']:.0f}", f"{o64['per_second'] / b64:.2f}",
        f"{o64['p50_ms']:.1f}", f"{o64['p99_ms']:.1f}", f"{tail(o64):.2f}",
        f"{rep['per_second']:.0f}", f"{sel:.0f}", f"{rep['per_second'] / sel:.2f}",
        f"{wpo:.3f}", f"{lg_wrk:.3f}",
        f"{rss['rss64_peak_kb']:.1f}", f"{rss['rss1024_peak_kb']:.1f}",
        f"{rss['rss_after_flood_kb']:.1f}", str(unanswered), f"{passed}/{len(targets)}",
        f"{worst:.0f}",
    ] + [f"{r['per_second']:.0f}" if r else "-"
         for r in [*inventory(res).values(), *inventory(res, STORE_PHASES).values()]]
    line = "| " + " | ".join(row) + " |\n"
    if not os.path.exists(results_md):
        with open(results_md, "w") as f:
            f.write(header + line)
    else:
        # After the run table's last row: the file has sections of other benches below it.
        with open(results_md) as f:
            lines = f.readlines()
        rows = [i for i, l in enumerate(lines) if re.match(r"\| \d{4}-\d\d-\d\d \d\d:\d\d \| ", l)]
        at = rows[-1] + 1 if rows else len(lines)
        lines.insert(at, line)
        with open(results_md, "w") as f:
            f.writelines(lines)
    print(f"added a row to {results_md}")


def main():
    cmd = sys.argv[1]
    if cmd == "show":
        print(phase_line(load(sys.argv[2]), sys.argv[3]))
    elif cmd == "check":
        cmd_check(sys.argv[2])
    elif cmd == "commits":
        cmd_commits(sys.argv[2])
    elif cmd == "other-cpu":
        f = (foreign_cpu(sys.argv[2], values(sys.argv[2]), [sys.argv[3]]) or {}).get(sys.argv[3])
        print(f"{f[0]:.1f}" if f else "0")
    elif cmd == "inventory":
        cmd_inventory(sys.argv[2])
    elif cmd == "stores":
        cmd_stores(sys.argv[2])
    elif cmd == "final":
        cmd_final(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"report.py: unknown command {cmd}")


if __name__ == "__main__":
    main()
