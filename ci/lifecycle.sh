#!/usr/bin/env bash
# The QEMU lifecycle scenarios (every way a session can end). Each runs against one long-lived device model, prints its open
# descriptors, threads and RSS before and after, fails if the descriptors or threads grew or RSS grew by more
# than RSS_SLACK_KIB, and ends with a clean demo run against the same process.
#
#   ci/lifecycle.sh [--scenario NAME]... [--keep-logs]
#
#   killed     QEMU SIGKILLed in the middle of a demo, twice, then a clean run
#   reboot     the guest is reset once (QMP system_reset) after its demos; the demos pass again after the reboot
#   hotplug    QMP device_del and device_add of the hfi1 vfio-user-pci; its demo runs on the replugged function
#   stall      the device model SIGSTOPped during a demo for longer than QEMU's 5 s reply timeout, then
#              SIGCONT: the run ends (no hang on either side) and the next run works
#   dm-killed  the device model SIGKILLed while QEMU runs: the run reports the failure, and a device model
#              restarted on the same (now stale) sockets serves the next QEMU
# Default: all of them, in this order. Logs go to a /tmp/rdma-emu-life.XXXXXX directory, kept on failure.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

usage() { sed -n '2,18s/^# \{0,1\}//p' "$0" >&2; exit "${1:-2}"; }
ALL=(killed reboot hotplug stall dm-killed)
SCENARIOS=() KEEP=0
while [ $# -gt 0 ]; do
    case "$1" in
        --scenario) [ $# -ge 2 ] || usage; SCENARIOS+=("$2"); shift 2 ;;
        --keep-logs) KEEP=1; shift ;;
        -h|--help) usage 0 ;;
        *) log "unknown argument: $1"; usage ;;
    esac
done
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=("${ALL[@]}")
for s in "${SCENARIOS[@]}"; do [[ " ${ALL[*]} " == *" $s "* ]] || die "unknown scenario $s (${ALL[*]})"; done

# Growth of the device model's RSS tolerated over a scenario: allocator caches, not leaks.
RSS_SLACK_KIB=16384
RUN_TIMEOUT=300

build_bins
DM=${BINS[0]} UD=${BINS[1]}
QEMU=${RDMA_EMU_QEMU:-$(bash ci/get-qemu.sh)}
export RDMA_EMU_QEMU=$QEMU
log "building the guest"
bash ci/build-guest.sh --udriver "$UD" >&2

WORK=$(mktemp -d /tmp/rdma-emu-life.XXXXXX)
SOCKS="$WORK/dm"
mkdir -p "$SOCKS"
DM_PID="" FAILED=()
cleanup() {
    [ -n "$DM_PID" ] && kill -KILL "$DM_PID" 2>/dev/null
    for f in "$WORK"/run-*/qemu.pid; do [ -e "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
    true
}
trap cleanup EXIT

start_dm() {
    "$DM" --hfi1 "$SOCKS/hfi1.sock" --irdma "$SOCKS/irdma.sock" --control "$SOCKS/control.sock" \
        </dev/null >>"$SOCKS/device-model.log" 2>&1 &
    DM_PID=$!
    for _ in $(seq 1 200); do
        [ -S "$SOCKS/hfi1.sock" ] && [ -S "$SOCKS/irdma.sock" ] && [ -S "$SOCKS/control.sock" ] && return 0
        kill -0 "$DM_PID" 2>/dev/null || break
        sleep 0.1
    done
    die "the device model did not come up (log: $SOCKS/device-model.log)"
}

# "fds threads rss_kib" of the device model.
counts() {
    local fds threads rss
    fds=$(find "/proc/$DM_PID/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    threads=$(awk '/^Threads:/ {print $2}' "/proc/$DM_PID/status")
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$DM_PID/status")
    echo "$fds $threads $rss"
}

# Waits until the device model is back to (at most) the descriptors and threads of `counts` output $1, 10 s at
# most: a client's teardown finishes a little after QEMU is gone.
settle() { # baseline
    local f0 t0 f t
    read -r f0 t0 _ <<<"$1"
    for _ in $(seq 1 100); do
        read -r f t _ <<<"$(counts)"
        [ "$f" -le "$f0" ] && [ "$t" -le "$t0" ] && return 0
        sleep 0.1
    done
}

# Compares and prints; records a failure if anything leaked.
report() { # scenario before after
    local f0 t0 r0 f1 t1 r1 verdict=ok
    read -r f0 t0 r0 <<<"$2"
    read -r f1 t1 r1 <<<"$3"
    if [ "$f1" -gt "$f0" ] || [ "$t1" -gt "$t0" ] || [ "$r1" -gt $((r0 + RSS_SLACK_KIB)) ]; then
        verdict=LEAK
        FAILED+=("$1: device model grew")
    fi
    printf 'lifecycle %-9s device model fds %s -> %s, threads %s -> %s, RSS %s -> %s KiB: %s\n' \
        "$1" "$f0" "$f1" "$t0" "$t1" "$r0" "$r1" "$verdict" >&2
}

RUN_N=0
# Starts ci/run-qemu.sh against the device model in the background, QEMU's monitor on RUN_DIR/qmp.sock: sets
# RUN_PID and RUN_DIR.
run_bg() { # [run-qemu options]
    RUN_N=$((RUN_N + 1))
    RUN_DIR="$WORK/run-$RUN_N"
    mkdir -p "$RUN_DIR"
    bash ci/run-qemu.sh --sockets "$SOCKS" --udriver "$UD" --logs "$RUN_DIR" --keep-logs --quiet \
        --timeout "$RUN_TIMEOUT" --result "$RUN_DIR/result-host.json" "$@" \
        -- -qmp "unix:$RUN_DIR/qmp.sock,server=on,wait=off" >"$RUN_DIR/stdout" 2>"$RUN_DIR/stderr" &
    RUN_PID=$!
}

# Waits for run_bg's run to end; its exit status.
run_wait() {
    local rc=0
    wait "$RUN_PID" || rc=$?
    return "$rc"
}

# A whole run that must pass.
clean_run() { # scenario
    run_bg
    if run_wait; then
        log "$1: clean run PASS ($RUN_DIR)"
    else
        log "$1: clean run FAILED ($RUN_DIR):"; tail -n 20 "$RUN_DIR/stderr" >&2
        FAILED+=("$1: clean run")
    fi
}

# Waits until the run's serial log has $2 lines matching the extended regexp $1; fails after $3 seconds.
wait_serial() { # regexp count secs
    local n
    for _ in $(seq 1 $(($3 * 10))); do
        n=$(grep -cE "$1" "$RUN_DIR/serial.log" 2>/dev/null || true)
        [ "${n:-0}" -ge "$2" ] && return 0
        kill -0 "$RUN_PID" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# Kills QEMU of the current run.
kill_qemu() { kill -KILL "$(cat "$RUN_DIR/qemu.pid")" 2>/dev/null || true; }

# QMP on the run's monitor socket (testing/guest-run/src/qmp.rs): each argument is one JSON command; "wait:EVENT"
# waits (60 s) for an event.
qmp() {
    "$GUEST_RUN" qmp --socket "$RUN_DIR/qmp.sock" --timeout-s 60 "$@"
}

# Whether the first result block in the run's serial log says ok.
first_block_ok() {
    "$GUEST_RUN" first-result-ok "$RUN_DIR/serial.log"
}

# "VALUE TIMED-OUT" of the run's result: FIELD's value (None when null) and whether QEMU timed out (True or
# False); "? ?" without a readable result.
result_facts() { # field
    local f="$RUN_DIR/result-host.json" v t=False
    v=$("$GUEST_RUN" json-field "$1" 2>/dev/null <"$f") || { echo "? ?"; return 0; }
    ! "$GUEST_RUN" json-has problems "QEMU timed out" 2>/dev/null <"$f" || t=True
    echo "${v:-None} $t"
}

DEMO_STARTED='udriver --json hfi1-demo'
# The guest's last demo: killing the device model there leaves one demo to fail, not three (each failed
# demo costs the guest kernel's vfio-pci reset wait of about a minute once the device is gone).
LAST_DEMO_STARTED='udriver --json irdma-demo .*--wait irq'

scenario_killed() {
    local before
    clean_run killed # warm-up: lazily created state is not a leak
    before=$(counts)
    for i in 1 2; do
        run_bg
        if wait_serial "$DEMO_STARTED" 1 180; then
            sleep 0.3 # inside the demo (it takes about a second under TCG)
            kill_qemu
            log "killed: QEMU SIGKILLed during the hfi1 demo (run $i)"
        else
            FAILED+=("killed: run $i never reached the demo")
        fi
        run_wait || true
    done
    clean_run killed
    settle "$before"
    report killed "$before" "$(counts)"
}

scenario_reboot() {
    local before
    before=$(counts)
    run_bg --allow-reboot --append "rdma_emu.hold=1"
    if wait_serial '^RDMA-EMU-HOLD' 1 240 && first_block_ok; then
        log "reboot: demos passed; resetting the guest"
        qmp '{"execute":"system_reset"}' || FAILED+=("reboot: QMP system_reset")
        wait_serial '^RDMA-EMU-HOLD' 2 240 || FAILED+=("reboot: the guest did not finish its demos after the reset")
        qmp '{"execute":"quit"}' || true
    else
        FAILED+=("reboot: the first boot's demos did not pass")
        kill_qemu
    fi
    # run-qemu.sh judges the last result block: the one after the reboot.
    run_wait || FAILED+=("reboot: the demos after the reboot failed ($RUN_DIR)")
    clean_run reboot
    settle "$before"
    report reboot "$before" "$(counts)"
}

scenario_hotplug() {
    local before add
    before=$(counts)
    run_bg --hotplug --append "rdma_emu.hold=1"
    add=$(printf '{"execute":"device_add","arguments":{"driver":"vfio-user-pci","id":"hfi1","bus":"rp-hfi1","socket":{"path":"%s","type":"unix"}}}' "$SOCKS/hfi1.sock")
    if wait_serial '^RDMA-EMU-HOLD' 1 240 && first_block_ok; then
        log "hotplug: demos passed; device_del hfi1"
        if qmp '{"execute":"device_del","arguments":{"id":"hfi1"}}' wait:DEVICE_DELETED \
            && wait_serial 'hfi1 is gone' 1 60; then
            log "hotplug: hfi1 unplugged; device_add hfi1"
            qmp "$add" || FAILED+=("hotplug: QMP device_add")
            wait_serial '^RDMA-EMU-HOLD' 2 240 || FAILED+=("hotplug: no demo on the replugged function")
        else
            FAILED+=("hotplug: the unplug did not complete")
        fi
        qmp '{"execute":"quit"}' || true
    else
        FAILED+=("hotplug: the demos before the unplug did not pass")
        kill_qemu
    fi
    # The last result block holds every step, the replugged function's demo included.
    run_wait || FAILED+=("hotplug: the demo on the replugged function failed ($RUN_DIR)")
    clean_run hotplug
    settle "$before"
    report hotplug "$before" "$(counts)"
}

scenario_stall() {
    local before status
    before=$(counts)
    run_bg
    if wait_serial "$DEMO_STARTED" 1 180; then
        kill -STOP "$DM_PID"
        log "stall: device model stopped for 8 s during the hfi1 demo"
        sleep 8
        kill -CONT "$DM_PID"
    else
        FAILED+=("stall: the run never reached the demo")
    fi
    run_wait || true
    # Errors are expected; a hang is not: QEMU must have ended by itself, before run-qemu.sh's timeout.
    status=$(result_facts qemu_exit_status)
    log "stall: QEMU exit status and timeout: $status"
    [[ $status == *False ]] || FAILED+=("stall: QEMU did not end by itself ($status)")
    kill -0 "$DM_PID" 2>/dev/null || FAILED+=("stall: the device model died")
    clean_run stall
    settle "$before"
    report stall "$before" "$(counts)"
}

scenario_dm_killed() {
    local before ok
    run_bg
    if wait_serial "$LAST_DEMO_STARTED" 1 180; then
        kill -KILL "$DM_PID"
        wait "$DM_PID" 2>/dev/null || true
        DM_PID=""
        log "dm-killed: device model SIGKILLed during the irdma demo (MSI-X)"
    else
        FAILED+=("dm-killed: the run never reached the demo")
    fi
    if run_wait; then
        FAILED+=("dm-killed: the run passed although its device model was killed")
    fi
    ok=$(result_facts ok)
    log "dm-killed: the run reported: ok/timed-out = $ok"
    [ "$ok" = "False False" ] || FAILED+=("dm-killed: the failure was not reported cleanly ($ok)")
    [ -n "$DM_PID" ] || start_dm # on the stale sockets the killed one left
    # The new process's first client creates what every process creates once (threads, the DMA space's
    # mappings): the baseline is taken after it, as in the other scenarios.
    clean_run dm-killed
    before=$(counts)
    clean_run dm-killed
    settle "$before"
    report dm-killed "$before" "$(counts)"
}

start_dm
for s in "${SCENARIOS[@]}"; do
    log "scenario $s"
    "scenario_${s//-/_}"
done
kill -TERM "$DM_PID" 2>/dev/null && wait "$DM_PID" 2>/dev/null
DM_PID=""
if grep -q 'panicked at' "$SOCKS/device-model.log"; then FAILED+=("the device model panicked"); fi
if [ ${#FAILED[@]} -gt 0 ]; then
    for f in "${FAILED[@]}"; do log "FAIL: $f"; done
    log "logs kept in $WORK"
    exit 1
fi
log "lifecycle: every scenario passed"
if [ "$KEEP" = 1 ]; then log "logs in $WORK"; else rm -rf "$WORK"; fi
