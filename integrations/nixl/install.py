#!/usr/bin/env python3
"""Adds libplugin_ORBITE.so to the nixl installation of this Python.

NIXL finds backend plugins in the `plugins` folder beside its libnixl.so
(each nixl_cuXX wheel has its own), unless NIXL_PLUGIN_DIR names another
folder, which then replaces it (and UCX would be missing). Copying the
plugin there keeps UCX and every other bundled plugin available.

Usage: install.py PATH/TO/libplugin_ORBITE.so [--check]
  --check: only print the folders it would use.
"""
import importlib.util
import os
import shutil
import sys
import tempfile


def plugin_dirs():
    """The plugins folder of every NIXL wheel importable here."""
    found = []
    for mod in ("nixl_cu12", "nixl_cu13", "nixl_rocm"):
        spec = importlib.util.find_spec(mod)  # does not import it
        if spec is None or not spec.submodule_search_locations:
            continue
        pkg = list(spec.submodule_search_locations)[0]
        libs = os.path.join(os.path.dirname(pkg), "." + mod + ".mesonpy.libs", "plugins")
        if os.path.isfile(os.path.join(libs, "libplugin_UCX.so")) or os.path.isdir(libs):
            found.append(libs)
    return found


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        sys.exit(__doc__)
    plugin = args[0]
    dirs = plugin_dirs()
    if not dirs:
        sys.exit(
            f"{sys.executable}: no nixl wheel is installed here (pip install nixl), "
            "or set NIXL_PLUGIN_DIR to a folder holding libplugin_ORBITE.so and the plugins you use"
        )
    for d in dirs:
        dest = os.path.join(d, "libplugin_ORBITE.so")
        if "--check" in sys.argv:
            print(dest)
            continue
        # Replace atomically: a process that has the old file mapped keeps it.
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".libplugin_ORBITE.")
        os.close(fd)
        shutil.copyfile(plugin, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
        print(f"installed {dest}")


if __name__ == "__main__":
    main()
