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
# Usage: ci/e2e.sh [--mode shared|no-share|both|lifecycle|all] [extra ci/run-qemu.sh options]
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
MODE=both
if [ "${1:-}" = "--mode" ]; then MODE=$2; shift 2; fi
if [ "$MODE" = lifecycle ]; then exec bash ci/lifecycle.sh; fi

mapfile -t BINS < <(bash ci/build.sh)
DM=${BINS[0]} UD=${BINS[1]} HU=${BINS[2]} HUH=${BINS[3]}
QEMU=$(bash ci/get-qemu.sh)
export RDMA_EMU_QEMU=$QEMU
log "building the guest"
bash ci/build-guest.sh --udriver "$UD" --hfi1-user "$HU" >&2

rc=0
run_mode() { # name, run-qemu options...
    local name=$1; shift
    log "end-to-end run: $name"
    if out=$(bash ci/run-qemu.sh --device-model "$DM" --udriver "$UD" --hfi1-user "$HU" --hfi1-user-host "$HUH" \
        --hfi1-wfr --timing "$@" "${EXTRA[@]}"); then
        # A demo that passes but logs errors (e.g. a teardown the kernel refused) is a failure too.
        if errors=$(python3 -c '
import json, sys
steps = json.load(open(sys.argv[1])).get("guest", {}).get("steps", [])
bad = [s["name"] + ": " + line for s in steps for line in (s.get("stderr") or "").splitlines() if "ERROR" in line]
print(chr(10).join(bad))
sys.exit(1 if bad else 0)' "$out"); then
            log "$name: PASS ($out)"
        else
            log "$name: FAIL: the driver logged errors:"; echo "$errors" >&2
            rc=1
        fi
    else
        log "$name: FAIL (result: $out)"
        rc=1
    fi
}
EXTRA=("$@")
case $MODE in
    shared) run_mode "fd-mapped guest RAM (memfd, share=on)" ;;
    no-share) run_mode "DMA_READ/WRITE messages (guest RAM not shared)" --no-share ;;
    both|all)
        run_mode "fd-mapped guest RAM (memfd, share=on)"
        run_mode "DMA_READ/WRITE messages (guest RAM not shared)" --no-share
        if [ "$MODE" = all ]; then
            log "end-to-end: lifecycle scenarios"
            bash ci/lifecycle.sh || rc=1
        fi
        ;;
    *) die "unknown mode $MODE" ;;
esac
exit $rc
