#!/usr/bin/env bash
# Keeps the README and docs/ runnable: every command line they show for one of our programs (device-model,
# udriver, testbed, kernel-irdma, hfi1-user, hfi1-user-host) or scripts (ci/*.sh) uses only flags that the
# program's or script's --help lists (the subcommand's, for a program with subcommands); docs/README.md indexes
# every page of docs/; every relative link, anchors included, leads somewhere; and no tracked file carries git
# conflict markers. ci/test.sh runs it.
#
#   ci/check-docs.sh [--no-build] [FILE.md]...
#
#   --no-build   use the binaries already in target/debug (default: cargo build them first)
#   FILE.md      check these files (default: README.md, docs/*.md and every crate's README.md)
#
# A failure names the file and line, the command, the flag and the --help it is missing from.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

usage() { sed -n '2,12s/^# \{0,1\}//p' "$0" >&2; exit "${1:-2}"; }
BUILD=1 FILES=()
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) BUILD=0; shift ;;
        -h|--help) usage 0 ;;
        -*) log "unknown argument: $1"; usage ;;
        *) FILES+=("$1"); shift ;;
    esac
done
if [ ${#FILES[@]} -eq 0 ]; then
    FILES=(README.md docs/*.md)
    for f in */README.md testing/*/README.md; do FILES+=("$f"); done
fi

# A merge left half done: git's conflict markers in any tracked file (a line starting with seven of <, = or >
# and, for the outer two, a space).
markers=$(git grep -nE '^(<{7} |={7}$|>{7} )' -- . ':!*.rej' || true)
[ -z "$markers" ] || die "git conflict markers in tracked files:
$markers"

TARGET_DIR=${CARGO_TARGET_DIR:-$REPO_ROOT/target}
if [ "$BUILD" = 1 ]; then
    log "cargo build (the binaries whose --help the docs are checked against)"
    cargo build -q -p device-model -p udriver -p testbed -p hfi1-kernel-check -p kernel-conformance -p check-docs \
        --bins >&2
elif [ ! -x "$TARGET_DIR/debug/check-docs" ]; then
    cargo build -q -p check-docs >&2
fi

# The checks themselves: testing/check-docs.
"$TARGET_DIR/debug/check-docs" --bindir "$TARGET_DIR/debug" "${FILES[@]}"
