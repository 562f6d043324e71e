#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks for building and testing OrbiTE:
# cmake, pkg-config, a C/C++ compiler, valgrind (memcheck stage), abigail-tools
# (the ABI check), protoc (the etcd client's build) and etcd (the discovery
# tests start their own).
set -euo pipefail
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
# The ABI and API check (scripts/abi_check.py): libabigail's abidw/abidiff.
command -v abidiff >/dev/null 2>&1 || missing+=(abigail-tools)
# Discovery: protoc builds the etcd client; the tests run a real etcd.
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
[ -x /usr/bin/etcd ] || command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "cargo is required (https://rustup.rs)"; exit 1; }
