#!/usr/bin/env bash
# Boots the test guest in QEMU with the two emulated functions served by the device model over vfio-user, lets
# the guest's init run udriver's demos through /dev/vfio, and turns its result block into a JSON file.
#
#   ci/run-qemu.sh [options] [-- extra QEMU arguments]
#
#   --device-model PATH   device-model binary (env RDMA_EMU_DEVICE_MODEL; default target/{release,debug}/device-model)
#   --dm-arg ARG          extra device-model argument (repeatable)
#   --sockets DIR         use the device model already serving DIR/hfi1.sock, DIR/irdma.sock and
#                         DIR/control.sock: it is neither started nor stopped here (ci/lifecycle.sh)
#   --hotplug             put each function behind its own pcie-root-port (rp-hfi1, rp-irdma), so QMP
#                         device_del/device_add of the device ids "hfi1" and "irdma" work
#   --allow-reboot        a guest reboot restarts the guest instead of ending QEMU (no -no-reboot)
#   --udriver PATH        static udriver put into the guest (env RDMA_EMU_UDRIVER; default: the first static
#                         target/x86_64-unknown-linux-{gnu,musl}/{release,debug}/udriver; without one the guest
#                         reports that udriver is missing)
#   --kernel K --initrd I boot this guest instead of the one ci/build-guest.sh builds
#   --no-share            guest RAM in a non-shared memory-backend-ram: QEMU has no fd to send, so the device
#                         model must use DMA_READ/DMA_WRITE messages
#   --no-devices          boot the same guest without the device model and its devices
#   --accel auto|tcg|kvm  (env RDMA_EMU_ACCEL, default auto: KVM only if a probe boot really works)
#   --timeout SECS        the whole run (default 600)
#   --demo-timeout SECS   each udriver demo inside the guest (default 120)
#   --args "ARGS"         extra arguments for both udriver demos (guest parameter rdma_emu.args)
#   --hfi1-id V:D, --irdma-id V:D   PCI IDs of the functions (default 1b36:1100, 1b36:1101); non-default ones
#                         are passed to the device model as --hfi1-ids/--irdma-ids
#   --hfi1-wfr            also serve an HFI with the real chip's personality (8086:24f0) and run the guest's
#                         kernel-driver steps on it (modprobe/rmmod hfi1, sysfs, the fabric userland, dmesg)
#   --fabric              serve two chip-personality HFIs joined by a cable (device names hfi1-wfr and hfi1-wfr1
#                         on the control socket) instead of one, and run the guest's fabric steps on them
#                         instead of the single-HFI kernel-driver steps (bring-up under opa-fm, verbs traffic,
#                         cable faults; docs/hfi1-fabric.md); implies --hfi1-wfr. The host answers the guest's
#                         requests on the console (arming cable faults, reading access totals)
#   --capture FILE        with --fabric: record the packets that cross the cable (device-model --capture)
#   --icode NAME          the chip-personality HFIs' implementation code (device-model --hfi1-wfr-icode):
#                         rtl-simulation (default: the driver loads the guest's /lib/firmware/hfi_dc8051.bin and
#                         runs the full link bring-up; the fabric run also bounces a link, loses a neighbour and
#                         unloads hfi1 with the links up) or functional-simulator (no firmware; the stock driver
#                         deadlocks taking an up link down, docs/hfi1-fabric.md)
#   --hfi1-dma MODE       the IOMMU domain the hfi1 functions get before hfi1 binds them: translated (default: the
#                         kernel's DMA domain, so the vIOMMU checks every address the device uses) or identity
#                         (guest-physical addresses, nothing mapped per packet: the hfi1 send path maps and
#                         unmaps every packet's buffers, and under QEMU's caching-mode vIOMMU each of those is a
#                         blocking DMA map or unmap to the device model; ci/bench.sh's guest-verbs case). The
#                         guest's modprobe step fails if a function's domain is not the one asked for
#   --fabric-bounce       with --fabric: after the bring-up only bounce hfi1_1's link (opaportconfig) and wait
#                         for ACTIVE again (ci/e2e.sh runs it with --icode functional-simulator, where the stock
#                         driver deadlocks, to check the stall report)
#   --fabric-perf         with --fabric: after its steps, perftest bandwidth and latency between hfi1_0 and hfi1_1
#                         and the same on SoftRoCE over a veth pair in the guest (step fabric-perf, the result's
#                         fabric_perf; ci/bench.sh's guest-verbs case); with --tid-rdma instead perftest READ
#                         and WRITE with TID RDMA, without it and on SoftRoCE (step tid-perf; ci/bench.sh's
#                         guest-tid case); the default --timeout becomes 1800
#   --tid-rdma            the fabric with the kernel's own TID RDMA: cap_mask gains TID_RDMA and OPFN, and after
#                         the bring-up the guest runs its TID RDMA steps (ci/guest/tid-rdma.sh) instead of the
#                         plain verbs and fault steps; implies --fabric (docs/kernel-tid-rdma.md)
#   --shell               boot with the devices, run the setup (functions bound, hfi1 loaded, opa-fm's sm started
#                         with two HFIs) and give the console to an interactive shell instead of the demos;
#                         leaving the shell powers the guest off and stops the device model. Uses --fabric
#                         unless --hfi1-wfr is given; no --timeout unless one is given. With a terminal on
#                         stdin, QEMU owns it (Ctrl-A X quits QEMU, Ctrl-A C its monitor); piped stdin is sent
#                         once the shell is ready. No result file; not with --no-devices
#   --hfi1-params "P"     module parameters of each modprobe hfi1 (default: the small set in docs/hfi1-kernel-driver.md)
#   --kdriver-timeout S   each kernel-driver step (default 120); a guest too stuck to time out itself is stopped
#                         by the host, which reports the last CSR accesses
#   --hfi1-user PATH      static hfi1-user put into the guest: with --hfi1-wfr the guest runs it on /dev/hfi1_0
#   --hfi1-user-host PATH its host side, started before QEMU on the guest's second serial port; it checks the
#                         device model's RcvArray against the kernel's TIDs and injects the data
#   --bench               run the in-guest benchmark (`udriver bench`) instead of the demos: besides our two
#                         functions, an hfi1 function behind rust-vmm's vfio-user server and one behind ours
#                         with the device model's defaults (no busy-poll, no worker spin; both served by
#                         `testbed serve-peers`; ci/bench.sh gives the device model --low-latency), and QEMU's edu
#                         device
#   --testbed PATH        testbed binary for --bench (default target/{release,debug}/testbed)
#   --bench-budget-ms N   wall time per measured variant inside the guest (default 1000)
#   --reply-poll-us N     how long QEMU's vCPU thread reads its own vfio-user reply before it sleeps (env
#                         RDMA_EMU_REPLY_POLL_US, default 50; 0 leaves QEMU waiting for its I/O thread); needs
#                         qemu-patches/0005 (x-reply-poll-us), which ci/get-qemu.sh's build has
#   --append "PARAMS"     extra guest kernel parameters
#   --result FILE         result JSON (default $CARGO_TARGET_DIR or target/, then rdma-emu/result-<mode>.json)
#   --logs DIR            log directory (default a new /tmp/rdma-emu-run.XXXXXX); kept on failure
#   --keep-logs           keep the log directory on success too
#   --timing              print how long each phase took
#   --quiet               do not stream the guest console to stderr
#
# Exit status 0 only if every step the guest ran is ok. Prints the result file's path on stdout.
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit "${1:-2}"; }

DEVICE_MODEL=${RDMA_EMU_DEVICE_MODEL:-}
UDRIVER=${RDMA_EMU_UDRIVER:-}
ACCEL=${RDMA_EMU_ACCEL:-auto}
KERNEL="" INITRD="" SHARE=1 DEVICES=1 TIMEOUT=600 DEMO_TIMEOUT=120 UARGS="" APPEND_EXTRA=""
HFI1_ID=1b36:1100 IRDMA_ID=1b36:1101 RESULT="" LOG_DIR="" KEEP_LOGS=0 TIMING=0 QUIET=0
HFI1_WFR=0 KDRIVER_TIMEOUT=120 HFI1_USER="" HFI1_USER_HOST="" FABRIC=0 SHELL_MODE=0 TIMEOUT_SET=0
CAPTURE="" FABRIC_BOUNCE=0 FABRIC_PERF=0 TID_RDMA=0 ICODE=rtl-simulation HFI1_DMA=translated
# Small enough for TCG: 2 kernel and 1 user receive contexts, one SDMA engine, no accelerated IP (docs/hfi1-kernel-driver.md).
HFI1_PARAMS="num_vls=1 num_sdma=1 krcvqs=1 num_user_contexts=1 cap_mask=0x4c09000cb9a eager_buffer_size=131072 rcvhdrcnt=64"
DM_ARGS=() QEMU_EXTRA=() SOCKETS_DIR="" HOTPLUG=0 ALLOW_REBOOT=0
BENCH=0 TESTBED=${RDMA_EMU_TESTBED:-} BENCH_BUDGET_MS=1000
REPLY_POLL_US=${RDMA_EMU_REPLY_POLL_US:-50} REPLY_POLL_SET=${RDMA_EMU_REPLY_POLL_US:+1}
need() { [ "$1" -ge 2 ] || usage; }
while [ $# -gt 0 ]; do
    case "$1" in
        --device-model) need $#; DEVICE_MODEL=$2; shift 2 ;;
        --dm-arg) need $#; DM_ARGS+=("$2"); shift 2 ;;
        --sockets) need $#; SOCKETS_DIR=$2; shift 2 ;;
        --hotplug) HOTPLUG=1; shift ;;
        --allow-reboot) ALLOW_REBOOT=1; shift ;;
        --udriver) need $#; UDRIVER=$2; shift 2 ;;
        --kernel) need $#; KERNEL=$2; shift 2 ;;
        --initrd) need $#; INITRD=$2; shift 2 ;;
        --no-share) SHARE=0; shift ;;
        --no-devices) DEVICES=0; shift ;;
        --accel) need $#; ACCEL=$2; shift 2 ;;
        --timeout) need $#; TIMEOUT=$2; TIMEOUT_SET=1; shift 2 ;;
        --demo-timeout) need $#; DEMO_TIMEOUT=$2; shift 2 ;;
        --args) need $#; UARGS=$2; shift 2 ;;
        --hfi1-id) need $#; HFI1_ID=$2; shift 2 ;;
        --irdma-id) need $#; IRDMA_ID=$2; shift 2 ;;
        --hfi1-wfr) HFI1_WFR=1; shift ;;
        --fabric) FABRIC=1; shift ;;
        --capture) need $#; CAPTURE=$2; shift 2 ;;
        --fabric-bounce) FABRIC_BOUNCE=1; shift ;;
        --icode) need $#; ICODE=$2; shift 2 ;;
        --hfi1-dma) need $#; HFI1_DMA=$2; shift 2 ;;
        --fabric-perf) FABRIC_PERF=1; shift ;;
        --tid-rdma) TID_RDMA=1; shift ;;
        --shell) SHELL_MODE=1; shift ;;
        --hfi1-params) need $#; HFI1_PARAMS=$2; shift 2 ;;
        --kdriver-timeout) need $#; KDRIVER_TIMEOUT=$2; shift 2 ;;
        --hfi1-user) need $#; HFI1_USER=$2; shift 2 ;;
        --hfi1-user-host) need $#; HFI1_USER_HOST=$2; shift 2 ;;
        --bench) BENCH=1; shift ;;
        --testbed) need $#; TESTBED=$2; shift 2 ;;
        --bench-budget-ms) need $#; BENCH_BUDGET_MS=$2; shift 2 ;;
        --reply-poll-us) need $#; REPLY_POLL_US=$2; REPLY_POLL_SET=1; shift 2 ;;
        --append) need $#; APPEND_EXTRA=$2; shift 2 ;;
        --result) need $#; RESULT=$2; shift 2 ;;
        --logs) need $#; LOG_DIR=$2; shift 2 ;;
        --keep-logs) KEEP_LOGS=1; shift ;;
        --timing) TIMING=1; shift ;;
        --quiet) QUIET=1; shift ;;
        --) shift; QEMU_EXTRA=("$@"); break ;;
        -h|--help) usage 0 ;;
        *) log "unknown argument: $1"; usage ;;
    esac
done

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
# The shell wants the fabric unless one HFI was asked for; a user's session has no deadline unless asked for.
[ "$SHELL_MODE" = 1 ] && [ "$HFI1_WFR" = 0 ] && FABRIC=1
[ "$TID_RDMA" = 1 ] && FABRIC=1
[ "$FABRIC" = 1 ] && HFI1_WFR=1
[ "$SHELL_MODE" = 1 ] && [ "$TIMEOUT_SET" = 0 ] && TIMEOUT=$((100 * 365 * 86400))
# The fabric run (about 2 minutes under TCG) and then some 60 perftest runs with their set-ups.
[ "$FABRIC_PERF" = 1 ] && [ "$TIMEOUT_SET" = 0 ] && TIMEOUT=1800
is_uint "$TIMEOUT" && [ "$TIMEOUT" -ge 10 ] || die "--timeout must be a number of seconds >= 10"
is_uint "$DEMO_TIMEOUT" && [ "$DEMO_TIMEOUT" -ge 1 ] || die "--demo-timeout must be a number of seconds"
[[ $HFI1_ID =~ ^([0-9a-fA-F]{4}:[0-9a-fA-F]{4}|none)$ ]] || die "--hfi1-id must be VVVV:DDDD or none"
[[ $IRDMA_ID =~ ^([0-9a-fA-F]{4}:[0-9a-fA-F]{4}|none)$ ]] || die "--irdma-id must be VVVV:DDDD or none"
[[ $UARGS != *'"'* ]] || die "--args cannot contain a double quote (it travels on the kernel command line)"
[[ $HFI1_PARAMS =~ ^[A-Za-z0-9_=,.\ -]*$ ]] || die "--hfi1-params takes name=value words only (it travels on the kernel command line)"
is_uint "$KDRIVER_TIMEOUT" && [ "$KDRIVER_TIMEOUT" -ge 1 ] || die "--kdriver-timeout must be a number of seconds"
[ -z "$HFI1_USER_HOST" ] || [ "$HFI1_WFR" = 1 ] || die "--hfi1-user-host needs --hfi1-wfr"
[ -z "$HFI1_USER_HOST" ] || [ -x "$HFI1_USER_HOST" ] || die "--hfi1-user-host $HFI1_USER_HOST is not executable"
case "$ACCEL" in auto|tcg|kvm) ;; *) die "--accel must be auto, tcg or kvm" ;; esac
is_uint "$BENCH_BUDGET_MS" && [ "$BENCH_BUDGET_MS" -ge 1 ] || die "--bench-budget-ms must be a number of milliseconds"
is_uint "$REPLY_POLL_US" && [ "$REPLY_POLL_US" -le 1000000 ] || die "--reply-poll-us must be a number of microseconds <= 1000000"
[ "$BENCH" = 0 ] || [ "$DEVICES" = 1 ] || die "--bench needs the devices"
[ "$SHELL_MODE" = 0 ] || [ "$BENCH" = 0 ] || die "--shell and --bench do not go together"
[ "$SHELL_MODE" = 0 ] || [ "$DEVICES" = 1 ] || die "--shell sets up the devices: not with --no-devices"
[ "$SHELL_MODE" = 0 ] || [ -z "$HFI1_USER_HOST" ] || die "--shell runs no hfi1-user (no --hfi1-user-host)"
[ "$FABRIC" = 0 ] || [ "$SHELL_MODE" = 1 ] || [ -z "$HFI1_USER_HOST" ] || die "--fabric runs no hfi1-user (no --hfi1-user-host)"
[ -z "$CAPTURE" ] || [ "$FABRIC" = 1 ] || die "--capture needs --fabric"
[ "$FABRIC_BOUNCE" = 0 ] || [ "$FABRIC" = 1 ] || die "--fabric-bounce needs --fabric"
case "$ICODE" in rtl-simulation|functional-simulator) ;; *) die "--icode must be rtl-simulation or functional-simulator" ;; esac
case "$HFI1_DMA" in translated|identity) ;; *) die "--hfi1-dma must be translated or identity" ;; esac
[ "$FABRIC_PERF" = 0 ] || { [ "$FABRIC" = 1 ] && [ "$SHELL_MODE" = 0 ]; } || die "--fabric-perf needs --fabric (and no --shell)"
[ "$FABRIC_PERF" = 0 ] || [ "$FABRIC_BOUNCE" = 0 ] || die "--fabric-perf and --fabric-bounce do not go together (the bounce run stops after the link)"
[ "$TID_RDMA" = 0 ] || [ "$FABRIC_BOUNCE" = 0 ] || die "--tid-rdma and --fabric-bounce do not go together"
if [ "$TID_RDMA" = 1 ]; then
    # HFI1_CAP_TID_RDMA (1 << 5) and HFI1_CAP_OPFN (1 << 16), include/uapi/rdma/hfi/hfi1_user.h: ORed into the
    # cap_mask of --hfi1-params (the driver's default mask has neither, common.h HFI1_CAP_MASK_DEFAULT).
    [[ " $HFI1_PARAMS " =~ \ cap_mask=(0x[0-9a-fA-F]+)\  ]] || die "--tid-rdma needs a hexadecimal cap_mask in --hfi1-params"
    HFI1_PARAMS=${HFI1_PARAMS/cap_mask=${BASH_REMATCH[1]}/cap_mask=$(printf '0x%x' $(( BASH_REMATCH[1] | 0x20 | 0x10000 )))}
    # A smaller RcvArray partition, so the tid-exhaust step runs a kernel context out of RcvArray groups as well
    # as flows: 14 user contexts and the 2 kernel ones share the chip's 16 receive contexts, so each gets 512 / 16
    # = 32 groups of the 4096 entries (set_up_context_variables, chip.c:13484-13491) instead of 170.
    if [[ " $HFI1_PARAMS " =~ \ num_user_contexts=[0-9-]+\  ]]; then
        HFI1_PARAMS=$(sed -E 's/(^| )num_user_contexts=[0-9-]+/\1num_user_contexts=14/' <<<"$HFI1_PARAMS")
    else
        HFI1_PARAMS="$HFI1_PARAMS num_user_contexts=14"
    fi
fi
if [ -n "$CAPTURE" ]; then
    mkdir -p "$(dirname "$CAPTURE")" && CAPTURE=$(cd "$(dirname "$CAPTURE")" && pwd)/$(basename "$CAPTURE")
    DM_ARGS+=(--capture "$CAPTURE")
fi
[ "$BENCH" = 0 ] || [ -z "$SOCKETS_DIR" ] || die "--bench starts its own servers: not with --sockets"
# The run's row of the scenario table (testing/guest-run/src/scenario.rs): its kernel parameters and the steps
# the verdict expects.
if [ "$BENCH" = 1 ]; then SCENARIO=bench
elif [ "$DEVICES" = 0 ]; then SCENARIO=no-devices
elif [ "$SHELL_MODE" = 1 ]; then SCENARIO=shell
elif [ "$FABRIC_BOUNCE" = 1 ]; then SCENARIO=fabric-bounce
elif [ "$TID_RDMA" = 1 ]; then SCENARIO=tid-rdma
elif [ "$FABRIC" = 1 ]; then SCENARIO=fabric
elif [ "$HFI1_WFR" = 1 ]; then SCENARIO=kernel-driver
elif [ -n "$SOCKETS_DIR" ]; then SCENARIO=lifecycle
else SCENARIO=demo
fi
guest_run_bin

if [ "$DEVICES" = 0 ]; then MODE=no-devices; elif [ "$SHARE" = 1 ]; then MODE=share; else MODE=no-share; fi
if [ "$SHARE" = 1 ]; then MEMORY=memfd-shared; else MEMORY=ram-private; fi
SUFFIX=$MODE
[ "$DEVICES" = 0 ] && [ "$SHARE" = 0 ] && SUFFIX=no-devices-no-share
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO_ROOT/target}
[ -n "$RESULT" ] || RESULT="$TARGET_DIR/rdma-emu/result-$SUFFIX.json"
mkdir -p "$(dirname "$RESULT")"
RESULT=$(cd "$(dirname "$RESULT")" && pwd)/$(basename "$RESULT")
rm -f "$RESULT"
# A run that fails before the guest reports still leaves a result file, so nobody reads a stale one.
fail() {
    "$GUEST_RUN" fail-result --result "$RESULT" --mode "$MODE" "$1" || true
    die "$1"
}

usecs() { echo "${EPOCHREALTIME/./}"; } # microseconds since the epoch
T_START=$(usecs)
deadline_left() { # seconds left of --timeout
    local left=$(((TIMEOUT * 1000000 - ($(usecs) - T_START)) / 1000000))
    echo $((left > 1 ? left : 1))
}

# --- QEMU, guest, accelerator -----------------------------------------------------------------------------
QEMU=${RDMA_EMU_QEMU:-}
[ -n "$QEMU" ] || QEMU=$(bash "$REPO_ROOT/ci/get-qemu.sh") || fail "ci/get-qemu.sh failed"
[ -x "$QEMU" ] || fail "QEMU $QEMU is not executable"
# The vCPU thread reading its own reply (qemu-patches/0005) takes two wake-ups off every trapped access
# (docs/bench.md, "The waiter reads its own reply"). A QEMU without it is still usable unless it was asked for.
REPLY_POLL=()
if [ "$REPLY_POLL_US" != 0 ]; then
    if "$QEMU" -device vfio-user-pci,help 2>/dev/null | grep -q 'x-reply-poll-us='; then
        REPLY_POLL=(-global "vfio-user-pci.x-reply-poll-us=$REPLY_POLL_US")
    elif [ -n "$REPLY_POLL_SET" ]; then
        fail "--reply-poll-us $REPLY_POLL_US: $QEMU has no vfio-user-pci.x-reply-poll-us (qemu-patches/0005)"
    else
        log "note: $QEMU has no vfio-user-pci.x-reply-poll-us (qemu-patches/0005): its vCPU waits for the I/O thread"
    fi
fi

if [ -z "$KERNEL" ] || [ -z "$INITRD" ]; then
    [ -z "$KERNEL$INITRD" ] || fail "--kernel and --initrd go together"
    if [ -z "$UDRIVER" ] && [ "$DEVICES" = 1 ]; then
        # A static build for the explicit host target, as `cargo build --target x86_64-unknown-linux-gnu` with
        # `-C target-feature=+crt-static` leaves it.
        for c in "$TARGET_DIR"/x86_64-unknown-linux-{gnu,musl}/{release,debug}/udriver; do
            if [ -x "$c" ] && ! readelf -lW "$c" 2>/dev/null | grep -q 'program interpreter'; then
                UDRIVER=$c; log "using udriver $c"; break
            fi
        done
    fi
    build_args=()
    [ -n "$UDRIVER" ] && build_args=(--udriver "$UDRIVER")
    [ -n "$HFI1_USER" ] && build_args+=(--hfi1-user "$HFI1_USER")
    guest=$(bash "$REPO_ROOT/ci/build-guest.sh" "${build_args[@]}") || fail "ci/build-guest.sh failed"
    while IFS='=' read -r k v; do
        case "$k" in KERNEL) KERNEL=$v ;; INITRD) INITRD=$v ;; esac
    done <<<"$guest"
elif [ -n "$UDRIVER" ]; then
    log "--udriver is ignored with --kernel/--initrd"
fi
[ -f "$KERNEL" ] && [ -f "$INITRD" ] || fail "guest kernel/initrd missing ($KERNEL, $INITRD)"

if [ "$ACCEL" = auto ]; then ACCEL=$(accel_for "$QEMU" "$KERNEL" "$INITRD"); fi
log "mode $MODE, accel $ACCEL, QEMU $QEMU"

# --- log directory and cleanup ----------------------------------------------------------------------------
if [ -n "$LOG_DIR" ]; then mkdir -p "$LOG_DIR"; else LOG_DIR=$(mktemp -d /tmp/rdma-emu-run.XXXXXX); fi
LOG_DIR=$(cd "$LOG_DIR" && pwd)
[[ $LOG_DIR =~ ^[A-Za-z0-9._/+-]+$ ]] || fail "log directory $LOG_DIR: use plain characters (it goes into QEMU's JSON)"
[ ${#LOG_DIR} -le 80 ] || fail "log directory $LOG_DIR is too long for UNIX socket paths"
rm -f "$LOG_DIR"/{serial.log,qemu.stderr,qemu.pid,qemu.rc,device-model.log,host-times,result.json}
DM_PID=""
DM_STATUS="not started"
stop_device_model() {
    [ -n "$DM_PID" ] || return 0
    if kill -0 "$DM_PID" 2>/dev/null; then
        DM_STATUS="running until stopped"
        kill -TERM "$DM_PID" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$DM_PID" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$DM_PID" 2>/dev/null; then
            DM_STATUS="running until stopped; ignored SIGTERM for 5 s, killed"
            kill -KILL "$DM_PID" 2>/dev/null || true
        fi
        wait "$DM_PID" 2>/dev/null || true
    else
        local rc=0
        wait "$DM_PID" 2>/dev/null || rc=$?
        DM_STATUS="exited early with status $rc"
    fi
    DM_PID=""
}
# shellcheck disable=SC2317 # called from the INT/TERM trap
stop_qemu() {
    local pid
    pid=$(cat "$LOG_DIR/qemu.pid" 2>/dev/null) || return 0
    kill -TERM "$pid" 2>/dev/null || true
}
PEERS_PID=""
stop_peers() {
    [ -n "$PEERS_PID" ] || return 0
    kill -TERM "$PEERS_PID" 2>/dev/null || true
    wait "$PEERS_PID" 2>/dev/null || true
    PEERS_PID=""
}
trap 'stop_device_model; stop_peers' EXIT
# QEMU runs in the background and is waited for, so a signal is handled at once, not after QEMU's timeout.
trap 'log "interrupted; logs kept in $LOG_DIR"; stop_qemu; exit 130' INT TERM

# --- device model -----------------------------------------------------------------------------------------
HFI1_SOCK="$LOG_DIR/hfi1.sock" IRDMA_SOCK="$LOG_DIR/irdma.sock" CONTROL_SOCK="$LOG_DIR/control.sock"
# The chip-personality HFIs: hfi1-wfr, and with --fabric hfi1-wfr1 at the cable's other end (the device
# model names them so on its control socket, and QEMU's device ids follow).
wfr_names() { [ "$HFI1_WFR" = 1 ] || return 0; echo hfi1-wfr; [ "$FABRIC" = 0 ] || echo hfi1-wfr1; }
WFR_DIR=$LOG_DIR
if [ -n "$SOCKETS_DIR" ] && [ "$DEVICES" = 1 ]; then
    SOCKETS_DIR=$(cd "$SOCKETS_DIR" && pwd) || fail "--sockets $SOCKETS_DIR is not a directory"
    HFI1_SOCK="$SOCKETS_DIR/hfi1.sock" IRDMA_SOCK="$SOCKETS_DIR/irdma.sock" CONTROL_SOCK="$SOCKETS_DIR/control.sock"
    WFR_DIR=$SOCKETS_DIR
    wanted=("$HFI1_SOCK" "$IRDMA_SOCK")
    for w in $(wfr_names); do wanted+=("$WFR_DIR/$w.sock"); done
    for sock in "${wanted[@]}"; do
        [ -S "$sock" ] || fail "--sockets: $sock is not a socket (is the device model running?)"
    done
    DM_STATUS="external (--sockets)"
    log "using the device model serving $SOCKETS_DIR"
elif [ "$DEVICES" = 1 ]; then
    if [ -z "$DEVICE_MODEL" ]; then
        for c in "$TARGET_DIR/release/device-model" "$TARGET_DIR/debug/device-model"; do
            [ -x "$c" ] && { DEVICE_MODEL=$c; break; }
        done
        [ -n "$DEVICE_MODEL" ] || fail "no device-model binary: build it (cargo build --release -p device-model) or pass --device-model"
    fi
    [ -x "$DEVICE_MODEL" ] || fail "device model $DEVICE_MODEL is not executable"
    rm -f "$HFI1_SOCK" "$IRDMA_SOCK" "$CONTROL_SOCK"
    for w in $(wfr_names); do rm -f "$WFR_DIR/$w.sock"; DM_ARGS+=(--hfi1-wfr "$WFR_DIR/$w.sock"); done
    [ "$HFI1_WFR" = 0 ] || DM_ARGS+=(--hfi1-wfr-icode "$ICODE")
    # Non-default IDs must be presented by the device model too (its defaults are 1b36:1100 and 1b36:1101).
    [ "$HFI1_ID" = 1b36:1100 ] || [ "$HFI1_ID" = none ] || DM_ARGS+=(--hfi1-ids "$HFI1_ID")
    [ "$IRDMA_ID" = 1b36:1101 ] || [ "$IRDMA_ID" = none ] || DM_ARGS+=(--irdma-ids "$IRDMA_ID")
    log "starting $DEVICE_MODEL"
    T_DM=$(usecs)
    "$DEVICE_MODEL" --hfi1 "$HFI1_SOCK" --irdma "$IRDMA_SOCK" --control "$CONTROL_SOCK" "${DM_ARGS[@]}" \
        </dev/null >"$LOG_DIR/device-model.log" 2>&1 &
    DM_PID=$!
    DM_STATUS="started"
    sockets_up() {
        [ -S "$HFI1_SOCK" ] && [ -S "$IRDMA_SOCK" ] && [ -S "$CONTROL_SOCK" ] || return 1
        for w in $(wfr_names); do [ -S "$WFR_DIR/$w.sock" ] || return 1; done
    }
    for _ in $(seq 1 200); do # 20 s
        sockets_up && break
        kill -0 "$DM_PID" 2>/dev/null || break
        sleep 0.1
    done
    if ! sockets_up; then
        stop_device_model
        tail -n 20 "$LOG_DIR/device-model.log" >&2 || true
        fail "the device model did not create its sockets within 20 s ($DM_STATUS); logs kept in $LOG_DIR"
    fi
    DM_START_S=$(( ($(usecs) - T_DM + 500) / 1000 ))
    DM_START_S=$((DM_START_S / 1000)).$(printf '%03d' $((DM_START_S % 1000)))
    log "device model ready in ${DM_START_S}s (pid $DM_PID, control socket $CONTROL_SOCK)"
fi
PEER_SOCK="$LOG_DIR/peer.sock" POLLED_SOCK="$LOG_DIR/polled.sock"
if [ "$BENCH" = 1 ]; then
    if [ -z "$TESTBED" ]; then
        for c in "$TARGET_DIR/release/testbed" "$TARGET_DIR/debug/testbed"; do [ -x "$c" ] && { TESTBED=$c; break; }; done
    fi
    [ -n "$TESTBED" ] && [ -x "$TESTBED" ] || fail "--bench needs the testbed binary (cargo build --release -p testbed, or --testbed PATH)"
    rm -f "$PEER_SOCK" "$POLLED_SOCK"
    "$TESTBED" serve-peers --peer "$PEER_SOCK" --polled "$POLLED_SOCK" </dev/null >"$LOG_DIR/serve-peers.log" 2>&1 &
    PEERS_PID=$!
    for _ in $(seq 1 100); do
        [ -S "$PEER_SOCK" ] && [ -S "$POLLED_SOCK" ] && break
        kill -0 "$PEERS_PID" 2>/dev/null || break
        sleep 0.1
    done
    [ -S "$PEER_SOCK" ] && [ -S "$POLLED_SOCK" ] || fail "testbed serve-peers did not listen within 10 s: $(tail -n 5 "$LOG_DIR/serve-peers.log")"
    log "testbed serve-peers ready (pid $PEERS_PID): rust-vmm's peer and ours with the defaults"
fi

# --- the control socket -------------------------------------------------------------------------------------
# One control-socket request; prints the reply's result as JSON, or fails with the reply's error.
dm_query() { timeout 10 "$GUEST_RUN" request --socket "$CONTROL_SOCK" --device "$1" --cmd "$2"; } # device cmd
# "reads writes unnamed" of the chip-personality HFIs together so far ("- - -" if the device model does not
# answer).
# shellcheck disable=SC2046 # one name a word
dm_access_totals() { timeout 10 "$GUEST_RUN" access-totals --socket "$CONTROL_SOCK" $(wfr_names); }
# The guest's requests of the fabric run (ci/guest/fabric.sh, host_request): one line in, one answer line out.
host_answer() { # verb args...
    local chips=() w
    for w in $(wfr_names); do chips+=(--chip "$w"); done
    timeout 20 "$GUEST_RUN" host-answer --socket "$CONTROL_SOCK" "${chips[@]}" -- "$@" || echo "error guest-run host-answer failed"
}

# --- QEMU -------------------------------------------------------------------------------------------------
MEM=512M
# no_timer_check: under TCG on a loaded host the IO-APIC timer probe can miss its window and the kernel
# panics with "timer doesn't work through Interrupt-remapped IO-APIC" (seen here); the probe tests nothing we need.
APPEND="console=ttyS0 panic=-1 intel_iommu=on no_timer_check quiet rdma_emu.timeout=$DEMO_TIMEOUT"
QEMU_TIMEOUT=$(deadline_left)
APPEND="$APPEND rdma_emu.watchdog=$((QEMU_TIMEOUT > 40 ? QEMU_TIMEOUT - 20 : 20))"
[ "$DEVICES" = 0 ] || APPEND="$APPEND rdma_emu.hfi1=$HFI1_ID rdma_emu.irdma=$IRDMA_ID"
[ -n "$UARGS" ] && APPEND="$APPEND rdma_emu.args=\"$UARGS\""
if [ "$HFI1_WFR" = 1 ] && [ "$DEVICES" = 1 ]; then
    APPEND="$APPEND rdma_emu.hfi1_params=\"$HFI1_PARAMS\" rdma_emu.kdriver_timeout=$KDRIVER_TIMEOUT"
    APPEND="$APPEND rdma_emu.hfi1_icode=$ICODE rdma_emu.hfi1_dma=$HFI1_DMA"
fi
[ "$BENCH" = 1 ] && APPEND="$APPEND rdma_emu.bench_budget_ms=$BENCH_BUDGET_MS"
if [ "$FABRIC" = 1 ] && [ "$SHELL_MODE" = 0 ] && [ "$DEVICES" = 1 ]; then
    # The node GUIDs the device model gave its two HFIs: the guest checks that opasmaquery reads them back.
    guids=$(for w in $(wfr_names); do
        timeout 10 "$GUEST_RUN" request --socket "$CONTROL_SOCK" --device "$w" --cmd link --field node_guid
    done | paste -sd,)
    [[ $guids =~ ^0x[0-9a-f]{16},0x[0-9a-f]{16}$ ]] || fail "the device model did not tell its HFIs' node GUIDs (got '$guids')"
    APPEND="$APPEND rdma_emu.fabric_guids=$guids"
fi
# The scenario's own parameters (after the computed ones: the last occurrence wins), then the caller's.
ROW_OPTS=(--icode "$ICODE")
[ "$FABRIC_PERF" = 1 ] && ROW_OPTS+=(--fabric-perf)
ROW_PARAMS=$("$GUEST_RUN" scenario "$SCENARIO" "${ROW_OPTS[@]}" --kernel-params) || fail "guest-run scenario $SCENARIO failed"
[ -n "$ROW_PARAMS" ] && APPEND="$APPEND $ROW_PARAMS"
[ -n "$APPEND_EXTRA" ] && APPEND="$APPEND $APPEND_EXTRA"

QCMD=("$QEMU" -accel "$ACCEL")
[ "$ACCEL" = kvm ] && QCMD+=(-cpu host)
QCMD+=(-machine "q35,memory-backend=mem" -m "$MEM")
if [ "$SHARE" = 1 ]; then
    QCMD+=(-object "memory-backend-memfd,id=mem,size=$MEM,share=on")
else
    QCMD+=(-object "memory-backend-ram,id=mem,size=$MEM,share=off")
fi
QCMD+=(-device "intel-iommu,caching-mode=on"
    -kernel "$KERNEL" -initrd "$INITRD" -append "$APPEND"
    -nodefaults -display none)
SHELL_TTY=0
[ "$SHELL_MODE" = 1 ] && [ -t 0 ] && SHELL_TTY=1
if [ "$SHELL_TTY" = 1 ]; then
    # The user's terminal: QEMU puts it in raw mode and restores it; Ctrl-C goes to the guest (signal=off), the
    # monitor shares the console (Ctrl-A C), and the console is copied to serial.log.
    QCMD+=(-chardev "stdio,id=console,mux=on,signal=off,logfile=$LOG_DIR/serial.log" -serial chardev:console
        -mon chardev=console,mode=readline)
else
    QCMD+=(-serial stdio)
fi
[ "$ALLOW_REBOOT" = 1 ] || QCMD+=(-no-reboot)
QCMD+=("${REPLY_POLL[@]}")
if [ "$DEVICES" = 1 ]; then
    for dev in hfi1 irdma; do
        if [ "$dev" = hfi1 ]; then sock=$HFI1_SOCK id=$HFI1_ID; else sock=$IRDMA_SOCK id=$IRDMA_ID; fi
        # A function the guest does not look for is not attached, so its socket stays free for others.
        [ "$id" = none ] && continue
        bus=""
        if [ "$HOTPLUG" = 1 ]; then
            QCMD+=(-device "pcie-root-port,id=rp-$dev,chassis=$([ "$dev" = hfi1 ] && echo 1 || echo 2)")
            bus=",\"bus\":\"rp-$dev\""
        fi
        QCMD+=(-device "{\"driver\":\"vfio-user-pci\",\"id\":\"$dev\"$bus,\"socket\":{\"path\":\"$sock\",\"type\":\"unix\"}}")
    done
    for w in $(wfr_names); do
        QCMD+=(-device "{\"driver\":\"vfio-user-pci\",\"id\":\"$w\",\"socket\":{\"path\":\"$WFR_DIR/$w.sock\",\"type\":\"unix\"}}")
    done
    if [ "$BENCH" = 1 ]; then
        for p in peer polled; do
            sock=$PEER_SOCK; [ "$p" = polled ] && sock=$POLLED_SOCK
            QCMD+=(-device "{\"driver\":\"vfio-user-pci\",\"id\":\"$p\",\"socket\":{\"path\":\"$sock\",\"type\":\"unix\"}}")
        done
        QCMD+=(-device edu)
    fi
fi
QCMD+=("${QEMU_EXTRA[@]}")
printf '%q ' "${QCMD[@]}" >"$LOG_DIR/qemu-command.txt"
echo >>"$LOG_DIR/qemu-command.txt"

# Copies the console to serial.log (and stderr), noting when init starts and when the result block ends, and
# the deadlines of guest steps that announce one (RDMA-EMU-DEADLINE name secs).
serial_reader() {
    local line
    while IFS= read -r line || [ -n "$line" ]; do
        line=${line%$'\r'}
        case "$line" in
            RDMA-EMU-INIT*) echo "init $EPOCHREALTIME" >>"$LOG_DIR/host-times" ;;
            RDMA-EMU-RESULT-END*) echo "result_end $EPOCHREALTIME" >>"$LOG_DIR/host-times" ;;
            RDMA-EMU-DEADLINE-END*)
                rm -f "$LOG_DIR/deadline"
                # The device model's access totals at each end of a kernel-driver step: the probe's share.
                set -- $line
                [ $# -ge 2 ] && [ "$HFI1_WFR" = 1 ] && { echo "$2 end $(dm_access_totals)" >>"$LOG_DIR/step-accesses"; } ;;
            RDMA-EMU-HOST\ *)
                # A request of the guest's fabric run: answered on the console's input (fd 4).
                set -- $line
                [ $# -ge 3 ] && is_uint "$2" && printf 'RDMA-EMU-ACK %s %s\n' "$2" "$(host_answer "${@:3}")" >&4 ;;
            RDMA-EMU-ACK\ *) continue ;; # our own answer, echoed
            RDMA-EMU-DEADLINE\ *)
                set -- $line
                # The guest's own timeout goes first; the host steps in 30 s later.
                [ $# -ge 3 ] && is_uint "$3" && echo "$2 $(( ${EPOCHREALTIME%.*} + $3 + 30 ))" >"$LOG_DIR/deadline"
                [ $# -ge 2 ] && [ "$HFI1_WFR" = 1 ] && { echo "$2 start $(dm_access_totals)" >>"$LOG_DIR/step-accesses"; } ;;
        esac
        printf '%s\n' "$line" >>"$LOG_DIR/serial.log"
        [ "$QUIET" = 1 ] || printf '  | %s\n' "$line" >&2
    done
}

# Stops a guest whose announced step overran its deadline: the kernel may be spinning where the guest's own
# timeouts cannot reach. Saves what the device model saw last, then ends QEMU.
deadline_watch() {
    local name until
    while sleep 1; do
        [ -e "$LOG_DIR/qemu.rc" ] && return 0
        { read -r name until <"$LOG_DIR/deadline"; } 2>/dev/null || continue
        [ "${EPOCHREALTIME%.*}" -gt "$until" ] || continue
        echo "$name" >"$LOG_DIR/stalled"
        log "guest step $name overran its deadline; stopping QEMU"
        dm_query hfi1-wfr accesses >"$LOG_DIR/stall-accesses.json" 2>/dev/null || true
        [ "$FABRIC" = 1 ] && { dm_query hfi1-wfr1 accesses >"$LOG_DIR/stall-accesses-1.json" 2>/dev/null || true; }
        [ "$FABRIC" = 1 ] && { dm_query hfi1-wfr link >"$LOG_DIR/stall-link.json" 2>/dev/null || true; }
        stop_qemu
        return 0
    done
}

# --- --shell: the console belongs to the user --------------------------------------------------------------
# Piped input goes to the guest only once its shell is ready: bytes that reach the UART before the kernel opens
# the console are dropped by the port's start-up (it clears the FIFO). At the input's end the shell is told to
# exit, which ends the session. (A Ctrl-D would do that at a terminal, but typed ahead it is only an EOF if the
# tty is in canonical mode when it arrives, which depends on what the shell is doing then.)
shell_reader() { # fd of the console input FIFO
    local line feeder=""
    while IFS= read -r line || [ -n "$line" ]; do
        line=${line%$'\r'}
        printf '%s\n' "$line" >>"$LOG_DIR/serial.log"
        printf '%s\n' "$line"
        if [ -z "$feeder" ] && [[ $line == "rdma-emu: ["*"] shell ready"* ]]; then
            # shellcheck disable=SC2016 # $c is the subshell's
            ( c=""; trap '[ -z "$c" ] || kill "$c" 2>/dev/null; exit 0' TERM
              cat <&3 >&"$1" & c=$!
              wait "$c"; printf '\nexit\n' >&"$1" ) &
            feeder=$!
        fi
    done
    [ -z "$feeder" ] || kill "$feeder" 2>/dev/null || true
}

run_shell() {
    local rc=0 saved_tty="" killer=""
    log "booting the guest; its shell comes on this console (logs in $LOG_DIR; QEMU command in qemu-command.txt)"
    rm -f "$LOG_DIR/timed-out"
    if [ "$TIMEOUT_SET" = 1 ]; then
        # shellcheck disable=SC2016 # $s is the subshell's
        ( s=""; trap '[ -z "$s" ] || kill "$s" 2>/dev/null; exit 0' TERM
          sleep "$(deadline_left)" & s=$!
          wait "$s" || exit 0
          touch "$LOG_DIR/timed-out"; log "--timeout: stopping QEMU"; stop_qemu ) &
        killer=$!
    fi
    set +e
    if [ "$SHELL_TTY" = 1 ]; then
        saved_tty=$(stty -g 2>/dev/null)
        # Not job-controlled: QEMU stays in the terminal's foreground process group. The explicit redirection keeps
        # the terminal as its stdin (a background command's default stdin is /dev/null).
        "${QCMD[@]}" -pidfile "$LOG_DIR/qemu.pid" <&0 2>"$LOG_DIR/qemu.stderr" &
        wait $!
        rc=$?
        [ -n "$saved_tty" ] && stty "$saved_tty" 2>/dev/null
    else
        mkfifo "$LOG_DIR/console.in"
        # Held open for reading and writing: QEMU never sees the end of its input; the shell is told to exit instead.
        exec 4<>"$LOG_DIR/console.in" 3<&0
        ( "${QCMD[@]}" -pidfile "$LOG_DIR/qemu.pid" <&4 2>"$LOG_DIR/qemu.stderr" | shell_reader 4
          echo "${PIPESTATUS[0]}" >"$LOG_DIR/qemu.rc" ) &
        wait $!
        rc=$(cat "$LOG_DIR/qemu.rc" 2>/dev/null || echo 255)
        exec 4>&- 3<&-
    fi
    set -e
    [ -n "$killer" ] && { kill "$killer" 2>/dev/null || true; wait "$killer" 2>/dev/null || true; }
    stop_device_model
    trap - EXIT
    # QEMU ends with status 0 on SIGTERM too.
    if [ -e "$LOG_DIR/timed-out" ]; then
        rc=124
        log "the session outlived --timeout; QEMU was stopped; device model $DM_STATUS; logs in $LOG_DIR"
    elif [ "$rc" = 0 ] && [[ $DM_STATUS != "exited early"* ]]; then
        log "guest powered off; device model $DM_STATUS; logs in $LOG_DIR"
    else
        log "QEMU exited with status $rc ($(grep -v 'warning:' "$LOG_DIR/qemu.stderr" 2>/dev/null | tail -n 2 | tr '\n' ' ')); device model $DM_STATUS; logs in $LOG_DIR"
    fi
    exit "$rc"
}
[ "$SHELL_MODE" = 1 ] && run_shell

rm -f "$LOG_DIR/deadline" "$LOG_DIR/stalled" "$LOG_DIR/step-accesses"

# The hfi1-user host side listens on the guest's second serial port (QEMU connects to it as a client).
HU_SOCK="$LOG_DIR/hfi1-user.sock" HU_PID="" HU_STATUS="not started"
if [ -n "$HFI1_USER_HOST" ] && [ "$DEVICES" = 1 ]; then
    rm -f "$HU_SOCK" "$LOG_DIR/hfi1-user-host.json"
    "$HFI1_USER_HOST" --listen "$HU_SOCK" --control "$CONTROL_SOCK" --device hfi1-wfr \
        --result "$LOG_DIR/hfi1-user-host.json" --accept-timeout-s 60 --hello-timeout-s "$QEMU_TIMEOUT" \
        --step-timeout-s "$KDRIVER_TIMEOUT" </dev/null >"$LOG_DIR/hfi1-user-host.log" 2>&1 &
    HU_PID=$!
    for _ in $(seq 1 100); do [ -S "$HU_SOCK" ] && break; kill -0 "$HU_PID" 2>/dev/null || break; sleep 0.1; done
    [ -S "$HU_SOCK" ] || fail "hfi1-user-host did not listen on $HU_SOCK within 10 s: $(tail -n 5 "$LOG_DIR/hfi1-user-host.log")"
    QCMD+=(-chardev "socket,id=hfi1user,path=$HU_SOCK,server=off" -serial chardev:hfi1user)
    printf '%q ' "${QCMD[@]}" >"$LOG_DIR/qemu-command.txt"
    echo >>"$LOG_DIR/qemu-command.txt"
    HU_STATUS="started"
fi
# The console's input: the host's answers to the guest's requests (fabric run); otherwise nothing. Held open
# here for writing too, so QEMU never sees it end.
rm -f "$LOG_DIR/console.in"
mkfifo "$LOG_DIR/console.in"
exec 4<>"$LOG_DIR/console.in"
deadline_watch &
WATCH_PID=$!
log "booting the guest (timeout ${QEMU_TIMEOUT}s; QEMU command in $LOG_DIR/qemu-command.txt)"
T_QEMU=$EPOCHREALTIME
set +e
(
    timeout -k 5 "$QEMU_TIMEOUT" "${QCMD[@]}" -pidfile "$LOG_DIR/qemu.pid" <&4 2>"$LOG_DIR/qemu.stderr" \
        | serial_reader
    echo "${PIPESTATUS[0]}" >"$LOG_DIR/qemu.rc"
) &
wait $!
QEMU_RC=$(cat "$LOG_DIR/qemu.rc" 2>/dev/null || echo 255)
set -e
T_QEMU_END=$EPOCHREALTIME
kill "$WATCH_PID" 2>/dev/null || true
wait "$WATCH_PID" 2>/dev/null || true
if [ -n "$HU_PID" ]; then
    # QEMU is gone, so the host side's channel is closed: it finishes at once, or it is stopped.
    for _ in $(seq 1 100); do kill -0 "$HU_PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$HU_PID" 2>/dev/null && { kill -TERM "$HU_PID" 2>/dev/null || true; HU_STATUS="stopped after QEMU exited"; }
    rc=0; wait "$HU_PID" 2>/dev/null || rc=$?
    [ "$HU_STATUS" = started ] && HU_STATUS="exited with status $rc"
    HU_PID=""
fi
[ "$QEMU_RC" = 124 ] && log "QEMU did not finish within ${QEMU_TIMEOUT}s"
# The device model's final state, for the logs: best effort, 10 s at most.
if [ -n "$DM_PID" ] && [ -S "$CONTROL_SOCK" ]; then
    timeout 10 "$GUEST_RUN" device-state --socket "$CONTROL_SOCK" --out "$LOG_DIR/device-state.json" \
        2>>"$LOG_DIR/device-state.err" || true
fi
stop_device_model
stop_peers
trap - EXIT

# --- result -----------------------------------------------------------------------------------------------
set +e
VERDICT=(--scenario "$SCENARIO" "${ROW_OPTS[@]}" --log-dir "$LOG_DIR" --result "$RESULT" --mode "$MODE"
    --memory "$MEMORY" --accel "$ACCEL" --qemu "$QEMU" --kernel "$KERNEL" --initrd "$INITRD"
    --qemu-exit-status "$QEMU_RC" --device-model "$DM_STATUS" --t-qemu "$T_QEMU" --t-qemu-end "$T_QEMU_END"
    --hfi1-dma "$HFI1_DMA" --hfi1-user-host "$HU_STATUS")
[ -n "${DM_START_S:-}" ] && VERDICT+=(--device-model-start-s "$DM_START_S")
[ ${#REPLY_POLL[@]} -gt 0 ] && VERDICT+=(--reply-poll-us "$REPLY_POLL_US")
[ -n "$CAPTURE" ] && VERDICT+=(--capture "$CAPTURE")
[ "$TIMING" = 1 ] && VERDICT+=(--timing)
"$GUEST_RUN" verdict "${VERDICT[@]}"
RC=$?
set -e
if [ "$RC" = 0 ]; then
    log "PASS ($MODE): result in $RESULT"
    [ "$KEEP_LOGS" = 1 ] && log "logs kept in $LOG_DIR" || rm -rf "$LOG_DIR"
else
    log "FAIL ($MODE): result in $RESULT; logs kept in $LOG_DIR (serial.log, qemu.stderr, device-model.log)"
fi
echo "$RESULT"
exit "$RC"
