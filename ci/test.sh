#!/usr/bin/env bash
# Runs every test: formatting, clippy, unit and integration tests, the docs' command lines, the QEMU end-to-end run,
# the fuzz targets' regression inputs and a fuzz smoke.
# Usage: ci/test.sh [--no-e2e] [--no-fuzz]
#   --no-fuzz  no fuzz smoke (FUZZ_SMOKE_SECONDS=0 likewise); the regression inputs (fuzz/regressions/) still run
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

E2E=1 FUZZ=1
for a in "$@"; do
    case $a in
        --no-e2e) E2E=0 ;;
        --no-fuzz) FUZZ=0 ;;
        -h|--help) sed -n '2,5s/^# \{0,1\}//p' "$0" >&2; exit 0 ;;
        *) die "unknown option $a" ;;
    esac
done

# CI shows the end of the output: on failure, the lines that say what failed are repeated there.
TEST_LOG=$(mktemp /tmp/rdma-emu-test.XXXXXX)
exec > >(tee "$TEST_LOG") 2>&1
repeat_failures() {
    local rc=$?
    [ "$rc" = 0 ] && return
    echo "=== ci/test.sh failed (exit $rc); the failure lines of this run, again (a run that must fail, such as"
    echo "=== stall or fabric-bounce, prints problem lines and then PASS):"
    grep -E 'FAIL|problem:|^test .* FAILED|panicked at|^error' "$TEST_LOG" | cut -c1-600 | tail -n 80
}
trap repeat_failures EXIT

bash ci/setup-rust.sh
# The cable-capture test decodes our capture with Debian's tshark.
ensure_tshark

# kernel-conformance compiles the kernel's irdma ctrl.c from the guest kernel's source package.
log "kernel source for kernel-conformance"
RDMA_EMU_KERNEL_SRC=$(bash ci/kernel-source.sh)
export RDMA_EMU_KERNEL_SRC

log "cargo fmt --check"
cargo fmt --all --check

log "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

# The fuzz crate is its own workspace (libFuzzer's build flags): linted here, so a change to an API it uses
# fails in minutes rather than at the fuzz smoke's build at the end.
if [ -d fuzz ]; then
    log "fuzz: cargo fmt --check, cargo clippy -- -D warnings"
    # libfuzzer-sys's build script compiles libFuzzer's C++.
    command -v c++ >/dev/null || apt_install g++
    (cd fuzz && cargo fmt --all --check && cargo clippy --all-targets --features kernel -- -D warnings)
fi

# The kernel differential runs its fixed seed here (the same cases every run); ci/fuzz.sh runs random ones.
log "cargo test"
env -u KERNEL_DIFF_SEED cargo test --workspace 2>&1 | tee /tmp/rdma-emu-cargo-test.log
grep -q "test result:" /tmp/rdma-emu-cargo-test.log || die "cargo test ran no test"
# RDMA_EMU_KERNEL_SRC being set makes a missing tree a build error; this catches tests that compiled to nothing.
for t in the_kernel_irdma_session_passes_every_step_on_both_transports \
    the_kernel_and_udriver_build_the_same_wqes_and_decode_the_same_cqes; do
    grep -q "^test $t \.\.\. ok$" /tmp/rdma-emu-cargo-test.log ||
        die "the kernel-conformance test $t did not pass (did kernel-conformance build without the kernel source?)"
done
log "the README's and docs' command lines against the --help of what they run, their links, the docs index"
bash ci/check-docs.sh
log "the guest init's helpers under the guest's busybox (ci/guest/test-init.sh)"
bash ci/guest/test-init.sh
log "docs/bench.md's results table against docs/bench/results.json"
bash ci/bench-table.sh --check
log "irdma integration tests again, over a real vfio-user socket"
UDRIVER_IT_BACKEND=vfio-user cargo test -p testbed --test irdma_inproc

if [ "$E2E" = 1 ]; then
    log "QEMU end-to-end (fd-mapped guest RAM, DMA_READ/WRITE messages, the fabric, the kernel's TID RDMA, the lifecycle and stall scenarios)"
    bash ci/e2e.sh --mode all
    if [ "$FUZZ" = 1 ]; then
        # The stock driver fuzzed from the wire for 2 minutes with the test-only planted defect: the loop runs, its
        # coverage grows past what the fabric reached before the first exec, and the planted WARN is reported
        # and replayed on a fresh boot (docs/fuzzing-kernel.md).
        log "kernel fuzz smoke: the wire side, 2 minutes, with the planted finding"
        bash ci/fuzz-kernel.sh --side wire --minutes 2 --plant --smoke --out "$(mktemp -d /tmp/rdma-emu-kfuzz.XXXXXX)"
    fi
fi

# Every input that once failed a fuzz target is a test: replayed by both paths (ci/fuzz.sh replays before it fuzzes).
if [ -d fuzz ]; then
    if [ "$FUZZ" = 1 ] && [ "${FUZZ_SMOKE_SECONDS:-30}" != 0 ]; then
        log "fuzz: regression inputs and smoke"
        bash ci/fuzz.sh --seconds "${FUZZ_SMOKE_SECONDS:-30}"
    else
        log "fuzz: regression inputs (no smoke)"
        bash ci/fuzz.sh --build-only
    fi
fi
log "all tests passed"
# One plain closing line over every cargo test binary of the main run.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) } }
     END { printf "%d passed, %d failed\n", p, f }' /tmp/rdma-emu-cargo-test.log
