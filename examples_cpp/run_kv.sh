#!/bin/sh
# Runs the KV-cache example as two separate processes (kv_prefill, kv_decode)
# talking over pipes to this script, and checks what they print.
#
#   run_kv.sh PREFILL DECODE MODE
#
# MODE:
#   tcp, shm        one prefill, one decode forcing that transport: 3 rounds
#                   of scattered READs and WRITE-backs, every byte checked on
#                   both sides, both engines close OK, the pool is freed.
#   killed-prefill  the prefill is killed (SIGKILL) between two rounds over
#                   SHM: the decode's next round fails with a typed status
#                   (UNAVAILABLE or STALE_PEER, no hang), the decode connects to a new
#                   prefill and runs the round again; bytes checked there.
#                   The decode's close is OK with nothing retained: its
#                   cached import of the dead prefill's pool is unmapped and
#                   let go with the lost peer (counted in "peers lost: 1"),
#                   since no process is left to owe a close receipt to.
#   killed-decode   the decode is killed while it holds a cached SHM import
#                   of the pool: the prefill's close still ends OK (the dead
#                   importer's export is reclaimed) and frees the pool.
#   two-decodes     one prefill, two decodes over SHM sharing the pool, as
#                   serving runs them: each READs scattered blocks and WRITEs
#                   its own blocks back, 3 rounds, and the rounds interleave
#                   (each decode pauses after a round holding its cached
#                   imports of the pool while the other runs one); every byte
#                   checked on all three sides, all three close OK, the pool
#                   is freed.
# Synchronisation is by the lines the programs print; no sleeps.
set -eu
prefill="$1"; decode="$2"; mode="$3"
plan="--blocks 1024 --block-size 65536 --seed 7 --writes 64"
work="$(mktemp -d)"
pids=""
cleanup() {
  for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# spawn NAME IN_FD OUT_FD PROGRAM ARGS...: starts PROGRAM with its stdin and
# stdout on FIFOs that this shell holds open as IN_FD and OUT_FD; its pid
# goes to $spawned.
spawn() {
  name="$1"; in="$2"; out="$3"; shift 3
  mkfifo "$work/$name.in" "$work/$name.out"
  "$@" <"$work/$name.in" >"$work/$name.out" &
  spawned=$!
  pids="$pids $spawned"
  eval "exec $in>\"\$work/$name.in\" $out<\"\$work/$name.out\""
}

# expect FD PATTERN: echoes the lines read from FD until one matches the
# shell PATTERN (kept in $line); fails at end of file.
expect() {
  while IFS= read -r line <&"$1"; do
    echo "  | $line"
    case "$line" in $2) return 0 ;; esac
  done
  echo "run_kv: end of output before a line matching \"$2\""
  exit 1
}

# finish PID WHAT: waits for PID, which must exit 0.
finish() {
  rc=0
  wait "$1" || rc=$?
  if [ "$rc" -ne 0 ]; then echo "run_kv: $2 exited with $rc"; exit 1; fi
}

case "$mode" in
  tcp | shm)
    spawn prefill 3 4 "$prefill" $plan
    p=$spawned
    expect 4 "endpoint *"
    spawn decode 5 6 "$decode" $plan --endpoint "${line#endpoint }" --transport "$mode" --reads 256 --rounds 3
    d=$spawned
    expect 6 "round 2: READ 256 scattered blocks of 64 KiB over $mode in *; bytes verified"
    expect 6 "total: 768 blocks read in *"
    expect 6 "closed: ORBITE_STATUS_OK; imports retained: 0 (peers lost: 0)"
    finish "$d" kv_decode
    echo verify >&3
    expect 4 "verified: 1024 blocks, 64 written back by the decode, 0 wrong; close ORBITE_STATUS_OK; pool freed"
    finish "$p" kv_prefill
    ;;
  killed-prefill)
    spawn prefill1 3 4 "$prefill" $plan
    p1=$spawned
    expect 4 "endpoint *"
    spawn decode 5 6 "$decode" $plan --endpoint "${line#endpoint }" --transport shm --reads 256 --rounds 2 --step --recover
    d=$spawned
    expect 6 "round 0 done"
    kill -9 "$p1"
    wait "$p1" || true # reaped: it is gone for sure
    exec 3>&- 4<&-
    echo next >&5
    expect 6 "peer lost: *; waiting for a new prefill endpoint"
    # UNAVAILABLE when the decode saw the connection end before submitting;
    # STALE_PEER when its SHM channel found the prefill's socket gone first.
    case "$line" in
      "peer lost: ORBITE_STATUS_UNAVAILABLE;"* | "peer lost: ORBITE_STATUS_STALE_PEER;"*) ;;
      *) echo "run_kv: unexpected status"; exit 1 ;;
    esac
    spawn prefill2 7 8 "$prefill" $plan
    p2=$spawned
    expect 8 "endpoint *"
    echo "$line" >&5
    expect 6 "round 1: READ 256 scattered blocks of 64 KiB over shm in *; bytes verified"
    expect 6 "recovered: round 1 ran again on *"
    expect 6 "closed: ORBITE_STATUS_OK; imports retained: 0 (peers lost: 1)"
    finish "$d" kv_decode
    echo verify >&7
    expect 8 "verified: 1024 blocks, 64 written back by the decode, 0 wrong; close ORBITE_STATUS_OK; pool freed"
    finish "$p2" kv_prefill
    ;;
  killed-decode)
    spawn prefill 3 4 "$prefill" $plan
    p=$spawned
    expect 4 "endpoint *"
    spawn decode 5 6 "$decode" $plan --endpoint "${line#endpoint }" --transport shm --reads 256 --rounds 2 --step
    d=$spawned
    expect 6 "round 0 done"
    kill -9 "$d"
    wait "$d" || true
    echo verify >&3
    expect 4 "verified: 1024 blocks, 64 written back by the decode, 0 wrong; close ORBITE_STATUS_OK; pool freed"
    finish "$p" kv_prefill
    ;;
  two-decodes)
    spawn prefill 3 4 "$prefill" $plan --decodes 2
    p=$spawned
    expect 4 "endpoint *"
    ep="${line#endpoint }"
    both="$plan --decodes 2 --endpoint $ep --transport shm --reads 256 --rounds 3 --step"
    spawn decode0 5 6 "$decode" $both --index 0
    d0=$spawned
    spawn decode1 7 8 "$decode" $both --index 1
    d1=$spawned
    # Round 0 of both (in whatever order), then rounds 1 and 2 in turn: the
    # decode that waits holds its cached READ and WRITE imports of the pool
    # while the other READs and WRITEs.
    expect 6 "round 0: READ 256 scattered blocks of 64 KiB over shm in *; bytes verified"
    expect 6 "round 0 done"
    expect 8 "round 0: READ 256 scattered blocks of 64 KiB over shm in *; bytes verified"
    expect 8 "round 0 done"
    echo next >&5
    expect 6 "round 1: READ 256 scattered blocks of 64 KiB over shm in *; bytes verified"
    expect 6 "round 1 done"
    echo next >&7
    expect 8 "round 1: READ 256 scattered blocks of 64 KiB over shm in *; bytes verified"
    expect 8 "round 1 done"
    echo next >&5
    expect 6 "round 2: READ 256 scattered blocks of 64 KiB over shm in *; bytes verified"
    expect 6 "total: 768 blocks read in *"
    expect 6 "closed: ORBITE_STATUS_OK; imports retained: 0 (peers lost: 0)"
    finish "$d0" "kv_decode 0"
    echo next >&7
    expect 8 "round 2: READ 256 scattered blocks of 64 KiB over shm in *; bytes verified"
    expect 8 "total: 768 blocks read in *"
    expect 8 "closed: ORBITE_STATUS_OK; imports retained: 0 (peers lost: 0)"
    finish "$d1" "kv_decode 1"
    echo verify >&3
    expect 4 "verified: 1024 blocks, 128 written back by 2 decodes, 0 wrong; close ORBITE_STATUS_OK; pool freed"
    finish "$p" kv_prefill
    ;;
  *)
    echo "run_kv: unknown mode $mode"
    exit 2
    ;;
esac
echo "run_kv $mode: ok"
