#!/usr/bin/env bash
# Builds every libFuzzer target on the stable toolchain, checks the oracles' unit tests, replays every
# committed regression input, then runs each target for N seconds on its seed corpus and dictionary and
# prints execs/s and coverage per target against the throughput targets (device_mmio >= 10k execs/s, the other
# targets >= 2k; docs/fuzzing.md) and against the coverage the committed baseline reached in the same time
# (fuzz/coverage-baseline.txt). Fails on a build error, a failing test, or any crash; a missed throughput or
# coverage target is reported, not a failure (the machine's load decides much of it).
#
# Usage: ci/fuzz.sh [--seconds N] [--target NAME]... [--build-only] [-- extra libFuzzer flags]
#   --seconds N    run time per target (default 30)
#   --target NAME  only this target (repeatable; default: all)
#   --build-only   build, test and replay regressions, run nothing
# Environment: FUZZ_JOBS=J runs each target with -fork=J (default 1: plain in-process run).
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT/fuzz"

SECONDS_PER_TARGET=30 BUILD_ONLY=0
TARGETS=() EXTRA=()
while [ $# -gt 0 ]; do
    case $1 in
        --seconds) SECONDS_PER_TARGET=${2:?--seconds needs a value}; shift ;;
        --target) TARGETS+=("${2:?--target needs a value}"); shift ;;
        --build-only) BUILD_ONLY=1 ;;
        -h|--help) sed -n '2,13s/^# \{0,1\}//p' "$REPO_ROOT/ci/fuzz.sh" >&2; exit 0 ;;
        --) shift; EXTRA=("$@"); break ;;
        *) die "unknown option $1" ;;
    esac
    shift
done
ALL_TARGETS=(vfio_user_server device_mmio udriver_hostile client_parse kernel_diff)
# execs/s each target should reach on an idle machine (docs/fuzzing.md, "Throughput").
declare -A WANT_EXECS=([device_mmio]=10000 [vfio_user_server]=2000 [udriver_hostile]=2000 [client_parse]=2000 [kernel_diff]=2000)
# Coverage (edges) of the old harnesses after N seconds: "target seconds cov" lines.
BASELINE=coverage-baseline.txt
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL_TARGETS[@]}")

# libFuzzer's instrumentation, done by rustc itself: no nightly, no cargo-fuzz. Debug assertions and
# overflow checks come from fuzz/Cargo.toml's release profile.
TRIPLE=x86_64-unknown-linux-gnu
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares"
export CARGO_TARGET_DIR="$REPO_ROOT/fuzz/target"
BIN="$CARGO_TARGET_DIR/$TRIPLE/release"
command -v c++ >/dev/null || apt_install g++
# kernel_diff links the kernel's irdma ctrl.c, built from the guest kernel's source package.
RDMA_EMU_KERNEL_SRC=$(bash "$REPO_ROOT/ci/kernel-source.sh")
export RDMA_EMU_KERNEL_SRC

log "fuzz: build ${ALL_TARGETS[*]} (stable, sancov)"
cargo build --release --target "$TRIPLE" --bins --features kernel
log "fuzz: oracle unit tests"
cargo test --release --target "$TRIPLE" --lib --features kernel

# Every crash ever found stays fixed: its input is replayed (libFuzzer runs given files once).
for t in "${TARGETS[@]}"; do
    if compgen -G "regressions/$t/*" >/dev/null; then
        log "fuzz: replay regressions/$t"
        "$BIN/$t" -runs=1 regressions/"$t"/* >"$CARGO_TARGET_DIR/replay-$t.log" 2>&1 ||
            { tail -n 40 "$CARGO_TARGET_DIR/replay-$t.log" >&2; die "$t: a regression input fails again"; }
    fi
done
[ "$BUILD_ONLY" = 1 ] && { log "fuzz: built, tests and regressions pass"; exit 0; }

mkdir -p "$CARGO_TARGET_DIR/logs" artifacts
ROWS=() FAILED=()
for t in "${TARGETS[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    dict=()
    [ -f "dicts/$t.dict" ] && dict=(-dict="dicts/$t.dict")
    fork=()
    [ "${FUZZ_JOBS:-1}" -gt 1 ] && fork=(-fork="$FUZZ_JOBS" -ignore_crashes=0)
    logf="$CARGO_TARGET_DIR/logs/$t.log"
    log "fuzz: $t for ${SECONDS_PER_TARGET}s"
    rc=0
    "$BIN/$t" "corpus/$t" "${dict[@]}" "${fork[@]}" -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 \
        -timeout=25 -rss_limit_mb=2048 -artifact_prefix="artifacts/$t/" "${EXTRA[@]}" >"$logf" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$logf" | tail -n1)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logf" | tail -n1)
    # The last status line carries the coverage: "#N DONE cov: C ft: F corp: ..." (or INITED/pulse).
    # A target that crashed before its first status line has none: the row says "?", the crash is reported.
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$logf" | tail -n1 || true)
    edges=$(echo "$cov" | awk '{print $2}')
    want=${WANT_EXECS[$t]:-0}
    speed=$(awk -v e="${execs:-0}" -v w="$want" 'BEGIN { if (w == 0) print "-"; else printf "%s (%.2fx)", (e >= w ? "met" : "MISSED"), e / w }')
    base=$(awk -v t="$t" -v s="$SECONDS_PER_TARGET" '$1 == t && $2 == s { print $3 }' "$BASELINE" 2>/dev/null | tail -n1 || true)
    covv="-"
    [ -n "$base" ] && [ -n "$edges" ] && covv=$([ "$edges" -ge "$base" ] && echo "met (>= $base)" || echo "MISSED (< $base)")
    ROWS+=("$(printf '| %-17s | %9s | %6s | %-16s | %10s | %5s | %6s | %-18s | %s |' "$t" "${execs:-?}" "$want" "$speed" \
        "${runs:-?}" "${edges:-?}" "$(echo "$cov" | awk '{print $4}')" "$covv" "$([ $rc = 0 ] && echo ok || echo CRASH)")")
    if [ $rc != 0 ] || compgen -G "artifacts/$t/*" >/dev/null; then
        FAILED+=("$t")
        grep -E 'panicked at|ERROR: libFuzzer|SUMMARY|Test unit written' "$logf" | head -n 8 >&2 || true
    fi
done

printf '\n| %-17s | %9s | %6s | %-16s | %10s | %5s | %6s | %-18s | %s |\n' target "execs/s" target "execs/s target" runs cov ft \
    "cov vs baseline" result
printf '|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n' ------------------- ----------- -------- ------------------ ------------ ------- -------- \
    -------------------- --------
printf '%s\n' "${ROWS[@]}"
echo
[ ${#FAILED[@]} = 0 ] || die "fuzz: crash in ${FAILED[*]}: inputs in fuzz/artifacts/, logs in $CARGO_TARGET_DIR/logs/"
log "fuzz: no crash"
