#!/usr/bin/env bash
# The main job, from a fresh clone: installs what is missing (apt packages, meson from PyPI, QEMU >= 10.1
# built from Debian's source package with qemu-patches/ applied), builds the device model and a static udriver,
# builds the guest (Debian kernel + busybox initramfs), boots QEMU with both emulated functions over vfio-user,
# and runs udriver's hfi1 and irdma demos inside the guest through VFIO; then boots the fabric (two emulated
# HFIs on one cable, brought up by the stock hfi1 driver and opa-fm, verbs traffic between them). Prints what the
# guest saw.
# Usage: ci/demo.sh [--no-share]   (--no-share: guest RAM not shared, so all DMA goes through messages)
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
MODE=shared
case "${1:-}" in
    --no-share) MODE=no-share ;;
    -h|--help) sed -n '2,8s/^# \{0,1\}//p' "$0" >&2; exit 0 ;;
    "") ;;
    *) die "unknown option $1 (ci/demo.sh --help)" ;;
esac
apt_install python3 ca-certificates
rc=0
bash ci/e2e.sh --mode "$MODE" || rc=$?
bash ci/e2e.sh --mode fabric || rc=$?
RESULT=${CARGO_TARGET_DIR:-$REPO_ROOT/target}/rdma-emu/result-$([ "$MODE" = shared ] && echo share || echo no-share).json
python3 - "$RESULT" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"\nguest run: {'OK' if r['ok'] else 'FAILED'} ({r['memory']}, {r['accel']}, kernel {r['guest'].get('kernel')})")
for step in r["guest"]["steps"]:
    out = step.get("output")
    if not isinstance(out, dict) or "steps" not in out:
        continue
    label = step["name"].removeprefix("demo-").replace("-irq", " (CQP completions by MSI-X)")
    print(f"\n{label} demo over VFIO in the guest: {'OK' if out['ok'] else 'FAILED'}")
    for s in out["steps"]:
        d = s["detail"]
        d = d if isinstance(d, str) else json.dumps(d)
        print(f"  [{' ok ' if s['ok'] else 'FAIL'}] {s['name']:<48} {d[:110]}")
kdrv = [s for s in r["guest"]["steps"] if s["name"].startswith("kdriver-") or s["name"] == "find-hfi1-wfr"]
if kdrv:
    ok = all(s["ok"] for s in kdrv)
    print(f"\nthe guest's own hfi1 driver on the emulated HFI (8086:24f0): {'OK' if ok else 'FAILED'}")
    acc = r.get("hfi1_wfr_step_accesses") or {}
    for s in kdrv:
        name = s["name"]
        if not s["ok"]:
            d = s.get("error") or ""
        elif "probe_s" in s:
            a = acc.get(name, {})
            d = f"{s['ib_device']} registered in {s['probe_s']} s, {a.get('reads', '?')} CSR reads, {a.get('writes', '?')} writes; {s['params']}"
        elif name == "kdriver-sysfs":
            fs = s.get("sysfs", {})
            sde = (fs.get("sdes") or "").split(" STE ")[-1].split(" ")[0]
            d = (f"port {fs.get('ports/1/state')}, {fs.get('ports/1/phys_state')}; node GUID {fs.get('node_guid')}; "
                 f"hw_rev {fs.get('hw_rev')}; SDMA engine 0 {sde}")
        elif name == "kdriver-user":
            h = r.get("hfi1_user_host") or {}
            rounds = h.get("rounds") or []
            tids = sum(x.get("tids", 0) for x in rounds)
            placed = sum(x.get("placed", 0) for x in rounds)
            kib = sum(x.get("payload_bytes", 0) for x in rounds) // 1024
            neg = sum(1 for x in rounds for n in x.get("negatives", []) if n.get("ok"))
            d = (f"TID_UPDATE through the kernel: {tids} TIDs in {len(rounds)} rounds matched the RcvArray and the DMA "
                 f"maps on the host; {placed} packets ({kib} KiB) placed and verified byte for byte in the guest; "
                 f"{neg} wrong-TID/context/generation packets dropped; nothing valid after TID_FREE")
        elif name.startswith("kdriver-params"):
            d = f"modprobe hfi1 {s.get('params')}: the driver says {(s.get('driver_said') or '').split(': ', 2)[-1]!r}; function {s.get('device')}"
            if s.get("kernel_warning"):
                d += "; known kernel warning at rmmod (init_one leaks its devdata on this error path)"
        elif name.startswith("kdriver-dmesg"):
            d = "no oops, WARN, BUG or hung task in the kernel log" + (" since the invalid-parameter step" if name.endswith("final") else "")
        elif name == "kdriver-final-probe":
            d = f"{s['ib_device']} registered again in {s['probe_s']} s: the device model still serves"
        elif name.startswith("kdriver-rmmod"):
            d = "rmmod hfi1 returned; the function is unbound"
        elif name == "find-hfi1-wfr":
            d = f"{s.get('id')} at {s.get('address')}"
        else:
            d = json.dumps({k: v for k, v in s.items() if k not in ('name', 'ok', 'start', 'end', 'error')})
        print(f"  [{' ok ' if s['ok'] else 'FAIL'}] {name:<48} {d[:150]}")
t = r.get("timing", {})
print(f"\ntiming: QEMU start {t.get('qemu_start_s')} s, kernel boot {t.get('kernel_boot_s')} s, demos {t.get('demo_s')}, "
      f"hfi1 probes {t.get('hfi1_probe_s')}")
PY
python3 - "${CARGO_TARGET_DIR:-$REPO_ROOT/target}/rdma-emu/result-fabric.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
g = r.get("guest") or {}
print(f"\nthe fabric: two emulated HFIs on one cable, the stock hfi1 driver and opa-fm: {'OK' if r['ok'] else 'FAILED'}")
for p in (g.get("fabric") or {}).get("ports", []):
    print(f"  {p['device']}: node GUID {p['node_guid']}, {p['phys_state']}, {p['state']}, LID {p['lid']}, "
          f"neighbour {p['neighbor_guid']}")
print(f"  opa-fm: {((g.get('fabric') or {}).get('sm_discovery') or '').split('topology_main: ')[-1]}")
print(f"  hfi1_setup_wqe calls counted by ftrace: {(g.get('kernel_functions') or {}).get('hfi1_setup_wqe')}")
for s in g.get("steps", []):
    name = s["name"]
    if not name.startswith(("fabric-", "verbs-", "fault-")):
        continue
    if not s["ok"]:
        d = s.get("error") or ""
    elif name == "fabric-modprobe":
        d = f"modprobe hfi1: {', '.join(s.get('functions', []))} bound in {s.get('probe_s')} s"
    elif name == "fabric-init":
        d = f"both ports LinkUp/INIT {s.get('init_s')} s after modprobe, each the other's neighbour"
    elif name == "fabric-sm":
        d = f"both ACTIVE {s.get('active_s')} s after modprobe; sweep {s.get('sweep_s')} s"
    elif name == "fabric-smp":
        q = s.get("queries", [])
        a = s.get("accesses") or {}
        d = f"NodeInfo across the cable: {', '.join(x['node_guid'] for x in q)}; {a.get('per_smp')} trapped accesses per SMP"
    elif "bw_avg_mb_s" in s:
        d = f"{s.get('bytes')} B messages: {s.get('bw_avg_mb_s')} MB/s (perftest checks no data)"
    elif name == "verbs-check":
        x = s.get("summary") or {}
        d = f"RDMA WRITE + READ, {x.get('transfers')} transfers, {x.get('bytes_compared')} bytes compared, {x.get('failed')} failed"
    elif name.startswith("fault-"):
        d = f"{s.get('fault')} fired {s.get('fired')}x; the kernel: {json.dumps(s.get('rc_counters_moved') or s.get('sm_line', '').split('topology_main: ')[-1])}"
    elif "rate" in s:
        d = f"{s.get('command')} -c: every byte checked; {s.get('rate')}"
    elif name == "fabric-link-bounce":
        d = "opaportconfig bounce: the link trained again (VerifyCap) and both ports are ACTIVE"
    elif name == "fabric-peer-loss":
        d = f"{s.get('address')} unbound with the link up: hfi1_0 went down and came out of its freeze; rebound, ACTIVE, every byte again"
    elif name == "fabric-rmmod":
        d = "rmmod hfi1 with both links up: completed on both HFIs"
    else:
        d = ""
    print(f"  [{' ok ' if s['ok'] else 'FAIL'}] {name:<20} {d[:160]}")
PY
exit "$rc"
