#!/usr/bin/env python3
"""The C ABI and C++ API check (docs/versioning.md).

The baseline is the public headers of the last release, committed under
abi/baseline/include with abi/baseline/VERSION ("<package version> <C ABI
version>"). Both header sets are compiled into small shared objects with
their debug information -- the C header into a stub library whose functions
have the header's exact prototypes, the C++ layer with every inline
function kept and only `orbite::` exported -- and libabigail's `abidiff`
(Debian: abigail-tools) compares baseline and current. The check fails when

  * the C ABI changed incompatibly (a function removed, a type a function
    uses changed, a constant removed or given another value) and the ABI
    version (abi-version in Cargo.toml, the SONAME's number) did not move;
  * the C++ layer changed incompatibly (a function or member removed or
    changed) and the package version did not move past its compatibility
    range (before 1.0 the minor number, from 1.0 the major number);
  * either changed at all and CHANGELOG.md has no entry for it (a non-empty
    "Unreleased" section, or a section for the current version when the
    version moved);
  * liborbite.so (when given) exports another set of orbite_* functions
    than orbite.h declares.

  scripts/abi_check.py check [--lib target/release/liborbite.so]
  scripts/abi_check.py update     # at a release: the current headers become the baseline

Options for the self-tests (c_tests/abi/run.sh): --include DIR (the
current headers), --baseline DIR, --manifest FILE (Cargo.toml),
--changelog FILE, --only c|cpp, --cache DIR (compiled header sets kept by
their content between runs).
"""

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = os.path.join(ROOT, "abi", "baseline")

PROTOTYPE = re.compile(r"^(?!#|//|\s)(.*?\b(orbite_\w+)\((.*)\));$")
DEFINE = re.compile(r"^#define (ORBITE_\w+) (.+)$")
ABIDW = ["abidw", "--no-corpus-path", "--no-comp-dir-path", "--no-show-locs", "--type-id-style", "hash"]


def fail(msg):
    print(f"abi check: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd, **kw):
    return subprocess.run(cmd, check=False, capture_output=True, text=True, **kw)


def need_tools():
    missing = [t for t in ("abidw", "abidiff", "cc", "c++") if shutil.which(t) is None]
    if missing:
        fail(f"missing {', '.join(missing)} (Debian: apt-get install abigail-tools gcc g++)")


def manifest_versions(path):
    text = open(path).read()
    version = re.search(r'^version = "(\d+)\.(\d+)\.(\d+)"$', text, re.M)
    abi = re.search(r"^abi-version = (\d+)$", text, re.M)
    if not version or not abi:
        fail(f"{path} lacks the package `version` or `abi-version`")
    return tuple(int(x) for x in version.groups()), int(abi.group(1))


def baseline_versions(baseline):
    parts = open(os.path.join(baseline, "VERSION")).read().split()
    return tuple(int(x) for x in parts[0].split(".")), int(parts[1])


def header_functions(header):
    """The function prototypes orbite.h declares: {name: prototype}."""
    return {m.group(2): m.group(1) for m in map(PROTOTYPE.match, open(header).read().splitlines()) if m}


def header_constants(header):
    return {m.group(1): m.group(2).strip() for m in map(DEFINE.match, open(header).read().splitlines()) if m}


def headers_digest(include, kind):
    """A name for what one set of headers compiles to (the cache's key)."""
    h = hashlib.sha256(kind.encode())
    for dirpath, _dirs, files in sorted(os.walk(include)):
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            h.update(os.path.relpath(path, include).encode() + b"\0" + open(path, "rb").read())
    return h.hexdigest()[:24]


def cached(make, include, work, tag, cache):
    """make()'s abixml, reused from the cache folder when one is given."""
    if not cache:
        return make(include, work, tag)
    kind = make.__name__
    path = os.path.join(cache, f"{kind}-{headers_digest(include, kind)}.abi")
    if not os.path.exists(path):
        os.makedirs(cache, exist_ok=True)
        shutil.copy(make(include, work, tag), path + ".tmp")
        os.replace(path + ".tmp", path)
    return path


def c_abi(include, work, tag):
    """abidw of a stub library with orbite.h's exact prototypes."""
    header = os.path.join(include, "orbite.h")
    stub = os.path.join(work, f"{tag}_c.c")
    with open(stub, "w") as f:
        f.write('#include "orbite.h"\n')
        for proto in header_functions(header).values():
            f.write(proto + " { __builtin_trap(); }\n")
    lib = os.path.join(work, f"lib{tag}_c.so")
    r = run(["cc", "-g", "-O0", "-shared", "-fPIC", "-Wno-return-type", "-I", include, stub, "-o", lib])
    if r.returncode:
        fail(f"the {tag} C header does not compile:\n{r.stderr}")
    return abixml(lib, work, f"{tag}_c")


def cpp_abi(include, work, tag):
    """abidw of orbite.hpp with every inline function kept and orbite:: exported."""
    src = os.path.join(work, f"{tag}_cpp.cpp")
    with open(src, "w") as f:
        f.write('#include "orbite.hpp"\n')
    script = os.path.join(work, "orbite_only.map")
    with open(script, "w") as f:
        f.write('{ global: extern "C++" { orbite::*; }; local: *; };\n')
    lib = os.path.join(work, f"lib{tag}_cpp.so")
    r = run(["c++", "-std=c++17", "-g", "-O0", "-fkeep-inline-functions", "-shared", "-fPIC", "-I", include, src,
             f"-Wl,--version-script={script}", "-o", lib])
    if r.returncode:
        fail(f"the {tag} C++ headers do not compile:\n{r.stderr}")
    return abixml(lib, work, f"{tag}_cpp")


def abixml(lib, work, tag):
    out = os.path.join(work, f"{tag}.abi")
    r = run(ABIDW + ["--out-file", out, lib])
    if r.returncode:
        fail(f"abidw failed on {lib}:\n{r.stderr}")
    return out


SUMMARY = re.compile(r"(Functions|Variables) changes summary: (\d+) Removed(?: \(\d+ filtered out\))?, "
                     r"(\d+) Changed(?: \(\d+ filtered out\))?, (\d+) Added")

# What the C++ comparison leaves out: functions outside namespace orbite
# (the standard library's instantiations) and orbite::detail, the layer's
# own internals, which no program names.
CPP_SUPPRESSIONS = """[suppress_function]
  name_not_regexp = ^orbite::
[suppress_function]
  name_regexp = ^orbite::detail::
[suppress_type]
  name_regexp = ^orbite::detail::
"""

# In the C++ layer's report, what breaks a program's source: a member,
# enumerator or base taken away, or something given another name, type or
# value. Sizes and offsets that moved because members were added do not:
# orbite.hpp is compiled into the program, never into liborbite.
CPP_BREAKS = re.compile(r"deletion|name changed from|value changed from|was removed|access changed|"
                        r"base class (?:deletion|change)")


def abidiff(old, new, what, suppressions=None):
    """(removed, changed, added, report) of abidiff over two abixml files."""
    cmd = ["abidiff", "--no-show-locs", "--no-unreferenced-symbols"]
    if suppressions:
        path = os.path.join(os.path.dirname(old), "suppressions.ini")
        with open(path, "w") as f:
            f.write(suppressions)
        cmd += ["--suppressions", path]
    r = run(cmd + [old, new])
    if r.returncode & 3:
        fail(f"abidiff failed on the {what}:\n{r.stdout}{r.stderr}")
    counts = [0, 0, 0]
    for _kind, *numbers in SUMMARY.findall(r.stdout):
        counts = [c + int(n) for c, n in zip(counts, numbers)]
    return (*counts, r.stdout.strip())


def compare_c(old, new):
    """The C ABI is binary: any function removed or whose types changed breaks it."""
    removed, changed, added, report = abidiff(old, new, "C ABI")
    return removed + changed > 0, added > 0, report


def compare_cpp(old, new):
    """The C++ layer is header-only: what breaks is what breaks a program's source."""
    removed, changed, added, report = abidiff(old, new, "C++ layer", CPP_SUPPRESSIONS)
    incompatible = removed > 0 or bool(CPP_BREAKS.search(report))
    return incompatible, incompatible or added + changed > 0, report


def compare_constants(old_header, new_header):
    old, new = header_constants(old_header), header_constants(new_header)
    old.pop("ORBITE_VERSION_STRING", None), new.pop("ORBITE_VERSION_STRING", None)
    old.pop("ORBITE_ABI_VERSION", None), new.pop("ORBITE_ABI_VERSION", None)
    lost = [f"{k} {v}" for k, v in sorted(old.items()) if new.get(k) != v]
    gained = [k for k in sorted(new) if k not in old]
    return lost, gained


def changelog_entry(path, version, version_moved):
    """Whether CHANGELOG.md says what changed: a non-empty Unreleased
    section, or (when the version moved) a non-empty section for it."""
    if not os.path.exists(path):
        return False
    sections = re.split(r"^## ", open(path).read(), flags=re.M)[1:]
    want = ["[Unreleased]"] + ([f"[{'.'.join(map(str, version))}]"] if version_moved else [])
    for s in sections:
        head, _, body = s.partition("\n")
        if any(head.startswith(w) for w in want) and re.search(r"^\s*[-*] \S", body, re.M):
            return True
    return False


def check_exports(lib, header):
    r = run(["nm", "-D", "--defined-only", lib])
    if r.returncode:
        fail(f"nm failed on {lib}: {r.stderr}")
    exported = {line.split()[-1] for line in r.stdout.splitlines() if re.search(r" T orbite_\w+$", line)}
    declared = set(header_functions(header))
    if exported != declared:
        fail(f"{lib} exports {sorted(exported - declared)} that orbite.h does not declare, "
             f"and orbite.h declares {sorted(declared - exported)} that it does not export")


def check(args):
    need_tools()
    version, abi = manifest_versions(args.manifest)
    base_version, base_abi = baseline_versions(args.baseline)
    base_include = os.path.join(args.baseline, "include")
    if args.lib:
        check_exports(args.lib, os.path.join(args.include, "orbite.h"))
    c_bad = c_new = cpp_bad = cpp_new = False
    c_report = cpp_report = ""
    lost = []
    with tempfile.TemporaryDirectory(prefix="orbite-abi.") as work:
        if args.only in (None, "c"):
            c_bad, c_new, c_report = compare_c(cached(c_abi, base_include, work, "base", args.cache),
                                               cached(c_abi, args.include, work, "cur", args.cache))
            lost, gained = compare_constants(os.path.join(base_include, "orbite.h"),
                                             os.path.join(args.include, "orbite.h"))
            c_bad, c_new = c_bad or bool(lost), c_new or bool(gained)
        if args.only in (None, "cpp"):
            cpp_bad, cpp_new, cpp_report = compare_cpp(cached(cpp_abi, base_include, work, "base", args.cache),
                                                       cached(cpp_abi, args.include, work, "cur", args.cache))
    # Which numbers a break must move: before 1.0 the minor, then the major.
    key = 2 if base_version[0] == 0 else 1
    breaking = key - 1
    version_broke = version[:key] > base_version[:key]
    problems = []
    if c_bad and abi <= base_abi:
        problems.append(f"the C ABI changed incompatibly since {'.'.join(map(str, base_version))} "
                        f"(ABI {base_abi}) but abi-version in Cargo.toml is still {abi}: bump it (the SONAME "
                        f"becomes liborbite.so.{base_abi + 1}) and the package version"
                        + (f"; constants lost or changed: {', '.join(lost)}" if lost else ""))
    if (cpp_bad or c_bad) and not version_broke:
        problems.append(f"the {'C++ layer' if cpp_bad else 'C ABI'} changed incompatibly but the package version "
                        f"{'.'.join(map(str, version))} is still in {'.'.join(map(str, base_version))}'s "
                        f"compatibility range: move the {'minor' if breaking == 1 else 'major'} number")
    if (c_bad or c_new or cpp_bad or cpp_new) and not changelog_entry(args.changelog, version,
                                                                      version != base_version):
        problems.append("the C ABI or the C++ layer changed but CHANGELOG.md has no entry for it "
                        "(a line under ## [Unreleased], or under the new version's section)")
    print(f"C ABI: {'incompatible change' if c_bad else 'additions' if c_new else 'unchanged'}; "
          f"C++ layer: {'incompatible change' if cpp_bad else 'additions' if cpp_new else 'unchanged'} "
          f"(baseline {'.'.join(map(str, base_version))} ABI {base_abi}; now {'.'.join(map(str, version))} ABI {abi})")
    if problems:
        for report, name in ((c_report, "C ABI"), (cpp_report, "C++ layer")):
            if report:
                print(f"--- abidiff of the {name} ---\n{report}")
        for p in problems:
            print(f"abi check: {p}", file=sys.stderr)
        sys.exit(1)


def update(args):
    version, abi = manifest_versions(args.manifest)
    target = os.path.join(args.baseline, "include")
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    shutil.copy(os.path.join(args.include, "orbite.h"), target)
    shutil.copy(os.path.join(args.include, "orbite.hpp"), target)
    shutil.copytree(os.path.join(args.include, "orbite"), os.path.join(target, "orbite"))
    with open(os.path.join(args.baseline, "VERSION"), "w") as f:
        f.write(f"{'.'.join(map(str, version))} {abi}\n")
    print(f"{args.baseline} now holds the headers of {'.'.join(map(str, version))} (ABI {abi})")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["check", "update"])
    p.add_argument("--include", default=os.path.join(ROOT, "include"))
    p.add_argument("--manifest", default=os.path.join(ROOT, "Cargo.toml"))
    p.add_argument("--changelog", default=os.path.join(ROOT, "CHANGELOG.md"))
    p.add_argument("--baseline", default=BASELINE, help="the last release's headers and VERSION")
    p.add_argument("--lib", help="liborbite.so whose exports must match orbite.h")
    p.add_argument("--only", choices=["c", "cpp"], help="compare only the C ABI or only the C++ layer")
    p.add_argument("--cache", help="a folder that keeps compiled header sets between runs")
    args = p.parse_args()
    (check if args.mode == "check" else update)(args)


if __name__ == "__main__":
    main()
