#!/usr/bin/env python3
"""GPU qualification of OrbiTE's NVLink (CUDA IPC) transport.

Runs two processes on one GPU (device 0 for both is fine) and covers the
seed's modes for each local memory kind (device, pinned host, mixed):

  healthy         READ the whole export and WRITE half of it back; bytes checked
  batch           three out-of-order slices over two allocations
  cache           four concurrent READs and a WRITE through one cached import,
                  then one final close (imports opened == closed == 1)
  source-close    close_source with an open import -> UNQUIESCED, export kept;
                  after the requester flushes, close_source -> OK
  requester-exit  the requester exits with a live import; once it is reaped,
                  close_source reclaims the export -> OK
  stale           the source restarts on the same endpoint; the old peer is
                  refused, a new connection is served by the new identity
  bandwidth       IPC READ/WRITE GB/s against a plain device-to-device copy

and, for MNNVL (fabric-handle VMM memory from allocate_mnnvl), the healthy,
batch, cache and bandwidth modes with POSIX-fd handles on one GPU, with
fabric handles where the driver and an IMEX channel allow (else SKIP), and
with fabric handles and a fabric domain (the IPC protocol over TCP, as
between hosts of one NVLink partition).

Usage:
  python3 tests/hardware/qualify.py [--binary PATH] [--memory device,host,mixed]
                                    [--size BYTES] [--out DIR]

--binary is a prebuilt `orbite-gpu-qual` (cargo build --release --features cuda
--bin orbite-gpu-qual); without it the script builds one with cargo. It prints
a table last. Exit status: 0 all passed, 1 a mode failed (a wrong byte
included), 2 no usable CUDA on this machine.
"""
import argparse
import json
import os
import subprocess
import sys
import time

TIMEOUT = 120


class Proc:
    """A helper process speaking one line per message."""

    def __init__(self, argv, log):
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=log, text=True, bufsize=1)

    def line(self):
        deadline = time.time() + TIMEOUT
        while time.time() < deadline:
            l = self.p.stdout.readline()
            if l:
                return l.strip()
            if self.p.poll() is not None:
                return ""
        return ""

    def send(self, text):
        self.p.stdin.write(text + "\n")
        self.p.stdin.flush()

    def cmd(self, text):
        self.send(text)
        return self.line()

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


def find_binary(args):
    if args.binary:
        return args.binary
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.check_call(["cargo", "build", "--release", "--features", "cuda", "--bin", "orbite-gpu-qual"], cwd=root)
    return os.path.join(root, "target", "release", "orbite-gpu-qual")


# The fabric domain of the `mnnvl-fabric_domain` rows (any nonzero value
# shared by both sides): MNNVL then runs its channel over TCP, as it does
# between hosts of one NVLink partition.
FABRIC_DOMAIN = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"


def handle_of(transport):
    return "fabric" if transport == "mnnvl-fabric_domain" else transport.split("-", 1)[1]


def transport_config(transport):
    if transport == "nvlink":
        return {"nvlink": True}
    cfg = {"mnnvl": {"handle_type": handle_of(transport)}}
    if transport == "mnnvl-fabric_domain":
        cfg["mnnvl"]["fabric_domain"] = FABRIC_DOMAIN
    return cfg


def start_source(binary, log, allocs=1, size=8 << 20, seed=1, listen=None, transport="nvlink"):
    argv = [binary, "source", "--allocs", str(allocs), "--size", str(size), "--seed", str(seed)]
    cfg = transport_config(transport)
    if listen:
        cfg["listen"] = listen
    argv += ["--config", json.dumps(cfg)]
    if transport != "nvlink":
        argv += ["--kind", "mnnvl"]
    src = Proc(argv, log)
    first = src.line()
    if first.startswith("FAIL"):
        src.stop()
        raise RuntimeError(first)
    return src, json.loads(first)


def requester(binary, log, info, mode, memory, size, seed=1, transport="nvlink"):
    argv = [binary, "requester", "--endpoint", info["endpoint"], "--mode", mode, "--memory", memory,
            "--remote", ",".join(str(a) for a in info["addrs"]), "--len", str(size), "--seed", str(seed)]
    if transport != "nvlink":
        argv += ["--transport", "mnnvl", "--handle", handle_of(transport)]
    if transport == "mnnvl-fabric_domain":
        argv += ["--fabric-domain", FABRIC_DOMAIN]
    return Proc(argv, log)


def run_mode(binary, log, mode, memory, size, transport="nvlink"):
    """Returns (ok, detail, extra)."""
    allocs = 2 if mode == "batch" else 1
    src, info = start_source(binary, log, allocs=allocs, size=size, transport=transport)
    req = requester(binary, log, info, mode, memory, size, transport=transport)
    lines, extra = [], ""
    try:
        while True:
            l = req.line()
            if not l:
                break
            lines.append(l)
            if l.startswith("BANDWIDTH"):
                extra = l[len("BANDWIDTH "):]
            if l.startswith("FAIL"):
                return False, l, extra
            if l.startswith("WAIT source-close"):
                r = src.cmd("close_source 500")
                if not r.startswith("err ORBITE_STATUS_UNQUIESCED"):
                    return False, "close_source with an open import answered: " + r, extra
                st = json.loads(src.cmd("stats"))
                if st["ipc"][transport.split("-")[0]]["exports_open"] != 1:
                    return False, "the export was not retained: %s" % st["ipc"], extra
                req.send("continue")
            elif l.startswith("WAIT requester-exit"):
                req.send("exit")
                req.p.wait(timeout=TIMEOUT)
                r = src.cmd("close_source 30000")
                if r != "ok":
                    return False, "close_source after the requester exited: " + r, extra
                return True, "export reclaimed after the requester exited", extra
            elif l.startswith("WAIT stale"):
                endpoint = info["endpoint"]
                src.stop()
                src, info2 = start_source(binary, log, size=size, seed=11, listen=endpoint, transport=transport)
                req.send("continue %d" % info2["addrs"][0])
        req.p.wait(timeout=TIMEOUT)
        passed = [l for l in lines if l.startswith("PASS")]
        if req.p.returncode != 0 or not passed:
            return False, "requester exited %s: %s" % (req.p.returncode, lines[-3:]), extra
        return True, passed[-1][len("PASS " + mode):].strip(), extra
    finally:
        req.stop()
        src.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary")
    ap.add_argument("--memory", default="device,host,mixed")
    ap.add_argument("--size", type=int, default=8 << 20)
    ap.add_argument("--out", default="/tmp/orbite-qualify")
    ap.add_argument("--modes", default="healthy,batch,cache,source-close,requester-exit,stale,bandwidth")
    ap.add_argument("--mnnvl", default="posix_fd,fabric,fabric_domain",
                    help="MNNVL variants to qualify: posix_fd, fabric, fabric_domain (fabric handles and a fabric "
                         "domain: the channel runs over TCP) ('' to skip)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    binary = find_binary(args)
    log = open(os.path.join(args.out, "helpers.log"), "w")
    rows, failed = [], False
    plan = [("nvlink", m, mode) for m in args.memory.split(",") for mode in args.modes.split(",")]
    for t in args.mnnvl.split(","):
        if t:
            plan += [("mnnvl-" + t, "device", mode) for mode in ("healthy", "batch", "cache", "bandwidth")
                     if mode in args.modes.split(",")]
    for transport, memory, mode in plan:
        if mode == "bandwidth" and memory != "device":
            continue
        try:
            ok, detail, extra = run_mode(binary, log, mode, memory, args.size, transport)
            result = "PASS" if ok else "FAIL"
        except RuntimeError as e:
            if "no usable CUDA" in str(e):
                print("qualify: no usable CUDA here: %s" % e)
                return 2
            if transport.startswith("mnnvl-fabric") and "NOT_SUPPORTED" in str(e).upper().replace(" ", "_"):
                detail, extra, result = str(e), "", "SKIP"
            else:
                detail, extra, result = str(e), "", "FAIL"
        failed |= result == "FAIL"
        rows.append((transport, memory, mode, result, (detail + " " + extra).strip()))
        print("%-13s %-7s %-15s %s" % (transport, memory, mode, result if result == "PASS" else result + ": " + detail),
              flush=True)
    print()
    print("%-13s | %-7s | %-15s | %-6s | %s" % ("transport", "memory", "mode", "result", "detail"))
    print("-" * 110)
    for r in rows:
        print("%-13s | %-7s | %-15s | %-6s | %s" % r)
    # A SKIP is not a PASS: every requested mode needs at least one PASS row.
    for mode in args.modes.split(","):
        if mode and not any(r[2] == mode and r[3] == "PASS" for r in rows):
            print("qualify: requested mode %s has no PASS row" % mode)
            failed = True
    counts = {k: sum(1 for r in rows if r[3] == k) for k in ("PASS", "FAIL", "SKIP")}
    print("qualify: %d PASS, %d FAIL, %d SKIP" % (counts["PASS"], counts["FAIL"], counts["SKIP"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
