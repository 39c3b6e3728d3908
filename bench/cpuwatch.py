#!/usr/bin/env python3
"""Watches for CPU the benchmark does not use: this machine is shared, and a compile or
another engineer's test during a phase makes its figures meaningless. Every second it reads
/proc/*/stat and writes one line: the time and the CPU seconds spent in that second by
processes that are not the benchmark's (not descendants of ROOT_PID, of the cluster's
postmaster, or of a PID listed in a PID_FILE), with the busiest such command; then the CPU
seconds of the servers measured (descendants of the postmaster, of the PID_FILEs' PIDs and of
$CPUWATCH_SERVER_PID: the dev stack, the peers) and of the rest of the benchmark (its clients:
loadgen, wrk, pgbench), and, as a second instrument, the machine's busy CPU seconds and
context switches from /proc/stat. `report.py` sums the lines of each phase.

  cpuwatch.py ROOT_PID POSTMASTER_PID_FILE OUT [PID_FILE...]   (runs until ROOT_PID exits)

A PID_FILE lists PIDs one a line, and may come and go (the peers' processes, bench/peers:
started by a script that exits, they are no descendants of ROOT_PID).

Processes that start and end between two samples are seen through their parent's counters
of waited-for children (cutime, cstime), so a compiler under make or ninja is counted. When a
parent reaps a child it had already seen, what that child used before the last sample is taken
off again, so an old process that exits (and its parent, often init) does not show its whole
lifetime in its last second.
"""
import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def snapshot():
    procs = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1:s.rindex(")")]
        fields = s[s.rindex(")") + 2:].split()
        ppid = int(fields[1])
        # utime stime cutime cstime: fields 14-17 of stat, 11-14 after the comm
        own = int(fields[11]) + int(fields[12])
        children = int(fields[13]) + int(fields[14])
        procs[int(pid)] = (ppid, comm, own, children)
    return procs


def machine():
    """Busy CPU ticks (all but idle and iowait) and context switches since boot."""
    busy = ctxt = 0
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu "):
                t = [int(x) for x in line.split()[1:]]
                busy = sum(t[:8]) - t[3] - t[4]  # user..steal, without idle and iowait
            elif line.startswith("ctxt "):
                ctxt = int(line.split()[1])
    return busy, ctxt


def used(prev, cur, group, skip=()):
    """CPU ticks the processes of `group` used between two snapshots: the living ones' deltas
    (all of a new one's), less what children that were counted before and are now reaped
    into a group member's cutime had used by the last snapshot."""
    d = 0
    for pid, (ppid, _, own, children) in prev.items():
        if pid in cur:
            continue
        while ppid not in cur and ppid in prev:
            ppid = prev[ppid][0]
        if ppid in group:  # a descendant then too: counted up to the last snapshot
            d -= own + children
    for pid, (_, comm, own, children) in cur.items():
        if pid not in group or pid in skip:
            continue
        if pid in prev and prev[pid][1] == comm:
            d += (own - prev[pid][2]) + (children - prev[pid][3])
        elif pid not in prev:
            d += own + children
    return max(d, 0)


def ours(procs, roots):
    mine = set(r for r in roots if r)
    changed = True
    while changed:
        changed = False
        for pid, (ppid, _, _, _) in procs.items():
            if pid not in mine and ppid in mine:
                mine.add(pid)
                changed = True
    return mine


def main():
    root, pm_file, out, pid_files = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    me = os.getpid()
    server_root = int(os.environ.get("CPUWATCH_SERVER_PID", "0") or 0)
    prev = snapshot()
    prev_busy, prev_ctxt = machine()
    with open(out, "a", buffering=1) as f:
        while os.path.exists(f"/proc/{root}"):
            time.sleep(1)
            cur = snapshot()
            postmaster = 0
            try:
                with open(pm_file) as pm:
                    postmaster = int(pm.readline())
            except (OSError, ValueError):
                pass
            listed = []
            for name in pid_files:
                try:
                    with open(name) as pids:
                        listed += [int(line) for line in pids if line.strip().isdigit()]
                except OSError:
                    pass
            mine = ours(cur, [root, postmaster, me] + listed)
            servers = ours(cur, [postmaster, server_root] + listed)
            busy, ctxt = machine()
            foreign, busiest = 0, {}
            # Gone since the last sample: the nearest living ancestor (through others that are
            # gone too) now holds all of their time in its cutime, of which what they had used
            # by the last sample was counted then (or was ours).
            for pid, (ppid, comm, own, children) in prev.items():
                if pid in cur:
                    continue
                while ppid not in cur and ppid in prev:
                    ppid = prev[ppid][0]
                if ppid in cur and ppid not in mine:
                    parent = cur[ppid][1]
                    foreign -= own + children
                    busiest[parent] = busiest.get(parent, 0) - (own + children)
            for pid, (_, comm, own, children) in cur.items():
                if pid in mine or pid not in prev or prev[pid][1] != comm:
                    continue
                d = (own - prev[pid][2]) + (children - prev[pid][3])
                foreign += d
                busiest[comm] = busiest.get(comm, 0) + d
            foreign = max(foreign, 0)
            top = max(busiest, key=busiest.get) if foreign > 0 else "-"
            server = used(prev, cur, servers)
            client = used(prev, cur, mine - servers, skip=(me,))
            f.write(f"{time.time():.3f} {foreign / TICK:.2f} {top} {server / TICK:.2f}"
                    f" {client / TICK:.2f} {(busy - prev_busy) / TICK:.2f} {ctxt - prev_ctxt}\n")
            prev, prev_busy, prev_ctxt = cur, busy, ctxt


if __name__ == "__main__":
    main()
