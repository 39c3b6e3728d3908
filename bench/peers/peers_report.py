#!/usr/bin/env python3
"""The peers' part of bench/run.sh's report (bench/peers/phases.sh): whether each peer did the
work it answered for, and idemsaga beside Restate and DBOS with the ratios and their targets,
appended as one row to the peers' table of bench/RESULTS.md.

  peers_report.py effects RESULTS_DIR PEER        the peer's answers vs its effects
  peers_report.py summary RESULTS_DIR RESULTS.md  the comparison, and its row
"""
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from report import append_row, foreign_cpu, load, values  # noqa: E402  (bench/report.py)

PEERS = {"restate": ("Restate 1.7.12", 4.0), "dbos": ("DBOS Transact 5.3.0", 6.0)}
TABLE_TITLE = "## The peers"


def tally(res, peer):
    out = {}
    with open(os.path.join(res, f"peer_{peer}_tally.jsonl")) as f:
        for line in f:
            for status, n in json.loads(line).items():
                out[status] = out.get(status, 0) + n
    return out


def effects(res, peer):
    """(passed, detail): one reservation and one charge per 2xx answer to a unique key, and
    one for the key sent 20 times, each of which must have been answered 2xx; for each
    declined order (402), its reservation released and no charge; no other answers."""
    answers = tally(res, peer)
    ok = sum(n for s, n in answers.items() if s.startswith("2"))
    declined = answers.get("402", 0)
    other = sum(answers.values()) - ok - declined
    same = load(os.path.join(res, f"same_key_{peer}.json"))
    same_ok = sum(n for s, n in same["statuses"].items() if s.startswith("2"))
    other += same["requests"] - same_ok
    ok += 1 if same_ok else 0
    with open(os.path.join(res, f"peer_{peer}_effects.txt")) as f:
        got = dict(kv.split("=") for kv in f.read().split())
    got = {k: int(v) for k, v in got.items()}
    passed = (got["reserved"] == ok and got["captured"] == ok and got["charges"] == ok and
              got["released"] == declined and other == 0)
    detail = (f"orders 2xx {ok}, 402 {declined}, other answers {other} {answers}, one key "
              f"x{same['requests']} {same['statuses']}; reservations held "
              f"{got['reserved']}, released {got['released']}; charges captured "
              f"{got['captured']} of {got['charges']}")
    return passed, detail


def cmd_effects(res, peer):
    passed, detail = effects(res, peer)
    print(f"{peer:<9} effects : {'PASS' if passed else 'FAIL'}  {detail}")


def cmd_summary(res, results_md):
    v = values(res)
    ran = [p for p in PEERS if v.get(f"peer_{p}") == "1"]
    if not ran:
        print("peers: not run (--no-peers, BENCH_PEERS, or not installable)")
        return
    ours = {c: load(os.path.join(res, f"orders{c}.json")) for c in (16, 64)}
    theirs = {(p, c): load(os.path.join(res, f"{p}{c}.json")) for p in ran for c in (16, 64)}
    foreign = foreign_cpu(res, v, [f"{p}{c}" for p in ran for c in (16, 64)]) or {}
    print("peers: the same saga against the same participants, same loadgen, unique keys")
    for c in (16, 64):
        o = ours[c]
        print(f"  c={c:<3} idemsaga {o['per_second']:6.0f}/s (p50 {o['p50_ms']:.1f} / "
              f"p99 {o['p99_ms']:.1f} ms)")
        for p in ran:
            t = theirs[(p, c)]
            noise = foreign.get(f"{p}{c}", (0, "-"))[0]
            print(f"        {PEERS[p][0]:<20} {t['per_second']:6.0f}/s (p50 {t['p50_ms']:.1f} / "
                  f"p99 {t['p99_ms']:.1f} ms, statuses {t['statuses']}, other CPU "
                  f"{noise:.0f}%) -> idemsaga x{o['per_second'] / t['per_second']:.2f}")
    print("-" * 100)
    met = 0
    checks = []
    for p in ran:
        for c in (16, 64):
            ratio = ours[c]["per_second"] / theirs[(p, c)]["per_second"]
            ok = ratio >= PEERS[p][1]
            met += ok
            name = f"idemsaga >= {PEERS[p][1]:.0f} x {p}, c={c}"
            print(f"{'PASS' if ok else 'FAIL'}  {name:<40} x{ratio:.2f}")
        passed, detail = effects(res, p)
        checks.append(passed)
        name = f"{p} did the work it answered for"
        print(f"{'PASS' if passed else 'FAIL'}  {name:<40} {detail}")
    print(f"peer targets met: {met}/{2 * len(ran)}")

    def cell(p, c):
        if p not in ran:
            return ["-"] * 4
        t = theirs[(p, c)]
        return [f"{t['per_second']:.0f}", f"{t['p50_ms']:.1f}", f"{t['p99_ms']:.1f}",
                f"{ours[c]['per_second'] / t['per_second']:.2f}"]

    row = [datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
           v.get("head", "?"), "quick" if v.get("quick") == "1" else "full"]
    for c in (16, 64):
        o = ours[c]
        row += [f"{o['per_second']:.0f}", f"{o['p50_ms']:.1f}", f"{o['p99_ms']:.1f}"]
        row += cell("restate", c) + cell("dbos", c)
    row += ["yes" if all(checks) else "NO",
            f"{max((f[0] for f in foreign.values()), default=0):.0f}"]
    append_row(results_md, TABLE_TITLE, HEADER, "| " + " | ".join(row) + " |\n")
    print(f"added a row to the peers' table of {results_md}")


HEADER = f"""
{TABLE_TITLE}

One row per run of `bench/run.sh` that ran the peers (docs/benchmarks.md): the same two-step
order saga with its compensation on Restate and on DBOS Transact, against idemsaga's own demo
participants, at 16 and 64 connections, in the same run as the row of the runs table with the
same date and commit.
`x` is idemsaga's orders/s divided by the peer's (targets: ≥ 4 × Restate, ≥ 6 × DBOS);
`effects ok` says each peer made exactly one reservation and one charge per order it answered
2xx (one key sent 20 times is one order) and released the stock of each declined one; `other CPU %` as above, for the peers' phases.

| date (UTC) | commit | mode | idemsaga o/s 16 | p50 | p99 | Restate o/s 16 | p50 | p99 | x | DBOS o/s 16 | p50 | p99 | x | idemsaga o/s 64 | p50 | p99 | Restate o/s 64 | p50 | p99 | x | DBOS o/s 64 | p50 | p99 | x | effects ok | other CPU % |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
"""


COMMANDS = {"effects": cmd_effects, "summary": cmd_summary}


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    COMMANDS[sys.argv[1]](*sys.argv[2:])


if __name__ == "__main__":
    main()
