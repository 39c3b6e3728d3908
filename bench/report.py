#!/usr/bin/env python3
"""The arithmetic of bench/run.sh: phase lines, the instrument check, commits per order, and the
final report with its targets, which it also appends as one row to bench/RESULTS.md.

  report.py show FILE.json LABEL     one phase's line (loadgen's JSON)
  report.py check RESULTS_DIR        loadgen vs wrk on the participant baseline
  report.py commits RESULTS_DIR      write commits per order in the 16-connection phase
  report.py per-order RESULTS_DIR PHASE   CPU and context switches per order of an order phase
  report.py growth RESULTS_DIR       the orders and the garbage collector on grown tables
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
PHASES = ["check", "orders1", "pgbench_w16", "orders16", "pgbench_w16_after", "pgbench_w64", "orders64",
          "pgbench_w64_after", "replays", "select"] + INVENTORY_PHASES + [
              "overload", "flood", "pgbench_w16g", "growth16", "pgbench_w16g_after", "gc"]


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
        if k.startswith("stat_after_") and not k.startswith("stat_after_wal_"):
            db = k[len("stat_after_"):]
            before = v.get("stat_before_" + db)
            if before is not None:
                stat[db.replace("idemsaga_", "")] = (int(val) - int(before)) / n
    out["stat_per_db"] = dict(sorted(stat.items()))
    # WAL flushes (pg_stat_wal: fsyncs by backends and the WAL writer) and WAL bytes per order,
    # in all and by database (record lengths of the window's write transactions).
    sync = [num(v, f"stat_{w}_wal_sync") for w in ("before", "after")]
    if None not in sync:
        out["wal_flushes"] = (sync[1] - sync[0]) / n
    out["wal_bytes"] = num(v, "wal_bytes_window", 0) / n
    out["wal_bytes_per_db"] = {k[len("walbytes_"):]: int(val) / n for k, val in sorted(v.items())
                               if k.startswith("walbytes_")}
    return out


def per_order(res, v, phase, orders):
    """CPU and context switches per order of a phase, by two instruments: the machine's busy
    time and context switches at the phase's boundaries (/proc/stat, every process, others
    included), and cpuwatch's per-second samples of the processes: the servers measured
    (PostgreSQL and the stack), the benchmark's clients, and the others."""
    out = {}
    a, b = v.get(f"proc_{phase}_start"), v.get(f"proc_{phase}_end")
    if not (a and b and orders):
        return out
    tick = os.sysconf("SC_CLK_TCK")
    (b0, c0), (b1, c1) = (map(int, x.split(":")) for x in (a, b))
    out["machine_ms"] = 1000 * (b1 - b0) / tick / orders
    out["ctxsw"] = (c1 - c0) / orders
    t0, t1 = num(v, f"t_{phase}_start"), num(v, f"t_{phase}_end")
    path = os.path.join(res, "cpuwatch.txt")
    if os.path.exists(path) and t0 and t1:
        rows = [line.split() for line in open(path)]
        rows = [r for r in rows if len(r) == 7 and t0 < float(r[0]) <= t1 + 1.0]
        if rows:
            out["server_ms"] = 1000 * sum(float(r[3]) for r in rows) / orders
            out["client_ms"] = 1000 * sum(float(r[4]) for r in rows) / orders
            out["others_ms"] = 1000 * sum(float(r[1]) for r in rows) / orders
    return out


def per_order_text(p):
    if not p:
        return "CPU per order: not measured"
    text = f"CPU per order {p['machine_ms']:.3f} ms (machine)"
    if "server_ms" in p:
        text += (f" = servers {p['server_ms']:.3f} + clients {p['client_ms']:.3f}"
                 f" + others {p['others_ms']:.3f} (processes, 1-s samples)")
    return text + f"; context switches {p['ctxsw']:.1f}/order"


def orders_of(r):
    return sum(n for s, n in r["statuses"].items() if s.startswith("2"))


SERVICES = ["orchestrator", "inventory", "payment"]


def gc_stats(res, v):
    """Per service, from the sampler's backlog counts during the GC phase: the backlog at the
    start, when its collector's pass began (the first sample below it; the sample before
    bounds it), when the backlog was gone, and the deletion rate that implies (at least)."""
    path = os.path.join(res, "gc_backlog.txt")
    if not os.path.exists(path):
        return None
    rows = [[float(x) for x in line.split()] for line in open(path) if len(line.split()) == 4]
    out = {}
    for i, name in enumerate(SERVICES, 1):
        if not rows:
            break
        start = rows[0][i]
        t0 = rows[0][0]
        drop = next((k for k, r in enumerate(rows) if r[i] < start), None)
        gone = next((k for k, r in enumerate(rows) if r[i] == 0), None)
        st = {"backlog": int(start), "left": int(rows[-1][i])}
        if drop is not None and gone is not None and drop > 0:
            st["began_s"] = rows[drop - 1][0] - t0
            st["drained_s"] = rows[gone][0] - rows[drop - 1][0]
            st["rows_per_s"] = start / st["drained_s"]
        elif drop is not None and drop > 0:  # not gone by the end: the rate it went at
            st["began_s"] = rows[drop - 1][0] - t0
            st["rows_per_s"] = (start - rows[-1][i]) / (rows[-1][0] - rows[drop - 1][0])
        out[name] = st
    return out


def growth(res, v):
    """The grown-table figures against phase 3's, and the GC's, or None when not run."""
    if not os.path.exists(os.path.join(res, "growth16.json")):
        return None
    g = {"keys": int(num(v, "growth_keys", 0)),
         "o16": load(os.path.join(res, "orders16.json")),
         "g16": load(os.path.join(res, "growth16.json"))}
    g["x_rate"] = g["g16"]["per_second"] / g["o16"]["per_second"]
    g["x_p99"] = g["g16"]["p99_ms"] / g["o16"]["p99_ms"]
    # The same ratio against the pgbench bound measured beside each phase: what is left of
    # it once the machine's drift between the two phases is taken out.
    b16, bg = num(v, "pgbench_w16_tps"), num(v, "pgbench_w16g_tps")
    if b16 and bg:
        g["bound_drift"] = bg / b16
        g["x_rate_bound"] = g["x_rate"] / g["bound_drift"]
    if os.path.exists(os.path.join(res, "gc.json")):
        g["gc"] = load(os.path.join(res, "gc.json"))
        g["gc_x_p99"] = g["gc"]["p99_ms"] / g["g16"]["p99_ms"]
        g["gc_services"] = gc_stats(res, v) or {}
        need = 2 * g["gc"]["per_second"]
        g["gc_need"] = need
        g["gc_kept_up"] = bool(g["gc_services"]) and all(
            st.get("left") == 0 and st.get("rows_per_s", 0) >= need
            for st in g["gc_services"].values())
    return g


def growth_lines(g):
    if g is None:
        return ["growth    not measured (skipped: see the run's output)"]
    lines = [f"growth    {g['keys']} keys more per table: orders/s x{g['x_rate']:.2f}, "
             f"p99 x{g['x_p99']:.2f} of the empty tables' (c=16)"]
    if "x_rate_bound" in g:
        lines.append(f"          the pgbench bound beside it x{g['bound_drift']:.2f} of phase 3's: "
                     f"orders/s x{g['x_rate_bound']:.2f} as shares of their bounds")
    if "gc" in g:
        lines.append(
            f"gc        under orders at {g['gc']['per_second']:.0f}/s (p99 x{g['gc_x_p99']:.2f}"
            f" of the grown tables'), each backlog needing >= {g['gc_need']:.0f} rows/s: " +
            "; ".join(f"{name} {st['backlog']} expired, " + (
                f"pass at +{st['began_s']:.1f} s, gone in <= {st['drained_s']:.1f} s"
                f" (>= {st['rows_per_s']:.0f} rows/s)" if "drained_s" in st
                else f"{st['left']} left at the end" + (
                    f" (pass at +{st['began_s']:.1f} s, {st['rows_per_s']:.0f} rows/s)"
                    if "rows_per_s" in st else ""))
                for name, st in g["gc_services"].items()))
    return lines


def cmd_growth(res):
    for line in growth_lines(growth(res, values(res))):
        print(line)


def cmd_per_order(res, phase):
    r = load(os.path.join(res, f"{phase}.json"))
    print(f"{'':<16}  {per_order_text(per_order(res, values(res), phase, orders_of(r)))}")


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
    print(f"          WAL flushes {c.get('wal_flushes', float('nan')):.3f}/order (pg_stat_wal"
          f" wal_sync), WAL {c['wal_bytes']:.0f} bytes/order: " +
          "  ".join(f"{db} {x:.0f}" for db, x in c["wal_bytes_per_db"].items()))


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

    o1 = load(os.path.join(res, "orders1.json"))
    g = growth(res, v)
    wal_total = c.get("wal_total", float("nan"))
    # Issue 32's targets (since 2026-11-27; before, 0.5 x bound and 0.3 x select).
    targets = [
        ("orders/s >= 0.8 x bound, c=16", o16["per_second"] >= 0.8 * b16,
         f"{o16['per_second']:.0f}/s vs bound {b16:.0f}/s: x{o16['per_second'] / b16:.2f}"),
        ("orders/s >= 0.8 x bound, c=64", o64["per_second"] >= 0.8 * b64,
         f"{o64['per_second']:.0f}/s vs bound {b64:.0f}/s: x{o64['per_second'] / b64:.2f}"),
        ("orders/s c=64 >= c=16", o64["per_second"] >= o16["per_second"],
         f"{o64['per_second']:.0f}/s vs {o16['per_second']:.0f}/s:"
         f" x{o64['per_second'] / o16['per_second']:.2f}"),
        ("p50 <= 1.5 ms, c=1", o1["p50_ms"] <= 1.5,
         f"p50 {o1['p50_ms']:.2f} ms ({o1['per_second']:.0f}/s)"),
        ("p99 <= 2.5 x p50, c=1", tail(o1) <= 2.5,
         f"p50 {o1['p50_ms']:.2f} ms, p99 {o1['p99_ms']:.2f} ms: x{tail(o1):.2f}"),
        ("p99 <= 2.5 x p50, c=16", tail(o16) <= 2.5,
         f"p50 {o16['p50_ms']:.1f} ms, p99 {o16['p99_ms']:.1f} ms: x{tail(o16):.2f}"),
        ("p99 <= 2.5 x p50, c=64", tail(o64) <= 2.5,
         f"p50 {o64['p50_ms']:.1f} ms, p99 {o64['p99_ms']:.1f} ms: x{tail(o64):.2f}"),
        ("replays/s >= 0.6 x select TPS", rep["per_second"] >= 0.6 * sel,
         f"{rep['per_second']:.0f}/s vs {sel:.0f} tps: x{rep['per_second'] / sel:.2f}"),
        ("write commits/order <= 4.00", wal_total <= 4.0,
         f"{wal_total:.3f} committed write transactions/order (WAL; xid delta {wpo:.3f})"),
        ("grown tables: orders/s >= 0.9 x", g is not None and g["x_rate"] >= 0.9,
         f"x{g['x_rate']:.2f} with {g['keys']} keys more" + (
             f" (x{g['x_rate_bound']:.2f} as shares of the bound beside each)"
             if g and "x_rate_bound" in g else "") if g else "not measured"),
        ("grown tables: p99 <= 1.2 x", g is not None and g["x_p99"] <= 1.2,
         f"x{g['x_p99']:.2f}" if g else "not measured"),
        ("GC keeps up with 2 x the order rate", bool(g and g.get("gc_kept_up")),
         "every backlog gone within the phase, fast enough" if g and g.get("gc_kept_up")
         else ("a backlog outlived the phase or drained too slowly" if g and "gc" in g
               else "not measured")),
        ("GC: p99 <= 1.2 x", bool(g and "gc" in g and g["gc_x_p99"] <= 1.2),
         f"x{g['gc_x_p99']:.2f}" if g and "gc" in g else "not measured"),
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
    for name, r in (("c=1", o1), ("c=16", o16), ("c=64", o64)):
        print(f"orders {name:<5}: " + per_order_text(per_order(res, v, f"orders{name[2:]}",
                                                                orders_of(r))))
    for line in growth_lines(g) + inventory_lines(res) + store_lines(res):
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
`met` counts the targets of the summary that `run.sh` prints: 10 until 2026-11-27, issue 32's 17
since (the table of issue 32's figures, at the end, has their other figures).

| column | meaning |
|---|---|
| date (UTC), commit | when, and `git rev-parse --short HEAD` (`-dirty`: uncommitted changes) |
| mode | `full`, or `quick` (short phases: smoke test only) |
| bound16, bound64 | pgbench TPS of a participant-shaped transaction (INSERT a key row + UPDATE it, `-M prepared`) at 16 / 64 clients, divided by 4 (an order makes 4 write commits): the orders/s PostgreSQL alone allows. Since 2026-11-26 the mean of a run right before and one right after the orders phase at as many connections (the machine's speed drifts within minutes) |
| o/s 16, o/s 64 | orders/s through the whole saga (unique keys) at 16 / 64 connections |
| x bound | o/s ÷ bound; target ≥ 0.80 since 2026-11-27 (≥ 0.50 before) |
| p50, p99 (ms) | order latency percentiles at that concurrency |
| p99/p50 | tail ratio; target ≤ 2.5 (a steady server has a short tail) |
| replays/s, select tps | replays of one stored key at 16 connections; `pgbench -S -M prepared -c 16` (a primary-key select) |
| x select | replays/s ÷ select tps; target ≥ 0.60 since 2026-11-27 (≥ 0.30 before) |
| writes/order | cluster-wide write transactions (xid delta) per order in the c=16 phase, span storage included; target 4.00 ± 0.05 until 2026-11-27, then ≤ 4.00 committed writes from the WAL |
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
            f.write(header)
    # The runs table: its header row is the first line that starts with this.
    append_row(results_md, "| date (UTC) | commit | mode | bound16 |", "", line)
    print(f"added a row to {results_md}")

    def ratio(x):
        return f"{x:.2f}" if x == x else "-"

    po = {name: per_order(res, v, f"orders{name}", orders_of(r))
          for name, r in (("1", o1), ("16", o16), ("64", o64))}
    gcs = (g or {}).get("gc_services") or {}
    gc_min = min((st.get("rows_per_s", 0) for st in gcs.values()), default=float("nan"))
    row32 = [
        datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        v.get("head", "?"), "quick" if quick else "full",
        ratio(o16["per_second"] / b16), ratio(o64["per_second"] / b64),
        ratio(o64["per_second"] / o16["per_second"]),
        f"{o1['p50_ms']:.2f}", ratio(tail(o1)), ratio(tail(o16)), ratio(tail(o64)),
        ratio(rep["per_second"] / sel),
        f"{c.get('wal_per_db', {}).get('orchestrator', 0):.2f}"
        f" ({c.get('wal_spans', 0):.2f}) / " +
        " / ".join(f"{c.get('wal_per_db', {}).get(db, 0):.2f}" for db in SERVICES[1:]) +
        f" = {wal_total:.2f}",
        f"{c.get('wal_flushes', float('nan')):.2f}", f"{c.get('wal_bytes', 0):.0f}",
        " / ".join(f"{po[n].get('machine_ms', float('nan')):.2f}" for n in ("1", "16", "64")),
        (f"{po['16']['server_ms']:.2f} + {po['16']['client_ms']:.2f}"
         if "server_ms" in po["16"] else "-"),
        " / ".join(f"{po[n].get('ctxsw', float('nan')):.0f}" for n in ("1", "16", "64")),
        str(g["keys"]) if g else "-", ratio(g["x_rate"]) if g else "-",
        ratio(g["x_p99"]) if g else "-",
        (f"{gc_min:.0f} ({g['gc_need']:.0f})" if g and "gc" in g else "-"),
        ratio(g["gc_x_p99"]) if g and "gc" in g else "-",
        f"{passed}/{len(targets)}", f"{worst:.0f}",
    ]
    append_row(results_md, ISSUE32_TITLE, ISSUE32_HEADER, "| " + " | ".join(row32) + " |\n")
    print(f"added a row to the table of issue 32's figures in {results_md}")


ISSUE32_TITLE = "## Issue 32's figures, one row per run"
ISSUE32_HEADER = f"""
{ISSUE32_TITLE}

Appended by `bench/run.sh` since 2026-11-27, beside its row of the runs table. Targets in brackets.
`x bound` (≥ 0.8), `64÷16` (≥ 1), `p50 c=1` ms (≤ 1.5), `p99/p50` at 1, 16, 64 connections
(≤ 2.5), `x select` (≥ 0.6); `commits/order`: committed write transactions per order of the c=16
phase by database from the WAL, orchestrator (of which span batches) / inventory / payment =
total, with any other database's in the total (≤ 4);
`WAL flushes` (pg_stat_wal `wal_sync`, by backends and the WAL writer) and `WAL bytes` per order
of that phase; `CPU ms/order`: the machine's busy CPU per order at 1 / 16 / 64 connections
(/proc/stat at the phase's bounds: every process, PostgreSQL included); `servers + clients`: at
16, the same split by process (PostgreSQL and the stack; loadgen and the script) from
cpuwatch's 1-s samples, the second instrument; `ctxsw/order` at 1 / 16 / 64 (machine-wide);
`grown keys`: finished keys added to each service's table; `grown x o/s` (≥ 0.9) and
`grown x p99` (≤ 1.2) against the empty tables' c=16 phase; `GC rows/s`: the slowest
service's deletion of its expired backlog during orders (at least; the rate it needs, twice the
order rate, in brackets); `GC x p99` (≤ 1.2) against the grown tables' phase; `met` of the
summary's targets; `other CPU %` as in the runs table.

| date (UTC) | commit | mode | x bound 16 | x bound 64 | 64÷16 | p50 c=1 | p99/p50 c=1 | p99/p50 16 | p99/p50 64 | x select | commits/order | WAL flushes | WAL bytes | CPU ms/order | servers + clients | ctxsw/order | grown keys | grown x o/s | grown x p99 | GC rows/s | GC x p99 | met | other CPU % |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
"""


def append_row(results_md, title, header, line):
    """Appends a row after the last row of the table that follows the first line starting with
    `title` (a section title or a table's header row); a missing table is added, with
    `header`, at the end of the file."""
    with open(results_md) as f:
        text = f.read()
    lines = text.splitlines(keepends=True)
    start = next((i for i, l in enumerate(lines) if l.startswith(title)), None)
    if start is None:
        text = text.rstrip("\n") + "\n" + header + line
    else:
        at = start + 1
        for i in range(start + 1, len(lines)):
            if re.match(r"\|[ -]", lines[i]):
                at = i + 1
            elif at > start + 1 and not lines[i].strip():
                break
        lines.insert(at, line)
        text = "".join(lines)
    with open(results_md, "w") as f:
        f.write(text)


def main():
    cmd = sys.argv[1]
    if cmd == "show":
        print(phase_line(load(sys.argv[2]), sys.argv[3]))
    elif cmd == "check":
        cmd_check(sys.argv[2])
    elif cmd == "commits":
        cmd_commits(sys.argv[2])
    elif cmd == "per-order":
        cmd_per_order(sys.argv[2], sys.argv[3])
    elif cmd == "growth":
        cmd_growth(sys.argv[2])
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
