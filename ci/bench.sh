#!/usr/bin/env bash
# Runs the benchmarks of docs/bench.md and writes docs/bench/results.json, docs/bench/results.svg,
# docs/bench/scale.svg and the results table in docs/bench.md.
#
#   ci/bench.sh [--budget-ms N] [--case ID]... [--no-qemu] [--no-guest] [--guest-budget-ms N] [--guest-boots N]
#               [--verbs-boots N] [--out DIR] [--keep-work]
#   ci/bench.sh --report-only DIR [--case ID]... [--out DIR]
#
#   --budget-ms N        wall time per measured variant (testbed bench's default when not given)
#   --case ID            run only this case (testbed bench's a, b, c, d, e, spin, scale, fabric, tid, or quiet, or
#                        the boots h, guest-verbs (with guest-verbs-iommu) and guest-tid; repeatable); implies
#                        --no-qemu for the other boots. The cases not run keep their entries from the results
#                        already in --out, each with the date of its run
#   --no-qemu            skip every guest boot: (f), (g), (h), the in-guest benchmark, guest-verbs and guest-tid
#   --no-guest           skip only the in-guest benchmark boots, guest-verbs and guest-tid
#   --guest-budget-ms N  wall time per measured variant inside the guest (default 1000)
#   --guest-boots N      in-guest benchmark boots per condition (default 3): where threads land is fixed per
#                        boot, so the trapped-access ratios are judged by their median over the boots
#   --verbs-boots N      guest-verbs boots (default 3): each boot's hfi1 / SoftRoCE ratios are measured in that
#                        boot, and the targets judge their median over the boots
#   --out DIR            where the results and plots go (default docs/bench)
#   --keep-work          keep the run's work directory (the boots' results, testbed's report) and print its path
#   --report-only DIR    run nothing: write the results, plots and table from the work directory DIR a run kept
#                        (with --case: as a run of those cases, the others kept from the results in --out)
#
# (a)-(e), the worker spin, the scale curves, `fabric` and `tid` (TID RDMA placed through the flow table against
# memcpy) come from `testbed bench --json` (release build, one process, ratios measured in that run); `quiet`, the device-model process's CPU idle and under a sparse client
# with its defaults, every knob at zero and --low-latency, from device-model's tests/quiet.rs (release). The targets are
# judged with the latency opt-in: testbed bench runs ours as `device-model --low-latency` does, and every boot below
# runs the device model with --low-latency. (f) boots the test guest under TCG twice with ci/run-qemu.sh --timing:
# with the device model and its two functions, and with --no-devices; (g) once with the chip personality; (h) once
# with the fabric (--fabric: two HFIs on one cable, modprobe to ACTIVE, the SM's sweep, accesses per SMP). The
# in-guest benchmark boots it --guest-boots times more with ci/run-qemu.sh --bench: `udriver bench` over VFIO
# against our functions, rust-vmm's peer, ours with the device model's defaults and QEMU's edu; where
# /dev/cpu_dma_latency is writable, as many boots again hold the host's idle exit latency at 0 us (PM QoS, for
# the boot only), reported as guest-a-lat0. A boot that cannot be had is skipped, with the reason in the
# results. One more boot with --reply-poll-us 0 (QEMU's vCPU waits for its I/O thread, as upstream) is reported
# as guest-a-no-reply-poll, not judged. guest-verbs boots the fabric --verbs-boots times (ci/run-qemu.sh --fabric
# --fabric-perf --hfi1-dma identity): perftest between the two emulated HFIs against SoftRoCE over a veth pair in
# the same guest, ratios from each boot, judged by their median; one more boot with the hfi1 functions behind the
# vIOMMU's translation (the run's default) is reported as guest-verbs-iommu, not judged. guest-tid boots the fabric
# with the kernel's TID RDMA (ci/run-qemu.sh --tid-rdma --fabric-perf --hfi1-dma identity): perftest READ and WRITE
# with TID RDMA, without it (OPFN cleared at run time) and on SoftRoCE, in that boot. The plot shows every target
# as measured/target on a log scale; scale.svg the curves.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

usage() { sed -n '2,/^source/{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit "${1:-2}"; }
BUDGET="" CASES=() QEMU=1 GUEST=1 GUEST_BUDGET=1000 GUEST_BOOTS=3 VERBS_BOOTS=3 OUT=docs/bench KEEP_WORK=0 REPORT_ONLY=""
while [ $# -gt 0 ]; do
    case "$1" in
        --budget-ms) [ $# -ge 2 ] || usage; BUDGET=$2; shift 2 ;;
        --case) [ $# -ge 2 ] || usage; CASES+=("$2"); QEMU=0; shift 2 ;;
        --no-qemu) QEMU=0; shift ;;
        --no-guest) GUEST=0; shift ;;
        --guest-budget-ms) [ $# -ge 2 ] || usage; GUEST_BUDGET=$2; shift 2 ;;
        --guest-boots) [ $# -ge 2 ] || usage; GUEST_BOOTS=$2; shift 2 ;;
        --verbs-boots) [ $# -ge 2 ] || usage; VERBS_BOOTS=$2; shift 2 ;;
        --out) [ $# -ge 2 ] || usage; OUT=$2; shift 2 ;;
        --keep-work) KEEP_WORK=1; shift ;;
        --report-only) [ $# -ge 2 ] || usage; REPORT_ONLY=$2; shift 2 ;;
        -h|--help) usage 0 ;;
        *) log "unknown argument: $1"; usage ;;
    esac
done
[ -z "$BUDGET" ] || [[ $BUDGET =~ ^[0-9]+$ ]] || die "--budget-ms must be a number of milliseconds"
[[ $GUEST_BUDGET =~ ^[0-9]+$ ]] || die "--guest-budget-ms must be a number of milliseconds"
[[ $GUEST_BOOTS =~ ^[1-9][0-9]?$ ]] || die "--guest-boots must be a number from 1 to 99"
[[ $VERBS_BOOTS =~ ^[1-9][0-9]?$ ]] || die "--verbs-boots must be a number from 1 to 99"

# The results, the plots (testing/guest-run/src/bench) and docs/bench.md's table from what a run left in WORK.
report() { # work-dir
    guest_run_bin
    mkdir -p "$OUT"
    local partial=()
    [ ${#CASES[@]} -eq 0 ] || partial=(--partial)
    "$GUEST_RUN" bench-report --work "$1" --out "$OUT" "${partial[@]}"
    # docs/bench.md's results table, from the results just written (not for results written elsewhere).
    [ "$OUT" != docs/bench ] || bash ci/bench-table.sh
}
if [ -n "$REPORT_ONLY" ]; then
    [ -d "$REPORT_ONLY" ] || die "--report-only: no directory $REPORT_ONLY"
    report "$REPORT_ONLY"
    exit 0
fi
# guest-verbs and guest-tid are this script's own boots; the other cases are testbed bench's (and quiet's).
TB_CASES=() VERBS=0 TIDPERF=0 FABRIC=0
for c in "${CASES[@]}"; do
    case $c in guest-verbs|guest-verbs-iommu) VERBS=1 ;; guest-tid) TIDPERF=1 ;; h) FABRIC=1 ;; *) TB_CASES+=("$c") ;; esac
done
[ ${#CASES[@]} -gt 0 ] || { [ "$QEMU" = 1 ] && [ "$GUEST" = 1 ] && VERBS=1 && TIDPERF=1; }
[ ${#CASES[@]} -gt 0 ] || [ "$QEMU" = 0 ] || FABRIC=1
TESTBED=1
[ ${#CASES[@]} -eq 0 ] || [ ${#TB_CASES[@]} -gt 0 ] || TESTBED=0

bash ci/setup-rust.sh
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO_ROOT/target}
if [ "$TESTBED" = 1 ] || [ "$QEMU" = 1 ]; then
    log "cargo build --release -p testbed"
    cargo build --release -p testbed >&2
fi
# The device model's latency opt-in, given to every device model this script starts (docs/bench.md).
DM_OPT_IN=(--dm-arg --low-latency)
WORK=$(mktemp -d /tmp/rdma-emu-bench.XXXXXX)
if [ "$KEEP_WORK" = 1 ]; then
    trap 'log "the run'"'"'s work directory: $WORK (ci/bench.sh --report-only $WORK)"' EXIT
else
    trap 'rm -rf "$WORK"' EXIT
fi

ARGS=(bench --json)
[ -z "$BUDGET" ] || ARGS+=(--budget-ms "$BUDGET")
for c in "${TB_CASES[@]}"; do ARGS+=(--case "$c"); done
if [ "$TESTBED" = 1 ]; then
    log "testbed ${ARGS[*]}"
    "$TARGET_DIR/release/testbed" "${ARGS[@]}" >"$WORK/udriver.json"
fi

# The idle and sparse-client CPU of the device-model process, defaults against every knob at zero and against
# --low-latency, side by side (it prints its figures as a case line).
if [ ${#CASES[@]} -eq 0 ] || printf '%s\n' "${CASES[@]}" | grep -qx quiet; then
    log "cargo test --release -p device-model --test quiet"
    cargo test --release -p device-model --test quiet -- --nocapture >"$WORK/quiet.log" 2>&1 ||
        echo "tests/quiet.rs failed (see its output)" >"$WORK/quiet-fail"
    sed -n 's/^BENCH_CASE //p' "$WORK/quiet.log" >"$WORK/quiet.json"
fi

# (f): each run leaves its result JSON (with a "timing" object) in $WORK; a skip leaves its reason.
qemu_run() { # name [run-qemu.sh options]
    local name=$1 skip
    shift
    log "ci/run-qemu.sh $* (TCG)"
    if ! bash ci/run-qemu.sh --accel tcg --timing --quiet --result "$WORK/qemu-$name.json" \
        --device-model "$DM" --udriver "$UDRIVER_STATIC" "${DM_OPT_IN[@]}" "$@" >&2; then
        # (f) cannot be judged without both of its runs; (g) and (h) report what their run left.
        case $name in devices|no-devices) skip=qemu-skip ;; *) skip=$name-failed ;; esac
        echo "ci/run-qemu.sh $* failed (see its log above)" >"$WORK/$skip"
        return 1
    fi
}
if [ "$QEMU" = 0 ]; then
    echo "not requested (--no-qemu or --case)" >"$WORK/qemu-skip"
elif [ ! -f ci/run-qemu.sh ]; then
    echo "ci/run-qemu.sh is not in this tree" >"$WORK/qemu-skip"
elif ! BUILT=$(bash ci/build.sh); then
    echo "ci/build.sh failed" >"$WORK/qemu-skip"
elif ! bash ci/get-qemu.sh >/dev/null; then
    echo "no QEMU >= 10.1 with vfio-user-pci (ci/get-qemu.sh failed)" >"$WORK/qemu-skip"
else
    DM=$(sed -n 1p <<<"$BUILT")
    UDRIVER_STATIC=$(sed -n 2p <<<"$BUILT")
    qemu_run devices && qemu_run no-devices --no-devices || true
    # (g): the stock hfi1 driver on the chip personality alone, for its probe time and trapped accesses.
    qemu_run kdriver --hfi1-wfr --hfi1-id none --irdma-id none || true
    # The in-guest benchmark: udriver bench over VFIO, with rust-vmm's peer and QEMU's edu beside our functions.
    if [ "$GUEST" = 1 ]; then
        guest_boot() { # result-file label skip-file [more ci/run-qemu.sh options]
            bash ci/run-qemu.sh --accel tcg --quiet --bench --testbed "$TARGET_DIR/release/testbed" "${DM_OPT_IN[@]}" "${@:4}" \
                --bench-budget-ms "$GUEST_BUDGET" --result "$1" --device-model "$DM" --udriver "$UDRIVER_STATIC" >&2 ||
                echo "$2 failed (see its log above)" >>"$3"
        }
        for k in $(seq "$GUEST_BOOTS"); do
            log "ci/run-qemu.sh --bench (TCG), boot $k of $GUEST_BOOTS"
            guest_boot "$WORK/qemu-guest-$k.json" "ci/run-qemu.sh --bench, boot $k" "$WORK/guest-skip"
        done
        # As many again with the host's idle CPUs polling instead of halting (a PM QoS request of 0 us, held
        # open for the boot): on a VM, waking a halted vCPU is most of every trapped access's thread
        # hand-offs, the same for every server, and it hides what the servers themselves cost.
        if [ -w /dev/cpu_dma_latency ]; then
            for k in $(seq "$GUEST_BOOTS"); do
                log "ci/run-qemu.sh --bench (TCG), idle exit latency held at 0 us, boot $k of $GUEST_BOOTS"
                ( exec 9>/dev/cpu_dma_latency && printf '\0\0\0\0' >&9 &&
                  guest_boot "$WORK/qemu-guest-lat0-$k.json" "the boot $k with idle latency 0" \
                      "$WORK/guest-lat0-skip" 9>&- ) || echo "boot $k: no PM QoS request" >>"$WORK/guest-lat0-skip"
            done
        else
            echo "/dev/cpu_dma_latency is not writable here" >"$WORK/guest-lat0-skip"
        fi
        # One boot of QEMU as it is upstream, its vCPU waiting for the I/O thread to read each reply
        # (qemu-patches/0005 off): what the patch is worth, same servers, same run. Reported, not judged.
        log "ci/run-qemu.sh --bench --reply-poll-us 0 (TCG)"
        guest_boot "$WORK/qemu-guest-nopoll-1.json" "ci/run-qemu.sh --bench --reply-poll-us 0" \
            "$WORK/guest-nopoll-skip" --reply-poll-us 0
    else
        echo "not requested (--no-guest)" | tee "$WORK/guest-lat0-skip" "$WORK/guest-nopoll-skip" >"$WORK/guest-skip"
    fi
fi
[ "$QEMU" = 1 ] || echo "not requested (--no-qemu or --case)" | tee "$WORK/guest-lat0-skip" "$WORK/guest-nopoll-skip" >"$WORK/guest-skip"

# What a boot of its own needs: the device model and the static udriver (built once) and QEMU. False, with the
# reason in SKIP-FILE, when one cannot be had.
boot_prereqs() { # skip-file
    if [ -z "${DM:-}" ] && ! { BUILT=$(bash ci/build.sh) && DM=$(sed -n 1p <<<"$BUILT") \
        && UDRIVER_STATIC=$(sed -n 2p <<<"$BUILT"); }; then
        echo "ci/build.sh failed" >"$1"
        return 1
    fi
    bash ci/get-qemu.sh >/dev/null && return 0
    echo "no QEMU >= 10.1 with vfio-user-pci (ci/get-qemu.sh failed)" >"$1"
    return 1
}

# (h): the fabric, two HFIs on one cable brought to ACTIVE by the stock driver and opa-fm: its bring-up times,
# the SM's sweep and the trapped accesses per SMP, from the fabric run's own steps.
if [ "$FABRIC" = 1 ] && boot_prereqs "$WORK/fabric-failed"; then
    qemu_run fabric --fabric || true
fi

# One boot with a benchmark after the run's steps, its result in RESULT-FILE; a skip leaves its reason.
perf_boot() { # wanted(0|1) skip-file result-file run-qemu.sh options...
    local wanted=$1 skip=$2 result=$3
    shift 3
    if [ "$wanted" = 0 ]; then
        echo "not requested (--no-qemu, --no-guest or --case)" >"$skip"
        return 0
    fi
    boot_prereqs "$skip" || return 0
    log "ci/run-qemu.sh $* (TCG)"
    bash ci/run-qemu.sh --accel tcg --quiet "$@" "${DM_OPT_IN[@]}" --result "$result" \
        --device-model "$DM" --udriver "$UDRIVER_STATIC" >&2 || log "ci/run-qemu.sh $* failed"
}
# guest-verbs: the fabric run with the verbs benchmark after its steps (ci/guest/perf.sh): perftest between hfi1_0
# and hfi1_1 across the device model's cable, then the same commands on SoftRoCE over a veth pair. Both transports
# share the boot's one vCPU and the host's two CPUs, and where QEMU's and the device model's threads land is
# fixed per boot, so each boot gives its own ratios and the targets judge their median. The hfi1 functions get an
# identity IOMMU domain (--hfi1-dma identity): SoftRoCE maps nothing for DMA, while hfi1 maps and unmaps every
# packet, which QEMU's vIOMMU makes a blocking round trip to the device model; guest-verbs-iommu is that cost.
for k in $(seq "$VERBS_BOOTS"); do
    perf_boot "$VERBS" "$WORK/verbs-skip" "$WORK/qemu-verbs-$k.json" --fabric --fabric-perf --hfi1-dma identity
    [ ! -e "$WORK/verbs-skip" ] || break # not requested, or no boot to be had: the same for every boot
done
[ -e "$WORK/verbs-skip" ] && cp "$WORK/verbs-skip" "$WORK/verbs-iommu-skip" \
    || perf_boot "$VERBS" "$WORK/verbs-iommu-skip" "$WORK/qemu-verbs-iommu.json" --fabric --fabric-perf
# guest-tid: the TID RDMA run with its benchmark after its steps (ci/guest/perf.sh step_tid_perf).
perf_boot "$TIDPERF" "$WORK/tidperf-skip" "$WORK/qemu-tid.json" --tid-rdma --fabric-perf --hfi1-dma identity

report "$WORK"
