#!/usr/bin/env bash
# Soak (not part of CI): one device model serves back-to-back QEMU runs and, at the same time, direct
# vfio-user clients, for MINUTES; after every round it prints the device model's open descriptors, threads and
# RSS, and at the end compares the last round with the first.
#
#   ci/soak.sh [--minutes N] [--no-qemu] [--keep-logs]
#
#   --minutes N   how long (default 30); the round in progress is finished
#   --no-qemu     direct clients only (both functions at once), for machines without QEMU
#
# A round with QEMU: the guest gets one function (hfi1 and irdma alternate, `--irdma-id none` / `--hfi1-id none`,
# so QEMU attaches only that one) while a direct client loop (udriver demo, then udriver stress for 5 s) uses the
# other one, and the control socket is queried (list, pci, dump) all along. Without QEMU a round is 60 s of
# client loops on both functions. Fails if a QEMU run or a client failed, or if from the first round to the last
# the descriptors or threads grew or RSS grew by more than 32 MiB.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

usage() { sed -n '2,17s/^# \{0,1\}//p' "$0" >&2; exit "${1:-2}"; }
MINUTES=30 QEMU_RUNS=1 KEEP=0
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) [ $# -ge 2 ] && [[ $2 =~ ^[0-9]+$ ]] || usage; MINUTES=$2; shift 2 ;;
        --no-qemu) QEMU_RUNS=0; shift ;;
        --keep-logs) KEEP=1; shift ;;
        -h|--help) usage 0 ;;
        *) log "unknown argument: $1"; usage ;;
    esac
done
RSS_SLACK_KIB=32768
NO_QEMU_ROUND_S=60

build_bins
DM=${BINS[0]} UD=${BINS[1]}
# The host-side client: the release build (the static one is for the guest, and works here too).
HOST_UD=$UD
if [ "$QEMU_RUNS" = 1 ]; then
    QEMU=${RDMA_EMU_QEMU:-$(bash ci/get-qemu.sh)}
    export RDMA_EMU_QEMU=$QEMU
    log "building the guest"
    bash ci/build-guest.sh --udriver "$UD" >&2
fi

WORK=$(mktemp -d /tmp/rdma-emu-soak.XXXXXX)
SOCKS="$WORK/dm"
mkdir -p "$SOCKS"
DM_PID="" LOOPS=()
cleanup() {
    for p in "${LOOPS[@]}"; do kill "$p" 2>/dev/null; done
    [ -n "$DM_PID" ] && kill -KILL "$DM_PID" 2>/dev/null
    true
}
trap cleanup EXIT

"$DM" --hfi1 "$SOCKS/hfi1.sock" --irdma "$SOCKS/irdma.sock" --control "$SOCKS/control.sock" \
    </dev/null >"$SOCKS/device-model.log" 2>&1 &
DM_PID=$!
for _ in $(seq 1 200); do
    [ -S "$SOCKS/hfi1.sock" ] && [ -S "$SOCKS/irdma.sock" ] && [ -S "$SOCKS/control.sock" ] && break
    sleep 0.1
done
[ -S "$SOCKS/control.sock" ] || die "the device model did not come up ($SOCKS/device-model.log)"

counts() {
    local fds threads rss
    fds=$(find "/proc/$DM_PID/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    threads=$(awk '/^Threads:/ {print $2}' "/proc/$DM_PID/status")
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$DM_PID/status")
    echo "$fds $threads $rss"
}

# A direct client loop on one function until $WORK/stop exists; one line per session in $WORK/clients.log.
client_loop() { # device
    local sock="$SOCKS/$1.sock" rc
    while [ ! -e "$WORK/stop" ]; do
        rc=0
        timeout 120 "$HOST_UD" --json --vfio-user "$sock" "$1-demo" >"$WORK/$1-demo.out" 2>&1 || rc=$?
        echo "$1 demo $rc" >>"$WORK/clients.log"
        [ -e "$WORK/stop" ] && break
        rc=0
        timeout 120 "$HOST_UD" --json stress --vfio-user "$sock" --seconds 5 --threads 2 >"$WORK/$1-stress.out" 2>&1 || rc=$?
        echo "$1 stress $rc" >>"$WORK/clients.log"
    done
}

# Control socket queries (list, hfi1 pci, irdma dump) once a second until $WORK/stop exists; one line per round in
# $WORK/clients.log.
control_loop() {
    "$GUEST_RUN" control-soak --socket "$SOCKS/control.sock" --stop "$WORK/stop" --log "$WORK/clients.log"
}

start_loops() { # devices...
    rm -f "$WORK/stop"
    LOOPS=()
    for d in "$@"; do client_loop "$d" & LOOPS+=("$!"); done
    control_loop & LOOPS+=("$!")
}
stop_loops() {
    touch "$WORK/stop"
    for p in "${LOOPS[@]}"; do wait "$p" 2>/dev/null || true; done
    LOOPS=()
}

FAILED=() FIRST="" LAST="" ROUND=0
END=$(($(date +%s) + MINUTES * 60))
: >"$WORK/clients.log"
while [ "$(date +%s)" -lt "$END" ]; do
    ROUND=$((ROUND + 1))
    if [ "$QEMU_RUNS" = 1 ]; then
        if [ $((ROUND % 2)) = 1 ]; then guest=hfi1 direct=irdma ids=(--irdma-id none); else guest=irdma direct=hfi1 ids=(--hfi1-id none); fi
        start_loops "$direct"
        rc=0
        bash ci/run-qemu.sh --sockets "$SOCKS" --udriver "$UD" --logs "$WORK/run-$ROUND" --quiet "${ids[@]}" \
            >"$WORK/run-$ROUND.out" 2>&1 || rc=$?
        stop_loops
        if [ "$rc" != 0 ]; then FAILED+=("round $ROUND: QEMU run with $guest failed ($WORK/run-$ROUND)"); fi
        what="QEMU $guest $([ "$rc" = 0 ] && echo PASS || echo FAIL), direct $direct"
    else
        start_loops hfi1 irdma
        sleep "$NO_QEMU_ROUND_S"
        stop_loops
        what="direct hfi1 + irdma"
    fi
    sleep 1 # the last client's teardown
    now=$(counts)
    [ -n "$FIRST" ] || FIRST=$now
    LAST=$now
    read -r f t r <<<"$now"
    log "soak round $ROUND ($(( (END - $(date +%s)) / 60 )) min left): $what; device model fds $f, threads $t, RSS $r KiB"
done

stop_loops
bad=$(awk '$3 != 0' "$WORK/clients.log" | sort | uniq -c)
total=$(wc -l <"$WORK/clients.log")
log "direct clients and control queries: $total sessions, failures: ${bad:-none}"
[ -z "$bad" ] || FAILED+=("some direct client sessions or control queries failed")
read -r f0 t0 r0 <<<"$FIRST"
read -r f1 t1 r1 <<<"$LAST"
log "soak: $ROUND rounds; device model fds $f0 -> $f1, threads $t0 -> $t1, RSS $r0 -> $r1 KiB (first round -> last)"
if [ "$f1" -gt "$f0" ] || [ "$t1" -gt "$t0" ] || [ "$r1" -gt $((r0 + RSS_SLACK_KIB)) ]; then
    FAILED+=("the device model grew from the first round to the last")
fi
kill -TERM "$DM_PID" 2>/dev/null && wait "$DM_PID" 2>/dev/null
DM_PID=""
grep -q 'panicked at' "$SOCKS/device-model.log" && FAILED+=("the device model panicked")
if [ ${#FAILED[@]} -gt 0 ]; then
    for x in "${FAILED[@]}"; do log "FAIL: $x"; done
    log "logs kept in $WORK"
    exit 1
fi
log "soak passed"
if [ "$KEEP" = 1 ]; then log "logs in $WORK"; else rm -rf "$WORK"; fi
