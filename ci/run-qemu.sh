#!/usr/bin/env bash
# Boots the test guest in QEMU with the two emulated functions served by the device model over vfio-user, lets
# the guest's init run udriver's demos through /dev/vfio, and turns its result block into a JSON file.
#
#   ci/run-qemu.sh [options] [-- extra QEMU arguments]
#
#   --device-model PATH   device-model binary (env RDMA_EMU_DEVICE_MODEL; default target/{release,debug}/device-model)
#   --dm-arg ARG          extra device-model argument (repeatable)
#   --sockets DIR         use the device model already serving DIR/hfi1.sock, DIR/irdma.sock and
#                         DIR/control.sock: it is neither started nor stopped here (ci/lifecycle.sh)
#   --hotplug             put each function behind its own pcie-root-port (rp-hfi1, rp-irdma), so QMP
#                         device_del/device_add of the device ids "hfi1" and "irdma" work
#   --allow-reboot        a guest reboot restarts the guest instead of ending QEMU (no -no-reboot)
#   --udriver PATH        static udriver put into the guest (env RDMA_EMU_UDRIVER; default: the first static
#                         target/x86_64-unknown-linux-{gnu,musl}/{release,debug}/udriver; without one the guest
#                         reports that udriver is missing)
#   --kernel K --initrd I boot this guest instead of the one ci/build-guest.sh builds
#   --no-share            guest RAM in a non-shared memory-backend-ram: QEMU has no fd to send, so the device
#                         model must use DMA_READ/DMA_WRITE messages
#   --no-devices          boot the same guest without the device model and its devices
#   --accel auto|tcg|kvm  (env RDMA_EMU_ACCEL, default auto: KVM only if a probe boot really works)
#   --timeout SECS        the whole run (default 600)
#   --demo-timeout SECS   each udriver demo inside the guest (default 120)
#   --args "ARGS"         extra arguments for both udriver demos (guest parameter rdma_emu.args)
#   --hfi1-id V:D, --irdma-id V:D   PCI IDs of the functions (default 1b36:1100, 1b36:1101); non-default ones
#                         are passed to the device model as --hfi1-ids/--irdma-ids
#   --hfi1-wfr            also serve an HFI with the real chip's personality (8086:24f0) and run the guest's
#                         kernel-driver steps on it (modprobe/rmmod hfi1, sysfs, the fabric userland, dmesg)
#   --fabric              serve two chip-personality HFIs joined by a cable (device names hfi1-wfr and hfi1-wfr1
#                         on the control socket) instead of one, and run the guest's fabric steps on them
#                         instead of the single-HFI kernel-driver steps (bring-up under opa-fm, verbs traffic,
#                         cable faults; docs/hfi1-fabric.md); implies --hfi1-wfr. The host answers the guest's
#                         requests on the console (arming cable faults, reading access totals)
#   --capture FILE        with --fabric: record the packets that cross the cable (device-model --capture)
#   --icode NAME          the chip-personality HFIs' implementation code (device-model --hfi1-wfr-icode):
#                         rtl-simulation (default: the driver loads the guest's /lib/firmware/hfi_dc8051.bin and
#                         runs the full link bring-up; the fabric run also bounces a link, loses a neighbour and
#                         unloads hfi1 with the links up) or functional-simulator (no firmware; the stock driver
#                         deadlocks taking an up link down, docs/hfi1-fabric.md)
#   --hfi1-dma MODE       the IOMMU domain the hfi1 functions get before hfi1 binds them: translated (default: the
#                         kernel's DMA domain, so the vIOMMU checks every address the device uses) or identity
#                         (guest-physical addresses, nothing mapped per packet: the hfi1 send path maps and
#                         unmaps every packet's buffers, and under QEMU's caching-mode vIOMMU each of those is a
#                         blocking DMA map or unmap to the device model; ci/bench.sh's guest-verbs case). The
#                         guest's modprobe step fails if a function's domain is not the one asked for
#   --fabric-bounce       with --fabric: after the bring-up only bounce hfi1_1's link (opaportconfig) and wait
#                         for ACTIVE again (ci/e2e.sh runs it with --icode functional-simulator, where the stock
#                         driver deadlocks, to check the stall report)
#   --fabric-perf         with --fabric: after its steps, perftest bandwidth and latency between hfi1_0 and hfi1_1
#                         and the same on SoftRoCE over a veth pair in the guest (step fabric-perf, the result's
#                         fabric_perf; ci/bench.sh's guest-verbs case); with --tid-rdma instead perftest READ
#                         and WRITE with TID RDMA, without it and on SoftRoCE (step tid-perf; ci/bench.sh's
#                         guest-tid case); the default --timeout becomes 1800
#   --psm2                the fabric with the OPA userspace stack: the guest boots with the psm2 layer (PSM2,
#                         libfabric, Open MPI, mpi-check), -cpu max (AVX2), 2 vCPUs and 2 GiB, hfi1 gets user
#                         contexts and PSM2-sized queues, and after the bring-up the guest runs fi_info,
#                         fi_pingpong and an MPI job over psm2 (ci/guest/psm2.sh); implies --fabric. With
#                         --shell: that guest, for your own PSM2 programs (docs/psm2.md)
#   --fuzz-wire           the fabric as the wire-side fuzzer's target: 2 vCPUs, 1 GiB, the kernel's detectors armed
#                         (panic_on_warn, oops=panic, KFENCE, slub_debug, soft-lockup and hung-task panics); after
#                         the bring-up qp-keeper keeps RC, UC and UD QPs on hfi1_0 and each of its reports is
#                         printed on stdout as a line "FUZZ-TARGET <json>" (and kept in the log directory's
#                         fuzz-target.json); then the guest holds until SIGTERM ends the run (no --timeout unless
#                         one is given); implies --fabric (docs/guest.md)
#   --fuzz-secs N         with --fuzz-wire: the guest ends the hold itself after N s and reports (default --timeout
#                         N + 900)
#   --tid-rdma            the fabric with the kernel's own TID RDMA: cap_mask gains TID_RDMA and OPFN, and after
#                         the bring-up the guest runs its TID RDMA steps (ci/guest/tid-rdma.sh) instead of the
#                         plain verbs and fault steps; implies --fabric (docs/kernel-tid-rdma.md)
#   --shell               boot with the devices, run the setup (functions bound, hfi1 loaded, opa-fm's sm started
#                         with two HFIs) and give the console to an interactive shell instead of the demos;
#                         leaving the shell powers the guest off and stops the device model. Uses --fabric
#                         unless --hfi1-wfr is given; no --timeout unless one is given. With a terminal on
#                         stdin, QEMU owns it (Ctrl-A X quits QEMU, Ctrl-A C its monitor); piped stdin is sent
#                         once the shell is ready. No result file; not with --no-devices
#   --hfi1-params "P"     module parameters of each modprobe hfi1 (default: the small set in docs/hfi1-kernel-driver.md)
#   --kdriver-timeout S   each kernel-driver step (default 120); a guest too stuck to time out itself is stopped
#                         by the host, which reports the last CSR accesses
#   --hfi1-user PATH      static hfi1-user put into the guest: with --hfi1-wfr the guest runs it on /dev/hfi1_0
#   --hfi1-user-host PATH its host side, started before QEMU on the guest's second serial port; it checks the
#                         device model's RcvArray against the kernel's TIDs and injects the data
#   --bench               run the in-guest benchmark (`udriver bench`) instead of the demos: besides our two
#                         functions, an hfi1 function behind rust-vmm's vfio-user server and one behind ours
#                         with the device model's defaults (no busy-poll, no worker spin; both served by
#                         `testbed serve-peers`; ci/bench.sh gives the device model --low-latency), and QEMU's edu
#                         device
#   --testbed PATH        testbed binary for --bench (default target/{release,debug}/testbed)
#   --bench-budget-ms N   wall time per measured variant inside the guest (default 1000)
#   --reply-poll-us N     how long QEMU's vCPU thread reads its own vfio-user reply before it sleeps (env
#                         RDMA_EMU_REPLY_POLL_US, default 50; 0 leaves QEMU waiting for its I/O thread); needs
#                         qemu-patches/0005 (x-reply-poll-us), which ci/get-qemu.sh's build has
#   --append "PARAMS"     extra guest kernel parameters
#   --result FILE         result JSON (default $CARGO_TARGET_DIR or target/, then rdma-emu/result-<mode>.json)
#   --logs DIR            log directory (default a new /tmp/rdma-emu-run.XXXXXX); kept on failure
#   --keep-logs           keep the log directory on success too
#   --timing              print how long each phase took
#   --quiet               do not stream the guest console to stderr
#
# Exit status 0 only if every step the guest ran is ok. Prints the result file's path on stdout.
#
# The run itself is `guest-run run` (testing/guest-run: the QEMU command line, the device model's start and
# stop, the console protocol, the verdict), which takes these same options; this script builds it and hands over.
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit "${1:-2}"; }
for arg in "$@"; do
    case "$arg" in
        -h|--help) usage 0 ;;
        --) break ;;
    esac
done
guest_run_bin
RDMA_EMU_REPO_ROOT=$REPO_ROOT exec "$GUEST_RUN" run "$@"
