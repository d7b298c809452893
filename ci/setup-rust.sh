#!/usr/bin/env bash
# Makes sure the Rust toolchain has what the tests need (rustfmt, clippy) and gcc for -sys crates.
source "$(dirname "$0")/lib.sh"
command -v cargo >/dev/null || die "cargo is not installed: install Rust (rustup) first"
if command -v rustup >/dev/null; then
    for c in rustfmt clippy; do
        rustup component list --installed 2>/dev/null | grep -q "^$c" || { log "rustup component add $c"; rustup component add "$c" >&2; }
    done
fi
command -v cc >/dev/null || apt_install gcc libc6-dev
