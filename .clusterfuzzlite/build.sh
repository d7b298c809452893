#!/bin/bash -eu
# ClusterFuzzLite / OSS-Fuzz build script: builds every fuzz target and puts it in $OUT with its seed
# corpus ($OUT/<target>_seed_corpus.zip), dictionary ($OUT/<target>.dict) and options ($OUT/<target>.options).
#
# In the base-builder-rust image `cargo fuzz` is there and honours $SANITIZER and the engine's
# RUSTFLAGS/CFLAGS (its `cargo` wrapper adds coverage instrumentation for coverage builds). Elsewhere
# (a local test of this script, see docs/fuzzing.md) the stable path of ci/fuzz.sh is used: rustc's own
# sancov passes, appended to the engine's RUSTFLAGS.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ -d "$REPO/fuzz" ] || REPO="$SRC/rdma-emu"
cd "$REPO/fuzz"
TARGETS=(vfio_user_server device_mmio udriver_hostile client_parse)
TRIPLE=x86_64-unknown-linux-gnu
: "${OUT:?OUT must name the output directory}"
mkdir -p "$OUT"

if cargo fuzz --version >/dev/null 2>&1 && [ "${RDMA_EMU_FUZZ_STABLE:-0}" != 1 ]; then
    # --debug-assertions: the oracles rely on overflow checks and debug assertions too.
    (cd "$REPO" && cargo fuzz build -O --debug-assertions)
    BIN="$REPO/fuzz/target/$TRIPLE/release"
else
    SANCOV="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares"
    export RUSTFLAGS="${RUSTFLAGS:-} $SANCOV"
    # libFuzzer's C++ is built by libfuzzer-sys with $CXX/$CXXFLAGS; a GCC toolchain cannot take clang's
    # -fsanitize=fuzzer-no-link, -stdlib=libc++ or -gline-tables-only, which the engine's flags carry.
    if ! "${CXX:-c++}" --version 2>/dev/null | grep -qi clang; then
        strip_clang() { echo "${1:-}" | sed -E 's/-fsanitize[^ ]*//g; s/-stdlib=libc\+\+//g; s/-gline-tables-only/-g/g'; }
        CFLAGS="$(strip_clang "${CFLAGS:-}")" CXXFLAGS="$(strip_clang "${CXXFLAGS:-}")"
        export CFLAGS CXXFLAGS
    fi
    export CARGO_TARGET_DIR="${WORK:-$REPO/fuzz/target}/cargo-target"
    cargo build --release --target "$TRIPLE" --bins
    BIN="$CARGO_TARGET_DIR/$TRIPLE/release"
fi

for t in "${TARGETS[@]}"; do
    cp "$BIN/$t" "$OUT/$t"
    rm -f "$OUT/${t}_seed_corpus.zip"
    if compgen -G "corpus/$t/seed-*" >/dev/null; then
        zip -jq "$OUT/${t}_seed_corpus.zip" corpus/"$t"/seed-*
    fi
    # Seeds cut from recorded sessions (device-model seeds, docs/fuzzing.md).
    if compgen -G "corpus/$t/rec-*" >/dev/null; then
        zip -jq "$OUT/${t}_seed_corpus.zip" corpus/"$t"/rec-*
    fi
    # Regression inputs are seeds too: each once crashed a target.
    if compgen -G "regressions/$t/*" >/dev/null; then
        zip -jq "$OUT/${t}_seed_corpus.zip" regressions/"$t"/*
    fi
    [ -f "dicts/$t.dict" ] && cp "dicts/$t.dict" "$OUT/$t.dict"
    # The hang detector, as ci/fuzz.sh's TIMEOUT: device_mmio's inputs run in milliseconds.
    timeout=25
    [ "$t" = device_mmio ] && timeout=5
    cat >"$OUT/$t.options" <<OPTS
[libfuzzer]
timeout = $timeout
rss_limit_mb = 2560
OPTS
    [ -f "dicts/$t.dict" ] && echo "dict = $t.dict" >>"$OUT/$t.options"
done
echo "built ${TARGETS[*]} into $OUT"
