#!/usr/bin/env bash
# TENT's own benchmark (tebench) over TENT's TCP, TENT's SHM, OrbiTE and
# OrbiTE held to TCP, two processes on loopback, READ and WRITE, 4 KiB to
# 8 MiB at batch 16; prints one table of GB/s, OrbiTE's ratio to TENT's
# SHM and OrbiTE TCP's to TENT's TCP.
#
#   scripts/tent-bench.sh TEBENCH [DURATION_S]
#
# TEBENCH is a tebench built from a Mooncake tree with the edits of
# docs/tent-integration.md applied (-DUSE_TENT=ON -DUSE_ORBITE=ON), against
# an installed OrbiTE (CMAKE_PREFIX_PATH). OrbiTE runs with the adapter's
# defaults (nothing under transports/orbite/engine). Each transport first
# runs tebench's checked mode (--op_type=mix --check_consistency: every
# batch written, read back and compared); READ and WRITE are then timed
# alone. With TENT_BENCH_ROUNDS=R (default 1) the timed points run R
# times, the transports alternated within each round, and the table holds
# each point's median. Raw tebench output goes to $TENT_BENCH_LOG (default
# /tmp/tent-bench.log).
#
# To repeat a few points cheaply (e.g. small READs under CPU hogs), these
# narrow the run; unset, everything runs:
#   TENT_BENCH_SIZES   sizes in bytes, space-separated (default 4096 65536 1048576 8388608)
#   TENT_BENCH_OPS     operations (default "read write")
#   TENT_BENCH_XPORTS  transports, of tcp shm orbite orbite-tcp (default all four)
#   TENT_BENCH_CHECK   0 skips the checked runs (default 1)
set -euo pipefail
tebench="${1:?usage: scripts/tent-bench.sh TEBENCH [DURATION_S]}"
duration="${2:-2}"
rounds="${TENT_BENCH_ROUNDS:-1}"
log="${TENT_BENCH_LOG:-/tmp/tent-bench.log}"
: > "$log"
read -r -a sizes <<< "${TENT_BENCH_SIZES:-4096 65536 1048576 8388608}"
read -r -a ops <<< "${TENT_BENCH_OPS:-read write}"
read -r -a xports <<< "${TENT_BENCH_XPORTS:-tcp shm orbite orbite-tcp}"
check="${TENT_BENCH_CHECK:-1}"
for xport in "${xports[@]}"; do
  case "$xport" in tcp | shm | orbite | orbite-tcp) ;; *) echo "tent-bench: unknown transport $xport" >&2; exit 2 ;; esac
done
for op in "${ops[@]}"; do
  case "$op" in read | write) ;; *) echo "tent-bench: unknown operation $op" >&2; exit 2 ;; esac
done

# A free loopback port from the OS.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# tebench's result rows (BlkSize Batch BW(GB/s) ...) as "SIZE GBPS", for
# the sizes of the table.
rows() {
  awk -v want="${sizes[*]}" 'BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) keep[w[i]] = 1 }
    $1 ~ /^[0-9]+$/ && $2 == 16 && ($1 in keep) { print $1, $3 }'
}

# Runs one transport and one operation (read, write, or mix: WRITE then
# READ of the same bytes, checked, which is how tebench verifies data);
# prints "SIZE GBPS" per size, from 4 KiB to 8 MiB or from $3 to $4 bytes.
run_one() {
  local xport="$1" op="$2" lo="${3:-4096}" hi="${4:-8388608}" tport iport target_pid out engine=""
  # orbite-tcp: OrbiTE held to its TCP transport (AUTO's candidates), for
  # the comparison with TENT's TCP.
  if [ "$xport" = orbite-tcp ]; then
    xport=orbite
    engine=', "engine": {"transport_policy": ["tcp"]}'
  fi
  tport="$(free_port)"
  iport="$(free_port)"
  # MC_TENT_CONF replaces the gates tebench sets from --xport_type: name
  # them all, only the measured transport on.
  local gates="" t
  for t in tcp shm orbite rdma nvlink mnnvl gds io_uring; do
    gates="$gates\"$t\": {\"enable\": $([ "$t" = "$xport" ] && echo true || echo false)$([ "$t" = orbite ] && echo "$engine")}, "
  done
  local conf="{\"rpc_server_hostname\": \"127.0.0.1\", \"transports\": {${gates%, }}}"
  local tlog
  tlog="$(mktemp)"
  MC_TENT_CONF="$conf" "$tebench" --backend=tent --xport_type="$xport" --metadata_type=p2p \
    --rpc_server_port="$tport" --seg_type=DRAM --total_buffer_size=$((256 << 20)) \
    > "$tlog" 2>&1 &
  target_pid=$!
  # The target is up once it has registered its buffers and says so (its
  # RPC port accepts earlier: an initiator started then finds a segment
  # without buffers and exits with no figure).
  stop_target() {
    kill "$target_pid" 2>/dev/null || true
    wait "$target_pid" 2>/dev/null || true
    cat "$tlog" >> "$log"
    rm -f "$tlog"
  }
  for _ in $(seq 1 600); do
    kill -0 "$target_pid" 2>/dev/null || { stop_target; echo "tent-bench: the $xport target exited (see $log)" >&2; return 1; }
    if grep -q "To start initiators" "$tlog"; then break; fi
    sleep 0.1
  done
  out="$(MC_TENT_CONF="$conf" "$tebench" --backend=tent --xport_type="$xport" --metadata_type=p2p \
    --rpc_server_port="$iport" --target_seg_name="127.0.0.1:$tport" --seg_type=DRAM \
    --total_buffer_size=$((256 << 20)) --op_type="$op" $([ "$op" = mix ] && echo --check_consistency=true) \
    --start_block_size="$lo" --max_block_size="$hi" --start_batch_size=16 --max_batch_size=16 \
    --start_num_threads=1 --max_num_threads=1 --duration="$duration" 2>&1)" || {
    echo "$out" >> "$log"
    stop_target
    echo "tent-bench: $xport $op failed (see $log)" >&2
    # What it measured before it stopped still counts.
    echo "$out" | rows
    return 1
  }
  echo "$out" >> "$log"
  stop_target
  echo "$out" | rows
}

# Runs a point up to 3 times until it gives a figure. A port from
# free_port is free only when asked: another socket may take it before
# tebench binds it (seen on a host at load 17: 12 of 24 points), and then
# the target runs without its RPC server ("address in used" in the log)
# and the initiator cannot connect.
retried() {
  local out="" try
  for try in 1 2 3; do
    out="$("$@" || true)"
    [ -n "$out" ] && break
    echo "tent-bench: no figure from $2 $3 (try $try of 3)" >&2
  done
  [ -n "$out" ] && echo "$out"
  return 0
}

declare -A gbps
for xport in "${xports[@]}"; do
  [ "$check" = 0 ] && break
  # Bytes first: a mismatch stops tebench. OrbiTE must pass; TENT's own
  # transports are measured even when their checked run stops early.
  if ! run_one "$xport" mix > /dev/null && ! run_one "$xport" mix > /dev/null; then
    [ "${xport%-tcp}" = orbite ] && { echo "tent-bench: $xport moved wrong bytes or failed" >&2; exit 1; }
    echo "tent-bench: TENT's $xport failed its checked run; measured anyway" >&2
  fi
done
# One tebench per point: TENT's TCP sometimes exits mid-sweep without a
# message, and then loses only that point. Each point's figures of all
# rounds are kept, space-separated.
for round in $(seq 1 "$rounds"); do
  for op in "${ops[@]}"; do
    for point in "${sizes[@]}"; do
      for xport in "${xports[@]}"; do
        while read -r size bw; do
          gbps["$xport/$op/$size"]="${gbps[$xport/$op/$size]:-} $bw"
        done < <(retried run_one "$xport" "$op" "$point" "$point")
      done
    done
  done
  echo "tent-bench: round $round of $rounds done" >&2
done
# The median of a point's figures ("" when it has none).
median() { [ -n "${1// /}" ] && python3 -c "import statistics, sys; print(f'{statistics.median(map(float, sys.argv[1:])):.3f}')" $1 || true; }
for k in "${!gbps[@]}"; do gbps[$k]="$(median "${gbps[$k]}")"; done

printf '%-8s %-6s %10s %10s %10s %10s %12s %16s\n' size op tent-tcp tent-shm orbite orbite-tcp orbite/shm orbite-tcp/tcp
for size in "${sizes[@]}"; do
  for op in "${ops[@]}"; do
    t="${gbps[tcp/$op/$size]:-}" s="${gbps[shm/$op/$size]:-}" o="${gbps[orbite/$op/$size]:-}"
    ot="${gbps[orbite-tcp/$op/$size]:-}"
    ratio() { [ -n "$1" ] && [ -n "$2" ] && python3 -c "print(f'{$1 / $2:.2f}' if $2 > 0 else '-')" || echo -; }
    printf '%-8s %-6s %10s %10s %10s %10s %12s %16s\n' "$size" "$op" "${t:--}" "${s:--}" "${o:--}" "${ot:--}" \
      "$(ratio "$o" "$s")" "$(ratio "$ot" "$t")"
  done
done
