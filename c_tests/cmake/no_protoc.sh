#!/bin/sh
# A default configure on a machine without protoc stops, naming both fixes;
# with -DORBITE_ETCD=OFF it configures. protoc is hidden by a PATH whose
# directories holding it are replaced by copies (symlinks) without it.
#
#   no_protoc.sh SRC WORK
set -eu
src="$1"; work="$2"
rm -rf "$work"; mkdir -p "$work"
path=""
i=0
IFS=:
for d in $PATH; do
  [ -n "$d" ] || continue
  if [ -e "$d/protoc" ]; then
    i=$((i + 1)); shadow="$work/path$i"; mkdir -p "$shadow"
    for f in "$d"/* "$d"/.[!.]*; do
      [ -e "$f" ] || continue
      case "${f##*/}" in protoc | protoc-*) continue ;; esac
      ln -s "$f" "$shadow/${f##*/}"
    done
    d="$shadow"
  fi
  path="${path:+$path:}$d"
done
unset IFS
if PATH="$path" command -v protoc >/dev/null 2>&1; then
  echo "no_protoc: protoc is still on the PATH: $(PATH="$path" command -v protoc)"; exit 1
fi
# CMake also looks in its system directories (/usr/bin, ...) whatever PATH says:
# only PATH, as on a machine where protoc is not installed at all.
quick="-DORBITE_BUILD_TESTS=OFF -DORBITE_BUILD_EXAMPLES=OFF -DCMAKE_FIND_USE_CMAKE_SYSTEM_PATH=OFF"
if PATH="$path" cmake -S "$src" -B "$work/default" $quick >"$work/default.log" 2>&1; then
  echo "no_protoc: the default configure succeeded without protoc:"; cat "$work/default.log"; exit 1
fi
for needle in "needs protoc" "protobuf-compiler" "-DORBITE_ETCD=OFF"; do
  if ! tr -s ' \n' ' ' <"$work/default.log" | grep -q -e "$needle"; then
    echo "no_protoc: the failed configure does not say \"$needle\":"; cat "$work/default.log"; exit 1
  fi
done
if ! PATH="$path" cmake -S "$src" -B "$work/off" $quick -DORBITE_ETCD=OFF >"$work/off.log" 2>&1; then
  echo "no_protoc: -DORBITE_ETCD=OFF does not configure without protoc:"; cat "$work/off.log"; exit 1
fi
echo "no_protoc: without protoc the default configure stops and names both fixes; -DORBITE_ETCD=OFF configures"
