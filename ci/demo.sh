#!/usr/bin/env bash
# The main job, from a fresh clone: installs what is missing (apt packages, meson from PyPI, QEMU >= 10.1
# built from Debian's source package with qemu-patches/ applied), builds the device model and a static udriver,
# builds the guest (Debian kernel + busybox initramfs), boots QEMU with both emulated functions over vfio-user,
# and runs udriver's hfi1 and irdma demos inside the guest through VFIO; then boots the fabric (two emulated
# HFIs on one cable, brought up by the stock hfi1 driver and opa-fm, verbs traffic between them). Prints what the
# guest saw.
# Usage: ci/demo.sh [--no-share]   (--no-share: guest RAM not shared, so all DMA goes through messages)
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
MODE=shared
case "${1:-}" in
    --no-share) MODE=no-share ;;
    -h|--help) sed -n '2,8s/^# \{0,1\}//p' "$0" >&2; exit 0 ;;
    "") ;;
    *) die "unknown option $1 (ci/demo.sh --help)" ;;
esac
apt_install ca-certificates
rc=0
bash ci/e2e.sh --mode "$MODE" || rc=$?
bash ci/e2e.sh --mode fabric || rc=$?
# What the guest saw, from the two runs' result JSON (testing/guest-run/src/demo_summary.rs).
guest_run_bin
RESULT=${CARGO_TARGET_DIR:-$REPO_ROOT/target}/rdma-emu/result-$([ "$MODE" = shared ] && echo share || echo no-share).json
"$GUEST_RUN" demo-summary "$RESULT" || rc=1
"$GUEST_RUN" demo-summary --fabric "${CARGO_TARGET_DIR:-$REPO_ROOT/target}/rdma-emu/result-fabric.json" || rc=1
exit "$rc"
