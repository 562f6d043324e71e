#!/usr/bin/env python3
"""ORBITE against UCX through NIXL: two processes on this host, memory the
application allocated (numpy), the backends as a NIXL user gets them.

For each backend (UCX is the wheel's own plugin), each direction (READ,
WRITE) and each block size (4 KiB, 64 KiB, 1 MiB, 8 MiB): one prepared
transfer of up to 1024 gapped blocks (128 MiB at most per transfer: 1024,
1024, 128 and 16 blocks) posted again and again for --seconds; GB/s of
payload. Then the posting cost: microseconds per descriptor spent in
postXfer (the `transfer` call) for 100 000 gapped 4 KiB descriptors
(--post-count), median of --post-reps posts, wall-clock and the posting
thread's CPU time.

Run it with the venv of integrations/nixl/tests/venv.sh and the plugin's
folder; it re-runs unchanged (docs/benchmarks.md, "NIXL"):

  python nixl_bench.py [--backends ORBITE,UCX] [--seconds S] [--json FILE]

With ORBITE installed beside the wheel's own plugins (install.py, or the
nixl_install target), no NIXL_PLUGIN_DIR is needed; a NIXL_PLUGIN_DIR must
hold every backend compared.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

KiB, MiB = 1 << 10, 1 << 20
BLOCKS = (4 * KiB, 64 * KiB, MiB, 8 * MiB)
MAX_DESCS, MAX_BYTES = 1024, 128 * MiB


def agent(name, backend, params):
    from nixl._api import nixl_agent, nixl_agent_config
    a = nixl_agent(name, nixl_agent_config(backends=[]))
    a.create_backend(backend, params)
    return a


def descs(base, count, size):
    d = np.empty((count, 3), dtype=np.uint64)
    d[:, 0] = np.uint64(base) + np.arange(count, dtype=np.uint64) * np.uint64(2 * size)
    d[:, 1] = size
    d[:, 2] = 0
    return d


def target(args):
    """Registers a buffer big enough for every point, prints its address and
    metadata file, and serves until stdin closes."""
    nbytes = int(args.nbytes)
    a = agent("bench-target", args.backend, {})
    buf = np.ones(nbytes, dtype=np.uint8)
    a.register_memory([(buf.ctypes.data, nbytes, 0, "")], "DRAM")
    path = os.path.join(tempfile.mkdtemp(prefix="nixl-bench-"), "meta")
    with open(path, "wb") as f:
        f.write(a.get_agent_metadata())
    print(f"READY {buf.ctypes.data} {path}", flush=True)
    sys.stdin.read()


def wait(a, h):
    while True:
        s = a.check_xfer_state(h)
        if s == "DONE":
            return
        if s == "ERR":
            raise RuntimeError("transfer failed")


def run_backend(args, backend):
    nbytes = max(2 * 100000 * 4 * KiB if args.post_count else 0, 2 * MAX_BYTES, 2 * MAX_DESCS * 4 * KiB)
    nbytes = max(nbytes, 2 * args.post_count * 4 * KiB)
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", "target", "--backend", backend,
                          "--nbytes", str(nbytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ready = p.stdout.readline().split()
    if not ready or ready[0] != "READY":
        raise SystemExit(f"{backend}: target did not start")
    rbase, meta = int(ready[1]), ready[2]
    rows = []
    try:
        params = {"transport": args.orbite_transport} if backend == "ORBITE" and args.orbite_transport else {}
        a = agent("bench-initiator", backend, params)
        buf = np.zeros(nbytes, dtype=np.uint8)
        a.register_memory([(buf.ctypes.data, nbytes, 0, "")], "DRAM")
        with open(meta, "rb") as f:
            a.add_remote_agent(f.read())
        for op in ("READ", "WRITE"):
            for size in BLOCKS:
                count = min(MAX_DESCS, MAX_BYTES // size)
                lp = a.prep_xfer_dlist("NIXL_INIT_AGENT", descs(buf.ctypes.data, count, size), "DRAM")
                rp = a.prep_xfer_dlist("bench-target", descs(rbase, count, size), "DRAM")
                idx = np.arange(count, dtype=np.int32)
                h = a.make_prepped_xfer(op, lp, idx, rp, idx)
                for _ in range(2):  # warm-up
                    if a.transfer(h) != "DONE":
                        wait(a, h)
                n, t0 = 0, time.perf_counter()
                while True:
                    if a.transfer(h) != "DONE":
                        wait(a, h)
                    n += 1
                    el = time.perf_counter() - t0
                    if el >= args.seconds and n >= 3:
                        break
                gbps = n * count * size / el / 1e9
                rows.append({"backend": backend, "op": op, "block": size, "descs": count, "transfers": n,
                             "GBps": round(gbps, 3)})
                print(f"{backend:6} {op:5} {size // KiB:5} KiB x {count:4}: {gbps:7.2f} GB/s ({n} transfers)",
                      flush=True)
                a.release_xfer_handle(h)
                a.release_dlist_handle(lp)
                a.release_dlist_handle(rp)
        if args.post_count:
            count = args.post_count
            ld, rd = descs(buf.ctypes.data, count, 4 * KiB), descs(rbase, count, 4 * KiB)
            lp = a.prep_xfer_dlist("NIXL_INIT_AGENT", ld, "DRAM")
            rp = a.prep_xfer_dlist("bench-target", rd, "DRAM")
            idx = np.arange(count, dtype=np.int32)
            h = a.make_prepped_xfer("READ", lp, idx, rp, idx)
            posts, cpus = [], []
            for _ in range(args.post_reps):
                t0, c0 = time.perf_counter(), time.thread_time()
                s = a.transfer(h)
                posts.append(time.perf_counter() - t0)
                cpus.append(time.thread_time() - c0)
                if s != "DONE":
                    wait(a, h)
            us = sorted(posts)[len(posts) // 2] / count * 1e6
            # The posting thread's own CPU time: what a loaded host's
            # preemptions leave out of the wall-clock figure.
            cpu_us = sorted(cpus)[len(cpus) // 2] / count * 1e6
            rows.append({"backend": backend, "op": "post", "descs": count, "us_per_desc": round(us, 4),
                         "cpu_us_per_desc": round(cpu_us, 4), "posts_s": [round(x, 4) for x in posts]})
            print(f"{backend:6} postXfer of {count} gapped 4 KiB descriptors: {us:.3f} us per descriptor "
                  f"(median of {len(posts)}: {sorted(posts)[len(posts) // 2] * 1e3:.1f} ms; the posting thread's "
                  f"CPU: {cpu_us:.3f} us per descriptor)", flush=True)
            a.release_xfer_handle(h)
    finally:
        p.stdin.close()
        p.wait(timeout=60)
    return rows


def check_plugins(backends):
    """NIXL_PLUGIN_DIR replaces NIXL's own plugin folder: the bench runs
    either without it (ORBITE installed beside UCX, install.py) or with a
    folder that holds every backend it compares."""
    d = os.environ.get("NIXL_PLUGIN_DIR")
    if not d:
        return
    missing = [b for b in backends if not os.path.exists(os.path.join(d, f"libplugin_{b}.so"))]
    if missing:
        raise SystemExit(f"NIXL_PLUGIN_DIR={d} lacks {', '.join(missing)}: unset it and install ORBITE beside "
                         "the wheel's plugins (integrations/nixl/install.py, or the nixl_install target)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", default="initiator")
    ap.add_argument("--backend", default="ORBITE")
    ap.add_argument("--backends", default="ORBITE,UCX")
    ap.add_argument("--nbytes", default="0")
    ap.add_argument("--seconds", type=float, default=1.0, help="time per point")
    ap.add_argument("--post-count", type=int, default=100000)
    ap.add_argument("--post-reps", type=int, default=5)
    ap.add_argument("--orbite-transport", default="", help="the initiator's ORBITE transport parameter (tcp, shm, cma, ...); "
                    "AUTO when empty")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.role == "target":
        return target(args)
    check_plugins(args.backends.split(","))
    rows = []
    for b in args.backends.split(","):
        rows += run_backend(args, b)
    by = {(r["backend"], r["op"], r.get("block")): r for r in rows}
    print("\n| op | block | descs | ORBITE GB/s | UCX GB/s | ORBITE/UCX |\n| --- | --- | --- | --- | --- | --- |")
    for op in ("READ", "WRITE"):
        for size in BLOCKS:
            o, u = by.get(("ORBITE", op, size)), by.get(("UCX", op, size))
            if o and u:
                print(f"| {op} | {size // KiB} KiB | {o['descs']} | {o['GBps']:.2f} | {u['GBps']:.2f} | "
                      f"{o['GBps'] / u['GBps']:.2f}x |")
    po, pu = by.get(("ORBITE", "post", None)), by.get(("UCX", "post", None))
    if po and pu:
        print(f"\npostXfer, {po['descs']} gapped 4 KiB descriptors: ORBITE {po['us_per_desc']:.3f} us/descriptor, "
              f"UCX {pu['us_per_desc']:.3f} us/descriptor")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
