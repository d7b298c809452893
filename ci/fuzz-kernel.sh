#!/usr/bin/env bash
# Fuzzes the guest kernel's stock hfi1 driver from the device side (docs/fuzzing-kernel.md): the driver built
# out of tree with coverage (ci/build-hfi1-module.sh), two HFIs on one cable brought to ACTIVE by opa-fm, a QP
# keeper in the guest, and `kernel-fuzz` on the host sending batches of packets into hfi1_0's port as if from
# the cable's far end, steered by the module's edge map and judged by the kernel's own detectors.
#
#   ci/fuzz-kernel.sh --side wire --minutes N --out DIR [--plant] [--smoke] [-- kernel-fuzz wire options]
#
#   --side wire     the wire side (the chip side is not built yet: docs/fuzzing-kernel.md says what remains)
#   --minutes N     fuzzing time, boots not counted (default 2)
#   --out DIR       DIR/summary.json, DIR/findings/<id>/ (report, reproducer, logs), DIR/stats.log
#   --plant         TEST ONLY: the module has the planted defect (ci/build-hfi1-module.sh --plant) and the corpus
#                   a seed that hits it; the campaign must report it
#   --smoke         check the summary as ci/test.sh does: execs ran, coverage grew past the keeper's fabric,
#                   and with --plant the planted finding was caught and replayed
#
# Reproduce a finding on a fresh boot (the stock signed module with --stock):
#   ci/fuzz-kernel.sh --repro DIR/findings/<id> [--stock]
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

usage() { sed -n '2,20s/^# \{0,1\}//p' "$0" >&2; exit "${1:-2}"; }

SIDE="" MINUTES=2 OUT="" PLANT=0 SMOKE=0 REPRO="" STOCK=0
EXTRA=()
while [ $# -gt 0 ]; do
    case "$1" in
        --side) SIDE=$2; shift 2 ;;
        --minutes) MINUTES=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --plant) PLANT=1; shift ;;
        --smoke) SMOKE=1; shift ;;
        --repro) REPRO=$2; shift 2 ;;
        --stock) STOCK=1; shift ;;
        -h|--help) usage 0 ;;
        --) shift; EXTRA=("$@"); break ;;
        *) echo "unknown option $1" >&2; usage ;;
    esac
done
if [ -z "$REPRO" ]; then
    [ "$SIDE" = wire ] || die "--side wire is the side there is (the chip side: docs/fuzzing-kernel.md)"
    [ -n "$OUT" ] || die "--out DIR is required"
fi

# --- host binaries, guest, module with coverage
guest_run_bin
(cargo build --release -p kernel-fuzz >&2) || die "cargo build -p kernel-fuzz failed"
TARGET=${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release
KFUZZ=$TARGET/kernel-fuzz
GUEST=$(bash ci/build-guest.sh) || die "ci/build-guest.sh failed"
BASE_INITRD=$(sed -n 's/^INITRD=//p' <<<"$GUEST")
KERNEL=$(sed -n 's/^KERNEL=//p' <<<"$GUEST")
# Known defects are disarmed in the fuzz build so they do not drown new ones: every fix in kernel-patches/
# (docs/kernel-findings.md) is applied to it. A defect without a fix is de-duplicated by its signature.
MODULE_OPTS=(--base-initrd "$BASE_INITRD")
for p in kernel-patches/hfi1-*.patch; do MODULE_OPTS+=(--patch "$p"); done
[ "$PLANT" = 1 ] && MODULE_OPTS+=(--plant)
if [ "$STOCK" = 1 ]; then
    # The stock signed module: the guest as ci/build-guest.sh builds it (the ivshmem device stays, unused).
    INITRD=$BASE_INITRD
else
    MOD=$(bash ci/build-hfi1-module.sh "${MODULE_OPTS[@]}") || die "ci/build-hfi1-module.sh failed"
    KO=$(sed -n 's/^KO=//p' <<<"$MOD")
    INITRD=$(sed -n 's/^INITRD=//p' <<<"$MOD")
fi
KSRC=$(bash ci/kernel-source.sh) || die "ci/kernel-source.sh failed"

# --- the coverage region: a file QEMU's ivshmem-plain maps and the fuzzer reads (2 MiB, HFI1_COV_REGION_SIZE)
COV=$(mktemp /dev/shm/rdma-emu-hfi1cov.XXXXXX)
trap 'rm -f "$COV"' EXIT
truncate -s 2M "$COV"
BOOT=(--guest-run "$GUEST_RUN" --kernel "$KERNEL" --initrd "$INITRD" --device-model "$TARGET/device-model"
      --coverage-file "$COV")

if [ -n "$REPRO" ]; then
    out=$(mktemp -d /tmp/rdma-emu-repro.XXXXXX)
    log "replaying $REPRO on a fresh boot ($([ "$STOCK" = 1 ] && echo 'stock signed module' || echo 'coverage module')); logs in $out"
    exec "$KFUZZ" repro "${BOOT[@]}" --finding "$REPRO" --out "$out"
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ARGS=(wire "${BOOT[@]}" --minutes "$MINUTES" --out "$OUT" --ko "$KO" --hfi1-src "$KSRC/drivers/infiniband/hw/hfi1")
[ -f docs/fuzzing/baseline.json ] && ARGS+=(--baseline docs/fuzzing/baseline.json)
if [ "$PLANT" = 1 ]; then
    "$KFUZZ" plant-seed >"$OUT/plant.seed" || die "kernel-fuzz plant-seed failed"
    ARGS+=(--seed-file "$OUT/plant.seed")
fi
log "fuzzing the wire side for $MINUTES min (out: $OUT)"
"$KFUZZ" "${ARGS[@]}" "${EXTRA[@]}" || die "kernel-fuzz wire failed"

if [ "$SMOKE" = 1 ]; then
    CHECK=(check --summary "$OUT/summary.json" --min-execs 100 --above-ready)
    [ "$PLANT" = 1 ] && CHECK+=(--finding hfi1_cov_plant --confirmed)
    "$KFUZZ" "${CHECK[@]}" || die "the fuzz smoke's checks failed (summary: $OUT/summary.json)"
fi
log "summary: $OUT/summary.json"
