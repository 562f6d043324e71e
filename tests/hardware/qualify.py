#!/usr/bin/env python3
"""GPU qualification of OrbiTE's NVLink (CUDA IPC) and MNNVL transports.

Runs a source and a requester process, the source's memory on device A and
the requester's on device B (--devices A,B; 0,0 is two processes on one GPU),
and covers the seed's modes for each local memory kind (device, pinned host,
mixed):

  topology        --devices A,B: cuDeviceCanAccessPeer and the P2P attributes
                  (access, native atomics, performance rank) both ways; A == B
                  passes trivially
  healthy         READ the whole export and WRITE half of it back; bytes checked
                  locally and, for the WRITE, by the source
  batch           three out-of-order slices over two allocations
  cache           four concurrent READs (sharing a READ-only cached import)
                  and a WRITE (a writable one; the WRITE's bytes checked by
                  the source), then one close per import (1 or 2)
  source-close    close_source with an open import of a live requester ->
                  the source revokes it, the requester gives it back -> OK
  requester-exit  the requester exits with a live import; once it is reaped,
                  close_source reclaims the export -> OK
  stale           the source restarts on the same endpoint; the old peer is
                  refused, a new connection is served by the new identity
  readers         four requester processes READ one source allocation through
                  a cache each and hold their READ-only imports at once (the
                  source lends the allocation to all four), READ again; a
                  fifth process's WRITE is refused within a short deadline,
                  then waits for the readers to give back and lands (bytes
                  checked by the source)
  bandwidth       IPC READ/WRITE GB/s against plain copies of the same bytes
                  in the same run (device A <-> device B; pinned host <->
                  device where host memory is involved): PASS only at
                  --min-ratio (0.8) or more in both directions. Against the
                  CPU stand-in for the driver (tests/fakecuda), CI passes
                  --baseline-gbps G: a fixed baseline of its choosing instead
                  of the plain copies, so that it checks the gate (PASS at
                  the threshold or above, FAIL below) and never the speed of
                  the machine; the helper refuses it with a real driver, so
                  on a GPU the threshold always meets a measured baseline
  producer        the source's stack hands OrbiTE a producer stream (a stream
                  held at a gate, then rewriting the allocation): a READ
                  submitted meanwhile waits for it (the source's answer is
                  made off its I/O thread once the stream ran), stays
                  unanswered until the gate opens, then returns the
                  producer's bytes, every one checked
  kv              KV-shaped traffic: 128 block requests in runs of 1-8 blocks,
                  one submission each way; each READ run must move as one
                  native copy (the WRITE's, contiguous throughout, as one),
                  bytes checked; prints each way's posting share of end to
                  end and write_read_ratio (the READ/WRITE symmetry)

Not run unless named in --modes (it needs a pair of GPUs without P2P):

  no-p2p          --devices A,B where B has no peer path to A (topology
                  says so; otherwise SKIP): a READ into memory on B of the
                  source's NVLink or MNNVL POSIX-fd allocation on A is
                  refused NOT_SUPPORTED before anything is posted (effect
                  NONE, local bytes untouched), and the same READ into
                  memory on A moves every byte. A pair with a path, or one
                  device, SKIPs: a SKIP is not a PASS

  doctor          (MNNVL rows but EGM) orbite-doctor --transport mnnvl with
                  the row's handle type on the source's GPU, against what
                  the helpers find: POSIX fd must be usable; fabric: the
                  doctor's verdict must agree with a real fabric export
                  (a source with fabric handles starting or not), a "no"
                  naming the broken layer on each failed line (a single
                  H100/H200 has no fabric: fabric_not_supported); fabric
                  domain: a probe import against a source of that domain
                  must pass (SKIP where fabric handles do not work)

and, with --nixl-venv (a venv holding the pinned nixl wheels:
integrations/nixl/tests/venv.sh) and --nixl-plugin-dir (the folder of a
built libplugin_ORBITE.so), the VRAM path through NIXL itself:

  nixl-vram       two processes, each a NIXL agent with the ORBITE backend:
                  device memory of device A (target) and device B
                  (initiator) from plain cuMemAlloc, registered as NIXL
                  VRAM (adopted by the plugin), READ of 512 gapped
                  descriptors and a whole-buffer WRITE with a notification,
                  every byte read back through the driver
                  (integrations/nixl/tests/nixl_orbite_test.py, case vram)

and, for NVLink again (--adopted), the healthy, batch, cache and readers
modes on memory the source's stack allocated with a plain cuMemAlloc (as
cudaMalloc does) and adopted with orbite_cuda_adopt, its buffers sub-ranges
of that one allocation; and, for MNNVL (VMM memory from allocate_mnnvl), the
healthy, batch, cache, readers, bandwidth and kv modes with POSIX-fd handles, with fabric handles where the
driver and an IMEX channel allow (else SKIP), with fabric handles and a
fabric domain (the IPC protocol over TCP, as between hosts of one NVLink
partition), and EGM (host NUMA memory from allocate_egm, both peers opted
in; SKIP where the platform has none).

Usage:
  python3 tests/hardware/qualify.py [--binary PATH] [--doctor PATH] [--devices A,B] [--memory device,host,mixed]
                                    [--modes LIST] [--mnnvl LIST] [--size BYTES] [--timeout S]
                                    [--min-ratio R] [--baseline-gbps G] [--json FILE] [--out DIR]

--binary is a prebuilt `orbite-gpu-qual` (cargo build --release --features cuda
--bin orbite-gpu-qual --bin orbite-doctor); without it the script builds both
with cargo. --doctor is `orbite-doctor` (default: beside the binary). Every
helper call is bounded by --timeout seconds: a helper that does not answer
fails its row and is killed. A SKIP is not a PASS: a requested mode with no
PASS row fails the run. It prints a line per row while it runs, then a table
and a summary. Exit status: 0 every row PASS or SKIP and every requested mode
passed somewhere, 1 otherwise, 2 no usable CUDA on this machine.
"""
import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time

MODES = "topology,healthy,batch,cache,readers,source-close,requester-exit,stale,bandwidth,kv,producer"
MNNVL_MODES = ("healthy", "batch", "cache", "readers", "bandwidth", "kv", "producer", "no-p2p", "doctor")
# Modes for MNNVL memory on a GPU only (EGM memory is host memory).
DEVICE_ONLY_MODES = ("producer", "no-p2p")
# How long the producer mode holds its gate closed once the wait began.
PRODUCER_HOLD_S = 1.0
ADOPTED_MODES = ("healthy", "batch", "cache", "readers")
READERS = 4


class HelperTimeout(Exception):
    pass


class Proc:
    """A helper process speaking one line per message; every read is bounded."""

    def __init__(self, argv, log, timeout):
        self.timeout = timeout
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=log, text=True, bufsize=1)
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for l in self.p.stdout:
            self.lines.put(l.strip())
        self.lines.put(None)  # end of output

    def line(self):
        """The next line; "" once the helper's output ended. Raises HelperTimeout."""
        try:
            l = self.lines.get(timeout=self.timeout)
        except queue.Empty:
            raise HelperTimeout("a helper gave no answer within %d s" % self.timeout)
        if l is None:
            self.lines.put(None)
            return ""
        return l

    def poll(self, seconds):
        """The next line if one comes within `seconds`, else None."""
        try:
            l = self.lines.get(timeout=seconds)
        except queue.Empty:
            return None
        if l is None:
            self.lines.put(None)
            return ""
        return l

    def send(self, text):
        try:
            self.p.stdin.write(text + "\n")
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def cmd(self, text):
        self.send(text)
        return self.line()

    def wait(self):
        try:
            return self.p.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise HelperTimeout("a helper did not exit within %d s" % self.timeout)

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


def find_binary(args):
    if args.binary:
        return args.binary
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.check_call(["cargo", "build", "--release", "--features", "cuda", "--bin", "orbite-gpu-qual", "--bin",
                           "orbite-doctor"], cwd=root)
    return os.path.join(root, "target", "release", "orbite-gpu-qual")


# The fabric domain of the `mnnvl-fabric_domain` rows (any nonzero value
# shared by both sides): MNNVL then runs its channel over TCP, as it does
# between hosts of one NVLink partition.
FABRIC_DOMAIN = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"


def is_nvlink(transport):
    return transport.startswith("nvlink")


def handle_of(transport):
    if transport == "mnnvl-fabric_domain":
        return "fabric"
    if transport == "mnnvl-egm":
        return "posix_fd"
    return transport.split("-", 1)[1]


def transport_config(transport):
    if is_nvlink(transport):
        return {"nvlink": True}
    cfg = {"mnnvl": {"handle_type": handle_of(transport)}}
    if transport == "mnnvl-fabric_domain":
        cfg["mnnvl"]["fabric_domain"] = FABRIC_DOMAIN
    if transport == "mnnvl-egm":
        cfg["mnnvl"]["egm"] = True
    return cfg


class Run:
    def __init__(self, args, binary, log):
        self.args, self.binary, self.log = args, binary, log
        self.src_dev, self.req_dev = args.device_pair

    def start_source(self, transport, allocs=1, seed=1, listen=None):
        argv = [self.binary, "source", "--allocs", str(allocs), "--size", str(self.args.size), "--seed", str(seed),
                "--device", str(self.src_dev), "--numa", str(self.args.egm_node)]
        cfg = transport_config(transport)
        if listen:
            cfg["listen"] = listen
        argv += ["--config", json.dumps(cfg)]
        if transport == "mnnvl-egm":
            argv += ["--kind", "egm"]
        elif transport == "nvlink-adopted":
            argv += ["--kind", "adopted"]
        elif not is_nvlink(transport):
            argv += ["--kind", "mnnvl"]
        src = Proc(argv, self.log, self.args.timeout)
        try:
            first = src.line()
        except HelperTimeout:
            src.stop()
            raise
        if not first.startswith("{"):
            src.stop()
            raise RuntimeError(first or "the source exited before describing itself")
        return src, json.loads(first)

    def requester(self, info, mode, memory, transport, seed=1):
        argv = [self.binary, "requester", "--endpoint", info["endpoint"], "--mode", mode, "--memory", memory,
                "--remote", ",".join(str(a) for a in info["addrs"]), "--len", str(self.args.size), "--seed", str(seed),
                "--device", str(self.req_dev), "--source-device", str(self.src_dev), "--remote-checks",
                "--bw-reps", str(self.args.bw_reps), "--bw-batch", str(self.args.bw_batch)]
        if self.args.baseline_gbps is not None:
            argv += ["--baseline-gbps", repr(self.args.baseline_gbps)]
        if not is_nvlink(transport):
            argv += ["--transport", "mnnvl", "--handle", handle_of(transport)]
        if transport == "mnnvl-fabric_domain":
            argv += ["--fabric-domain", FABRIC_DOMAIN]
        if transport == "mnnvl-egm":
            argv += ["--egm", "--source-memory", "host"]
        return Proc(argv, self.log, self.args.timeout)

    def topology(self):
        """Returns (ok, detail)."""
        p = Proc([self.binary, "topology", "--devices", "%d,%d" % self.args.device_pair], self.log, self.args.timeout)
        try:
            l = p.line()
            p.wait()
        finally:
            p.stop()
        if not l.startswith("{"):
            raise RuntimeError(l or "the topology helper said nothing")
        t = json.loads(l)
        if not t["pairs"]:
            return True, "one device (%d), %d visible" % (self.src_dev, t["visible"]), t
        bad = [q for q in t["pairs"] if q["can_access_peer"] != 1 or q["access_supported"] != 1]
        detail = "; ".join("%d->%d peer %d access %d atomics %d rank %d" % (
            q["from"], q["to"], q["can_access_peer"], q["access_supported"], q["native_atomic_supported"],
            q["performance_rank"]) for q in t["pairs"])
        return not bad, detail, t

    def bandwidth_verdict(self, extra):
        """PASS only when both ratios reach the threshold."""
        kv = dict(x.split("=", 1) for x in extra.split() if "=" in x)
        ratios = [float(kv.get("read_ratio", 0)), float(kv.get("write_ratio", 0))]
        ok = all(r >= self.args.min_ratio for r in ratios)
        why = "" if ok else "below %.2fx the same-run baseline: " % self.args.min_ratio
        return ok, why

    def readers(self, memory, transport):
        """The readers mode. Returns (result, detail, extra)."""
        src, info = self.start_source(transport)
        key = transport.split("-")[0]
        procs = []
        try:
            readers = [self.requester(info, "hold-read", memory, transport) for _ in range(READERS)]
            procs += readers
            for r in readers:
                l = r.line()
                if l != "HOLDING":
                    return "FAIL", "a reader said %r" % l, ""
            st = json.loads(src.cmd("stats"))["ipc"][key]
            if st["exports_open"] != READERS:
                return "FAIL", "%d readers hold %d exports of the allocation" % (READERS, st["exports_open"]), ""
            for r in readers:
                r.send("continue")
            for r in readers:
                l = r.line()
                if l != "WAIT release":
                    return "FAIL", "a reader said %r" % l, ""
            # The readers keep their imports; a writer's WRITE lands beside
            # them at once (imports of one allocation coexist).
            writer = self.requester(info, "write-beside", memory, transport)
            procs.append(writer)
            l = writer.line()
            if l != "WRITING":
                return "FAIL", "the writer said %r" % l, ""
            l = writer.line()
            if l.startswith("CHECK"):
                writer.send(src.cmd("verify " + l[len("CHECK "):]))
                l = writer.line()
            if not l.startswith("PASS"):
                return "FAIL", "the writer said %r" % l, ""
            st = json.loads(src.cmd("stats"))["ipc"][key]
            if st["exports_open"] < READERS:
                return "FAIL", "the readers' exports went while the WRITE ran (%d open)" % st["exports_open"], ""
            for r in readers:
                r.send("continue")
            rates = []
            for r in readers:
                l = r.line()
                if not l.startswith("PASS"):
                    return "FAIL", "a reader said %r" % l, ""
                rates.append(l)
            for p in procs:
                if p.wait() != 0:
                    return "FAIL", "a helper exited with an error", ""
            gbps = [float(x.split("(")[1].split()[0]) for x in rates if "GB/s" in x]
            return "PASS", "%d readers held one allocation at once (%.2f GB/s together on their second READ); " \
                "a WRITE landed beside their imports" % (READERS, sum(gbps)), ""
        finally:
            for p in procs:
                p.stop()
            src.stop()

    def producer(self, memory, transport):
        """The producer mode. Returns (result, detail, extra)."""
        src, info = self.start_source(transport)
        key = transport.split("-")[0]
        req = None
        try:
            r = src.cmd("produce 0 2")
            if r != "ok":
                return "FAIL", "the source's producer: " + r, ""
            req = self.requester(info, "producer", memory, transport, seed=2)
            l = req.line()
            if l != "READING":
                return "FAIL", "the requester said %r" % l, ""
            deadline = time.time() + self.args.timeout
            while json.loads(src.cmd("stats"))["ipc"][key]["exports_answered_after_producer_wait"] < 1:
                if time.time() > deadline:
                    return "FAIL", "the source never began waiting for the producer stream", ""
                time.sleep(0.01)
            # The gate is closed: the READ must stay unanswered.
            early = req.poll(PRODUCER_HOLD_S)
            if early is not None:
                return "FAIL", "the requester finished with the producer held at its gate: %r" % early, ""
            r = src.cmd("open")
            if r != "opened 1":
                return "FAIL", "opening the producer's gate: " + r, ""
            l = req.line()
            if not l.startswith("PASS"):
                return "FAIL", "the requester said %r" % l, ""
            if req.wait() != 0:
                return "FAIL", "the requester exited with an error", ""
            return "PASS", l[len("PASS producer"):].strip(), ""
        finally:
            if req:
                req.stop()
            src.stop()

    def no_p2p(self, memory, transport):
        """The no-p2p mode. Returns (result, detail, extra)."""
        a, b = self.args.device_pair
        if a == b:
            return "SKIP", "one device: the mode needs --devices A,B with no peer path from B to A", ""
        ok, detail, topo = self.topology()
        pair = [q for q in topo["pairs"] if q["from"] == b and q["to"] == a]
        if pair and pair[0]["can_access_peer"] == 1:
            return "SKIP", "GPU %d has a peer path to GPU %d (%s): no refusal to qualify" % (b, a, detail), ""
        return self.plain(mode="no-p2p", memory=memory, transport=transport)

    def doctor(self, transport):
        """The doctor mode: orbite-doctor's verdict against what the helpers
        find on this host. Returns (result, detail, extra)."""
        argv = [self.args.doctor, "--transport", "mnnvl", "--handle-type", handle_of(transport), "--device",
                str(self.src_dev), "--json"]
        src = None
        try:
            works, why = True, ""
            if transport != "mnnvl-posix_fd":
                # The truth the doctor must agree with: a source with fabric
                # handles starts only where a real fabric export works.
                try:
                    src, info = self.start_source(transport)
                except RuntimeError as e:
                    if "no usable CUDA" in str(e):
                        raise
                    works, why = False, str(e)
            if transport == "mnnvl-fabric_domain":
                if not works:
                    return "SKIP", "fabric handles do not work here: %s" % why, ""
                argv += ["--peer", info["endpoint"], "--config",
                         json.dumps({"mnnvl": {"fabric_domain": FABRIC_DOMAIN}})]
            try:
                p = subprocess.run(argv, capture_output=True, text=True, timeout=self.args.timeout)
            except subprocess.TimeoutExpired:
                raise HelperTimeout("orbite-doctor gave no answer within %d s" % self.args.timeout)
            try:
                d = json.loads(p.stdout)
            except ValueError:
                return "FAIL", "orbite-doctor exited %d saying %r %r" % (p.returncode, p.stdout, p.stderr), ""
            failed = [c for c in d["checks"] if c["status"] == "fail"]
            said = "; ".join("%s: %s" % (c["layer"], c["text"]) for c in failed)
            if any(c["cause"] == "no_driver" for c in failed):
                raise RuntimeError("no usable CUDA: " + said)
            if (p.returncode == 0) != (d["usable"] is True):
                return "FAIL", "orbite-doctor exited %d with usable %s" % (p.returncode, d["usable"]), ""
            if not all(c["cause"] for c in failed):
                return "FAIL", "a failed line names no layer: " + said, ""
            if d["usable"] and works:
                peer = [c["text"] for c in d["checks"] if c["layer"] == "peer"]
                return "PASS", "usable" + ("; peer: " + peer[0] if peer else ""), ""
            if not d["usable"] and not works and transport == "mnnvl-fabric":
                return "PASS", "no fabric here, as a real fabric export shows: " + said, ""
            return "FAIL", "orbite-doctor says usable %s, a real %s export %s: %s" % (
                d["usable"], handle_of(transport), "works" if works else "fails (%s)" % why, said), ""
        finally:
            if src:
                src.stop()

    def mode(self, mode, memory, transport):
        """Returns (result, detail, extra)."""
        if mode == "doctor":
            return self.doctor(transport)
        if mode == "readers":
            return self.readers(memory, transport)
        if mode == "producer":
            return self.producer(memory, transport)
        if mode == "no-p2p":
            return self.no_p2p(memory, transport)
        return self.plain(mode, memory, transport)

    def plain(self, mode, memory, transport):
        """A mode the requester runs to its end, answering its CHECK and
        WAIT lines. Returns (result, detail, extra)."""
        allocs = 2 if mode == "batch" else 1
        src, info = self.start_source(transport, allocs=allocs)
        req = self.requester(info, mode, memory, transport)
        lines, extra = [], ""
        key = transport.split("-")[0]
        try:
            while True:
                l = req.line()
                if not l:
                    break
                lines.append(l)
                if l.startswith("BANDWIDTH"):
                    extra = l[len("BANDWIDTH "):]
                if l.startswith("FAIL"):
                    return "FAIL", l, extra
                if l.startswith("CHECK"):
                    req.send(src.cmd("verify " + l[len("CHECK "):]))
                elif l == "WAIT source-close":
                    # The source revokes the live requester's import, which
                    # gives it back: close_source succeeds.
                    r = src.cmd("close_source 30000")
                    if r != "ok":
                        return "FAIL", "close_source with a live requester's import answered: " + r, extra
                    st = json.loads(src.cmd("stats"))
                    if st["ipc"][key]["exports_open"] != 0:
                        return "FAIL", "the live requester did not give its import back: %s" % st["ipc"], extra
                    req.send("continue")
                elif l.startswith("WAIT requester-exit"):
                    req.send("exit")
                    req.wait()
                    r = src.cmd("close_source 30000")
                    if r != "ok":
                        return "FAIL", "close_source after the requester exited: " + r, extra
                    return "PASS", "export reclaimed after the requester exited", extra
                elif l.startswith("WAIT stale"):
                    endpoint = info["endpoint"]
                    src.stop()
                    src, info2 = self.start_source(transport, seed=11, listen=endpoint)
                    req.send("continue %d" % info2["addrs"][0])
            code = req.wait()
            passed = [l for l in lines if l.startswith("PASS")]
            if code != 0 or not passed:
                return "FAIL", "requester exited %s: %s" % (code, lines[-3:]), extra
            detail = passed[-1][len("PASS " + mode):].strip()
            if mode == "bandwidth":
                ok, why = self.bandwidth_verdict(extra)
                if not ok:
                    return "FAIL", why + detail, extra
            return "PASS", detail, extra
        finally:
            req.stop()
            src.stop()


def nixl_vram(args):
    """The nixl-vram row: the plugin's own VRAM case, run against the real
    driver with the target on device A and the initiator on device B.
    Returns (result, detail)."""
    here = os.path.dirname(os.path.abspath(__file__))
    test = os.path.join(here, "..", "..", "integrations", "nixl", "tests", "nixl_orbite_test.py")
    env = dict(os.environ, NIXL_PLUGIN_DIR=args.nixl_plugin_dir, PYTHONPATH=os.path.dirname(test),
               ORBITE_NIXL_DEVICES="%d,%d" % args.device_pair)
    try:
        out = subprocess.run([os.path.join(args.nixl_venv, "bin", "python"), test, "vram"], env=env,
                             capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return "FAIL", "no result within %d s" % args.timeout
    text = (out.stdout + out.stderr).strip()
    if out.returncode == 0 and "PASS vram" in out.stdout:
        return "PASS", " / ".join(l for l in out.stdout.splitlines() if l.startswith("ok "))
    return "FAIL", text.splitlines()[-1] if text else "exit status %d" % out.returncode


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary")
    ap.add_argument("--doctor", help="orbite-doctor (default: beside --binary)")
    ap.add_argument("--devices", default="0,0", help="A,B: the source's device and the requester's (default 0,0)")
    ap.add_argument("--memory", default="device,host,mixed",
                    help="the requester's memory for the NVLink rows ('' for no NVLink rows)")
    ap.add_argument("--size", type=int, default=8 << 20)
    ap.add_argument("--out", default="/tmp/orbite-qualify")
    ap.add_argument("--modes", default=MODES)
    ap.add_argument("--mnnvl", default="posix_fd,fabric,fabric_domain,egm",
                    help="MNNVL variants to qualify: posix_fd, fabric, fabric_domain (fabric handles and a fabric "
                         "domain: the channel runs over TCP), egm (host NUMA memory) ('' to skip)")
    ap.add_argument("--egm-node", type=int, default=0, help="the NUMA node of the EGM source memory")
    ap.add_argument("--adopted", default="yes", choices=("yes", "no"),
                    help="also qualify NVLink on adopted cuMemAlloc memory, with device memory on the requester "
                         "(when --memory names device; default yes)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds any helper may take to answer (default 120)")
    ap.add_argument("--min-ratio", type=float, default=0.8,
                    help="bandwidth PASS threshold against the same-run baseline (default 0.8)")
    ap.add_argument("--bw-reps", type=int, default=11, help="bandwidth reps; the ratio is their median")
    ap.add_argument("--baseline-gbps", type=float,
                    help="CPU stand-in for the driver only: a fixed bandwidth baseline (GB/s) instead of timed plain "
                         "copies, to check the gate's logic and not the machine's speed (refused with a real driver)")
    ap.add_argument("--bw-batch", type=int, default=16, help="whole-export requests per bandwidth submission")
    ap.add_argument("--json", help="also write the report (rows, summary, topology) as JSON to this file")
    ap.add_argument("--nixl-venv", help="a venv with the pinned nixl wheels: adds the nixl-vram row")
    ap.add_argument("--nixl-plugin-dir", help="the folder holding the libplugin_ORBITE.so to qualify")
    args = ap.parse_args()
    if bool(args.nixl_venv) != bool(args.nixl_plugin_dir):
        ap.error("--nixl-venv and --nixl-plugin-dir go together")
    try:
        a, b = (int(x) for x in args.devices.split(","))
    except ValueError:
        ap.error("--devices A,B")
    args.device_pair = (a, b)
    return args


def main():
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "helpers.log"), "w")
    modes = [m for m in args.modes.split(",") if m]
    plan = []
    if "topology" in modes:
        plan.append(("devices", "-", "topology"))
    # no-p2p reads into device memory only.
    plan += [("nvlink", m, mode) for m in args.memory.split(",") if m for mode in modes
             if mode != "topology" and (mode != "no-p2p" or m == "device")]
    if args.adopted == "yes" and "device" in args.memory.split(","):
        plan += [("nvlink-adopted", "device", mode) for mode in ADOPTED_MODES if mode in modes]
    for t in args.mnnvl.split(","):
        if t:
            plan += [("mnnvl-" + t, "device", mode) for mode in MNNVL_MODES if mode in modes
                     if not (t == "egm" and mode in DEVICE_ONLY_MODES + ("doctor",))
                     and not (mode == "no-p2p" and t != "posix_fd")]
    if args.nixl_venv:
        plan.append(("nixl", "device", "nixl-vram"))
    # The nixl-vram row needs no helper binary (a run of it alone builds none).
    binary = find_binary(args) if any(t != "nixl" for t, _, _ in plan) else None
    default_doctor = os.path.join(os.path.dirname(os.path.abspath(binary)), "orbite-doctor") if binary else None
    args.doctor = args.doctor or default_doctor
    run = Run(args, binary, log)
    rows, topo = [], None
    started = time.time()
    for transport, memory, mode in plan:
        if mode == "bandwidth" and memory == "mixed":
            continue
        extra = ""
        try:
            if mode == "topology":
                ok, detail, topo = run.topology()
                result = "PASS" if ok else "FAIL"
            elif mode == "nixl-vram":
                result, detail = nixl_vram(args)
            else:
                result, detail, extra = run.mode(mode, memory, transport)
        except HelperTimeout as e:
            result, detail = "FAIL", "timed out: %s" % e
        except RuntimeError as e:
            if "no usable CUDA" in str(e):
                print("qualify: no usable CUDA here: %s" % e)
                return 2
            unsupported = "NOT_SUPPORTED" in str(e).upper().replace(" ", "_")
            skippable = transport.startswith("mnnvl-fabric") or transport == "mnnvl-egm"
            result, detail = ("SKIP" if unsupported and skippable else "FAIL"), str(e)
        rows.append({"transport": transport, "memory": memory, "mode": mode, "result": result,
                     "detail": (detail + " " + extra).strip()})
        print("%-19s %-7s %-15s %s" % (transport, memory, mode, result if result == "PASS" else result + ": " + detail),
              flush=True)
    print()
    print("%-19s | %-7s | %-15s | %-6s | %s" % ("transport", "memory", "mode", "result", "detail"))
    print("-" * 120)
    for r in rows:
        print("%-19s | %-7s | %-15s | %-6s | %s" % (r["transport"], r["memory"], r["mode"], r["result"], r["detail"]))
    failed = any(r["result"] == "FAIL" for r in rows)
    # A SKIP is not a PASS: every requested mode needs at least one PASS row.
    missing = [m for m in modes if not any(r["mode"] == m and r["result"] == "PASS" for r in rows)]
    for m in missing:
        print("qualify: requested mode %s has no PASS row" % m)
    counts = {k: sum(1 for r in rows if r["result"] == k) for k in ("PASS", "FAIL", "SKIP")}
    print("qualify: devices %d,%d: %d PASS, %d FAIL, %d SKIP in %.0f s" % (
        args.device_pair + (counts["PASS"], counts["FAIL"], counts["SKIP"], time.time() - started)))
    verdict = 1 if failed or missing else 0
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"devices": list(args.device_pair), "size": args.size, "min_ratio": args.min_ratio,
                       "baseline_gbps": args.baseline_gbps,
                       "rows": rows, "summary": counts, "modes_without_pass": missing, "topology": topo,
                       "exit_status": verdict}, f, indent=1)
    return verdict


if __name__ == "__main__":
    sys.exit(main())
