#!/usr/bin/env bash
# Runs the benchmark of issue 7 and writes docs/bench/results.json and docs/bench/results.svg.
#
#   ci/bench.sh [--budget-ms N] [--case ID]... [--no-qemu] [--out DIR]
#
#   --budget-ms N   wall time per measured variant (rig bench's default when not given)
#   --case ID       run only this rig bench case (a, b, c, d, e, spin; repeatable); implies --no-qemu
#   --no-qemu       skip (f), the QEMU end-to-end timing
#   --out DIR       where results.json and results.svg go (default docs/bench)
#
# (a)-(e) and the worker spin come from `rig bench --json` (release build, one process, ratios measured
# in that run). (f) boots the test guest under TCG twice with ci/run-qemu.sh --timing: with the device model
# and its two functions, and with --no-devices. It is skipped, with the reason in the results, when the
# script or QEMU or the guest cannot be had. The plot shows every target as measured/target on a log scale.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

usage() { sed -n '2,16s/^# \{0,1\}//p' "$0" >&2; exit "${1:-2}"; }
BUDGET="" CASES=() QEMU=1 OUT=docs/bench
while [ $# -gt 0 ]; do
    case "$1" in
        --budget-ms) [ $# -ge 2 ] || usage; BUDGET=$2; shift 2 ;;
        --case) [ $# -ge 2 ] || usage; CASES+=("$2"); QEMU=0; shift 2 ;;
        --no-qemu) QEMU=0; shift ;;
        --out) [ $# -ge 2 ] || usage; OUT=$2; shift 2 ;;
        -h|--help) usage 0 ;;
        *) log "unknown argument: $1"; usage ;;
    esac
done
[ -z "$BUDGET" ] || [[ $BUDGET =~ ^[0-9]+$ ]] || die "--budget-ms must be a number of milliseconds"
command -v python3 >/dev/null || apt_install python3

bash ci/setup-rust.sh
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO_ROOT/target}
log "cargo build --release -p rig"
cargo build --release -p rig >&2
WORK=$(mktemp -d /tmp/rdma-emu-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

ARGS=(bench --json)
[ -z "$BUDGET" ] || ARGS+=(--budget-ms "$BUDGET")
for c in "${CASES[@]}"; do ARGS+=(--case "$c"); done
log "rig ${ARGS[*]}"
"$TARGET_DIR/release/rig" "${ARGS[@]}" >"$WORK/udriver.json"

# (f): each run leaves its result JSON (with a "timing" object) in $WORK; a skip leaves its reason.
qemu_run() { # name [run-qemu.sh options]
    local name=$1
    shift
    log "ci/run-qemu.sh $* (TCG)"
    if ! bash ci/run-qemu.sh --accel tcg --timing --quiet --result "$WORK/qemu-$name.json" \
        --device-model "$DM" --udriver "$UDRIVER_STATIC" "$@" >&2; then
        echo "ci/run-qemu.sh $* failed (see its log above)" >"$WORK/qemu-skip"
        return 1
    fi
}
if [ "$QEMU" = 0 ]; then
    echo "not requested (--no-qemu or --case)" >"$WORK/qemu-skip"
elif [ ! -f ci/run-qemu.sh ]; then
    echo "ci/run-qemu.sh is not in this tree" >"$WORK/qemu-skip"
elif ! BUILT=$(bash ci/build.sh); then
    echo "ci/build.sh failed" >"$WORK/qemu-skip"
elif ! bash ci/get-qemu.sh >/dev/null; then
    echo "no QEMU >= 10.1 with vfio-user-pci (ci/get-qemu.sh failed)" >"$WORK/qemu-skip"
else
    DM=$(sed -n 1p <<<"$BUILT")
    UDRIVER_STATIC=$(sed -n 2p <<<"$BUILT")
    qemu_run devices && qemu_run no-devices --no-devices || true
    # (g): the stock hfi1 driver on the chip personality alone, for its probe time and trapped accesses.
    qemu_run kdriver --hfi1-wfr --hfi1-id none --irdma-id none || echo "ci/run-qemu.sh --hfi1-wfr failed" >"$WORK/kdriver-skip"
fi

mkdir -p "$OUT"
python3 - "$WORK" "$OUT" <<'EOF'
import json, math, os, sys
from xml.sax.saxutils import escape

work, out = sys.argv[1:]
report = json.load(open(os.path.join(work, "udriver.json")))
TARGET_ADDED_S = 2.0


def target(what, measured, bound, unit, better):
    met = measured >= bound if better == "higher" else measured <= bound
    if better == "higher":
        factor = bound / measured if measured > 0 else math.inf
    else:
        factor = measured / bound if bound > 0 else math.inf
    return {"what": what, "measured": measured, "bound": bound, "unit": unit, "better": better,
            "met": met, "factor": factor}


def qemu_case():
    case = {"id": "f", "title": "QEMU end-to-end under TCG: with the devices vs the same guest without them",
            "metrics": [], "targets": [], "notes": [], "error": None}
    skip = os.path.join(work, "qemu-skip")
    if os.path.exists(skip):
        case["error"] = "skipped: " + open(skip).read().strip()
        return case
    runs = {n: json.load(open(os.path.join(work, f"qemu-{n}.json"))) for n in ("devices", "no-devices")}
    t = {n: r.get("timing", {}) for n, r in runs.items()}
    for n in ("devices", "no-devices"):
        for k in ("device_model_start_s", "qemu_start_s", "kernel_boot_s", "init_s", "total_s"):
            if k in t[n]:
                case["metrics"].append({"name": f"{n}: {k.removesuffix('_s').replace('_', ' ')}",
                                        "value": t[n][k], "unit": "s"})
    demos = t["devices"].get("demo_s", {})
    for d, v in demos.items():
        case["metrics"].append({"name": f"devices: driver demo {d}", "value": v, "unit": "s"})
    if not all(r.get("ok") for r in runs.values()):
        case["error"] = "a guest run failed: " + "; ".join(p for r in runs.values() for p in r.get("problems", []))
    for k in ("qemu_start_s", "kernel_boot_s", "init_s"):
        d = t["devices"].get(k, 0) - t["no-devices"].get(k, 0)
        case["metrics"].append({"name": f"difference: {k.removesuffix('_s').replace('_', ' ')}",
                                "value": round(d, 3), "unit": "s"})
    # What the devices add: device-model start plus the whole run minus the demos' own work, against the run
    # without devices.
    added = (t["devices"].get("device_model_start_s", 0) + t["devices"].get("total_s", 0) - sum(demos.values())
             - t["no-devices"].get("total_s", 0))
    case["metrics"].append({"name": "added by the devices (dm start + total - demos - total without devices)",
                            "value": round(added, 3), "unit": "s"})
    case["targets"].append(target("time the devices add to the guest run", round(added, 3), TARGET_ADDED_S,
                                  "s", "lower"))
    case["notes"].append(f"accel {runs['devices'].get('accel')}, memory {runs['devices'].get('memory')}; "
                         "demo time is the driver's work inside the guest, reported apart")
    return case


def kdriver_case():
    """Reported, not judged: what the kernel's probe costs under TCG, and how many register accesses it traps."""
    case = {"id": "g", "title": "the stock Linux hfi1 driver on the chip personality (TCG guest)",
            "metrics": [], "targets": [], "notes": [], "error": None}
    for skip in ("qemu-skip", "kdriver-skip"):
        if os.path.exists(os.path.join(work, skip)):
            case["error"] = "skipped: " + open(os.path.join(work, skip)).read().strip()
            return case
    r = json.load(open(os.path.join(work, "qemu-kdriver.json")))
    if not r.get("ok"):
        case["error"] = "the guest run failed: " + "; ".join(r.get("problems", []))
    for step, s in (r.get("timing", {}).get("hfi1_probe_s") or {}).items():
        case["metrics"].append({"name": f"{step}: modprobe to hfi1_0 registered", "value": s, "unit": "s"})
    for step, a in (r.get("hfi1_wfr_step_accesses") or {}).items():
        for k in ("reads", "writes"):
            case["metrics"].append({"name": f"{step}: trapped CSR {k}", "value": a.get(k), "unit": "accesses"})
    case["notes"].append("counted by the device model's access log between the guest's step marks; the "
                         "RcvArray traps too on this personality (docs/hfi1-kernel-driver.md)")
    return case


report["cases"].append(qemu_case())
report["cases"].append(kdriver_case())
with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(report, f, indent=2)
    f.write("\n")

# The plot: per target, how far the measurement is on the good side of its target (>= 1 met), log scale.
rows = []
for c in report["cases"]:
    for t in c["targets"]:
        m, b = t["measured"], t["bound"]
        score = (m / b if t["better"] == "higher" else b / m) if m > 0 and b > 0 else 0.01
        op = ">=" if t["better"] == "higher" else "<="
        rows.append((f"({c['id']}) {t['what']}", score, t["met"], f"{m:.4g} {t['unit']} (target {op} {b:g})"))
W, LEFT, BAR, GAP, TOP = 980, 330, 22, 10, 60
PLOT = W - LEFT - 250
skipped = [c for c in report["cases"] if c.get("error")]
AXIS = TOP + len(rows) * (BAR + GAP) + 4
H = AXIS + 30 + 16 * len(skipped)
LO, HI = -2.0, 4.0  # log10 of score shown
x = lambda s: LEFT + (min(max(math.log10(max(s, 1e-9)), LO), HI) - LO) / (HI - LO) * PLOT
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="10" y="22" font-size="15" font-weight="bold">rig bench {escape(report["date"])}: '
       f'{escape(str(report["machine"]["nproc"]))} x {escape(report["machine"]["cpu_model"])}</text>',
       f'<text x="10" y="42">bar = measured / target, oriented so that right of the line (1x) meets the target; '
       f'log scale</text>']
for p in range(int(LO), int(HI) + 1):
    px = x(10 ** p)
    svg.append(f'<line x1="{px:.1f}" y1="{TOP - 6}" x2="{px:.1f}" y2="{AXIS}" stroke="#ddd"/>')
    svg.append(f'<text x="{px:.1f}" y="{AXIS + 16}" text-anchor="middle">{10 ** p:g}x</text>')
base = x(1.0)
svg.append(f'<line x1="{base:.1f}" y1="{TOP - 10}" x2="{base:.1f}" y2="{AXIS}" stroke="black" stroke-width="2"/>')
for i, (label, score, met, text) in enumerate(rows):
    y = TOP + i * (BAR + GAP)
    end = x(score)
    left, width = min(base, end), max(abs(end - base), 1.0)
    colour = "#3a9d23" if met else "#d03030"
    svg.append(f'<text x="{LEFT - 8}" y="{y + 15}" text-anchor="end">{escape(label)}</text>')
    svg.append(f'<rect x="{left:.1f}" y="{y}" width="{width:.1f}" height="{BAR}" fill="{colour}"/>')
    svg.append(f'<text x="{LEFT + PLOT + 8}" y="{y + 15}">{escape(text)}</text>')
for j, c in enumerate(skipped):
    svg.append(f'<text x="10" y="{AXIS + 36 + 16 * j}" fill="#777">({escape(c["id"])}) '
               f'{escape(c["error"][:140])}</text>')
svg.append("</svg>")
with open(os.path.join(out, "results.svg"), "w") as f:
    f.write("\n".join(svg) + "\n")
met = sum(t["met"] for c in report["cases"] for t in c["targets"])
total = sum(len(c["targets"]) for c in report["cases"])
print(f"{met}/{total} targets met; results in {out}/results.json and {out}/results.svg", file=sys.stderr)
EOF
