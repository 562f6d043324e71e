"""Helpers of the ORBITE plugin's tests: agents, buffers, descriptor
arrays, waiting, and reading what NIXL logs to stderr."""

import contextlib
import ctypes
import os
import socket
import struct
import sys
import tempfile
import time

import numpy as np
from nixl._api import nixl_agent, nixl_agent_config

# Generous bounds: the tests run on two loaded cores. Tight figures are
# measured by the benchmark, never asserted here.
DEADLINE_S = 60.0


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def free_port():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))  # free on every address: NIXL's listener binds 0.0.0.0
        return s.getsockname()[1]


def make_agent(name, backends=("ORBITE",), params=None, listen_port=None):
    """An agent with `backends` created with `params` (each backend)."""
    cfg = nixl_agent_config(
        enable_listen_thread=listen_port is not None,
        listen_port=listen_port or 0,
        backends=[],
    )
    a = nixl_agent(name, cfg)
    for b in backends:
        a.create_backend(b, dict(params or {}))
    return a


def buffer(nbytes, fill=0xEE):
    b = np.empty(nbytes, dtype=np.uint8)
    b.fill(fill)
    return b


PERIOD = 1048583  # a prime: a block moved to another power-of-two offset shows


def pattern(nbytes, seed):
    """Deterministic random bytes, one sequence per seed, repeating every
    PERIOD bytes (cheap to make for hundreds of MiB)."""
    block = np.random.default_rng(seed).integers(0, 256, size=min(nbytes, PERIOD), dtype=np.uint8)
    return np.resize(block, nbytes)


def addr(arr):
    return arr.ctypes.data


def register(agent, arr, backends=()):
    return agent.register_memory([(addr(arr), arr.nbytes, 0, "")], "DRAM", backends=list(backends))


def layout(count, size, gapped):
    """Offsets of `count` blocks of `size` bytes: back to back, or with a
    gap of `size` bytes after each."""
    stride = 2 * size if gapped else size
    return np.arange(count, dtype=np.uint64) * np.uint64(stride)


def descs(base, offsets, size, dev=0):
    d = np.empty((len(offsets), 3), dtype=np.uint64)
    d[:, 0] = np.uint64(base) + offsets
    d[:, 1] = size
    d[:, 2] = dev
    return d


def block_mask(nbytes, offsets, size):
    m = np.zeros(nbytes, dtype=bool)
    idx = (offsets[:, None] + np.arange(size, dtype=np.uint64)[None, :]).ravel()
    m[idx.astype(np.int64)] = True
    return m


def wait(agent, handle, deadline_s=DEADLINE_S):
    """Polls until the transfer leaves PROC; returns DONE or ERR and the
    seconds it took."""
    t0 = time.monotonic()
    while True:
        try:
            s = agent.check_xfer_state(handle)
        except Exception as e:  # NIXL raises for some errors
            return "ERR", time.monotonic() - t0, e
        if s != "PROC":
            return s, time.monotonic() - t0, None
        if time.monotonic() - t0 > deadline_s:
            fail(f"transfer still in progress after {deadline_s} s")
        time.sleep(0.0005)


def wait_notif(agent, deadline_s=DEADLINE_S):
    """The first notification(s) that arrive: {agent name: [messages]}."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        n = agent.get_new_notifs()
        if n:
            return n
        time.sleep(0.001)
    fail(f"no notification within {deadline_s} s")


@contextlib.contextmanager
def stderr_to(path):
    """Sends fd 2 (where NIXL's Abseil logger writes) to `path`."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "wb") as f:
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def captured(fn):
    """Runs fn() with stderr captured; returns (result or exception, text)."""
    fd, path = tempfile.mkstemp(prefix="nixl-stderr-")
    os.close(fd)
    try:
        with stderr_to(path):
            try:
                out = fn()
            except Exception as e:  # noqa: BLE001 - the caller judges it
                out = e
        with open(path, "rb") as f:
            text = f.read().decode(errors="replace")
    finally:
        os.unlink(path)
    sys.stderr.write(text)
    return out, text


class FakeCuda:
    """Device memory through the CUDA driver on LD_LIBRARY_PATH (the CPU
    stand-in, tests/fakecuda, in CI; a real driver on a GPU machine)."""

    def __init__(self, device):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self._ok(self.cu.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self._ok(self.cu.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        self._ok(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self._ok(self.cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self.ctx = ctx

    @staticmethod
    def _ok(rc, what):
        if rc != 0:
            fail(f"{what} returned CUresult {rc}")

    def alloc(self, n):
        p = ctypes.c_uint64()
        self._ok(self.cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), "cuMemAlloc_v2")
        return p.value

    def put(self, dptr, arr):
        self._ok(self.cu.cuMemcpyHtoD_v2(ctypes.c_uint64(dptr), ctypes.c_void_p(addr(arr)),
                                         ctypes.c_size_t(arr.nbytes)), "cuMemcpyHtoD_v2")

    def get(self, dptr, n):
        out = np.empty(n, dtype=np.uint8)
        self._ok(self.cu.cuMemcpyDtoH_v2(ctypes.c_void_p(addr(out)), ctypes.c_uint64(dptr),
                                         ctypes.c_size_t(n)), "cuMemcpyDtoH_v2")
        return out


def find_desc_len(metadata, base, length, dev=0):
    """Where NIXL's serialized metadata holds a registration's descriptor
    (addr, len, dev): (offset, occurrences). The ORBITE public data beside
    it holds (addr, len) too, but followed by the memory type (4 bytes)."""
    needle = struct.pack("<QQQ", base, length, dev)
    return metadata.find(needle), metadata.count(needle)
