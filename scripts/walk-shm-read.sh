#!/bin/sh
# The lock walk of one 4 KiB SHM READ (issue 61): how many locks one
# orbite_submit takes and how many rooms (files of src/) its code runs in,
# from the call to the copy.
#
# c_tests/lock_walk.c submits one 4 KiB READ 21 times between two engines in
# one process; callgrind records the last call only (`measured_submit`), one
# instruction at a time. Each executed instruction of the driver (linked
# with liborbite.a, not position-independent, so addresses are the file's)
# is mapped with `addr2line -i` to its inlined frames:
# - a room is a file of this crate's src/ named by any frame of any executed
#   instruction, inlined helpers included (a frame without a line number,
#   which the compiler gives to glue it made, names no room; nor does a
#   dependency's own src/, such as hashbrown's src/lib.rs);
# - an entered room (`--entered`, the issue's coarser count) is a file of
#   src/ holding a function that ran as a function of its own: the file of
#   the outermost frame, by the majority of that function's instructions;
# - an atomic is an executed `lock`-prefixed instruction or an `xchg` with
#   memory (each execution counted);
# - a lock acquisition is an atomic executed inside the acquiring function
#   of a lock: parking_lot's `lock`/`lock_shared`/`lock_exclusive`/
#   `lock_upgradable` (and their `try_` forms) or std's futex mutex and
#   rwlock `lock`/`read`/`write`; it is named by its innermost frame in src/.
#
# usage: scripts/walk-shm-read.sh [--entered] [shm|cma|auto] (default shm)
#        --entered: list the entered rooms instead of all rooms (both counts
#        are printed either way)
# env:   ORBITE_LIB  liborbite.a to link (default target/release/liborbite.a;
#                    build it first: cargo build --release --locked --lib)
#        WALK_DIR    where the driver and callgrind's file go (default a temp dir)
#        WALK_LIST=0 print the counts only
# Prints "locks N rooms M entered E atomics K", then the acquisitions and
# the rooms (each with the functions of it that ran; `=` entered, `-` inlined only).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
mode=all
if [ "${1:-}" = "--entered" ]; then mode=entered; shift; fi
transport=${1:-shm}
lib=${ORBITE_LIB:-$root/target/release/liborbite.a}
dir=${WALK_DIR:-$(mktemp -d)}
[ -f "$lib" ] || { echo "no $lib: cargo build --release --locked --lib first" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind is needed" >&2; exit 2; }
cc -O2 -g -no-pie -I"$root/include" "$root/c_tests/lock_walk.c" "$lib" \
   -lpthread -ldl -lm -lrt -lutil -lgcc_s -o "$dir/lock_walk"
valgrind --tool=callgrind --toggle-collect=measured_submit --dump-instr=yes \
  --compress-strings=no --compress-pos=no --callgrind-out-file="$dir/cg.out" \
  "$dir/lock_walk" "$transport" >"$dir/run.log" 2>&1 || { cat "$dir/run.log" >&2; exit 1; }
exec python3 - "$dir/lock_walk" "$dir/cg.out" "$root" "${WALK_LIST:-1}" "$mode" <<'PY'
import collections, os, re, struct, subprocess, sys

exe, out, root, show = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] != "0"
entered_only = sys.argv[5] == "entered"

# Executed instructions of the driver and how often each ran.
counts = collections.Counter()
ob = None
for line in open(out):
    if line.startswith("ob="):
        ob = line[3:].strip()
    elif line.startswith("0x") and ob == exe:
        f = line.split()
        counts[int(f[0], 16)] += int(f[2]) if len(f) > 2 else int(f[1])
    elif line.startswith("calls="):
        # The next cost line is the call's inclusive cost: its instruction
        # ran once per call, not `cost` times.
        pass
# Calls' cost lines carry inclusive costs: recount call sites from calls=.
calls = collections.Counter()
ob = None
lines = open(out).read().splitlines()
i = 0
while i < len(lines):
    l = lines[i]
    if l.startswith("ob="):
        ob = l[3:].strip()
    if l.startswith("calls=") and ob == exe and i + 1 < len(lines):
        n = int(l[6:].split()[0])
        f = lines[i + 1].split()
        a = int(f[0], 16)
        inc = int(f[2]) if len(f) > 2 else int(f[1])
        counts[a] -= inc
        calls[a] += n
        i += 2
        continue
    i += 1
for a, n in calls.items():
    counts[a] += n
counts = {a: n for a, n in counts.items() if n > 0}

# The file's bytes at a virtual address (ELF64 program headers).
data = open(exe, "rb").read()
phoff, = struct.unpack_from("<Q", data, 0x20)
phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
segs = []
for k in range(phnum):
    p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + k * phentsize)
    if p_type == 1:
        segs.append((p_vaddr, p_filesz, p_offset))

def at(a):
    for v, sz, off in segs:
        if v <= a < v + sz:
            return data[off + a - v: off + a - v + 16]
    return b""

LEGACY = {0x66, 0x67, 0x2E, 0x3E, 0x26, 0x64, 0x65, 0x36, 0xF2, 0xF3}
def atomic(a):
    b = at(a)
    k, locked = 0, False
    while k < len(b) and (b[k] in LEGACY or b[k] == 0xF0):
        locked |= b[k] == 0xF0
        k += 1
    if locked:
        return True
    if k < len(b) and 0x40 <= b[k] <= 0x4F:
        k += 1
    return k + 1 < len(b) and b[k] in (0x86, 0x87) and (b[k + 1] >> 6) != 3

# Inlined frames of every executed instruction, innermost first.
addrs = sorted(counts)
res = subprocess.run(["addr2line", "-e", exe, "-i", "-f", "-C", "-a"] + ["%x" % a for a in addrs],
                     capture_output=True, text=True, check=True).stdout.splitlines()
frames, cur = {}, None
k = 0
while k < len(res):
    if res[k].startswith("0x"):
        cur = int(res[k], 16)
        frames[cur] = []
        k += 1
        continue
    frames[cur].append((res[k], res[k + 1] if k + 1 < len(res) else "??:0"))
    k += 2

def room(loc):
    """The file of this crate's src/ that `loc` (file:line) names, or None."""
    path, _, line = loc.split(" ")[0].rpartition(":")
    if line in ("?", "0") or "/.cargo/" in path or path.startswith("/rustc/") or path.startswith("/rust/deps/"):
        return None
    parts = path.split("/")
    for j in range(len(parts) - 1, -1, -1):
        if parts[j] == "src":
            rel = "/".join(parts[j:])
            if os.path.isfile(os.path.join(root, rel)):
                return rel
    return None

def short(fn):
    """`Type::method` for `<a::Type as b::Trait>::method`, else the path without the crate."""
    m = re.match(r"<(?:[\w:]*::)?(\w+)(?:<[^ ]*>)? as [^>]*>::(.*)$", fn)
    return "%s::%s" % m.groups() if m else fn.replace("orbite::", "")

ACQ = re.compile(r"(parking_lot|lock_api).*::(try_)?lock(_shared|_exclusive|_upgradable)?(_fast|_slow)?(<.*>)?$"
                 r"|std::sys::.*(mutex|rwlock).*::(lock|read|write|try_lock|try_read|try_write)(_contended)?$")
rooms = collections.defaultdict(set)  # room -> "=fn" (entered) / "-fn" (inlined)
outer = collections.defaultdict(collections.Counter)  # entered fn -> rooms of its instructions
acqs = collections.Counter()
atomics = 0
for a in addrs:
    fr = frames.get(a, [])
    for k, (fn, loc) in enumerate(fr):
        r = room(loc)
        if r:
            rooms[r].add(fn)
        if k == len(fr) - 1 and r:
            outer[fn][r] += 1
    if not atomic(a):
        continue
    atomics += counts[a]
    if any(ACQ.search(fn) and "unlock" not in fn for fn, _ in fr):
        site = next(("%s:%s %s" % (room(loc), loc.rsplit(":", 1)[1].split(" ")[0], fn[:90])
                     for fn, loc in fr if room(loc)), "?")
        acqs[site] += counts[a]
home = {fn: c.most_common(1)[0][0] for fn, c in outer.items()}
entered = collections.defaultdict(set)
for fn, r in home.items():
    entered[r].add(fn)
print("locks %d rooms %d entered %d atomics %d" % (sum(acqs.values()), len(rooms), len(entered), atomics))
if show:
    print("lock acquisitions (innermost frame in src/):")
    for s, n in sorted(acqs.items()):
        print("  %dx %s" % (n, s))
    listed = entered if entered_only else rooms
    print("entered rooms:" if entered_only else "rooms (= entered, - inlined only):")
    for r in sorted(listed):
        mark = "=" if r in entered else "-"
        fns = sorted(entered[r]) if entered_only else sorted(entered[r]) + sorted(rooms[r] - entered[r])
        print("  %s %s: %s" % (mark, r, ", ".join(short(f)[:70] for f in fns[:4])
                                 + (" (+%d)" % (len(fns) - 4) if len(fns) > 4 else "")))
PY
