#!/usr/bin/env bash
# The QEMU end-to-end test: builds everything, boots the guest twice with the emulated functions, runs
# udriver's demos inside it over VFIO, and then the guest's own hfi1 driver on the chip personality (load,
# sysfs, unload, load again, kernel log):
#   1. guest RAM in memory-backend-memfd,share=on: the device model maps QEMU's memfd (per-page DMA_MAPs
#      under the vIOMMU);
#   2. guest RAM not shared (--no-share): QEMU has no fd, so all device DMA goes through DMA_READ/WRITE
#      messages.
#   3. with --mode lifecycle (or all): the lifecycle scenarios of ci/lifecycle.sh (QEMU killed mid-demo, guest
#      reboot, hot-unplug and replug, a stalled and a killed device model), with the device model's
#      descriptors, threads and RSS printed before and after each.
#   4. with --mode stall (or all): the stock hfi1 driver on a chip whose SEND_DMA_STATUS[engine 0] never
#      reports ENG_CLEANED_UP (a reg-stuck fault): the run must fail within its deadline, naming the stalled
#      step and the last CSR accesses.
#   5. with --mode fabric (or both, all): two HFIs on one cable (ci/run-qemu.sh --fabric): the stock driver and
#      opa-fm bring both ports to ACTIVE, opasmaquery reads NodeInfo across the cable, verbs traffic with its
#      data checked, the kernel under cable faults; the wire is captured and tshark must find the sweep's OPA
#      MADs in it.
#   6. with --mode fabric-bounce (or all): a link bounce on the fabric with the chip reporting the functional
#      simulator's icode, where the stock driver deadlocks taking an up link offline (docs/hfi1-fabric.md): the
#      run must fail within its deadline, naming the step, the last CSR accesses of both HFIs and the last
#      packets on the cable. (The fabric run itself uses the RTL-simulation icode, where the bounce, a lost
#      neighbour and rmmod with the links up are fabric steps.)
#   7. with --mode all: ci/guest/test-shell.sh (ci/run-qemu.sh --shell with the fabric, piped and at a terminal).
#   8. with --mode tid-rdma (or both, all): the fabric with the kernel's own TID RDMA (ci/run-qemu.sh
#      --tid-rdma): OPFN negotiates, READ and WRITE of 256 KiB and more go through the RcvArray and flow table
#      the kernel programs, every byte compared, under cable faults and with flows and RcvArray groups run out;
#      the four seed functions counted (docs/kernel-tid-rdma.md).
#   9. with --mode psm2 (or both, all): the fabric with the OPA userspace stack (ci/run-qemu.sh --psm2):
#      libfabric's psm2 provider and Open MPI's psm2 MTL between hfi1_0 and hfi1_1, every byte checked, and the
#      device model's user-context counters moved (docs/psm2.md).
# Runs 1 and 2 record every session of the device model (--record) and replay each recording on a fresh device
# model afterwards (`device-model replay`): a real QEMU session must replay clean. The fabric run is not
# recorded: the HFIs' own work (SDMA, PIO launch, arrivals) is not yet cut into replayable device steps
# (docs/observe.md).
# Usage: ci/e2e.sh [--mode shared|no-share|both|fabric|fabric-bounce|tid-rdma|psm2|lifecycle|stall|all] [extra ci/run-qemu.sh options]
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
MODE=both
case "${1:-}" in -h|--help) sed -n '2,33s/^# \{0,1\}//p' "$0" >&2; exit 0 ;; esac
if [ "${1:-}" = "--mode" ]; then MODE=$2; shift 2; fi
if [ "$MODE" = lifecycle ]; then exec bash ci/lifecycle.sh; fi

build_bins
DM=${BINS[0]} UD=${BINS[1]} HU=${BINS[2]} HUH=${BINS[3]}
QEMU=$(bash ci/get-qemu.sh)
export RDMA_EMU_QEMU=$QEMU
log "building the guest"
bash ci/build-guest.sh --udriver "$UD" --hfi1-user "$HU" >&2

rc=0
OUT_DIR=${CARGO_TARGET_DIR:-$REPO_ROOT/target}/rdma-emu
REC_ROOT=$OUT_DIR/recordings
run_mode() { # name, recording subdirectory, run-qemu options...
    local name=$1 rec="$REC_ROOT/$2"; shift 2
    log "end-to-end run: $name (sessions recorded in $rec)"
    rm -rf "$rec"
    if out=$(bash ci/run-qemu.sh --device-model "$DM" --udriver "$UD" --hfi1-user "$HU" --hfi1-user-host "$HUH" \
        --hfi1-wfr --timing --dm-arg --record --dm-arg "$rec" "$@" "${EXTRA[@]}"); then
        # A demo that passes but logs errors (e.g. a teardown the kernel refused) is a failure too.
        if errors=$("$GUEST_RUN" driver-errors --result "$out"); then
            log "$name: PASS ($out)"
        else
            log "$name: FAIL: the driver logged errors:"; echo "$errors" >&2
            rc=1
        fi
        # The whole QEMU session again, on fresh device models, with every reply compared.
        replay "$name" "$rec"
    else
        log "$name: FAIL (result: $out)"
        rc=1
    fi
}

# Seconds since $1 (an $EPOCHREALTIME), rounded.
seconds_since() { echo $(( (${EPOCHREALTIME/./} - ${1/./} + 500000) / 1000000 )); }

# A run that must fail, as its row of the scenario table says (testing/guest-run/src/scenario.rs): run with the
# row's options, then its report checked against the row's outcome (the problems it must name, within how long).
run_must_fail() { # scenario message-if-it-passes [more run-qemu.sh options]
    local name=$1 passed=$2 t0=$EPOCHREALTIME out took opts
    shift 2
    mapfile -t opts < <("$GUEST_RUN" scenario "$name" --options)
    log "end-to-end scenario: $name (ci/run-qemu.sh ${opts[*]})"
    out=$(bash ci/run-qemu.sh --device-model "$DM" --udriver "$UD" "$@" "${opts[@]}" \
        --result "$OUT_DIR/result-$name.json" "${EXTRA[@]}") && { log "$name: FAIL: $passed"; rc=1; return; }
    took=$(seconds_since "$t0")
    if "$GUEST_RUN" expect "$name" --result "$out" --took "$took"; then
        log "$name: PASS: failed within its deadline (${took} s) and reported as its scenario requires"
    else
        log "$name: FAIL: the report is not what its scenario requires (result: $out)"
        rc=1
    fi
}

# The stock driver spins in softirq when ENG_CLEANED_UP never comes (sdma.c:506): the run must fail within its
# deadline, the stalled (or failed) kernel-driver step named, and SEND_DMA_STATUS[engine 0] among the last CSR
# accesses it reports.
run_stall() {
    run_must_fail stall "the run passed" --hfi1-user "$HU" --hfi1-user-host "$HUH"
}
# Replays the sessions recorded in $2 on fresh device models, every reply compared.
replay() { # name dir
    log "$1: replaying the recorded sessions"
    if "$DM" replay "$2" >&2; then
        log "$1: the recorded QEMU session replays clean ($(du -sh "$2" | cut -f1) in $2)"
    else
        log "$1: FAIL: the recorded QEMU session does not replay clean"
        rc=1
    fi
}

run_fabric() {
    local cap="$OUT_DIR/fabric.pcap" out opts
    log "end-to-end run: the fabric (the cable captured to $cap)"
    rm -f "$cap"
    mapfile -t opts < <("$GUEST_RUN" scenario fabric --options)
    if out=$(bash ci/run-qemu.sh --device-model "$DM" --udriver "$UD" "${opts[@]}" --capture "$cap" \
        --result "$OUT_DIR/result-fabric.json" "${EXTRA[@]}"); then
        log "fabric: PASS ($out)"
    else
        log "fabric: FAIL (result: $out)"
        rc=1
    fi
    # Wireshark's OPA dissectors on the capture of the real sweep: opa-fm's SubnGet(NodeInfo) and the answers
    # (opa.mad.method 0x01 Get, 0x81 GetResp; attribute 0x0011 NodeInfo). -2: the MAD dissector needs the second
    # pass for a display filter.
    ensure_tshark
    local gets resps
    gets=$(tshark -r "$cap" -2 -Y 'opa.mad.method == 0x01 && opa.mad.attributeid == 0x0011' 2>/dev/null | wc -l)
    resps=$(tshark -r "$cap" -2 -Y 'opa.mad.method == 0x81 && opa.mad.attributeid == 0x0011' 2>/dev/null | wc -l)
    if [ "$gets" -gt 0 ] && [ "$resps" -gt 0 ]; then
        log "fabric: tshark decodes the capture: $gets SubnGet(NodeInfo), $resps SubnGetResp(NodeInfo)"
    else
        log "fabric: FAIL: tshark finds no SubnGet/SubnGetResp(NodeInfo) in $cap ($gets, $resps)"
        rc=1
    fi
}

# A row of the scenario table that must pass, run with the options the table gives it.
run_row() { # scenario what
    local out opts
    log "end-to-end run: $2"
    mapfile -t opts < <("$GUEST_RUN" scenario "$1" --options)
    if out=$(bash ci/run-qemu.sh --device-model "$DM" --udriver "$UD" "${opts[@]}" \
        --result "$OUT_DIR/result-$1.json" "${EXTRA[@]}"); then
        log "$1: PASS ($out)"
    else
        log "$1: FAIL (result: $out)"
        rc=1
    fi
}
run_tid_rdma() { run_row tid-rdma "the kernel's own TID RDMA on the fabric"; }
run_psm2() { run_row psm2 "the OPA userspace stack (PSM2, libfabric, Open MPI) on the fabric"; }

# On the functional simulator's icode the link bounce deadlocks the stock driver (docs/hfi1-fabric.md, "A kernel
# deadlock the fabric reproduces"): the run must fail within its deadline, with the step, both HFIs' last CSR
# accesses and the cable's last packets.
run_fabric_bounce() {
    run_must_fail fabric-bounce "the bounce passed on the functional simulator's icode: the driver no longer deadlocks there (docs/hfi1-fabric.md)"
}

EXTRA=("$@")
case $MODE in
    shared) run_mode "fd-mapped guest RAM (memfd, share=on)" shared ;;
    no-share) run_mode "DMA_READ/WRITE messages (guest RAM not shared)" no-share --no-share ;;
    stall) run_stall ;;
    fabric) run_fabric ;;
    fabric-bounce) run_fabric_bounce ;;
    tid-rdma) run_tid_rdma ;;
    psm2) run_psm2 ;;
    both|all)
        run_mode "fd-mapped guest RAM (memfd, share=on)" shared
        run_mode "DMA_READ/WRITE messages (guest RAM not shared)" no-share --no-share
        run_fabric
        run_tid_rdma
        run_psm2
        if [ "$MODE" = all ]; then
            log "end-to-end: lifecycle scenarios"
            bash ci/lifecycle.sh || rc=1
            run_stall
            run_fabric_bounce
            log "end-to-end: the shell with the fabric, piped and at a terminal (ci/guest/test-shell.sh)"
            bash ci/guest/test-shell.sh --device-model "$DM" --udriver "$UD" || rc=1
        fi
        ;;
    *) die "unknown mode $MODE" ;;
esac
exit $rc
