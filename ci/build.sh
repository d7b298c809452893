#!/usr/bin/env bash
# Builds the release binaries: device-model and hfi1-user-host for the host, static udriver and hfi1-user for
# the guest. Prints four lines on stdout: the device-model path, the static udriver path, the static hfi1-user
# path, the hfi1-user-host path.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
bash ci/setup-rust.sh
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO_ROOT/target}
TRIPLE=x86_64-unknown-linux-gnu
log "cargo build --release (device-model, hfi1-user-host)"
cargo build --release -p device-model -p hfi1-kernel-check --bin device-model --bin hfi1-user-host >&2
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
echo "$TARGET_DIR/release/hfi1-user-host"
