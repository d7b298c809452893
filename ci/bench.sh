#!/usr/bin/env bash
# Runs the benchmarks of docs/bench.md and writes docs/bench/results.json, docs/bench/results.svg,
# docs/bench/scale.svg and the results table in docs/bench.md.
#
#   ci/bench.sh [--budget-ms N] [--case ID]... [--no-qemu] [--no-guest] [--guest-budget-ms N] [--guest-boots N]
#               [--verbs-boots N] [--out DIR]
#
#   --budget-ms N        wall time per measured variant (testbed bench's default when not given)
#   --case ID            run only this case (testbed bench's a, b, c, d, e, spin, scale, fabric, tid, or quiet, or
#                        the boots h, guest-verbs (with guest-verbs-iommu) and guest-tid; repeatable); implies
#                        --no-qemu for the other boots. The cases not run keep their entries from the results
#                        already in --out, each with the date of its run
#   --no-qemu            skip every guest boot: (f), (g), (h), the in-guest benchmark, guest-verbs and guest-tid
#   --no-guest           skip only the in-guest benchmark boots, guest-verbs and guest-tid
#   --guest-budget-ms N  wall time per measured variant inside the guest (default 1000)
#   --guest-boots N      in-guest benchmark boots per condition (default 3): where threads land is fixed per
#                        boot, so the trapped-access ratios are judged by their median over the boots
#   --verbs-boots N      guest-verbs boots (default 3): each boot's hfi1 / SoftRoCE ratios are measured in that
#                        boot, and the targets judge their median over the boots
#   --out DIR            where the results and plots go (default docs/bench)
#
# (a)-(e), the worker spin, the scale curves, `fabric` and `tid` (TID RDMA placed through the flow table against
# memcpy) come from `testbed bench --json` (release build, one process, ratios measured in that run); `quiet`, the device-model process's CPU idle and under a sparse client
# with its defaults, every knob at zero and --low-latency, from device-model's tests/quiet.rs (release). The targets are
# judged with the latency opt-in: testbed bench runs ours as `device-model --low-latency` does, and every boot below
# runs the device model with --low-latency. (f) boots the test guest under TCG twice with ci/run-qemu.sh --timing:
# with the device model and its two functions, and with --no-devices; (g) once with the chip personality; (h) once
# with the fabric (--fabric: two HFIs on one cable, modprobe to ACTIVE, the SM's sweep, accesses per SMP). The
# in-guest benchmark boots it --guest-boots times more with ci/run-qemu.sh --bench: `udriver bench` over VFIO
# against our functions, rust-vmm's peer, ours with the device model's defaults and QEMU's edu; where
# /dev/cpu_dma_latency is writable, as many boots again hold the host's idle exit latency at 0 us (PM QoS, for
# the boot only), reported as guest-a-lat0. A boot that cannot be had is skipped, with the reason in the
# results. One more boot with --reply-poll-us 0 (QEMU's vCPU waits for its I/O thread, as upstream) is reported
# as guest-a-no-reply-poll, not judged. guest-verbs boots the fabric --verbs-boots times (ci/run-qemu.sh --fabric
# --fabric-perf --hfi1-dma identity): perftest between the two emulated HFIs against SoftRoCE over a veth pair in
# the same guest, ratios from each boot, judged by their median; one more boot with the hfi1 functions behind the
# vIOMMU's translation (the run's default) is reported as guest-verbs-iommu, not judged. guest-tid boots the fabric
# with the kernel's TID RDMA (ci/run-qemu.sh --tid-rdma --fabric-perf --hfi1-dma identity): perftest READ and WRITE
# with TID RDMA, without it (OPFN cleared at run time) and on SoftRoCE, in that boot. The plot shows every target
# as measured/target on a log scale; scale.svg the curves.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

usage() { sed -n '2,/^source/{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit "${1:-2}"; }
BUDGET="" CASES=() QEMU=1 GUEST=1 GUEST_BUDGET=1000 GUEST_BOOTS=3 VERBS_BOOTS=3 OUT=docs/bench
while [ $# -gt 0 ]; do
    case "$1" in
        --budget-ms) [ $# -ge 2 ] || usage; BUDGET=$2; shift 2 ;;
        --case) [ $# -ge 2 ] || usage; CASES+=("$2"); QEMU=0; shift 2 ;;
        --no-qemu) QEMU=0; shift ;;
        --no-guest) GUEST=0; shift ;;
        --guest-budget-ms) [ $# -ge 2 ] || usage; GUEST_BUDGET=$2; shift 2 ;;
        --guest-boots) [ $# -ge 2 ] || usage; GUEST_BOOTS=$2; shift 2 ;;
        --verbs-boots) [ $# -ge 2 ] || usage; VERBS_BOOTS=$2; shift 2 ;;
        --out) [ $# -ge 2 ] || usage; OUT=$2; shift 2 ;;
        -h|--help) usage 0 ;;
        *) log "unknown argument: $1"; usage ;;
    esac
done
[ -z "$BUDGET" ] || [[ $BUDGET =~ ^[0-9]+$ ]] || die "--budget-ms must be a number of milliseconds"
[[ $GUEST_BUDGET =~ ^[0-9]+$ ]] || die "--guest-budget-ms must be a number of milliseconds"
[[ $GUEST_BOOTS =~ ^[1-9][0-9]?$ ]] || die "--guest-boots must be a number from 1 to 99"
[[ $VERBS_BOOTS =~ ^[1-9][0-9]?$ ]] || die "--verbs-boots must be a number from 1 to 99"
command -v python3 >/dev/null || apt_install python3
# guest-verbs and guest-tid are this script's own boots; the other cases are testbed bench's (and quiet's).
TB_CASES=() VERBS=0 TIDPERF=0 FABRIC=0
for c in "${CASES[@]}"; do
    case $c in guest-verbs|guest-verbs-iommu) VERBS=1 ;; guest-tid) TIDPERF=1 ;; h) FABRIC=1 ;; *) TB_CASES+=("$c") ;; esac
done
[ ${#CASES[@]} -gt 0 ] || { [ "$QEMU" = 1 ] && [ "$GUEST" = 1 ] && VERBS=1 && TIDPERF=1; }
[ ${#CASES[@]} -gt 0 ] || [ "$QEMU" = 0 ] || FABRIC=1
TESTBED=1
[ ${#CASES[@]} -eq 0 ] || [ ${#TB_CASES[@]} -gt 0 ] || TESTBED=0

bash ci/setup-rust.sh
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO_ROOT/target}
if [ "$TESTBED" = 1 ] || [ "$QEMU" = 1 ]; then
    log "cargo build --release -p testbed"
    cargo build --release -p testbed >&2
fi
# The device model's latency opt-in, given to every device model this script starts (docs/bench.md).
DM_OPT_IN=(--dm-arg --low-latency)
WORK=$(mktemp -d /tmp/rdma-emu-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

ARGS=(bench --json)
[ -z "$BUDGET" ] || ARGS+=(--budget-ms "$BUDGET")
for c in "${TB_CASES[@]}"; do ARGS+=(--case "$c"); done
if [ "$TESTBED" = 1 ]; then
    log "testbed ${ARGS[*]}"
    "$TARGET_DIR/release/testbed" "${ARGS[@]}" >"$WORK/udriver.json"
fi

# The idle and sparse-client CPU of the device-model process, defaults against every knob at zero and against
# --low-latency, side by side (it prints its figures as a case line).
if [ ${#CASES[@]} -eq 0 ] || printf '%s\n' "${CASES[@]}" | grep -qx quiet; then
    log "cargo test --release -p device-model --test quiet"
    cargo test --release -p device-model --test quiet -- --nocapture >"$WORK/quiet.log" 2>&1 ||
        echo "tests/quiet.rs failed (see its output)" >"$WORK/quiet-fail"
    sed -n 's/^BENCH_CASE //p' "$WORK/quiet.log" >"$WORK/quiet.json"
fi

# (f): each run leaves its result JSON (with a "timing" object) in $WORK; a skip leaves its reason.
qemu_run() { # name [run-qemu.sh options]
    local name=$1 skip
    shift
    log "ci/run-qemu.sh $* (TCG)"
    if ! bash ci/run-qemu.sh --accel tcg --timing --quiet --result "$WORK/qemu-$name.json" \
        --device-model "$DM" --udriver "$UDRIVER_STATIC" "${DM_OPT_IN[@]}" "$@" >&2; then
        # (f) cannot be judged without both of its runs; (g) and (h) report what their run left.
        case $name in devices|no-devices) skip=qemu-skip ;; *) skip=$name-failed ;; esac
        echo "ci/run-qemu.sh $* failed (see its log above)" >"$WORK/$skip"
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
    qemu_run kdriver --hfi1-wfr --hfi1-id none --irdma-id none || true
    # The in-guest benchmark: udriver bench over VFIO, with rust-vmm's peer and QEMU's edu beside our functions.
    if [ "$GUEST" = 1 ]; then
        guest_boot() { # result-file label skip-file [more ci/run-qemu.sh options]
            bash ci/run-qemu.sh --accel tcg --quiet --bench --testbed "$TARGET_DIR/release/testbed" "${DM_OPT_IN[@]}" "${@:4}" \
                --bench-budget-ms "$GUEST_BUDGET" --result "$1" --device-model "$DM" --udriver "$UDRIVER_STATIC" >&2 ||
                echo "$2 failed (see its log above)" >>"$3"
        }
        for k in $(seq "$GUEST_BOOTS"); do
            log "ci/run-qemu.sh --bench (TCG), boot $k of $GUEST_BOOTS"
            guest_boot "$WORK/qemu-guest-$k.json" "ci/run-qemu.sh --bench, boot $k" "$WORK/guest-skip"
        done
        # As many again with the host's idle CPUs polling instead of halting (a PM QoS request of 0 us, held
        # open for the boot): on a VM, waking a halted vCPU is most of every trapped access's thread
        # hand-offs, the same for every server, and it hides what the servers themselves cost.
        if [ -w /dev/cpu_dma_latency ]; then
            for k in $(seq "$GUEST_BOOTS"); do
                log "ci/run-qemu.sh --bench (TCG), idle exit latency held at 0 us, boot $k of $GUEST_BOOTS"
                ( exec 9>/dev/cpu_dma_latency && printf '\0\0\0\0' >&9 &&
                  guest_boot "$WORK/qemu-guest-lat0-$k.json" "the boot $k with idle latency 0" \
                      "$WORK/guest-lat0-skip" 9>&- ) || echo "boot $k: no PM QoS request" >>"$WORK/guest-lat0-skip"
            done
        else
            echo "/dev/cpu_dma_latency is not writable here" >"$WORK/guest-lat0-skip"
        fi
        # One boot of QEMU as it is upstream, its vCPU waiting for the I/O thread to read each reply
        # (qemu-patches/0005 off): what the patch is worth, same servers, same run. Reported, not judged.
        log "ci/run-qemu.sh --bench --reply-poll-us 0 (TCG)"
        guest_boot "$WORK/qemu-guest-nopoll-1.json" "ci/run-qemu.sh --bench --reply-poll-us 0" \
            "$WORK/guest-nopoll-skip" --reply-poll-us 0
    else
        echo "not requested (--no-guest)" | tee "$WORK/guest-lat0-skip" "$WORK/guest-nopoll-skip" >"$WORK/guest-skip"
    fi
fi
[ "$QEMU" = 1 ] || echo "not requested (--no-qemu or --case)" | tee "$WORK/guest-lat0-skip" "$WORK/guest-nopoll-skip" >"$WORK/guest-skip"

# What a boot of its own needs: the device model and the static udriver (built once) and QEMU. False, with the
# reason in SKIP-FILE, when one cannot be had.
boot_prereqs() { # skip-file
    if [ -z "${DM:-}" ] && ! { BUILT=$(bash ci/build.sh) && DM=$(sed -n 1p <<<"$BUILT") \
        && UDRIVER_STATIC=$(sed -n 2p <<<"$BUILT"); }; then
        echo "ci/build.sh failed" >"$1"
        return 1
    fi
    bash ci/get-qemu.sh >/dev/null && return 0
    echo "no QEMU >= 10.1 with vfio-user-pci (ci/get-qemu.sh failed)" >"$1"
    return 1
}

# (h): the fabric, two HFIs on one cable brought to ACTIVE by the stock driver and opa-fm: its bring-up times,
# the SM's sweep and the trapped accesses per SMP, from the fabric run's own steps.
if [ "$FABRIC" = 1 ] && boot_prereqs "$WORK/fabric-failed"; then
    qemu_run fabric --fabric || true
fi

# One boot with a benchmark after the run's steps, its result in RESULT-FILE; a skip leaves its reason.
perf_boot() { # wanted(0|1) skip-file result-file run-qemu.sh options...
    local wanted=$1 skip=$2 result=$3
    shift 3
    if [ "$wanted" = 0 ]; then
        echo "not requested (--no-qemu, --no-guest or --case)" >"$skip"
        return 0
    fi
    boot_prereqs "$skip" || return 0
    log "ci/run-qemu.sh $* (TCG)"
    bash ci/run-qemu.sh --accel tcg --quiet "$@" "${DM_OPT_IN[@]}" --result "$result" \
        --device-model "$DM" --udriver "$UDRIVER_STATIC" >&2 || log "ci/run-qemu.sh $* failed"
}
# guest-verbs: the fabric run with the verbs benchmark after its steps (ci/guest/perf.sh): perftest between hfi1_0
# and hfi1_1 across the device model's cable, then the same commands on SoftRoCE over a veth pair. Both transports
# share the boot's one vCPU and the host's two CPUs, and where QEMU's and the device model's threads land is
# fixed per boot, so each boot gives its own ratios and the targets judge their median. The hfi1 functions get an
# identity IOMMU domain (--hfi1-dma identity): SoftRoCE maps nothing for DMA, while hfi1 maps and unmaps every
# packet, which QEMU's vIOMMU makes a blocking round trip to the device model; guest-verbs-iommu is that cost.
for k in $(seq "$VERBS_BOOTS"); do
    perf_boot "$VERBS" "$WORK/verbs-skip" "$WORK/qemu-verbs-$k.json" --fabric --fabric-perf --hfi1-dma identity
    [ ! -e "$WORK/verbs-skip" ] || break # not requested, or no boot to be had: the same for every boot
done
[ -e "$WORK/verbs-skip" ] && cp "$WORK/verbs-skip" "$WORK/verbs-iommu-skip" \
    || perf_boot "$VERBS" "$WORK/verbs-iommu-skip" "$WORK/qemu-verbs-iommu.json" --fabric --fabric-perf
# guest-tid: the TID RDMA run with its benchmark after its steps (ci/guest/perf.sh step_tid_perf).
perf_boot "$TIDPERF" "$WORK/tidperf-skip" "$WORK/qemu-tid.json" --tid-rdma --fabric-perf --hfi1-dma identity

mkdir -p "$OUT"
python3 - "$WORK" "$OUT" "${#CASES[@]}" <<'EOF'
import json, math, os, re, sys
from xml.sax.saxutils import escape

work, out, partial = sys.argv[1], sys.argv[2], sys.argv[3] != "0"
previous_path = os.path.join(out, "results.json")
previous = json.load(open(previous_path)) if partial and os.path.exists(previous_path) else None
if os.path.exists(os.path.join(work, "udriver.json")):
    report = json.load(open(os.path.join(work, "udriver.json")))
else:
    # Only this script's own cases were asked for: the header of the results already there, with today's date
    # and this machine (as testbed bench names it: the first "model name" of /proc/cpuinfo).
    from datetime import datetime, timezone
    report = {k: v for k, v in (previous or {}).items() if k != "cases"}
    models = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")]
    report.update(tool=report.get("tool", "testbed bench"), cases=[],
                  date=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  machine={"nproc": os.cpu_count(), "cpu_model": models[0] if models else "unknown",
                           "kernel": os.uname().release})
TARGET_ADDED_S = 2.0
quiet_json = os.path.join(work, "quiet.json")
if os.path.exists(quiet_json) and os.path.getsize(quiet_json) > 0:
    quiet = json.loads(open(quiet_json).read().splitlines()[0])
    if os.path.exists(os.path.join(work, "quiet-fail")):
        quiet["error"] = "device-model tests/quiet.rs failed: a target was missed or the run broke"
    report["cases"].append(quiet)


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


def run_result(case, name):
    """The result JSON of the boot `name`, or None with the case's error saying why there is none. A run that
    failed part-way still left its figures: the case reports them beside the failure."""
    path = os.path.join(work, f"qemu-{name}.json")
    if not os.path.exists(path):
        why = [open(f).read().strip() for f in (os.path.join(work, f"{name}-failed"), os.path.join(work, "qemu-skip"))
               if os.path.exists(f)]
        case["error"] = "skipped: " + (why[0] if why else "the boot left no result")
        return None
    return json.load(open(path))


def kdriver_case():
    """Reported, not judged: what the kernel's probe costs under TCG, and how many register accesses it traps."""
    case = {"id": "g", "title": "the stock Linux hfi1 driver on the chip personality (TCG guest)",
            "metrics": [], "targets": [], "notes": [], "error": None}
    r = run_result(case, "kdriver")
    if r is None:
        return case
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


def boots(prefix):
    """The in-guest boots' reports, in boot order: (boot number, result JSON) for each file that was written."""
    found = []
    for name in os.listdir(work):
        m = re.fullmatch(re.escape(prefix) + r"-(\d+)\.json", name)
        if m:
            found.append((int(m.group(1)), json.load(open(os.path.join(work, name)))))
    return sorted(found, key=lambda b: b[0])


def median(xs):
    if not xs:
        return math.nan
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def over_boots(runs):
    """One case from several boots' (boot number, case) of the same id: where threads land is fixed per boot, so
    each figure is the median over the boots of that boot's value, and each target the median of the boots'
    ratios (every boot's ratio is a metric too)."""
    first = runs[0][1]
    if len(runs) == 1:
        return first
    case = dict(first, metrics=[], targets=[], notes=list(first.get("notes", [])))
    for m in first.get("metrics", []):
        vals = [v for _, c in runs for x in c.get("metrics", []) if x["name"] == m["name"] for v in [x["value"]]]
        case["metrics"].append(dict(m, value=median(vals)))
    for t in first.get("targets", []):
        per = [(k, x["measured"]) for k, c in runs for x in c.get("targets", []) if x["what"] == t["what"]]
        for k, v in per:
            case["metrics"].append({"name": f"boot {k}: {t['what']}", "value": v, "unit": t["unit"]})
        case["targets"].append(target(t["what"] + f", median of {len(per)} boots", median([v for _, v in per]),
                                      t["bound"], t["unit"], t["better"]))
    case["notes"].append(f"{len(runs)} boots (" + ", ".join(str(k) for k, _ in runs) + "): every figure is the "
                         "median over the boots of that boot's figure, and the target the median of the boots' "
                         "ratios")
    return case


def guest_cases():
    """udriver bench's own report from inside the guest: its cases join ours, ids guest-*. The trapped accesses
    (guest-a) come from every boot, the other cases from the first boot that reported."""
    skip = os.path.join(work, "guest-skip")
    why = open(skip).read().strip() if os.path.exists(skip) else ""
    reported = [(k, r) for k, r in boots("qemu-guest") if isinstance(r.get("bench"), dict) and r["bench"].get("cases")]
    if reported:
        bench = reported[0][1]["bench"]
        cases = bench["cases"]
        ga = [(k, c) for k, r in reported for c in r["bench"]["cases"]
              if c.get("id") == "guest-a" and not c.get("error")]
        cases = [over_boots(ga) if c.get("id") == "guest-a" and ga else c for c in cases]
        failed = "; ".join(p for k, r in boots("qemu-guest") if k not in dict(reported)
                           for p in r.get("problems", []))
        for c in cases:
            if why:
                c["notes"].append(why + (f" ({failed})" if failed else ""))
            if c.get("id") == "guest-a":
                c["notes"].append("ours: the device model run with --low-latency (the opt-in the targets are judged "
                                  "with); ours, defaults: the same hfi1 function served with the device model's "
                                  "defaults (testbed serve-peers), judged by nothing, reported against the peer")
            c["notes"].append(f"measured inside the TCG guest by udriver bench ({bench.get('date')}, budget "
                              f"{bench.get('budget_ms')} ms per variant, guest nproc {bench['machine']['nproc']})")
        return cases
    problems = "; ".join(p for _, r in boots("qemu-guest") for p in r.get("problems", []))
    return [{"id": "guest", "title": "in-guest benchmark (udriver bench over VFIO)", "metrics": [], "targets": [],
             "notes": [], "error": "skipped: " + (why or "no report from the guest") +
             (f" ({problems})" if problems else "")}]


def fabric_case():
    """Reported, not judged: the fabric's bring-up in the TCG guest, from the steps of ci/guest/fabric.sh."""
    case = {"id": "h", "title": "the fabric: two HFIs on one cable brought to ACTIVE by the stock driver and opa-fm "
            "(TCG guest)", "metrics": [], "targets": [], "notes": [], "error": None}
    r = run_result(case, "fabric")
    if r is None:
        return case
    steps = {s.get("name"): s for s in (r.get("guest") or {}).get("steps", [])}
    if not r.get("ok"):
        case["error"] = "the guest run failed: " + "; ".join(r.get("problems", []))
    # The first three are the table's (ci/bench-table.sh shows a reported case's first figures).
    acc = steps.get("fabric-smp", {}).get("accesses") or {}
    figures = [("fabric-sm", "active_s", "modprobe to both ports ACTIVE", "s"),
               ("fabric-sm", "sweep_s", "the SM's sweep (its DISCOVERY CYCLE END line)", "s"),
               (None, acc.get("per_smp"), f"trapped CSR accesses per SMP (opasmaquery, {acc.get('smps')} SMPs, both "
                "HFIs, idle background subtracted)", "accesses"),
               ("fabric-modprobe", "probe_s", "modprobe hfi1 to both functions registered", "s"),
               ("fabric-init", "init_s", "modprobe to both ports LinkUp/INIT", "s"),
               ("fabric-sm", "sm_to_active_s", "opa-fm start to both ports ACTIVE", "s")]
    for step, key, name, unit in figures:
        v = key if step is None else steps.get(step, {}).get(key)
        if v is not None:
            case["metrics"].append({"name": name, "value": v, "unit": unit})
    for name, s in steps.items():
        if name.startswith("verbs-") and name.endswith("-bw") and s.get("bw_avg_mb_s") is not None:
            case["metrics"].append({"name": f"{name}: perftest BW average ({s.get('bytes')} B messages)",
                                    "value": s["bw_avg_mb_s"], "unit": "MB/s"})
    if not case["metrics"] and not case["error"]:
        case["error"] = "the fabric run reported none of its figures"
    case["notes"].append("the times are the guest's clock from modprobe hfi1 (ci/guest/fabric.sh); the cable trains "
                         "for its default 1 s once both ends poll (docs/hfi1-fabric.md)")
    return case


report["cases"].append(qemu_case())
report["cases"].append(kdriver_case())
report["cases"].append(fabric_case())
report["cases"].extend(guest_cases())


def condition_case(prefix, cid, title, tag, note, judged):
    """The in-guest trapped accesses once more under another condition, from the boots written as prefix-N.json:
    judged against the same target (judged), or with the targets turned into metrics (a reference)."""
    ga = [(k, c) for k, r in boots(prefix) for c in (r.get("bench") or {}).get("cases", [])
          if c.get("id") == "guest-a" and not c.get("error")]
    if not ga:
        skip = os.path.join(work, prefix.replace("qemu-guest", "guest") + "-skip")
        why = open(skip).read().strip() if os.path.exists(skip) else "no report from the guest"
        return [{"id": cid, "title": f"in-guest trapped accesses, {tag}", "metrics": [], "targets": [],
                 "notes": [], "error": "skipped: " + why}]
    for _, c in ga:
        for t in c.get("targets", []):
            t["what"] += f" ({tag})"
    case = over_boots(ga)
    case["id"] = cid
    case["title"] += ", " + title
    case["notes"].append(note)
    if not judged:
        case["metrics"] += [{"name": t["what"], "value": t["measured"], "unit": t["unit"]} for t in case["targets"]]
        case["targets"] = []
    return [case]


report["cases"].extend(condition_case(
    "qemu-guest-lat0", "guest-a-lat0", "with the host's idle exit latency held at 0 us (/dev/cpu_dma_latency)",
    "idle latency 0", "boots made as guest-a's, with a PM QoS request of 0 us held open: idle CPUs poll instead of "
    "halting, so a thread hand-off does not wait for a halted vCPU to wake", judged=True))
def verbs_case():
    """perftest in the guest over the emulated HFIs against SoftRoCE (ci/guest/perf.sh), over the boots: each
    boot's figures and ratios from that boot, the case's their medians (over_boots)."""
    skip = os.path.join(work, "verbs-skip")
    if os.path.exists(skip):
        return verbs_boot_case({}, skip)
    per = [(k, verbs_boot_case(r)) for k, r in boots("qemu-verbs")]
    good = [(k, c) for k, c in per if not c.get("error")]
    case = over_boots(good) if good else per[0][1] if per else verbs_boot_case({})
    if len(good) == 1:
        case["notes"].append(f"one boot ({good[0][0]})")
    for k, c in per:
        if c.get("error") and c is not case:
            case["notes"].append(f"boot {k} left out: {c['error']}"[:600])
    return case


def verbs_iommu_case():
    """The same benchmark in one boot with the hfi1 functions in the kernel's default, translated DMA domain:
    what QEMU's vIOMMU costs hfi1's send path. Reported, not judged."""
    skip = os.path.join(work, "verbs-iommu-skip")
    path = os.path.join(work, "qemu-verbs-iommu.json")
    r = json.load(open(path)) if os.path.exists(path) else {}
    case = verbs_boot_case(r, skip if os.path.exists(skip) else None, "translated")
    case["targets"] = []
    case["notes"].append("one boot")
    return case


VERBS_TITLE = ("in the guest: perftest over the emulated HFIs (hfi1_0 -> hfi1_1 across the cable) against SoftRoCE "
               "(rdma_rxe over a veth pair), TCG")


def verbs_boot_case(r, skip=None, dma="identity"):
    """One boot of perftest over the emulated HFIs against SoftRoCE, both measured in that boot: bandwidth per
    size and tool, latency, and the 1 MiB bandwidth target per tool. DMA is the IOMMU domain the hfi1 functions
    were to have (ci/run-qemu.sh --hfi1-dma): identity for guest-verbs, translated for guest-verbs-iommu."""
    case = {"id": "guest-verbs" if dma == "identity" else "guest-verbs-iommu",
            "title": VERBS_TITLE + (", hfi1 in an identity IOMMU domain" if dma == "identity" else
                                    ", hfi1 behind the vIOMMU's translation (caching mode, strict)"),
            "metrics": [], "targets": [], "notes": [], "error": None}
    if skip:
        case["error"] = "skipped: " + open(skip).read().strip()
        return case
    if r and r.get("hfi1_wfr_dma") != dma:
        case["error"] = f"the boot ran the hfi1 functions with --hfi1-dma {r.get('hfi1_wfr_dma')}, not {dma}"
        return case
    perf = r.get("fabric_perf")
    step = guest_step(r, "fabric-perf")
    if not perf or not step:
        case["error"] = "the guest reported no fabric-perf: " + ("; ".join(r.get("problems", [])) or "no result")
        return case
    for row in perf.get("bw", []):
        b = row["bytes"]
        what = f"{row['tool']} " + (f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB")
        for who in ("hfi1", "rxe"):
            if row.get(who):
                case["metrics"].append({"name": f"{what}: {who}", "value": row[who]["mib_s"], "unit": "MiB/s"})
        if row.get("ratio") is not None:
            # The results table shows "x" figures of a case without targets: 1 MiB stands for the sizes.
            case["metrics"].append({"name": f"{what}: hfi1 / rxe", "value": row["ratio"],
                                    "unit": "x" if b == 1048576 else "ratio"})
        if row["bytes"] == 1048576:
            if row.get("ratio") is not None:
                case["targets"].append(target(f"{row['tool']} 1 MiB: hfi1 / SoftRoCE bandwidth", row["ratio"],
                                              1.0, "x", "higher"))
            else:
                case["notes"].append(f"{row['tool']} 1 MiB: no ratio (a transport gave no figure)")
    for row in perf.get("lat", []):
        what = f"{row['tool']} {row['bytes']} B typical latency"
        for who in ("hfi1", "rxe"):
            if row.get(who):
                case["metrics"].append({"name": f"{what}: {who}", "value": row[who]["typical_us"], "unit": "us"})
        if row.get("ratio") is not None:
            case["metrics"].append({"name": f"{what}: hfi1 / rxe (lower is better)", "value": row["ratio"],
                                    "unit": "x"})
    # What the device model saw of each hfi1 bandwidth run at 1 MiB (set-up and tear-down included).
    for a in perf.get("hfi1_accesses", []):
        if a["bytes"] == 1048576 and a["packets"] > 0:
            mib = a["bytes"] * a["iters"] / 1048576
            case["metrics"].append({"name": f"{a['tool']} 1 MiB on hfi1: cable packets per MiB",
                                    "value": round(a["packets"] / mib, 1), "unit": "packets"})
            case["metrics"].append({"name": f"{a['tool']} 1 MiB on hfi1: trapped CSR accesses per cable packet",
                                    "value": round((a["reads"] + a["writes"]) / a["packets"], 2), "unit": "accesses"})
            # The reads are what the vCPU waits for: QEMU posts BAR writes to a function with nothing mmappable.
            case["metrics"].append({"name": f"{a['tool']} 1 MiB on hfi1: trapped CSR reads per cable packet",
                                    "value": round(a["reads"] / a["packets"], 2), "unit": "reads"})
    if not step.get("ok"):
        case["error"] = "step fabric-perf failed: " + str(step.get("error"))
    other = [p for p in r.get("problems", []) if "fabric-perf" not in p]
    if other:
        case["notes"].append("the fabric run's other problems (not the benchmark's): " + "; ".join(other)[:600])
    case["notes"].append(f"hfi1 MTU {perf['hfi1'].get('active_mtu')}, rxe MTU {perf['rxe'].get('active_mtu')} "
                         f"(veth at 9000); MiB/s as perftest's MB/sec; the device model run with --low-latency; "
                         f"the hfi1 functions' IOMMU domains: {modprobe_domains(r)}; guest on TCG")
    case["notes"].append("latency: perftest's two processes busy-poll on the guest's one vCPU, so each ping-pong "
                         "waits for the scheduler's tick (HZ 250, 4 ms): the typical latency counts ticks for both "
                         "transports, it is not the wire's")
    return case


def guest_step(r, name):
    """The guest's record of step NAME in a run-qemu.sh result, or None."""
    return next((s for s in ((r.get("guest") or {}).get("steps") or []) if s.get("name") == name), None)


def modprobe_domains(r):
    """The IOMMU domain of each hfi1 function as the guest read it after modprobe (step fabric-modprobe)."""
    return (guest_step(r, "fabric-modprobe") or {}).get("iommu_domains") or "not reported"


report["cases"].append(verbs_case())
report["cases"].append(verbs_iommu_case())


def tid_case():
    """perftest READ and WRITE in one TID RDMA boot (ci/guest/perf.sh step_tid_perf): on hfi1 with TID RDMA, on
    hfi1 without it (OPFN cleared) and on SoftRoCE; the share of each hfi1 run's bytes placed through TIDs."""
    case = {"id": "guest-tid",
            "title": "in the guest: perftest READ and WRITE over the emulated HFIs with the kernel's TID RDMA, "
                     "without it, and on SoftRoCE (rdma_rxe over a veth pair), TCG", "metrics": [], "targets": [],
            "notes": [], "error": None}
    skip = os.path.join(work, "tidperf-skip")
    if os.path.exists(skip):
        case["error"] = "skipped: " + open(skip).read().strip()
        return case
    path = os.path.join(work, "qemu-tid.json")
    r = json.load(open(path)) if os.path.exists(path) else {}
    perf = r.get("fabric_perf")
    step = guest_step(r, "tid-perf")
    if not perf or not step or perf.get("kind") != "tid":
        case["error"] = "the guest reported no tid-perf: " + ("; ".join(r.get("problems", [])) or "no result")
        return case
    names = {"tid": "hfi1 TID RDMA", "plain": "hfi1 plain RDMA", "rxe": "SoftRoCE"}
    for row in perf.get("bw", []):
        b = row["bytes"]
        what = f"{row['tool']} " + (f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB")
        for who, label in names.items():
            if row.get(who):
                case["metrics"].append({"name": f"{what}: {label}", "value": row[who]["mib_s"], "unit": "MiB/s"})
        # The ratios at 1 MiB (guest-verbs' size) go to the results table; the others stay in the figures.
        for key, label in (("tid_over_plain", "TID / plain"), ("tid_over_rxe", "TID / SoftRoCE"),
                           ("plain_over_rxe", "plain / SoftRoCE")):
            if row.get(key) is not None:
                case["metrics"].append({"name": f"{what}: {label}", "value": row[key],
                                        "unit": "x" if b == 1048576 else "ratio"})
        share = row.get("tid_share") or {}
        for who in ("tid", "plain"):
            if share.get(who) is not None:
                case["metrics"].append({"name": f"{what}: bytes through TIDs, {names[who]} run",
                                        "value": share[who], "unit": "share"})
    if not step.get("ok"):
        case["error"] = "step tid-perf failed: " + str(step.get("error"))
    other = [p for p in r.get("problems", []) if "tid-perf" not in p]
    if other:
        case["notes"].append("the TID RDMA run's other problems (not the benchmark's): " + "; ".join(other)[:600])
    case["notes"].append(f"perftest at send queue depth {perf.get('depth')} on all three (only work requests posted "
                         f"after a QP's OPFN go by TID RDMA); hfi1 cap_mask {perf.get('cap_mask')}, OPFN cleared "
                         f"for the plain runs; the device model run with --low-latency; the hfi1 functions' IOMMU "
                         f"domains: {modprobe_domains(r)}; one boot, guest on TCG")
    return case


report["cases"].append(tid_case())
report["cases"].extend(condition_case(
    "qemu-guest-nopoll", "guest-a-no-reply-poll", "QEMU's vCPU waiting for its I/O thread to read each reply",
    "no reply poll", "a boot made as guest-a's with ci/run-qemu.sh --reply-poll-us 0: every server's replies are "
    "read by QEMU's I/O thread, which wakes the vCPU thread (QEMU upstream); a reference, not judged", judged=False))
if previous:
    # A partial run (--case): the cases it did not run keep their entries from the results already there, each
    # with the date of the run that measured it and the machine it ran on (the header names this run's).
    ran = {c["id"]: c for c in report["cases"] if not str(c.get("error") or "").startswith("skipped: not requested")}
    for c in ran.values():
        c["date"] = report["date"]
        c.pop("machine", None)
    merged = []
    for c in previous.get("cases", []):
        if c["id"] in ran:
            merged.append(ran.pop(c["id"]))
        else:
            c.setdefault("date", previous.get("date"))
            c.setdefault("machine", previous.get("machine"))
            merged.append(c)
    merged += [c for c in report["cases"] if c["id"] in ran]
    report["cases"] = merged
with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(report, f, indent=2)
    f.write("\n")

# The plot: per target, how far the measurement is on the good side of its target (>= 1 met), log scale.
rows = []
for c in report["cases"]:
    for t in c["targets"]:
        m, b = t["measured"], t["bound"]
        if m > 0 and b > 0:
            score = m / b if t["better"] == "higher" else b / m
        else:
            score = 10 ** 4 if t["met"] else 0.01
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
       f'<text x="10" y="22" font-size="15" font-weight="bold">testbed bench {escape(report["date"])}: '
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

# Scale curves: one log-log panel per unit, every curve of that unit in it.
scale = next((c for c in report["cases"] if c["id"] == "scale"), None)
curves = (scale or {}).get("curves") or []
if curves:
    units = []
    for cv in curves:
        if (cv["unit"], cv["x"]) not in units:
            units.append((cv["unit"], cv["x"]))
    PW, PH, M, COLS = 440, 260, 60, 2
    rows_n = (len(units) + COLS - 1) // COLS
    W2, H2 = COLS * (PW + M) + M, rows_n * (PH + 2 * M) + 40
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    g = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W2}" height="{H2}" font-family="sans-serif" font-size="11">',
         f'<rect width="{W2}" height="{H2}" fill="white"/>',
         f'<text x="10" y="20" font-size="14" font-weight="bold">testbed bench scale, {escape(scale.get("date", report["date"]))}: '
         f'how the cost grows with the work (log-log)</text>']
    for i, (unit, xname) in enumerate(units):
        ox, oy = M + (i % COLS) * (PW + M), 40 + M // 2 + (i // COLS) * (PH + 2 * M)
        mine = [cv for cv in curves if (cv["unit"], cv["x"]) == (unit, xname)]
        pts = [p for cv in mine for p in cv["points"] if p[0] > 0 and p[1] > 0]
        if not pts:
            continue
        lx = [math.log10(p[0]) for p in pts]
        ly = [math.log10(p[1]) for p in pts]
        x0, x1 = min(lx), max(lx) + 1e-9
        y0, y1 = math.floor(min(ly)), math.ceil(max(ly) + 1e-9)
        if y1 - y0 < 1:
            y1 = y0 + 1
        X = lambda v: ox + (math.log10(v) - x0) / (x1 - x0) * PW
        Y = lambda v: oy + PH - (math.log10(v) - y0) / (y1 - y0) * PH
        g.append(f'<rect x="{ox}" y="{oy}" width="{PW}" height="{PH}" fill="none" stroke="#999"/>')
        for d in range(int(y0), int(y1) + 1):
            yy = oy + PH - (d - y0) / (y1 - y0) * PH
            g.append(f'<line x1="{ox}" y1="{yy:.1f}" x2="{ox + PW}" y2="{yy:.1f}" stroke="#eee"/>')
            g.append(f'<text x="{ox - 4}" y="{yy + 4:.1f}" text-anchor="end">{10 ** d:g}</text>')
        xs = sorted({p[0] for p in pts})
        for v in xs:
            g.append(f'<text x="{X(v):.1f}" y="{oy + PH + 14}" text-anchor="middle">{v:g}</text>')
        g.append(f'<text x="{ox + PW / 2}" y="{oy + PH + 30}" text-anchor="middle">{escape(xname)}</text>')
        g.append(f'<text x="{ox}" y="{oy - 6}">{escape(unit)}</text>')
        for k, cv in enumerate(mine):
            c = colours[k % len(colours)]
            ps = [p for p in cv["points"] if p[0] > 0 and p[1] > 0]
            g.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                     % (c, " ".join(f"{X(p[0]):.1f},{Y(p[1]):.1f}" for p in ps)))
            for p in ps:
                g.append(f'<circle cx="{X(p[0]):.1f}" cy="{Y(p[1]):.1f}" r="2.5" fill="{c}"/>')
            g.append(f'<text x="{ox + 6}" y="{oy + 14 + 13 * k}" fill="{c}">{escape(cv["name"])}</text>')
    g.append("</svg>")
    with open(os.path.join(out, "scale.svg"), "w") as f:
        f.write("\n".join(g) + "\n")

# What the acceptance asks to see printed: (a) against the peer, the in-guest table, the scale curves.
def metric(case, name):
    return next((m["value"] for m in (case or {}).get("metrics", []) if m["name"] == name), None)

def fmt(v, unit=""):
    if v is None:
        return "-"
    if unit == "ns":
        return f"{v / 1000:.1f} us"
    return f"{v:.3g}{(' ' + unit) if unit else ''}"

a = next((c for c in report["cases"] if c["id"] == "a"), None)
if a:
    print("\n(a) trapped round trip, host, one process:", file=sys.stderr)
    # --low-latency (the opt-in): judged against the peer; defaults: judged against the raw socket; exact: the
    # opt-in reading message by message on both sides (what the peek mode saves).
    print(f"  {'':<18} {'opt-in':>9} {'defaults':>9} {'exact':>9} {'rust-vmm':>9} {'raw':>9} {'opt-in/peer':>12} "
          f"{'default/peer':>13} {'default/raw':>12}", file=sys.stderr)
    for op in ("REGION_READ 8 B", "REGION_WRITE 8 B"):
        o = metric(a, f"{op}: ours --low-latency, median")
        n = metric(a, f"{op}: ours with the defaults, median")
        e = metric(a, f"{op}: ours --low-latency, exact reads both sides, median")
        p = metric(a, f"{op}: rust-vmm peer server, median")
        r = metric(a, f"{op}: raw socket ping-pong, median")
        ratio = lambda x, y: f"{x / y:.2f}x" if x and y else "-"
        print(f"  {op:<18} {fmt(o, 'ns'):>9} {fmt(n, 'ns'):>9} {fmt(e, 'ns'):>9} {fmt(p, 'ns'):>9} {fmt(r, 'ns'):>9} "
              f"{ratio(o, p):>12} {ratio(n, p):>13} {ratio(n, r):>12}", file=sys.stderr)
quiet = next((c for c in report["cases"] if c["id"] == "quiet"), None)
if quiet:
    print("\n(quiet) device-model CPU, idle 2 s and a read every 2 ms:", file=sys.stderr)
    for name in ("defaults", "event-driven", "--low-latency"):
        print(f"  {name:<14} idle {fmt(metric(quiet, f'{name}: idle, CPU over 2 s'), 'ms')}, "
              f"{fmt(metric(quiet, f'{name}: idle, thread wake-ups over 2 s'))} wake-ups; sparse "
              f"{fmt(metric(quiet, f'{name}: sparse client, CPU per read'), 'us')} CPU per read", file=sys.stderr)
    for t in quiet.get("targets", []):
        print(f"  {t['what']:<44} {t['measured']:.3g} (target <= {t['bound']:g}): {'met' if t['met'] else 'MISSED'}",
              file=sys.stderr)
    if quiet.get("error"):
        print(f"  (quiet) {quiet['error']}", file=sys.stderr)
for cid, heading in (("fabric", "two HFIs on one cable"), ("tid", "TID RDMA through the flow table, two HFIs")):
    host = next((c for c in report["cases"] if c["id"] == cid), None)
    if host and host.get("date", report["date"]) == report["date"]:
        print(f"\n({cid}) {heading}, host, one process (reported, no target):", file=sys.stderr)
        for m in host.get("metrics", []):
            print(f"  {m['name']:<54} {fmt(m['value'], m['unit'])}", file=sys.stderr)
        if host.get("error"):
            print(f"  ({cid}) {host['error']}", file=sys.stderr)
def guest_table(ga, heading):
    print(heading, file=sys.stderr)
    if not ga or ga.get("error"):
        return
    print(f"  {'':<18} {'read':>10} {'write':>10}", file=sys.stderr)
    for who in ("ours", "ours, defaults", "peer", "edu"):
        r, w = metric(ga, f"{who}: trapped read, median"), metric(ga, f"{who}: trapped write, median")
        if r is not None:
            print(f"  {who:<18} {fmt(r, 'ns'):>10} {fmt(w, 'ns'):>10}", file=sys.stderr)
    for name in ("ours / edu, read", "defaults / ours, read", "ours, defaults / peer, trapped read"):
        v = metric(ga, name)
        if v is not None:
            print(f"  {name:<28} {v:.2f}x", file=sys.stderr)
    per = {}
    for m in ga.get("metrics", []):
        if m["name"].startswith("boot "):
            boot, what = m["name"].split(": ", 1)
            per.setdefault(what, []).append(f"{boot} {m['value']:.2f}x")
    for what, vals in per.items():
        print(f"  {what}, by boot: " + ", ".join(vals), file=sys.stderr)
    for t in ga.get("targets", []):
        print(f"  {t['what']:<28} {t['measured']:.2f}x (target <= {t['bound']}x): {'met' if t['met'] else 'MISSED'}",
              file=sys.stderr)

ga = next((c for c in report["cases"] if c["id"] == "guest-a"), None)
guest_table(ga, "\nin the guest (udriver bench over VFIO, TCG; ours: device-model --low-latency; ours, defaults: "
                "the same function served with the device model's defaults):")
lat0 = next((c for c in report["cases"] if c["id"] == "guest-a-lat0"), None)
guest_table(lat0, "\nthe same, the host's idle exit latency held at 0 us (PM QoS):")
if lat0 and lat0.get("error"):
    print(f"  (guest-a-lat0) {lat0['error']}", file=sys.stderr)
nopoll = next((c for c in report["cases"] if c["id"] == "guest-a-no-reply-poll"), None)
guest_table(nopoll, "\nthe same, QEMU's vCPU waiting for its I/O thread (--reply-poll-us 0, not judged):")
if nopoll:
    if nopoll.get("error"):
        print(f"  (guest-a-no-reply-poll) {nopoll['error']}", file=sys.stderr)
    for m in nopoll.get("metrics", []):
        if m["name"].startswith("ours / peer, trapped read"):
            print(f"  {m['name']:<28} {m['value']:.2f}x", file=sys.stderr)
for c in report["cases"]:
    if c["id"].startswith("guest") and c["id"] not in ("guest-a", "guest-a-lat0", "guest-a-no-reply-poll", "guest-verbs",
                                                       "guest-verbs-iommu", "guest-tid"):
        if c.get("error"):
            print(f"  ({c['id']}) {c['error']}", file=sys.stderr)
        for m in c.get("metrics", []):
            print(f"  ({c['id']}) {m['name']:<44} {fmt(m['value'], m['unit'])}", file=sys.stderr)
if ga and ga.get("error"):
    print(f"  (guest-a) {ga['error']}", file=sys.stderr)


def verbs_table(gv, gv_id, heading):
    """A guest-verbs case measured in this run, as a table of hfi1 against SoftRoCE."""
    if not gv or gv.get("date", report["date"]) != report["date"]:
        return
    print(f"\n({gv_id}) perftest in the guest, hfi1_0 -> hfi1_1 against SoftRoCE over veth, {heading} (MiB/s; "
          "latency us):", file=sys.stderr)
    rows, device = {}, []
    for m in gv.get("metrics", []):
        if " on hfi1: " in m["name"] or m["name"].startswith("boot "):
            device.append(m)
            continue
        what, _, who = m["name"].rpartition(": ")
        rows.setdefault(what, {})[who] = m["value"]
    print(f"  {'':<36} {'hfi1':>10} {'rxe':>10} {'hfi1/rxe':>9}", file=sys.stderr)
    for what, v in rows.items():
        ratio = v.get("hfi1 / rxe", v.get("hfi1 / rxe (lower is better)"))
        print(f"  {what:<36} {fmt(v.get('hfi1')):>10} {fmt(v.get('rxe')):>10} "
              f"{(f'{ratio:.3f}x' if ratio is not None else '-'):>9}", file=sys.stderr)
    for m in device:
        print(f"  {m['name']:<64} {m['value']:g}", file=sys.stderr)
    for t in gv.get("targets", []):
        print(f"  {t['what']:<44} {t['measured']:.3f}x (target >= {t['bound']:g}x): "
              f"{'met' if t['met'] else 'MISSED'}", file=sys.stderr)
    if gv.get("error"):
        print(f"  ({gv_id}) {gv['error']}", file=sys.stderr)


for gv_id, heading in (("guest-verbs", "hfi1 in an identity IOMMU domain"),
                       ("guest-verbs-iommu", "hfi1 behind the vIOMMU's translation, not judged")):
    verbs_table(next((c for c in report["cases"] if c["id"] == gv_id), None), gv_id, heading)
gt = next((c for c in report["cases"] if c["id"] == "guest-tid"), None)
if gt and gt.get("date", report["date"]) == report["date"]:
    print("\n(guest-tid) perftest READ and WRITE in the guest: TID RDMA, plain RDMA, SoftRoCE (MiB/s):", file=sys.stderr)
    for m in gt.get("metrics", []):
        print(f"  {m['name']:<56} {fmt(m['value'], m['unit'])}", file=sys.stderr)
    if gt.get("error"):
        print(f"  (guest-tid) {gt['error']}", file=sys.stderr)
if curves:
    print(f"\nscale curves ({out}/scale.svg):", file=sys.stderr)
    for cv in curves:
        pts = ", ".join(f"{p[0]:g}: {p[1]:.3g}" for p in cv["points"])
        print(f"  {cv['name']} [{cv['unit']} by {cv['x']}]: {pts}", file=sys.stderr)
met = sum(t["met"] for c in report["cases"] for t in c["targets"])
total = sum(len(c["targets"]) for c in report["cases"])
print(f"{met}/{total} targets met; results in {out}/results.json and {out}/results.svg", file=sys.stderr)
EOF
# docs/bench.md's results table, from the results just written (not for results written elsewhere).
[ "$OUT" != docs/bench ] || bash ci/bench-table.sh
