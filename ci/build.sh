#!/usr/bin/env bash
# Builds the release binaries: device-model for the host, and a static udriver for the guest.
# Prints two lines on stdout: the device-model path, then the static udriver path.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
bash ci/setup-rust.sh
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO_ROOT/target}
TRIPLE=x86_64-unknown-linux-gnu
log "cargo build --release (device-model)"
cargo build --release -p device-model >&2
log "cargo build --release --target $TRIPLE (static udriver for the guest)"
# --target keeps RUSTFLAGS away from build scripts and proc macros, and the host build's cache intact.
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release -p udriver --target "$TRIPLE" >&2
UDRIVER="$TARGET_DIR/$TRIPLE/release/udriver"
ldd "$UDRIVER" 2>&1 | grep -qE "statically linked|not a dynamic executable" \
    || die "$UDRIVER is not statically linked"
echo "$TARGET_DIR/release/device-model"
echo "$UDRIVER"
