#!/usr/bin/env bash
# Writes docs/bench.md's results table from docs/bench/results.json (ci/bench.sh runs it after each run).
#
#   ci/bench-table.sh [--check] [--results FILE] [--doc FILE]
#
#   --check          change nothing; fail if the table in the doc is not the one the results give
#   --results FILE   the results (default docs/bench/results.json)
#   --doc FILE       the page whose table is replaced, between its two marker lines (default docs/bench.md)
#
# The table: every judged target, then, for each case without one, its ratios (or its first figures), and
# every case that was skipped with its reason. A case carried from an earlier run (ci/bench.sh --case) says so
# with that run's date, and its machine when that was another. Nothing else in the doc is touched.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

usage() { sed -n '2,12s/^# \{0,1\}//p' "$0" >&2; exit "${1:-2}"; }
CHECK=0 RESULTS=docs/bench/results.json DOC=docs/bench.md
while [ $# -gt 0 ]; do
    case "$1" in
        --check) CHECK=1; shift ;;
        --results) [ $# -ge 2 ] || usage; RESULTS=$2; shift 2 ;;
        --doc) [ $# -ge 2 ] || usage; DOC=$2; shift 2 ;;
        -h|--help) usage 0 ;;
        *) log "unknown argument: $1"; usage ;;
    esac
done
[ -f "$RESULTS" ] || die "no results at $RESULTS (ci/bench.sh writes them)"
[ -f "$DOC" ] || die "no $DOC"
guest_run_bin
# The table: testing/guest-run/src/bench/table.rs.
ARGS=(bench-table --results "$RESULTS" --doc "$DOC")
[ "$CHECK" = 0 ] || ARGS+=(--check)
"$GUEST_RUN" "${ARGS[@]}"
