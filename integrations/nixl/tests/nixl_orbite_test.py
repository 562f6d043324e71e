#!/usr/bin/env python3
"""The ORBITE backend driven through the real NIXL library (the pinned
nixl wheel), one case per run: `nixl_orbite_test.py CASE [args]`.

The plugin is found through NIXL_PLUGIN_DIR (set by ctest), except in the
`installed` case, which uses the copy install.py put beside the wheel's own
plugins. Each case prints what it checked and exits non-zero on the first
difference. Two-process cases start this file again with `--role`.
"""

import argparse
import os
import signal
import struct
import subprocess
import sys
import time

import numpy as np

from nixl_helpers import (DEADLINE_S, FakeCuda, addr, block_mask, buffer, captured, check, descs, fail,
                          find_desc_len, free_port, layout, make_agent, pattern, register, wait, wait_notif)

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def transfer(a, op, local_d, remote_d, remote, path, notif=b""):
    """One transfer on the create-and-post path or the prep+make path."""
    if path == "create":
        h = a.initialize_xfer(op, a.get_xfer_descs(local_d, "DRAM"), a.get_xfer_descs(remote_d, "DRAM"), remote,
                              notif)
    else:
        lp = a.prep_xfer_dlist("NIXL_INIT_AGENT", local_d, "DRAM")
        rp = a.prep_xfer_dlist(remote, remote_d, "DRAM")
        idx = np.arange(len(local_d), dtype=np.int32)
        h = a.make_prepped_xfer(op, lp, idx, rp, idx, notif)
    return h


# ---- one process, two agents ----------------------------------------------

def case_matrix(args):
    """READ and WRITE of 1, 1024 and 100 000 descriptors, gapped and
    contiguous, on both paths, between two agents of one process."""
    a, b = make_agent("A"), make_agent("B")
    size_of = {1: MiB, 1024: 4096, 100000: 64}
    nbytes = 16 * MiB
    la, lb = buffer(nbytes), buffer(nbytes)
    register(a, la)
    register(b, lb)
    a.add_remote_agent(b.get_agent_metadata())
    seed = 1
    for count in (1, 1024, 100000):
        size = size_of[count]
        for gapped in (True, False):
            offs = layout(count, size, gapped)
            mask = block_mask(nbytes, offs, size)
            for op in ("READ", "WRITE"):
                for path in ("create", "prep"):
                    seed += 1
                    src, dst = (lb, la) if op == "READ" else (la, lb)
                    src[:] = pattern(nbytes, seed)
                    dst.fill(0xEE)
                    h = transfer(a, op, descs(addr(la), offs, size), descs(addr(lb), offs, size), "B", path)
                    check(a.query_xfer_backend(h) == "ORBITE", "the transfer is not on ORBITE")
                    t0 = time.monotonic()
                    st = a.transfer(h)
                    post_s = time.monotonic() - t0
                    if st != "DONE":
                        st, _, err = wait(a, h)
                    check(st == "DONE", f"{op} {count} {path}: {st}")
                    check(np.array_equal(dst[mask], src[mask]), f"{op} {count} gapped={gapped} {path}: bytes differ")
                    check(np.all(dst[~mask] == 0xEE), f"{op} {count} gapped={gapped} {path}: bytes outside moved")
                    a.release_xfer_handle(h)
                    print(f"ok {op:5} {count:6} x {size:7} B gapped={gapped!s:5} {path:6} (post {post_s * 1e3:.1f} ms)")


def case_notify(args):
    """genNotif between two agents of one process: message alone, exact,
    with the sender's free-form agent name; an unknown agent is an error."""
    name = "prefill worker #0 \u2713 (gpu 3)"
    a, b = make_agent(name), make_agent("decode")
    la, lb = buffer(4096), buffer(4096)
    register(a, la)
    register(b, lb)
    a.add_remote_agent(b.get_agent_metadata())
    for msg in (b"hello", b"", bytes(range(256)) * 200):
        a.send_notif("decode", msg)
        got = wait_notif(b)
        check(got == {name: [msg]}, f"notification {got!r:.200} is not {{{name!r}: [{msg!r:.40}]}}")
    out, _ = captured(lambda: a.send_notif("nobody", b"x"))
    check(isinstance(out, Exception), "a notification to an unknown agent did not fail")
    print("ok genNotif: 3 messages (5, 0 and 51200 bytes) with the sender's agent name; unknown agent refused")


def case_repost(args):
    """A finished handle posted again moves the new bytes; a notification
    given at a repost is delivered, and (NIXL's rule) carried over to the
    posts after it."""
    a, b = make_agent("A"), make_agent("B")
    la, lb = buffer(MiB), buffer(MiB)
    register(a, la)
    register(b, lb)
    a.add_remote_agent(b.get_agent_metadata())
    offs = layout(256, 1024, True)
    mask = block_mask(MiB, offs, 1024)
    h = transfer(a, "WRITE", descs(addr(la), offs, 1024), descs(addr(lb), offs, 1024), "B", "prep")
    for round_, note, expect in ((1, b"", None), (2, b"second", b"second"), (3, b"", b"second")):
        la[:] = pattern(MiB, round_)
        st = a.transfer(h, note)
        if st != "DONE":
            st, _, _ = wait(a, h)
        check(st == "DONE", f"post {round_}: {st}")
        check(np.array_equal(lb[mask], la[mask]), f"post {round_}: the peer holds other bytes")
        if expect:
            got = wait_notif(b)
            check(got == {"A": [expect]}, f"post {round_}: notification {got!r}")
        else:
            check(not b.get_new_notifs(), f"post {round_}: a notification came for a post that asked for none")
        print(f"ok post {round_} of one handle{' with notification ' + expect.decode() if expect else ''}")
    a.release_xfer_handle(h)


def case_release(args):
    """Releasing a transfer in flight never waits: what has not started is
    cancelled; a release that could not cancel everything fails once (NIXL's
    contract) and the next one frees the handle. A notification sent after
    it arrives once every request ended at the peer: then each descriptor
    moved whole or not at all, and some did not move."""
    a, b = make_agent("A"), make_agent("B")
    count, size = 32768, 4096
    nbytes = 2 * count * size
    la, lb = buffer(nbytes), buffer(nbytes)
    register(a, la)
    register(b, lb)
    a.add_remote_agent(b.get_agent_metadata())
    offs = layout(count, size, True)
    la[:] = pattern(nbytes, 7)
    h = transfer(a, "WRITE", descs(addr(la), offs, size), descs(addr(lb), offs, size), "B", "create")
    st = a.transfer(h)
    check(st == "PROC", f"128 MiB posted and already {st}")
    t0 = time.monotonic()
    out, log = captured(lambda: a.release_xfer_handle(h))
    release_s = time.monotonic() - t0
    check(release_s < 5, f"releasing a transfer in flight took {release_s:.1f} s")
    freed = not isinstance(out, Exception)
    if not freed:
        check("the handle stays" in log, "a refused release did not say why in NIXL's log")
        t0 = time.monotonic()
        a.release_xfer_handle(h)
        check(time.monotonic() - t0 < 5, "the second release waited")
    # OrbiTE delivers a notification after every request submitted before it.
    a.send_notif("B", b"fence")
    check(wait_notif(b) == {"A": [b"fence"]}, "the fence notification did not come")
    blocks = lb.reshape(count, 2 * size)[:, :size]
    src = la.reshape(count, 2 * size)[:, :size]
    whole = np.all(blocks == src, axis=1)
    untouched = np.all(blocks == 0xEE, axis=1)
    check(np.all(whole | untouched), "a descriptor moved in part")
    check(untouched.sum() > 0, "the release cancelled nothing: every descriptor moved")
    check(np.all(lb.reshape(count, 2 * size)[:, size:] == 0xEE), "bytes outside the descriptors moved")
    print(f"ok release in flight: returned in {release_s * 1e3:.1f} ms ({'freed' if freed else 'refused once'}), "
          f"{int(whole.sum())} descriptors moved, {int(untouched.sum())} cancelled, none in part")


def case_bounds(args):
    """A descriptor past its registration, and metadata that claims more
    than the peer registered, are NIXL errors; nothing moves."""
    a, b = make_agent("A"), make_agent("B")
    la, lb = buffer(MiB), buffer(MiB)
    register(a, la)
    register(b, lb)
    meta = b.get_agent_metadata()
    a.add_remote_agent(meta)
    lb[:] = pattern(MiB, 3)
    offs = np.array([MiB - 2048], dtype=np.uint64)
    out, _ = captured(lambda: transfer(a, "READ", descs(addr(la), offs, 4096), descs(addr(lb), offs, 4096), "B",
                                       "create"))
    check(isinstance(out, Exception), "a descriptor past the peer's registration was accepted")
    check(np.all(la == 0xEE), "bytes moved for a refused transfer")
    # Metadata that lies: the registration's length doubled in NIXL's
    # serialized descriptor, the ORBITE public data left as it is.
    at, n = find_desc_len(meta, addr(lb), MiB)
    check(n == 1, f"NIXL's descriptor (addr, len, dev) occurs {n} times in the metadata")
    lying = meta[:at + 8] + struct.pack("<Q", 2 * MiB) + meta[at + 16:]
    c = make_agent("C")
    out, log = captured(lambda: c.add_remote_agent(lying))
    check(isinstance(out, Exception), "metadata claiming twice the registered length was loaded")
    check("ORBITE: a registration of agent 'B' describes" in log, "NIXL's log does not say why (ORBITE's message)")
    print("ok descriptor past the registration refused; lying metadata refused, with ORBITE's reason in NIXL's log")


def case_stale(args):
    """A registration made again (new region, new epoch): a handle to the
    old one fails and NIXL drops the agent's metadata; the old metadata no
    longer loads; the new one works."""
    a, b = make_agent("A"), make_agent("B")
    la, lb = buffer(MiB), buffer(MiB)
    register(a, la)
    reg_b = register(b, lb)
    old = b.get_agent_metadata()
    a.add_remote_agent(old)
    offs = layout(16, 4096, True)
    d_l, d_r = descs(addr(la), offs, 4096), descs(addr(lb), offs, 4096)
    h = transfer(a, "WRITE", d_l, d_r, "B", "create")
    b.deregister_memory(reg_b)
    register(b, lb)
    la[:] = pattern(MiB, 5)
    out, log = captured(lambda: (a.transfer(h), wait(a, h))[1])
    state = out if isinstance(out, Exception) else out[0]
    check(isinstance(out, Exception) or state == "ERR", f"a WRITE to a registration made again ended {state}")
    check(np.all(lb == 0xEE), "bytes reached the new registration through the stale handle")
    check("was re-registered" in log and "ORBITE_STATUS_STALE_PEER" in log, "NIXL's log does not say why")
    try:
        a.release_xfer_handle(h)
    except Exception:
        pass
    if a.check_remote_metadata("B"):
        a.remove_remote_agent("B")
    out, log = captured(lambda: a.add_remote_agent(old))
    check(isinstance(out, Exception), "the old metadata loaded although its registration is gone")
    check("registration is stale" in log, "NIXL's log does not say the registration is stale")
    a.add_remote_agent(b.get_agent_metadata())
    h = transfer(a, "WRITE", d_l, d_r, "B", "create")
    st, _, _ = wait(a, h) if a.transfer(h) != "DONE" else ("DONE", 0, None)
    mask = block_mask(MiB, offs, 4096)
    check(st == "DONE" and np.array_equal(lb[mask], la[mask]), "the new metadata does not move the bytes")
    print("ok stale registration: old handle ERR, agent dropped, old metadata refused, new metadata works")


def case_params(args):
    """Backend parameters: each maps to OrbiTE's config; an unknown one is
    refused with its name in NIXL's log."""
    from nixl._api import nixl_agent, nixl_agent_config
    a = nixl_agent("P", nixl_agent_config(backends=[]))
    out, log = captured(lambda: a.create_backend("ORBITE", {"no_such_key": "1"}))
    check(isinstance(out, Exception), "an unknown backend parameter was accepted")
    check("unknown ORBITE backend parameter \"no_such_key\"" in log, "NIXL's log does not name the parameter")
    check("orbite_nixl.cpp:1] ORBITE:" in log, "the message did not go through NIXL's (Abseil) logger")
    port = free_port()
    a.create_backend("ORBITE", {"listen": f"127.0.0.1:{port}", "io_threads": "1", "transport_policy": "shm,tcp",
                                "notification_max_bytes": "1024"})
    check(f"127.0.0.1:{port}".encode() in a.get_agent_metadata(), "the engine does not listen where `listen` says")
    opts = a.get_plugin_params("ORBITE")
    check(opts.get("listen") == "127.0.0.1:0" and opts.get("connect_timeout_ms") == "5000", f"documented: {opts}")
    b = make_agent("Q")
    la = buffer(4096)
    register(a, la)
    a.add_remote_agent(b.get_agent_metadata())
    b.add_remote_agent(a.get_agent_metadata())
    out, log = captured(lambda: b.send_notif("P", b"x" * 2000))
    check(isinstance(out, Exception), "a notification over notification_max_bytes was accepted")
    c = nixl_agent("C", nixl_agent_config(backends=[]))
    out, log = captured(lambda: c.create_backend("ORBITE", {"transport": "cma", "cma": "true", "cma_ptracer": "any"}))
    check(not isinstance(out, Exception), f"transport cma, cma and cma_ptracer refused: {out} {log}")
    print("ok unknown parameter refused; listen, io_threads, transport_policy, notification_max_bytes, transport cma,"
          " cma, cma_ptracer applied")


def case_auth(args):
    """With auth_key_file on both sides, metadata, transfers and
    notifications work; an agent without the key cannot even load the
    peer's metadata (the connection is refused before anything is seen)."""
    key = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"nixl-auth-{os.getpid()}.key")
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(48))
    os.close(fd)
    try:
        a, b = make_agent("A", params={"auth_key_file": key}), make_agent("B", params={"auth_key_file": key})
        la, lb = buffer(MiB), buffer(MiB)
        register(a, la)
        register(b, lb)
        a.add_remote_agent(b.get_agent_metadata())
        lb[:] = pattern(MiB, 9)
        offs = layout(8, 4096, True)
        h = transfer(a, "READ", descs(addr(la), offs, 4096), descs(addr(lb), offs, 4096), "B", "create", b"sealed")
        st = a.transfer(h)
        st = wait(a, h)[0] if st != "DONE" else st
        mask = block_mask(MiB, offs, 4096)
        check(st == "DONE" and np.array_equal(la[mask], lb[mask]), f"READ between keyed agents: {st}")
        check(wait_notif(b) == {"A": [b"sealed"]}, "the notification between keyed agents")
        c = make_agent("C")
        out, log = captured(lambda: c.add_remote_agent(b.get_agent_metadata()))
        check(isinstance(out, Exception), "an agent without the key loaded a keyed peer's metadata")
        check("ORBITE: cannot connect to agent 'B'" in log, "NIXL's log does not say why")
        print("ok auth_key_file: keyed agents transfer and notify; an agent without the key is refused")
    finally:
        os.unlink(key)


def case_installed(args):
    """UCX and ORBITE in one agent, found beside the wheel's own plugins
    (install.py; no NIXL_PLUGIN_DIR): each transfer on the backend asked
    for, with exact bytes."""
    check("NIXL_PLUGIN_DIR" not in os.environ, "this case must find the installed plugin")
    a, b = make_agent("A", ("UCX", "ORBITE")), make_agent("B", ("UCX", "ORBITE"))
    with open("/proc/self/maps") as f:
        loaded = {l.split()[-1] for l in f if l.rstrip().endswith("/libplugin_ORBITE.so")}
    check(len(loaded) == 1, f"plugins loaded: {loaded}")
    loaded = loaded.pop()
    built = os.environ["ORBITE_NIXL_BUILT_PLUGIN"]
    check(os.path.getmtime(loaded) >= os.path.getmtime(built), f"NIXL loaded {loaded}, older than the build {built}")
    print(f"ok NIXL loaded the plugin just installed: {loaded}")
    check("ORBITE" in a.get_plugin_list() and "UCX" in a.get_plugin_list(), f"plugins: {a.get_plugin_list()}")
    la, lb = buffer(MiB), buffer(MiB)
    register(a, la)
    register(b, lb)
    a.add_remote_agent(b.get_agent_metadata())
    offs = layout(64, 4096, True)
    mask = block_mask(MiB, offs, 4096)
    for i, backend in enumerate(("ORBITE", "UCX", "ORBITE")):
        lb[:] = pattern(MiB, 11 + i)
        la.fill(0xEE)
        h = a.initialize_xfer("READ", a.get_xfer_descs(descs(addr(la), offs, 4096), "DRAM"),
                              a.get_xfer_descs(descs(addr(lb), offs, 4096), "DRAM"), "B", b"", [backend])
        check(a.query_xfer_backend(h) == backend, f"asked for {backend}, got {a.query_xfer_backend(h)}")
        st = a.transfer(h)
        if st != "DONE":
            st, _, _ = wait(a, h)
        check(st == "DONE" and np.array_equal(la[mask], lb[mask]), f"{backend}: {st} or bytes differ")
        a.release_xfer_handle(h)
        print(f"ok READ on {backend} in an agent holding UCX and ORBITE")


def case_refuse(args):
    """A plugin built for another NIXL release refuses to load, naming the
    release it needs and the one that runs; the agent reports the backend
    missing; nothing crashes."""
    from nixl._api import nixl_agent, nixl_agent_config
    a = nixl_agent("R", nixl_agent_config(backends=[]))
    out, log = captured(lambda: a.create_backend("ORBITE", {}))
    check(isinstance(out, Exception), "a plugin built for another release was loaded")
    want = f"libplugin_ORBITE.so is built for NIXL {args.built_for}"
    check(want in log, f"NIXL's log does not say `{want}`")
    check(f"this process runs NIXL {os.environ['ORBITE_NIXL_RELEASE']}" in log, "NIXL's log does not name the release")
    print(f"ok refused: {log.strip().splitlines()[0][:300]}")


# ---- two processes ------------------------------------------------------------

def spawn(role, *extra, env=None):
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "peer", "--role", role, *map(str, extra)],
                         stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True, env=env)
    seen = []
    for line in p.stdout:  # NIXL's Python logger may print to stdout first
        if line.startswith("READY"):
            return p, line.split()[1:]
        seen.append(line.strip())
    p.kill()
    fail(f"peer {role} did not start: {seen[-3:]!r}")


def role_target(args):
    """A target agent with NIXL's listener: registers a buffer holding
    pattern(seed), then serves until told to stop. On a notification it
    checks that the bytes the initiator wrote are all there, and answers."""
    nbytes = int(args.nbytes)
    params = {"listen": f"127.0.0.1:{args.orbite_port}"} if args.orbite_port else {}
    b = make_agent("target", params=params, listen_port=int(args.listen_port))
    buf = buffer(nbytes)
    buf[:] = pattern(nbytes, int(args.seed))
    register(b, buf)
    if args.meta_out:
        with open(args.meta_out, "wb") as f:
            f.write(b.get_agent_metadata())
    print(f"READY {addr(buf)}", flush=True)

    def holds(m):
        # check:SEED:COUNT:SIZE: the gapped blocks hold pattern(SEED). The
        # last block first, at once: a notification that came before the
        # end of its transfer finds it missing.
        _, seed, count, size = m.decode().split(":")
        want = pattern(nbytes, int(seed))
        last = int(layout(int(count), int(size), True)[-1])
        if not np.array_equal(buf[last:last + int(size)], want[last:last + int(size)]):
            return False
        offs = layout(int(count), int(size), True)
        mask = block_mask(nbytes, offs, int(size))
        return np.array_equal(buf[mask], want[mask])
    serve(b, holds)


def serve(b, holds):
    """Answers each "check:..." notification with "ok" when holds(message),
    until "bye" comes."""
    while True:
        for sender, msgs in b.get_new_notifs().items():
            for m in msgs:
                if m.startswith(b"check:"):
                    ok = holds(m)
                    while not b.check_remote_metadata(sender):
                        time.sleep(0.001)
                    b.send_notif(sender, b"ok" if ok else b"bytes missing at the notification")
                elif m == b"bye":
                    return
        time.sleep(0.0005)


def case_listener(args):
    """Two processes exchanging metadata through NIXL's listener
    (fetch_remote_metadata, send_local_metadata): READ and WRITE with exact
    bytes; the WRITE's notification arrives after all of its bytes."""
    port = free_port()
    nbytes, count, size = 64 * MiB, 1024, 32 * 1024
    p, (remote_base,) = spawn("target", "--listen-port", port, "--nbytes", nbytes, "--seed", 21)
    try:
        a = make_agent("initiator", listen_port=free_port())
        la = buffer(nbytes)
        register(a, la)
        a.fetch_remote_metadata("target", "127.0.0.1", port)
        a.send_local_metadata("127.0.0.1", port)
        t0 = time.monotonic()
        while not a.check_remote_metadata("target"):
            check(time.monotonic() - t0 < DEADLINE_S, "the target's metadata never came")
            time.sleep(0.001)
        offs = layout(count, size, True)
        mask = block_mask(nbytes, offs, size)
        d_l, d_r = descs(addr(la), offs, size), descs(int(remote_base), offs, size)
        h = transfer(a, "READ", d_l, d_r, "target", "prep")
        st = a.transfer(h)
        st = wait(a, h)[0] if st != "DONE" else st
        check(st == "DONE", f"READ: {st}")
        check(np.array_equal(la[mask], pattern(nbytes, 21)[mask]), "READ: bytes differ")
        a.release_xfer_handle(h)
        print(f"ok READ of {count} x {size} B from another process")
        # The WRITE with a notification: 100 000 gapped descriptors, long
        # enough on the wire that a notification sent ahead of its bytes
        # finds the last one missing.
        count, size = 100000, 256
        offs = layout(count, size, True)
        d_l, d_r = descs(addr(la), offs, size), descs(int(remote_base), offs, size)
        la[:] = pattern(nbytes, 22)
        h = transfer(a, "WRITE", d_l, d_r, "target", "create", notif=f"check:22:{count}:{size}".encode())
        st = a.transfer(h)
        got = wait_notif(a)
        check(got == {"target": [b"ok"]}, f"the target says: {got}")
        st = wait(a, h)[0] if st != "DONE" else st
        check(st == "DONE", f"WRITE: {st}")
        a.release_xfer_handle(h)
        print(f"ok WRITE of {count} x {size} B with a notification: every byte there when it arrived")
        a.send_notif("target", b"bye")
        check(p.wait(timeout=DEADLINE_S) == 0, "the target failed")
    finally:
        if p.poll() is None:
            p.kill()


def case_killed(args):
    """The peer killed with SIGKILL mid-transfer: the transfer ends ERR
    within the deadline (no hang, no crash). Restarted at the same
    addresses: its old metadata is refused, the old handle errors, and
    after loading its new metadata transfers work. Over TCP: a same-host
    AUTO transfer goes over CMA, which moves the 128 MiB before the kill
    lands (the READ then ends DONE, rightly); CMA's own failures when the
    source goes are tests/cma_two_process.rs'."""
    lport, oport = free_port(), free_port()
    nbytes = 128 * MiB
    meta_file = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"nixl-killed-{os.getpid()}.meta")
    p, (base,) = spawn("target", "--listen-port", lport, "--orbite-port", oport, "--nbytes", nbytes, "--seed", 31,
                       "--meta-out", meta_file)
    # The listener thread fetches metadata.
    a = make_agent("initiator", params={"transport": "tcp"}, listen_port=free_port())
    la = buffer(nbytes)
    register(a, la)
    with open(meta_file, "rb") as f:
        old_meta = f.read()
    a.add_remote_agent(old_meta)
    count, size = 128, MiB
    offs = layout(count, size, False)
    d_l, d_r = descs(addr(la), offs, size), descs(int(base), offs, size)
    h = transfer(a, "READ", d_l, d_r, "target", "create")
    st = a.transfer(h)
    check(st == "PROC", f"128 MiB posted and already {st}")
    p.send_signal(signal.SIGKILL)
    p.wait()
    st, took, _ = wait(a, h)
    check(st == "ERR", f"a READ from a killed peer ended {st}")
    print(f"ok peer killed mid-transfer: ERR after {took:.2f} s")
    try:
        a.release_xfer_handle(h)
    except Exception:
        pass
    p, (base,) = spawn("target", "--listen-port", lport, "--orbite-port", oport, "--nbytes", nbytes, "--seed", 32,
                       "--meta-out", meta_file)
    try:
        # NIXL 1.5.1 keeps a peer's metadata after NIXL_ERR_REMOTE_DISCONNECT:
        # the application drops it (later releases drop it themselves).
        if a.check_remote_metadata("target"):
            a.remove_remote_agent("target")
        out, log = captured(lambda: a.add_remote_agent(old_meta))
        check(isinstance(out, Exception), "the killed peer's metadata loaded into its successor")
        check("is not the one agent 'target' described" in log, "NIXL's log does not say the engine changed")
        a.fetch_remote_metadata("target", "127.0.0.1", lport)
        t0 = time.monotonic()
        while not a.check_remote_metadata("target"):
            check(time.monotonic() - t0 < DEADLINE_S, "the restarted peer's metadata never came")
            time.sleep(0.001)
        d_r = descs(int(base), offs, size)
        h = transfer(a, "READ", d_l, d_r, "target", "create")
        st = a.transfer(h)
        st = wait(a, h)[0] if st != "DONE" else st
        check(st == "DONE" and np.array_equal(la, pattern(nbytes, 32)), f"READ from the restarted peer: {st}")
        print("ok restarted at the same addresses: old metadata refused, new metadata moves exact bytes")
        a.send_notif("target", b"bye")
        check(p.wait(timeout=DEADLINE_S) == 0, "the restarted target failed")
    finally:
        if p.poll() is None:
            p.kill()
        os.unlink(meta_file)


def vram_devices():
    """The target's device and the initiator's: ORBITE_NIXL_DEVICES=A,B
    (tests/hardware/qualify.py sets it), by default 1,0."""
    a, b = os.environ.get("ORBITE_NIXL_DEVICES", "1,0").split(",")
    return int(a), int(b)


def role_vram(args):
    """A target agent whose buffer is device memory of the target's device."""
    dev = vram_devices()[0]
    cu = FakeCuda(dev)
    nbytes = int(args.nbytes)
    dptr = cu.alloc(nbytes)
    cu.put(dptr, pattern(nbytes, 41))
    b = make_agent("gpu-target", listen_port=int(args.listen_port))
    b.register_memory([(dptr, nbytes, dev, "")], "VRAM")
    print(f"READY {dptr}", flush=True)
    serve(b, lambda m: np.array_equal(cu.get(dptr, nbytes), pattern(nbytes, int(m.split(b":")[1]))))


def case_vram(args):
    """VRAM between two processes, by default device 1 (target) and device
    0 (initiator), over NVLink (the driver on LD_LIBRARY_PATH: the
    stand-in with two devices in CI): READ and WRITE with exact bytes, read
    back through the driver."""
    port = free_port()
    nbytes = 8 * MiB
    tdev, idev = vram_devices()
    p, (rbase,) = spawn("vram", "--listen-port", port, "--nbytes", nbytes)
    try:
        cu = FakeCuda(idev)
        dptr = cu.alloc(nbytes)
        cu.put(dptr, buffer(nbytes))
        a = make_agent("gpu-initiator", listen_port=free_port())
        a.register_memory([(dptr, nbytes, idev, "")], "VRAM")
        a.fetch_remote_metadata("gpu-target", "127.0.0.1", port)
        a.send_local_metadata("127.0.0.1", port)
        while not a.check_remote_metadata("gpu-target"):
            time.sleep(0.001)
        offs = layout(512, 8192, True)
        ld, rd = descs(dptr, offs, 8192, idev), descs(int(rbase), offs, 8192, tdev)
        h = a.initialize_xfer("READ", a.get_xfer_descs(ld, "VRAM"), a.get_xfer_descs(rd, "VRAM"), "gpu-target")
        st = a.transfer(h)
        st = wait(a, h)[0] if st != "DONE" else st
        mask = block_mask(nbytes, offs, 8192)
        got = cu.get(dptr, nbytes)
        check(st == "DONE" and np.array_equal(got[mask], pattern(nbytes, 41)[mask]) and np.all(got[~mask] == 0xEE),
              f"VRAM READ: {st} or device bytes differ")
        a.release_xfer_handle(h)
        print(f"ok VRAM READ device {tdev} -> device {idev}, 512 gapped descriptors")
        cu.put(dptr, pattern(nbytes, 42))
        whole = descs(dptr, np.zeros(1, dtype=np.uint64), nbytes, idev)
        h = a.initialize_xfer("WRITE", a.get_xfer_descs(whole, "VRAM"),
                              a.get_xfer_descs(descs(int(rbase), np.zeros(1, dtype=np.uint64), nbytes, tdev),
                                               "VRAM"),
                              "gpu-target", b"check:42")
        a.transfer(h)
        got = wait_notif(a)
        check(got == {"gpu-target": [b"ok"]}, f"the target says: {got}")
        a.release_xfer_handle(h)
        print(f"ok VRAM WRITE device {idev} -> device {tdev} with a notification: the device bytes there when it "
              "arrived")
        a.send_notif("gpu-target", b"bye")
        check(p.wait(timeout=DEADLINE_S) == 0, "the target failed")
        trace = os.environ.get("FAKECUDA_TRACE")
        if trace:
            print(f"driver trace: {trace}")
    finally:
        if p.poll() is None:
            p.kill()


CASES = {n[5:]: f for n, f in globals().items() if n.startswith("case_")}
ROLES = {"target": role_target, "vram": role_vram}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("case", choices=sorted(CASES) + ["peer"])
    ap.add_argument("--role", choices=sorted(ROLES))
    ap.add_argument("--listen-port", default="0")
    ap.add_argument("--orbite-port", default="")
    ap.add_argument("--nbytes", default=str(MiB))
    ap.add_argument("--seed", default="1")
    ap.add_argument("--meta-out", default="")
    ap.add_argument("--built-for", default="")
    args = ap.parse_args()
    if args.case == "peer":
        ROLES[args.role](args)
        return
    CASES[args.case](args)
    print(f"PASS {args.case}")


if __name__ == "__main__":
    main()
