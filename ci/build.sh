#!/usr/bin/env bash
# Builds the release binaries: device-model, hfi1-user-host and guest-run for the host, static udriver and
# hfi1-user for the guest, and the emulated chip's signed 8051 firmware file for the guest's /lib/firmware
# (guest-run is found next to device-model; lib.sh's build_bins sets GUEST_RUN). Prints five
# lines on stdout: the device-model path, the static udriver path, the static hfi1-user path, the
# hfi1-user-host path, the firmware file's path.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
bash ci/setup-rust.sh
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO_ROOT/target}
TRIPLE=x86_64-unknown-linux-gnu
log "cargo build --release (device-model, hfi1-user-host, hfi1-dc8051-image, guest-run)"
build_host_bins
log "cargo build --release --target $TRIPLE (static udriver and hfi1-user for the guest)"
# --target keeps RUSTFLAGS away from build scripts and proc macros, and the host build's cache intact.
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release -p udriver -p hfi1-kernel-check --bin udriver \
    --bin hfi1-user --target "$TRIPLE" >&2
UDRIVER="$TARGET_DIR/$TRIPLE/release/udriver"
HFI1_USER="$TARGET_DIR/$TRIPLE/release/hfi1-user"
for bin in "$UDRIVER" "$HFI1_USER"; do
    ldd "$bin" 2>&1 | grep -qE "statically linked|not a dynamic executable" || die "$bin is not statically linked"
done
echo "$TARGET_DIR/release/device-model"
echo "$UDRIVER"
echo "$HFI1_USER"
FIRMWARE="$TARGET_DIR/rdma-emu/hfi_dc8051.bin"
mkdir -p "$(dirname "$FIRMWARE")"
"$TARGET_DIR/release/hfi1-dc8051-image" --out "$FIRMWARE" >&2 || die "hfi1-dc8051-image failed"
echo "$TARGET_DIR/release/hfi1-user-host"
echo "$FIRMWARE"
