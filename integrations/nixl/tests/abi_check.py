#!/usr/bin/env python3
"""Checks libplugin_ORBITE.so against the NIXL release it loads into.

1. The vtable of nixlBackendEngine in the plugin (built from the project's
   declaration, abi/include) equals, slot by slot and symbol by symbol, the
   one in the release's own POSIX plugin (built from NIXL's headers): the
   same virtual functions, in the same order, with the same signatures
   (the mangled names encode every parameter type).
2. The plugin's engine adds no virtual function of its own.
3. The plugin exports nixl_plugin_init and nixl_plugin_fini and nothing
   else (its liborbite copy and C++ symbols stay inside).

Usage: abi_check.py PLUGIN REFERENCE_PLUGIN (binutils' nm and readelf).
"""
import re
import subprocess
import sys


def run(*a):
    return subprocess.run(a, capture_output=True, text=True, check=True).stdout


def symbols(so, dynamic):
    """address -> names, name -> (address, size)."""
    by_addr, by_name = {}, {}
    for line in run("nm", *(["-D"] if dynamic else []), "--defined-only", "-S", so).splitlines():
        p = line.split()
        if len(p) == 4:
            a, s, _, n = p
        elif len(p) == 3:
            (a, _, n), s = p, "0"
        else:
            continue
        by_addr.setdefault(int(a, 16), []).append(n)
        by_name[n] = (int(a, 16), int(s, 16))
    return by_addr, by_name


def vtable(so, name, dynamic):
    """The slots of vtable `name`: the mangled name each one points to."""
    by_addr, by_name = symbols(so, dynamic)
    if name not in by_name:
        sys.exit(f"{so}: no symbol {name}")
    base, size = by_name[name]
    slots = ["0"] * (size // 8)
    for line in run("readelf", "-rW", so).splitlines():
        m = re.match(r"^([0-9a-f]+)\s+[0-9a-f]+\s+(R_X86_64_\w+)\s+(.*)$", line)
        if not m:
            continue
        off = int(m.group(1), 16)
        if not base <= off < base + size:
            continue
        kind, rest = m.group(2), m.group(3).split()
        if kind == "R_X86_64_RELATIVE":
            target = int(rest[0], 16)
            names = [n for n in by_addr.get(target, []) if not n.endswith(".localalias")]
            slots[(off - base) // 8] = names[0] if names else f"local@{target:x}"
        else:
            slots[(off - base) // 8] = rest[1].split("@")[0]
    return slots


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    plugin, reference = sys.argv[1], sys.argv[2]
    ours = vtable(plugin, "_ZTV17nixlBackendEngine", dynamic=False)
    theirs = vtable(reference, "_ZTV17nixlBackendEngine", dynamic=True)
    # Slot 1 is the typeinfo; its symbol is local in one and global in the other.
    ours[1] = theirs[1] = "typeinfo"
    bad = 0
    for i in range(max(len(ours), len(theirs))):
        o = ours[i] if i < len(ours) else "-"
        t = theirs[i] if i < len(theirs) else "-"
        mark = "ok " if o == t else "BAD"
        bad += o != t
        print(f"{mark} slot {i:2}: {o}" + ("" if o == t else f"\n              release: {t}"))
    engine = vtable(plugin, "_ZTV16nixlOrbiteEngine", dynamic=False)
    if len(engine) != len(theirs):
        print(f"BAD nixlOrbiteEngine's vtable has {len(engine)} slots, the base {len(theirs)}")
        bad += 1
    exported = sorted(n for _, names in symbols(plugin, dynamic=True)[0].items() for n in names
                      if n not in ("_init", "_fini"))
    if exported != ["nixl_plugin_fini", "nixl_plugin_init"]:
        print(f"BAD the plugin exports {exported[:10]}{' ...' if len(exported) > 10 else ''}")
        bad += 1
    if bad:
        sys.exit(f"FAIL: {bad} differences from the release's backend interface")
    print(f"PASS: {len(ours)} vtable slots as in {reference}; only the two entry points exported")


if __name__ == "__main__":
    main()
