#!/usr/bin/env bash
# Builds every libFuzzer target on the stable toolchain, checks the oracles' unit tests, replays every
# committed regression input (fuzz/regressions/<target>/*), then fuzzes each target.
#
# Smoke (the default, part of ci/test.sh): each target runs N seconds on its seed corpus and dictionary; a table
# gives execs/s and coverage per target against the throughput targets (device_mmio >= 10k execs/s, the others
# >= 2k; docs/fuzzing.md) and against the coverage the committed baseline reached in the same time
# (fuzz/coverage-baseline.txt). Fails on a build error, a failing test, or any finding; a missed throughput or
# coverage target is reported, not a failure (the machine's load decides much of it).
#
# Campaign (--campaign MINUTES): each target fuzzes MINUTES on its corpus kept under the cache
# ($CACHE_DIR/fuzz-corpus/<target>, read together with the repo's seeds and regression inputs, minimised with
# -merge=1 afterwards; the repo's corpus is never written). A finding (crash, timeout, oom or leak artifact) is
# reproduced, minimised (crashes and leaks; a timeout or oom is kept as it is), and written to
# fuzz/regressions/<target>/ under a name from its cause; the target then fuzzes on for the rest of its time
# unless the same cause comes again (or after 3 findings). The table gets corpus and findings columns, and
# OUT/campaign.json holds per target: minutes, seconds, execs, execs_per_s, cov, ft, corpus size, findings.
# Fails if there was a finding.
#
# Every input runs under libFuzzer's -timeout (the hang detector: a timeout-<sha1> artifact and a finding):
# 5 s for device_mmio, whose inputs run in milliseconds, 25 s for the targets whose own oracles wait seconds.
#
# Usage: ci/fuzz.sh [--seconds N | --campaign MINUTES [--parallel] [--out DIR]] [--target NAME]... [--build-only]
#                   [-- extra libFuzzer flags]
#   --seconds N         smoke: run time per target (default 30)
#   --campaign MINUTES  campaign: fuzzing time per target, in minutes
#   --parallel          campaign: run the targets at the same time, as many as the machine has cores (default: one
#                       after another)
#   --out DIR           campaign: logs, artifacts and campaign.json (default fuzz/target/campaign)
#   --target NAME       only this target (repeatable; default: all)
#   --build-only        build, test and replay regressions, run nothing
# Environment: FUZZ_JOBS=J runs each target with -fork=J (default 1: plain in-process run); in a campaign the
# fork supervisor keeps going after findings and collects them all.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT/fuzz"

SECONDS_PER_TARGET=30 CAMPAIGN_MINUTES="" PARALLEL=0 OUT="" BUILD_ONLY=0
TARGETS=() EXTRA=()
while [ $# -gt 0 ]; do
    case $1 in
        --seconds) SECONDS_PER_TARGET=${2:?--seconds needs a value}; shift ;;
        --campaign) CAMPAIGN_MINUTES=${2:?--campaign needs MINUTES}; shift ;;
        --parallel) PARALLEL=1 ;;
        --out) OUT=${2:?--out needs a directory}; shift ;;
        --target) TARGETS+=("${2:?--target needs a value}"); shift ;;
        --build-only) BUILD_ONLY=1 ;;
        # The header comment, up to the first line that is not one.
        -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$REPO_ROOT/ci/fuzz.sh" >&2; exit 0 ;;
        --) shift; EXTRA=("$@"); break ;;
        *) die "unknown option $1" ;;
    esac
    shift
done
[[ "$SECONDS_PER_TARGET" =~ ^[1-9][0-9]*$ ]] || die "--seconds takes a positive whole number (0 is libFuzzer's 'forever')"
[ -z "$CAMPAIGN_MINUTES" ] || [[ "$CAMPAIGN_MINUTES" =~ ^[1-9][0-9]*$ ]] || die "--campaign takes positive whole minutes"
if [ -z "$CAMPAIGN_MINUTES" ]; then
    [ "$PARALLEL" = 0 ] && [ -z "$OUT" ] || die "--parallel and --out belong to --campaign"
fi
ALL_TARGETS=(vfio_user_server device_mmio udriver_hostile client_parse kernel_diff)
# execs/s each target should reach on an idle machine (docs/fuzzing.md, "Throughput").
declare -A WANT_EXECS=([device_mmio]=10000 [vfio_user_server]=2000 [udriver_hostile]=2000 [client_parse]=2000 [kernel_diff]=2000)
# libFuzzer's -timeout per target, in seconds: the hang detector. device_mmio's inputs run in microseconds to
# milliseconds with the engines' jobs inline, so a walk that never ends fails within seconds. The others' own
# oracles wait up to 2-5 s per call (docs/fuzzing.md, "What counts as a hang") and an input makes many calls.
declare -A TIMEOUT=([device_mmio]=5 [vfio_user_server]=25 [udriver_hostile]=25 [client_parse]=25 [kernel_diff]=25)
# Coverage (edges) of the old harnesses after N seconds: "target seconds cov" lines.
BASELINE=coverage-baseline.txt
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL_TARGETS[@]}")
for t in "${TARGETS[@]}"; do
    [ -n "${TIMEOUT[$t]:-}" ] || die "unknown target $t (targets: ${ALL_TARGETS[*]})"
done

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

# Every finding ever made stays fixed: its input is replayed (libFuzzer runs given files once), under the
# target's timeout, so a hang found once fails again as a hang.
REPLAY_ARTIFACTS=$(mktemp -d)
trap 'rm -rf "$REPLAY_ARTIFACTS"' EXIT
for t in "${TARGETS[@]}"; do
    if compgen -G "regressions/$t/*" >/dev/null; then
        log "fuzz: replay regressions/$t"
        "$BIN/$t" -runs=1 -timeout="${TIMEOUT[$t]}" -rss_limit_mb=2048 -artifact_prefix="$REPLAY_ARTIFACTS/" \
            regressions/"$t"/* >"$CARGO_TARGET_DIR/replay-$t.log" 2>&1 ||
            { tail -n 40 "$CARGO_TARGET_DIR/replay-$t.log" >&2; die "$t: a regression input fails again"; }
    fi
done
[ "$BUILD_ONLY" = 1 ] && { log "fuzz: built, tests and regressions pass"; exit 0; }

# The kernel differential with a fresh random seed (ci/test.sh runs its fixed one): new cases each run, and the
# seed printed so that a difference replays. A plain release build of the main workspace, not the fuzz one; with
# kernel_diff, the target that fuzzes the same comparison.
if [[ " ${TARGETS[*]} " == *" kernel_diff "* ]]; then
    DIFF_SEED=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
    log "fuzz: kernel differential, seed $DIFF_SEED (replay: KERNEL_DIFF_SEED=$DIFF_SEED cargo test -p kernel-conformance --test differential)"
    (cd "$REPO_ROOT" && env -u RUSTFLAGS -u CARGO_TARGET_DIR KERNEL_DIFF_SEED="$DIFF_SEED" \
        cargo test --release -p kernel-conformance --test differential) ||
        die "fuzz: the kernel differential found a difference with seed $DIFF_SEED"
fi

# --- results table (both modes) ---------------------------------------------------------------------------
COLUMNS_FMT='| %-17s | %9s | %6s | %-16s | %7s | %10s | %5s | %6s | %-18s | %6s | %s |'
table_header() {
    printf "\n$COLUMNS_FMT\n" target "execs/s" target "execs/s target" time runs cov ft "cov vs baseline" corpus result
    printf '|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n' ------------------- ----------- -------- ------------------ --------- \
        ------------ ------- -------- -------------------- -------- --------
}

# log_stats LOG...: "runs execs_per_s cov ft" over one target's libFuzzer logs (a campaign restarted after a
# finding has several): the runs added up, execs/s over the time they took, cov and ft of the last status line
# ("#N DONE cov: C ft: F ..." or a fork supervisor's "#N: cov: C ft: F ..."), "?" where a log has none (a target
# that crashed before its first status line).
log_stats() {
    local f runs eps cov_ft
    local -a parts=()
    for f in "$@"; do
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$f" | tail -n1)
        eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$f" | tail -n1)
        # A fork supervisor prints no final stats: its last status line counts the runs.
        [ -n "$runs" ] || runs=$(grep -oE '^#[0-9]+' "$f" | tail -n1 | tr -d '#')
        parts+=("${runs:-0} ${eps:-0}")
    done
    cov_ft=$(cat "$@" | grep -oE 'cov: [0-9]+ ft: [0-9]+' | tail -n1 | awk '{print $2, $4}' || true)
    printf '%s\n' "${parts[@]}" | awk -v cf="${cov_ft:-? ?}" '
        { runs += $1; if ($2 > 0) secs += $1 / $2 }
        END { printf "%d %s %s\n", runs, (secs > 0 ? sprintf("%d", runs / secs) : "?"), cf }'
}

# table_row TARGET SECONDS CORPUS_FILES RESULT LOG...: the row of one target.
table_row() {
    local t=$1 secs=$2 corpus=$3 result=$4 runs execs edges ft want speed base covv
    shift 4
    read -r runs execs edges ft < <(log_stats "$@")
    want=${WANT_EXECS[$t]:-0}
    speed=$(awk -v e="$execs" -v w="$want" 'BEGIN { if (w == 0 || e == "?") print "-"; else printf "%s (%.2fx)", (e >= w ? "met" : "MISSED"), e / w }')
    base=$(awk -v t="$t" -v s="$secs" '$1 == t && $2 == s { print $3 }' "$BASELINE" 2>/dev/null | tail -n1 || true)
    covv="-"
    [ -n "$base" ] && [ "$edges" != "?" ] && covv=$([ "$edges" -ge "$base" ] && echo "met (>= $base)" || echo "MISSED (< $base)")
    # shellcheck disable=SC2059
    printf "$COLUMNS_FMT\n" "$t" "$execs" "$want" "$speed" "${secs}s" "$runs" "$edges" "$ft" "$covv" "$corpus" "$result"
}

fork_flags() { # campaign?
    [ "${FUZZ_JOBS:-1}" -gt 1 ] || return 0
    if [ "$1" = 1 ]; then
        printf '%s\n' -fork="$FUZZ_JOBS" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1
    else
        printf '%s\n' -fork="$FUZZ_JOBS" -ignore_crashes=0 -ignore_timeouts=0 -ignore_ooms=0
    fi
}

# --- smoke -------------------------------------------------------------------------------------------------
if [ -z "$CAMPAIGN_MINUTES" ]; then
    mkdir -p "$CARGO_TARGET_DIR/logs" artifacts
    ROWS=() FAILED=()
    for t in "${TARGETS[@]}"; do
        mkdir -p "corpus/$t" "artifacts/$t"
        dict=()
        [ -f "dicts/$t.dict" ] && dict=(-dict="dicts/$t.dict")
        mapfile -t fork < <(fork_flags 0)
        logf="$CARGO_TARGET_DIR/logs/$t.log"
        log "fuzz: $t for ${SECONDS_PER_TARGET}s"
        rc=0
        "$BIN/$t" "corpus/$t" "${dict[@]}" "${fork[@]}" -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 \
            -timeout="${TIMEOUT[$t]}" -rss_limit_mb=2048 -artifact_prefix="artifacts/$t/" "${EXTRA[@]}" >"$logf" 2>&1 || rc=$?
        ROWS+=("$(table_row "$t" "$SECONDS_PER_TARGET" "$(find "corpus/$t" -type f | wc -l)" \
            "$([ $rc = 0 ] && echo ok || echo FINDING)" "$logf")")
        if [ $rc != 0 ] || compgen -G "artifacts/$t/*" >/dev/null; then
            FAILED+=("$t")
            grep -E 'panicked at|ERROR: libFuzzer|SUMMARY|Test unit written|fuzz-hang' "$logf" | head -n 8 >&2 || true
        fi
    done
    table_header
    printf '%s\n' "${ROWS[@]}"
    echo
    [ ${#FAILED[@]} = 0 ] || die "fuzz: finding in ${FAILED[*]}: inputs in fuzz/artifacts/, logs in $CARGO_TARGET_DIR/logs/"
    log "fuzz: no finding"
    exit 0
fi

# --- campaign ----------------------------------------------------------------------------------------------
OUT=$(mkdir -p "${OUT:-$CARGO_TARGET_DIR/campaign}" && cd "${OUT:-$CARGO_TARGET_DIR/campaign}" && pwd)
CORPORA="$CACHE_DIR/fuzz-corpus"
MAX_FINDINGS=3
# Crash minimisation: libFuzzer's -minimize_crash steps, each up to MIN_STEP_RUNS mutations, all within MIN_SECONDS.
MIN_STEP_RUNS=20000 MIN_SECONDS=300

# json_str S: S as a JSON string (control characters dropped).
json_str() {
    local s
    s=$(printf '%s' "$1" | tr -d '\000-\037')
    s=${s//\\/\\\\}
    printf '"%s"' "${s//\"/\\\"}"
}

# signature T LOG KIND: what a finding is, in one line: a panic's place and message, or the kind of failure (and
# for a hang the operation the target's watchdog named, if it names one).
signature() {
    local log=$2 kind=$3 s=""
    case $kind in
        crash)
            # "thread '...' panicked at PATH:LINE:COL:" then the message; the path made relative to the repo.
            s=$(awk '/panicked at/ { sub(/.*panicked at /, ""); sub(/:$/, ""); loc = $0; getline; print loc ": " $0; exit }' "$log")
            s=${s//$REPO_ROOT\//}
            [ -n "$s" ] || s=$(grep -oE 'ERROR: libFuzzer: [a-z -]+' "$log" | head -n1 | sed 's/ERROR: libFuzzer: //')
            [ -n "$s" ] || s="crash"
            ;;
        timeout)
            s="timeout after ${TIMEOUT[$1]}s"
            local hang
            hang=$(sed -n 's/.*fuzz-hang: \([^ ]*\).*/\1/p' "$log" | head -n1)
            [ -z "$hang" ] || s="$s in $hang"
            ;;
        oom) s="out of memory: $(grep -oE 'used: [0-9]+Mb; limit: [0-9]+Mb' "$log" | head -n1)" ;;
        leak) s="leak: $(grep -m1 -E 'Direct leak|Indirect leak' "$log" || true)" ;;
    esac
    printf '%s' "$s"
}

# slug S: a file name from a signature: "device-model/src/hfi1/sdma_walk.rs:199:17: attempt to subtract with
# overflow" gives "sdma_walk-199-attempt-to-subtract-with-overflow".
slug() {
    printf '%s' "$1" | sed -E 's#[^ :]*/([^/ :]+)\.rs:([0-9]+)(:[0-9]+)?#\1-\2#; s/timeout after [0-9]+s( in )?//' |
        tr 'A-Z' 'a-z' | tr -c 'a-z0-9_\n' '-' | sed -E 's/-+/-/g; s/^-//; s/-$//' | cut -c1-60 | sed -E 's/-$//'
}

# reproduces T INPUT LOG: whether INPUT fails T again (its output in LOG).
reproduces() {
    ! "$BIN/$1" -runs=1 -timeout="${TIMEOUT[$1]}" -rss_limit_mb=2048 -artifact_prefix="$REPLAY_ARTIFACTS/" "$2" >"$3" 2>&1
}

# finding T ARTIFACT JSONFILE: reproduces ARTIFACT, minimises it, writes it to fuzz/regressions/T/, appends its
# JSON object to JSONFILE and prints its signature.
finding() {
    local t=$1 a=$2 json=$3 base kind sig name dest min minsig reg="" repro=true
    base=$(basename "$a")
    kind=${base%%-*}
    local rlog="$OUT/logs/$t.$base.log"
    if reproduces "$t" "$a" "$rlog"; then
        sig=$(signature "$t" "$rlog" "$kind")
        if [ "$kind" = crash ] || [ "$kind" = leak ]; then
            min="$OUT/artifacts/$t/minimized-$base"
            log "fuzz: $t: minimising $base ($sig)"
            timeout -k 10 "$MIN_SECONDS" "$BIN/$t" -minimize_crash=1 -runs="$MIN_STEP_RUNS" \
                -max_total_time=$((MIN_SECONDS / 5)) -timeout="${TIMEOUT[$t]}" -rss_limit_mb=2048 \
                -artifact_prefix="$REPLAY_ARTIFACTS/" -exact_artifact_path="$min" "$a" >"$OUT/logs/$t.$base.min.log" 2>&1 || true
            # The minimiser takes any crash: keep its result only if it is still this one.
            if [ -s "$min" ] && reproduces "$t" "$min" "$rlog.min" && [ "$(signature "$t" "$rlog.min" "$kind")" = "$sig" ]; then
                a=$min
            fi
        fi
        name="$kind-$(slug "$sig")"
        name=${name%-}
        dest="regressions/$t/$name"
        local n=2
        while [ -e "$dest" ] && ! cmp -s "$dest" "$a"; do dest="regressions/$t/$name-$n"; n=$((n + 1)); done
        mkdir -p "regressions/$t"
        cp "$a" "$dest"
        reg="fuzz/$dest"
        # What the input does, for whoever fixes it (libfuzzer-sys decodes it without running it).
        mkdir -p "$OUT/decoded/$t"
        RUST_LIBFUZZER_DEBUG_PATH="$OUT/decoded/$t/$base.txt" "$BIN/$t" -runs=1 "$a" >/dev/null 2>&1 || true
        log "fuzz: $t: $kind ($sig): regression input $reg ($(wc -c <"$a") bytes)"
    else
        repro=false
        sig=$(signature "$t" "$OUT/logs/$t.round.log" "$kind")
        log "fuzz: $t: $base did not fail again when replayed: kept in $OUT/artifacts/$t/, no regression input"
    fi
    printf '{"kind": %s, "signature": %s, "reproduces": %s, "artifact": %s, "regression": %s}\n' "$(json_str "$kind")" \
        "$(json_str "$sig")" "$repro" "$(json_str "$OUT/artifacts/$t/$base")" "$(json_str "$reg")" >>"$json"
    printf '%s' "$kind: $sig"
}

# num V: V if it is a number, else JSON's null.
num() { [[ "$1" =~ ^[0-9]+$ ]] && echo "$1" || echo null; }

# campaign_target T: T's whole campaign; leaves its table row in OUT/rows/T and its JSON object in OUT/json/T.
campaign_target() {
    local t=$1 corpus="$CORPORA/$1" art="$OUT/artifacts/$1" round=0 rc secs=0 start end left
    local -a dict=() fork=() seeds=() logs=() seen=()
    local -A handled=()
    local findings_json="$OUT/json/$t.findings"
    mkdir -p "$corpus" "$OUT/logs" "$OUT/rows" "$OUT/json"
    rm -rf "$art" "$OUT/logs/$t".* "$OUT/decoded/$t" "$OUT/seeds/$t"
    mkdir -p "$art" "$OUT/seeds/$t"
    : >"$findings_json"
    [ -f "dicts/$t.dict" ] && dict=(-dict="dicts/$t.dict")
    mapfile -t fork < <(fork_flags 1)
    # New inputs go to the first directory (the cache); the repo's seeds and regression inputs are only read, the
    # regression inputs as they were at the start (a finding written there now would fail the next round at once).
    [ -d "corpus/$t" ] && seeds+=("corpus/$t")
    if compgen -G "regressions/$t/*" >/dev/null; then
        cp regressions/"$t"/* "$OUT/seeds/$t/"
        seeds+=("$OUT/seeds/$t")
    fi
    end=$((SECONDS + CAMPAIGN_MINUTES * 60))
    while left=$((end - SECONDS)); [ "$left" -ge 10 ]; do
        round=$((round + 1))
        local logf="$OUT/logs/$t.round$round.log"
        logs+=("$logf")
        log "fuzz: $t: campaign round $round, ${left}s left (corpus $corpus)"
        start=$SECONDS rc=0
        touch "$logf.start"
        "$BIN/$t" "$corpus" "${seeds[@]}" "${dict[@]}" "${fork[@]}" -max_total_time="$left" -print_final_stats=1 \
            -timeout="${TIMEOUT[$t]}" -rss_limit_mb=2048 -artifact_prefix="$art/" "${EXTRA[@]}" >"$logf" 2>&1 || rc=$?
        secs=$((secs + SECONDS - start))
        cp "$logf" "$OUT/logs/$t.round.log"
        local a s new=0 repeat=0 sig
        for a in "$art"/crash-* "$art"/timeout-* "$art"/oom-* "$art"/leak-*; do
            [ -e "$a" ] || continue
            # An input found again is written again under its name (libFuzzer names it by its hash).
            if [ -n "${handled[$a]:-}" ]; then
                [ "$a" -nt "$logf.start" ] && { new=$((new + 1)) repeat=1; }
                continue
            fi
            handled[$a]=1
            new=$((new + 1))
            sig=$(finding "$t" "$a" "$findings_json")
            for s in "${seen[@]}"; do [ "$s" != "$sig" ] || repeat=1; done
            seen+=("$sig")
        done
        [ "$rc" = 0 ] && [ "$new" = 0 ] && break
        if [ "$new" = 0 ]; then
            printf '{"kind": "error", "signature": %s, "reproduces": false, "artifact": "", "regression": ""}\n' \
                "$(json_str "libFuzzer exited $rc without an artifact: $(grep -m1 -E 'ERROR|error' "$logf" || true)")" >>"$findings_json"
            log "fuzz: $t: libFuzzer exited $rc without an artifact (log $logf)"
            break
        fi
        [ "$repeat" = 1 ] && { log "fuzz: $t: the same finding again, stopping this target"; break; }
        [ "$(wc -l <"$findings_json")" -ge "$MAX_FINDINGS" ] && { log "fuzz: $t: $MAX_FINDINGS findings, stopping"; break; }
    done
    # Only what adds coverage stays in the cache (the repo's seeds with it, so the cache alone is a full corpus).
    log "fuzz: $t: merging the corpus"
    rm -rf "$corpus.merge"
    mkdir -p "$corpus.merge"
    if "$BIN/$t" -merge=1 -timeout="${TIMEOUT[$t]}" -rss_limit_mb=2048 -artifact_prefix="$REPLAY_ARTIFACTS/" \
        "$corpus.merge" "$corpus" "${seeds[@]}" >"$OUT/logs/$t.merge.log" 2>&1; then
        rm -rf "$corpus.old"
        mv "$corpus" "$corpus.old" && mv "$corpus.merge" "$corpus" && rm -rf "$corpus.old"
    else
        log "fuzz: $t: merge failed (log $OUT/logs/$t.merge.log); the corpus stays unmerged"
        rm -rf "$corpus.merge"
    fi
    local files bytes nfind result runs execs cov ft
    files=$(find "$corpus" -type f | wc -l)
    bytes=$(find "$corpus" -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')
    nfind=$(wc -l <"$findings_json")
    result=ok
    [ "$nfind" = 0 ] || result="$nfind finding(s)"
    table_row "$t" "$secs" "$files" "$result" "${logs[@]}" >"$OUT/rows/$t"
    read -r runs execs cov ft < <(log_stats "${logs[@]}")
    {
        printf '{"target": %s, "minutes": %s, "seconds": %s, "execs": %s, "execs_per_s": %s, "cov": %s, "ft": %s, ' \
            "$(json_str "$t")" "$CAMPAIGN_MINUTES" "$secs" "$(num "$runs")" "$(num "$execs")" "$(num "$cov")" "$(num "$ft")"
        printf '"corpus_files": %s, "corpus_bytes": %s, "corpus_dir": %s, "findings": [%s]}' "$files" "$bytes" \
            "$(json_str "$corpus")" "$(paste -sd, "$findings_json")"
    } >"$OUT/json/$t"
}

# The code the campaign runs: taken now, since the tree may move on while it runs.
CAMPAIGN_COMMIT=$(git -C "$REPO_ROOT" rev-parse HEAD)
CAMPAIGN_DIRTY=$([ -z "$(git -C "$REPO_ROOT" status --porcelain --untracked-files=no)" ] && echo false || echo true)
log "fuzz: campaign of ${CAMPAIGN_MINUTES} min per target: ${TARGETS[*]} ($([ "$PARALLEL" = 1 ] && echo "parallel, $(nproc) at a time" || echo "one after another")); results in $OUT"
rm -f "$OUT/campaign.json"
for t in "${TARGETS[@]}"; do rm -f "$OUT/rows/$t" "$OUT/json/$t"; done
if [ "$PARALLEL" = 1 ]; then
    for t in "${TARGETS[@]}"; do
        while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
        campaign_target "$t" &
    done
    wait
else
    for t in "${TARGETS[@]}"; do campaign_target "$t"; done
fi

table_header
FOUND=()
objs=()
for t in "${TARGETS[@]}"; do
    [ -s "$OUT/json/$t" ] || die "fuzz: $t's campaign left no result (logs in $OUT/logs/)"
    cat "$OUT/rows/$t"
    objs+=("$(cat "$OUT/json/$t")")
    [ -s "$OUT/json/$t.findings" ] && FOUND+=("$t")
done
{
    printf '{"commit": %s, "dirty": %s, "started_utc": %s, "cores": %s, "parallel": %s, "minutes_per_target": %s,\n' \
        "$(json_str "$CAMPAIGN_COMMIT")" "$CAMPAIGN_DIRTY" \
        "$(json_str "$(date -u -d "@$(( $(date +%s) - SECONDS ))" +%Y-%m-%dT%H:%MZ)")" "$(nproc)" \
        "$([ "$PARALLEL" = 1 ] && echo true || echo false)" "$CAMPAIGN_MINUTES"
    printf ' "targets": [\n'
    printf '  %s\n' "${objs[@]}" | sed '$!s/$/,/'
    printf ' ]}\n'
} >"$OUT/campaign.json"
echo
log "fuzz: campaign results in $OUT/campaign.json"
if [ ${#FOUND[@]} -gt 0 ]; then
    for t in "${FOUND[@]}"; do
        sed -n 's/.*"signature": \("[^"]*"\).*"regression": \("[^"]*"\).*/  '"$t"': \1 -> \2/p' "$OUT/json/$t.findings" >&2
    done
    die "fuzz: findings in ${FOUND[*]}: regression inputs in fuzz/regressions/ (replayed by every ci/fuzz.sh run), logs in $OUT/logs/"
fi
log "fuzz: no finding"
