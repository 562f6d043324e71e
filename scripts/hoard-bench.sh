#!/usr/bin/env bash
# What exports a hostile importer holds cost an honest requester: the p50
# (and p99) of an uncached 4 KiB SHM READ (an export request, its answer,
# the copy and the close receipt each time), quiet, then while one
# `orbite-peer --import` process holds HELD exports of the same allocation
# (`same`) or of another one of the same source (`other`). KEEP=1 has the
# hoarder keep every descriptor it gets open (at most its RLIMIT_NOFILE),
# not only the one it maps.
#
#   [KEEP=1] scripts/hoard-bench.sh [HELD (90000)] [READS (2000)] [same|other]
#
# The source runs with ipc_max_exports_per_requester at its largest, so
# that the hoarder gets what it asks for (SRC_CONFIG='{...}' replaces its
# config, e.g. '{}' for a build without the key). Prints one line per
# phase.
set -euo pipefail
held=${1:-90000}
reads=${2:-2000}
where=${3:-same}
cd "$(dirname "$0")/.."
cargo build --release --locked --bin orbite-peer >&2
peer=target/release/orbite-peer
dir=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT

# start NAME ARGS...: runs orbite-peer with its stdin and stdout on fifos
# opened as fds: ${NAME}_in (write) and ${NAME}_out (read).
start() {
    local name=$1
    shift
    mkfifo "$dir/$name.in" "$dir/$name.out"
    "$peer" "$@" <"$dir/$name.in" >"$dir/$name.out" &
    pids+=($!)
    exec {in}>"$dir/$name.in"
    exec {out}<"$dir/$name.out"
    printf -v "${name}_in" %s "$in"
    printf -v "${name}_out" %s "$out"
}

src_config=${SRC_CONFIG:-'{"ipc_max_exports_per_requester": 1048576}'}
start src --shared --allocs 2 --size 1048576 --config "$src_config"
read -r desc <&"$src_out"
endpoint=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["endpoint"])' "$desc")
read -r a b < <(python3 -c 'import json,sys; print(*json.loads(sys.argv[1])["addrs"])' "$desc")
target=$a
[ "$where" = other ] && target=$b

start req --connect "$endpoint" --read "$a:4096" --config '{"shm_cache_entries": 0}'
read -r first <&"$req_out"
echo "lat $reads" >&"$req_in"
read -r quiet <&"$req_out"
echo "quiet:                     $quiet"

t0=$(date +%s.%N)
start hoard --import "$endpoint" --grant "$target:4096" --count "$held" --keep "${KEEP:-0}"
read -r got <&"$hoard_out"
t1=$(date +%s.%N)
echo "hoarder ($where allocation): $got in $(python3 -c "print(f'{$t1 - $t0:.1f}')") s"
echo "lat $reads" >&"$req_in"
read -r busy <&"$req_out"
echo "with the exports held:     $busy"
# What the source's own threads spend while nothing happens but the held
# exports (its I/O threads' ticks): CPU seconds over 10 s.
ticks() { awk '{print $14 + $15}' "/proc/${pids[0]}/stat"; }
c0=$(ticks)
sleep 10
c1=$(ticks)
echo "source CPU over 10 s idle:  $(python3 -c "import os; print(($c1 - $c0) / os.sysconf('SC_CLK_TCK'))") s"
echo stats >&"$src_in"
read -r stats <&"$src_out"
python3 -c 'import json,sys; s=json.loads(sys.argv[1])["ipc"]["shm"]; print("source: exports_open", s["exports_open"])' "$stats"
