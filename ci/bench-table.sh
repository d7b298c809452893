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
command -v python3 >/dev/null || apt_install python3

python3 - "$RESULTS" "$DOC" "$CHECK" <<'EOF'
import json, sys

results, doc, check = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
BEGIN = "<!-- results table: written by ci/bench-table.sh from docs/bench/results.json; do not edit -->"
END = "<!-- end of results table -->"
r = json.load(open(results))


def fmt(v, unit):
    """A value with its unit, four significant figures, in the unit a reader expects."""
    if v is None:
        return "-"
    if unit == "x":
        return f"{v:,.3g}x" if v < 1000 else f"{v:,.0f}x"
    if unit == "ns":
        return f"{v / 1000:.3g} us" if v >= 1000 else f"{v:.3g} ns"
    if unit == "1/s":
        for div, pre in ((1e6, "M"), (1e3, "k")):
            if v >= div:
                return f"{v / div:.3g} {pre}/s"
        return f"{v:.3g}/s"
    if unit in ("s", "GB/s"):
        return f"{v:.3g} {unit}"
    return f"{v:,.4g} {unit}".strip()


def bound(t):
    return ("<= " if t["better"] == "lower" else ">= ") + fmt(t["bound"], t["unit"])


def cell(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def cpu(m):
    return f"{(m or {}).get('nproc', '?')} x {(m or {}).get('cpu_model', '?')}"


rows, met, total, carried = [], 0, 0, False
for c in r["cases"]:
    cid = f"({c['id']})" if len(c["id"]) == 1 else f"`{c['id']}`"
    elsewhere = "machine" in c and cpu(c["machine"]) != cpu(r.get("machine"))
    if c.get("date", r.get("date")) != r.get("date") or elsewhere:
        cid += f" (run of {c.get('date', r.get('date'))}" + (f" on {cpu(c['machine'])})" if elsewhere else ")")
        carried = True
    if c.get("error"):
        rows.append((cid, c["title"], c["error"], "-", "not run"))
        continue
    for t in c["targets"]:
        total += 1
        met += bool(t["met"])
        rows.append((cid, t["what"], f"**{fmt(t['measured'], t['unit'])}**", bound(t), "met" if t["met"] else "**missed**"))
    if c["targets"]:
        continue
    shown = [m for m in c["metrics"] if m.get("unit") == "x" and not m["name"].startswith("boot ")]
    for m in shown or c["metrics"][:3]:
        rows.append((cid, m["name"], fmt(m["value"], m.get("unit", "")), "-", "reported"))

m = r.get("machine", {})
head = (f"`ci/bench.sh` of {r.get('date', '?')}: {r.get('build', '?')} build, {m.get('nproc', '?')} x "
        f"{m.get('cpu_model', '?')}, kernel {m.get('kernel', '?')}, {r.get('budget_ms', '?')} ms per variant on the "
        f"host; **{met} of {total} targets met**. Plots: [results.svg](bench/results.svg), "
        f"[scale.svg](bench/scale.svg)." + (" Cases marked with an earlier run were not run this time "
                                             "(`ci/bench.sh --case`)." if carried else ""))
table = [head, "", "| Case | What | Measured | Target | |", "|---|---|---|---|---|"]
table += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]

text = open(doc).read()
if BEGIN not in text or END not in text:
    sys.exit(f"{doc} has no results table markers:\n{BEGIN}\n{END}")
before, rest = text.split(BEGIN, 1)
_, after = rest.split(END, 1)
new = before + BEGIN + "\n" + "\n".join(table) + "\n" + END + after
if check:
    if new != text:
        sys.exit(f"{doc}: the results table is not the one {results} gives; run ci/bench-table.sh")
    print(f"{doc}: the results table matches {results}", file=sys.stderr)
elif new != text:
    open(doc, "w").write(new)
    print(f"{doc}: results table written from {results}", file=sys.stderr)
EOF
