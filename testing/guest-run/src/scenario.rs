//! The scenario table: one row per kind of guest run, read by the launchers (`ci/run-qemu.sh`, `ci/e2e.sh`)
//! and by the verdict. A row gives the run's devices, the `ci/run-qemu.sh` options `ci/e2e.sh` runs it with, its
//! `rdma_emu.*` kernel parameters (ci/guest/init reads them) and the steps the guest must report (the names its
//! scripts pass to `record`: ci/guest/init, fabric.sh, tid-rdma.sh, perf.sh).

use serde::Serialize;

/// What a step or a kernel parameter of a row depends on, besides the row itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum When {
    Always,
    /// The guest's result lists this device among the functions it found (`devices` of the result block).
    GuestLists(&'static str),
    /// `ci/run-qemu.sh --fabric-perf`: perftest after the fabric's steps (ci/guest/perf.sh).
    FabricPerf,
    /// The chip reports the RTL simulation's icode, where the stock driver takes an up link down without the
    /// deadlock of the functional simulator's (docs/hfi1-fabric.md).
    RtlIcode,
    /// `hfi1-user-host` serves the guest's second serial port, so the guest runs `hfi1-user`.
    HostSide,
}

/// The options of one run that rows depend on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunOptions {
    pub fabric_perf: bool,
    pub rtl_icode: bool,
    pub host_side: bool,
    /// The devices the guest's result block lists (`None`: not known, e.g. before the boot).
    pub guest_devices: Option<Vec<String>>,
}

impl RunOptions {
    /// Whether `when` holds; a step on a device holds while the guest's devices are not known yet.
    pub fn holds(&self, when: When) -> bool {
        match when {
            When::Always => true,
            When::GuestLists(dev) => self.guest_devices.as_ref().is_none_or(|d| d.iter().any(|x| x == dev)),
            When::FabricPerf => self.fabric_perf,
            When::RtlIcode => self.rtl_icode,
            When::HostSide => self.host_side,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Step {
    pub name: &'static str,
    pub when: When,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Param {
    pub text: &'static str,
    pub when: When,
}

/// Checks of the result block beyond its steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    /// `kernel_functions.hfi1_setup_wqe` counts calls: it runs on every work request posted on hfi1 (verbs.c,
    /// the hfi1_post_send path).
    SetupWqeCalled,
    /// Each of the four kernel TID RDMA functions ran, and the device model placed bytes of TID RDMA READ and
    /// WRITE through TIDs and flows the kernel programmed (docs/kernel-tid-rdma.md).
    TidRdmaCounts,
    /// The device model saw PSM2's bytes go through user contexts: PIO launches and SDMA bytes from them, RcvArray
    /// entries and flow-table writes for them, expected packets placed into them (`psm2` of the result).
    Psm2Counts,
}

/// What `ci/e2e.sh` requires of the run's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The run passes (the launcher's exit status).
    Passes,
    /// Not judged: the console belongs to the user (`--shell`).
    Interactive,
    /// Not judged: a host program drives the run and ends it (the wire-side fuzzer, which reads the guest's
    /// `FUZZ-TARGET` lines from `guest-run run` and stops it with SIGTERM). `ci/e2e.sh` does not run such a row.
    HostDriven,
    /// The run fails within `within_s`, one problem naming all of `one_problem_names`, the problems together
    /// naming all of `problems_name`.
    FailsReporting { one_problem_names: &'static [&'static str], problems_name: &'static [&'static str], within_s: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Devices {
    /// Our hfi1 and irdma functions (their IDs come from `--hfi1-id`/`--irdma-id`, `none` leaves one out).
    pub demo_functions: bool,
    /// The chip-personality HFIs, by their names on the control socket (QEMU's device ids follow).
    pub chip_hfis: &'static [&'static str],
    /// `testbed serve-peers`' two hfi1 functions and QEMU's edu device (`--bench`).
    pub bench_peers: bool,
}

/// The guest machine of a row: its RAM, CPU model and vCPUs, whether the initramfs carries the psm2 layer
/// (ci/build-guest.sh's INITRD_PSM2: PSM2, libfabric and Open MPI), and the guest kernel's own parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Guest {
    pub memory: &'static str,
    /// QEMU's `-cpu` (None: QEMU's default, qemu64 under TCG).
    pub cpu: Option<&'static str>,
    pub smp: u8,
    pub psm2_layer: bool,
    /// Kernel parameters of the guest kernel itself (not `rdma_emu.*`), appended to its command line.
    pub kernel_args: &'static [&'static str],
}

/// One vCPU and 512 MiB: enough for the kernel driver, opa-fm and the verbs tools.
pub const SMALL_GUEST: Guest = Guest { memory: "512M", cpu: None, smp: 1, psm2_layer: false, kernel_args: &[] };

/// The stock kernel's own detectors, armed for fuzzing (docs/guest.md, the fuzz-wire row): a WARN and an oops
/// panic (kernel/panic.c panic_on_warn, oops=), KFENCE samples every allocation it can (mm/kfence/core.c
/// sample_interval), SLUB redzones, poisons and tracks every cache (mm/slub.c slub_debug), and a soft lockup or a
/// hung task panics (kernel/watchdog.c softlockup_panic; hung_task_panic is the boot-time alias of the sysctl
/// kernel.hung_task_panic, fs/proc/proc_sysctl.c sysctl_aliases). Each name is in the guest kernel's image. With
/// the init's `panic=-1` and QEMU's `-no-reboot`, any of them ends QEMU.
pub const FUZZ_ORACLES: &[&str] = &[
    "panic_on_warn=1",
    "oops=panic",
    "kfence.sample_interval=1",
    "slub_debug=FZPU",
    "softlockup_panic=1",
    "hung_task_panic=1",
    // After the init's `quiet` (console level 4, errors only): WARN's report is pr_warn (level 4), so 5 lets it
    // reach the console, where the fuzzer reads it.
    "loglevel=5",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    pub devices: Devices,
    /// The `ci/run-qemu.sh` options that select this row, as `ci/e2e.sh` runs it (paths and the log options
    /// are the caller's).
    pub options: &'static [&'static str],
    pub kernel_params: &'static [Param],
    /// The guest machine the row boots.
    pub guest: Guest,
    /// Groups of steps, concatenated in order.
    pub steps: &'static [&'static [Step]],
    pub checks: &'static [Check],
    pub outcome: Outcome,
}

const fn always(name: &'static str) -> Step {
    Step { name, when: When::Always }
}

/// Every run: the init mounts, loads the vfio modules and finds the vIOMMU.
const BASE: &[Step] = &[always("mount"), always("modules"), always("iommu")];
/// udriver's demos on the functions the guest found.
const DEMOS: &[Step] = &[
    Step { name: "demo-hfi1", when: When::GuestLists("hfi1") },
    Step { name: "demo-irdma", when: When::GuestLists("irdma") },
    Step { name: "demo-irdma-irq", when: When::GuestLists("irdma") },
];
/// The stock hfi1 driver on one chip-personality HFI (ci/guest/init, the kdriver steps).
const KDRIVER: &[Step] = &[
    always("find-hfi1-wfr"),
    always("kdriver-modprobe"),
    always("kdriver-sysfs"),
    always("fabric-userland"),
    always("kdriver-rmmod"),
    always("kdriver-reprobe"),
    always("kdriver-rmmod-again"),
    always("kdriver-params-beyond-chip"),
    always("kdriver-dmesg"),
    always("kdriver-params-invalid"),
    always("kdriver-final-probe"),
    always("kdriver-dmesg-final"),
    Step { name: "kdriver-user", when: When::HostSide },
];
/// Two HFIs on one cable up under opa-fm (ci/guest/fabric.sh).
const FABRIC_UP: &[Step] =
    &[always("find-fabric"), always("fabric-modprobe"), always("fabric-init"), always("fabric-sm")];
/// The fabric's verbs traffic and cable faults (ci/guest/fabric.sh).
const FABRIC_TRAFFIC: &[Step] = &[
    always("fabric-smp"),
    always("verbs-rc-pio"),
    always("verbs-rc-sdma"),
    always("verbs-rc-sdma-odd"),
    always("verbs-ud"),
    always("verbs-send-bw"),
    always("verbs-write-bw"),
    always("verbs-read-bw"),
    always("verbs-check"),
    always("fault-rc-drop"),
    always("fault-rc-reorder"),
    always("fault-rc-corrupt"),
    always("fault-rc-delay"),
    always("fault-rc-seeded"),
    always("fault-sm-drop"),
    always("fabric-dmesg"),
    Step { name: "fabric-perf", when: When::FabricPerf },
    // A link that goes down once up: only where the stock driver does not deadlock (docs/hfi1-fabric.md).
    Step { name: "fabric-link-bounce", when: When::RtlIcode },
    Step { name: "fabric-peer-loss", when: When::RtlIcode },
    Step { name: "fabric-rmmod", when: When::RtlIcode },
];
const FABRIC_BOUNCE: &[Step] = &[always("fabric-link-bounce"), always("fabric-dmesg")];
/// The kernel's own TID RDMA on the fabric (ci/guest/tid-rdma.sh).
const TID_RDMA: &[Step] = &[
    always("tid-setup"),
    always("tid-read-bw"),
    always("tid-write-bw"),
    always("tid-verbs-check"),
    always("tid-opfn"),
    always("tid-fault-read-drop"),
    always("tid-fault-read-reorder"),
    always("tid-fault-write-corrupt"),
    always("tid-fault-write-resync"),
    always("tid-exhaust"),
    always("tid-exhaust-check"),
    always("fabric-dmesg"),
    Step { name: "tid-perf", when: When::FabricPerf },
];
/// The OPA userspace stack on the fabric (ci/guest/psm2.sh).
const PSM2: &[Step] = &[
    always("psm2-setup"),
    always("psm2-fi-info"),
    always("psm2-fi-pingpong"),
    always("psm2-mpi"),
    always("fabric-dmesg"),
];
const BENCH: &[Step] = &[always("bench")];
/// The wire-side fuzzer's target (ci/guest/fuzz.sh): qp-keeper's first report acknowledged by the host. The guest
/// holds after it; the steps it records if the hold ends on its own (fuzz-hold, fabric-dmesg) are not expected.
const FUZZ_WIRE: &[Step] = &[always("fuzz-keeper")];

const fn param(text: &'static str) -> Param {
    Param { text, when: When::Always }
}

/// The chip personality's PCI ID (8086:24f0, PCI_DEVICE_ID_INTEL0 in the kernel's hfi1 hfi.h).
const CHIP_PARAM: Param = param("rdma_emu.hfi1_wfr=8086:24f0");
const PERF_PARAM: Param = Param { text: "rdma_emu.fabric_perf=1", when: When::FabricPerf };
const ONE_HFI: &[&str] = &["hfi1-wfr"];
const TWO_HFIS: &[&str] = &["hfi1-wfr", "hfi1-wfr1"];
const NO_DEVICES: Devices = Devices { demo_functions: false, chip_hfis: &[], bench_peers: false };

/// The stuck ENG_CLEANED_UP of the stall scenario: SEND_DMA_STATUS[engine 0] never reports it (sdma.c:506).
pub const STALL_FAULT: &str = "hfi1-wfr:reg-stuck,reg=SEND_DMA_STATUS[engine 0],mask=0x0200000000000000,value=0";

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "no-devices",
        about: "the same guest without the device model and its devices",
        devices: NO_DEVICES,
        options: &["--no-devices"],
        kernel_params: &[param("rdma_emu.hfi1=none"), param("rdma_emu.irdma=none")],
        steps: &[BASE],
        guest: SMALL_GUEST,
        checks: &[],
        outcome: Outcome::Passes,
    },
    Scenario {
        name: "demo",
        about: "udriver's demos on our hfi1 and irdma functions through /dev/vfio",
        devices: Devices { demo_functions: true, ..NO_DEVICES },
        options: &[],
        kernel_params: &[],
        steps: &[BASE, DEMOS],
        guest: SMALL_GUEST,
        checks: &[],
        outcome: Outcome::Passes,
    },
    Scenario {
        name: "kernel-driver",
        about: "the demos, then the stock hfi1 driver on one chip-personality HFI (load, sysfs, unload, reload)",
        devices: Devices { demo_functions: true, chip_hfis: ONE_HFI, bench_peers: false },
        options: &["--hfi1-wfr"],
        kernel_params: &[CHIP_PARAM],
        steps: &[BASE, DEMOS, KDRIVER],
        guest: SMALL_GUEST,
        checks: &[],
        outcome: Outcome::Passes,
    },
    Scenario {
        name: "stall",
        about: "the stock hfi1 driver on a chip whose SEND_DMA_STATUS[engine 0] never reports ENG_CLEANED_UP: the \
                run fails within its deadline naming the stalled step and the last CSR accesses",
        devices: Devices { demo_functions: false, chip_hfis: ONE_HFI, bench_peers: false },
        options: &[
            "--hfi1-wfr",
            "--hfi1-id",
            "none",
            "--irdma-id",
            "none",
            "--kdriver-timeout",
            "20",
            "--timeout",
            "300",
            "--quiet",
            "--dm-arg",
            "--fault",
            "--dm-arg",
            STALL_FAULT,
        ],
        kernel_params: &[CHIP_PARAM],
        steps: &[BASE, DEMOS, KDRIVER],
        guest: SMALL_GUEST,
        checks: &[],
        // The guest's step timeout plus the host's 30 s grace, plus boot: well inside the run's own 300 s.
        outcome: Outcome::FailsReporting {
            one_problem_names: &["kdriver-", "last CSR accesses"],
            problems_name: &["SEND_DMA_STATUS[engine 0]"],
            within_s: 240,
        },
    },
    Scenario {
        name: "fabric",
        about: "two HFIs on one cable: bring-up under opa-fm, verbs traffic with its data checked, cable faults",
        devices: Devices { demo_functions: true, chip_hfis: TWO_HFIS, bench_peers: false },
        options: &["--fabric", "--timing"],
        kernel_params: &[CHIP_PARAM, param("rdma_emu.fabric=1"), PERF_PARAM],
        steps: &[BASE, DEMOS, FABRIC_UP, FABRIC_TRAFFIC],
        guest: SMALL_GUEST,
        checks: &[Check::SetupWqeCalled],
        outcome: Outcome::Passes,
    },
    Scenario {
        name: "fabric-bounce",
        about: "a link bounce on the fabric with the functional simulator's icode, where the stock driver \
                deadlocks: the run fails within its deadline naming the step, both HFIs' last CSR accesses and \
                the cable's last packets",
        devices: Devices { demo_functions: false, chip_hfis: TWO_HFIS, bench_peers: false },
        options: &[
            "--fabric",
            "--fabric-bounce",
            "--hfi1-id",
            "none",
            "--irdma-id",
            "none",
            "--icode",
            "functional-simulator",
            "--kdriver-timeout",
            "20",
            "--timeout",
            "400",
            "--quiet",
        ],
        kernel_params: &[CHIP_PARAM, param("rdma_emu.fabric=1"), param("rdma_emu.fabric_bounce=1")],
        steps: &[BASE, DEMOS, FABRIC_UP, FABRIC_BOUNCE],
        guest: SMALL_GUEST,
        checks: &[],
        // Bring-up, the step's own timeout and the host's 30 s grace: well inside the run's 400 s.
        outcome: Outcome::FailsReporting {
            one_problem_names: &[
                "guest step fabric-link-bounce overran its deadline",
                "last CSR accesses",
                "hfi1-wfr1's last CSR accesses",
                "last cable packets: to ",
            ],
            problems_name: &[],
            within_s: 330,
        },
    },
    Scenario {
        name: "tid-rdma",
        about: "the fabric with the kernel's own TID RDMA: OPFN, READ and WRITE through the RcvArray and flows \
                the kernel programs, under cable faults and with flows and RcvArray groups run out",
        devices: Devices { demo_functions: false, chip_hfis: TWO_HFIS, bench_peers: false },
        options: &["--tid-rdma", "--hfi1-id", "none", "--irdma-id", "none", "--timing"],
        kernel_params: &[CHIP_PARAM, param("rdma_emu.fabric=1"), PERF_PARAM, param("rdma_emu.tid_rdma=1")],
        steps: &[BASE, DEMOS, FABRIC_UP, TID_RDMA],
        guest: SMALL_GUEST,
        checks: &[Check::TidRdmaCounts],
        outcome: Outcome::Passes,
    },
    Scenario {
        name: "psm2",
        about: "the fabric with the OPA userspace stack: libfabric's psm2 provider and Open MPI's psm2 MTL between \
                hfi1_0 and hfi1_1, every byte checked, the device model's user-context counters moved",
        devices: Devices { demo_functions: false, chip_hfis: TWO_HFIS, bench_peers: false },
        // The identity domain: in the kernel's translated one, the stock driver's PIO_CRED mmap maps the wrong
        // page (docs/kernel-findings.md, 4) and libpsm2's first touch of it oopses.
        options: &["--psm2", "--hfi1-dma", "identity", "--hfi1-id", "none", "--irdma-id", "none"],
        kernel_params: &[CHIP_PARAM, param("rdma_emu.fabric=1"), param("rdma_emu.psm2=1")],
        // Debian's libpsm2 is built with -mavx2 (QEMU's default TCG CPU has no AVX); Open MPI's two ranks and
        // opa-fm want two vCPUs; PSM2's contexts pin their queues and eager buffers.
        guest: Guest { memory: "2G", cpu: Some("max"), smp: 2, psm2_layer: true, kernel_args: &[] },
        steps: &[BASE, DEMOS, FABRIC_UP, PSM2],
        checks: &[Check::Psm2Counts],
        outcome: Outcome::Passes,
    },
    Scenario {
        name: "fuzz-wire",
        about: "the fabric up under opa-fm with the kernel's detectors armed, qp-keeper's RC, UC and UD QPs on hfi1_0 \
                reported to the host as FUZZ-TARGET lines; the guest holds until the wire-side fuzzer ends the run",
        devices: Devices { demo_functions: false, chip_hfis: TWO_HFIS, bench_peers: false },
        options: &["--fuzz-wire", "--hfi1-id", "none", "--irdma-id", "none"],
        // The init's watchdog covers the set-up only: the guest stops it once it holds (ci/guest/fuzz.sh).
        kernel_params: &[
            CHIP_PARAM,
            param("rdma_emu.fabric=1"),
            param("rdma_emu.fuzz_wire=1"),
            param("rdma_emu.watchdog=900"),
        ],
        // The soft-lockup and hung-task detectors report from another vCPU; KFENCE and SLUB debugging want room.
        guest: Guest { memory: "1G", cpu: None, smp: 2, psm2_layer: false, kernel_args: FUZZ_ORACLES },
        steps: &[BASE, FABRIC_UP, FUZZ_WIRE],
        checks: &[],
        outcome: Outcome::HostDriven,
    },
    Scenario {
        name: "lifecycle",
        about: "the demos against a device model that outlives the guest (ci/lifecycle.sh: QEMU killed, reboot, \
                hot-unplug and replug)",
        devices: Devices { demo_functions: true, ..NO_DEVICES },
        options: &["--sockets"],
        kernel_params: &[],
        steps: &[BASE, DEMOS],
        guest: SMALL_GUEST,
        checks: &[],
        outcome: Outcome::Passes,
    },
    Scenario {
        name: "shell",
        about: "the fabric set up, then an interactive shell on the console",
        devices: Devices { demo_functions: true, chip_hfis: TWO_HFIS, bench_peers: false },
        options: &["--shell"],
        // The guest's watchdog covers the shell's setup only; the init stops it before the shell starts.
        kernel_params: &[CHIP_PARAM, param("rdma_emu.shell=1"), param("rdma_emu.watchdog=900")],
        steps: &[],
        guest: SMALL_GUEST,
        checks: &[],
        outcome: Outcome::Interactive,
    },
    Scenario {
        name: "bench",
        about: "the in-guest benchmark (udriver bench) on our functions, testbed's peers and QEMU's edu",
        devices: Devices { demo_functions: true, chip_hfis: &[], bench_peers: true },
        options: &["--bench"],
        // testbed serve-peers' device IDs (testing/testbed/src/peer.rs) and QEMU's edu (hw/misc/edu.c).
        kernel_params: &[
            param("rdma_emu.bench=1"),
            param("rdma_emu.peer=1b36:1102"),
            param("rdma_emu.polled=1b36:1103"),
            param("rdma_emu.edu=1234:11e8"),
        ],
        steps: &[BASE, BENCH],
        guest: SMALL_GUEST,
        checks: &[],
        outcome: Outcome::Passes,
    },
];

/// The prefix of the guest's kernel parameters (ci/guest/init, read_params).
pub const PARAM_PREFIX: &str = "rdma_emu.";

/// The guest's scenario file, /lib/rdma-emu/scenarios.sh in the initramfs (ci/build-guest.sh writes it from
/// `guest-run scenario --guest-env`): `scenario_row NAME` sets init's `P_<param>` variables to the row's settings,
/// where `rdma_emu.scenario=NAME` stands on the command line (so a later parameter still wins). Status 1 for a
/// name that is no row.
pub fn guest_env() -> String {
    let mut out = String::from(
        "# Generated by `guest-run scenario --guest-env` from testing/guest-run/src/scenario.rs: do not edit.\n\
         # shellcheck shell=sh\n\
         scenario_row() { # name\n    case \"$1\" in\n",
    );
    for s in SCENARIOS {
        let sets: Vec<String> = s.guest_settings().iter().map(|(k, v)| format!("P_{k}={}", sh_quote(v))).collect();
        let body = if sets.is_empty() { ":".to_string() } else { sets.join(" ") };
        out.push_str(&format!("        {}) {body} ;;\n", s.name));
    }
    out.push_str("        *) return 1 ;;\n    esac\n}\n");
    out
}

/// `v` in single quotes for the guest's sh.
fn sh_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', r"'\''"))
}

pub fn find(name: &str) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name == name)
}

pub fn names() -> Vec<&'static str> {
    SCENARIOS.iter().map(|s| s.name).collect()
}

impl Scenario {
    /// The steps the guest must report, in the order the guest runs them.
    pub fn expected_steps(&self, opts: &RunOptions) -> Vec<&'static str> {
        self.steps.iter().flat_map(|g| g.iter()).filter(|s| opts.holds(s.when)).map(|s| s.name).collect()
    }

    /// What the host puts on the guest's command line: the row's name (the guest reads the row's settings from
    /// its scenario file, `guest_env`) and the row's parameters that depend on the run's options.
    pub fn kernel_params(&self, opts: &RunOptions) -> Vec<String> {
        std::iter::once(format!("{PARAM_PREFIX}scenario={}", self.name))
            .chain(
                self.kernel_params
                    .iter()
                    .filter(|p| p.when != When::Always && opts.holds(p.when))
                    .map(|p| p.text.into()),
            )
            .collect()
    }

    /// The row's settings that hold on every run of it: (parameter name without `rdma_emu.`, value).
    pub fn guest_settings(&self) -> Vec<(&'static str, &'static str)> {
        self.kernel_params
            .iter()
            .filter(|p| p.when == When::Always)
            .filter_map(|p| p.text.strip_prefix(PARAM_PREFIX)?.split_once('='))
            .collect()
    }

    /// Whether the fabric's options apply (two HFIs on a cable).
    pub fn is_fabric(&self) -> bool {
        self.devices.chip_hfis.len() == 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_has_a_unique_name_and_every_step_is_named_once_per_row() {
        let mut seen = std::collections::HashSet::new();
        for s in SCENARIOS {
            assert!(seen.insert(s.name), "two rows named {}", s.name);
            let all = RunOptions { fabric_perf: true, rtl_icode: true, host_side: true, guest_devices: None };
            let steps = s.expected_steps(&all);
            let unique: std::collections::HashSet<_> = steps.iter().collect();
            assert_eq!(unique.len(), steps.len(), "{}: a step twice in {steps:?}", s.name);
        }
    }

    /// Steps whose names the guest scripts build from a helper's arguments: the call that makes each.
    const BUILT_NAMES: &[(&str, &str)] = &[
        ("demo-hfi1", "step_demo \"$1\""),
        ("demo-irdma", "step_demo \"$1\""),
        ("demo-irdma-irq", "step_demo irdma irq"),
        ("find-hfi1-wfr", "step_find hfi1-wfr"),
    ];

    #[test]
    fn every_guest_step_a_row_expects_is_recorded_by_a_guest_script() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../ci/guest/");
        let text: String = ["init", "fabric.sh", "tid-rdma.sh", "perf.sh", "psm2.sh", "fuzz.sh"]
            .iter()
            .map(|f| std::fs::read_to_string(format!("{root}{f}")).unwrap_or_default())
            .collect();
        assert!(text.contains("record "), "the guest scripts are not at {root}");
        let all = RunOptions { fabric_perf: true, rtl_icode: true, host_side: true, guest_devices: None };
        for s in SCENARIOS {
            for step in s.expected_steps(&all) {
                let call = BUILT_NAMES.iter().find(|(n, _)| *n == step).map_or(step, |(_, call)| call);
                assert!(text.contains(call), "{}: no guest script records step {step} ({call})", s.name);
            }
        }
    }

    #[test]
    fn the_guest_sets_a_rows_settings_from_its_scenario_file_and_only_run_options_travel_as_parameters() {
        let env = guest_env();
        let cases: &[(&str, &str)] = &[
            ("demo", "        demo) : ;;"),
            ("no-devices", "        no-devices) P_hfi1='none' P_irdma='none' ;;"),
            ("fabric", "        fabric) P_hfi1_wfr='8086:24f0' P_fabric='1' ;;"),
            ("tid-rdma", "        tid-rdma) P_hfi1_wfr='8086:24f0' P_fabric='1' P_tid_rdma='1' ;;"),
            ("shell", "        shell) P_hfi1_wfr='8086:24f0' P_shell='1' P_watchdog='900' ;;"),
        ];
        for (row, line) in cases {
            assert!(env.lines().any(|l| l == *line), "{row}: no line {line:?} in\n{env}");
            assert_eq!(find(row).unwrap().kernel_params(&RunOptions::default()), [format!("rdma_emu.scenario={row}")]);
        }
        assert!(env.contains("*) return 1 ;;"), "an unknown name fails");
    }

    #[test]
    fn every_parameter_a_row_sets_is_one_the_guest_init_reads() {
        let init = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../ci/guest/init")).unwrap();
        for s in SCENARIOS {
            for p in s.kernel_params {
                let name = p.text.strip_prefix(PARAM_PREFIX).and_then(|t| t.split_once('=')).map(|(k, _)| k);
                let name = name.unwrap_or_else(|| panic!("{}: {} is not rdma_emu.NAME=VALUE", s.name, p.text));
                assert!(
                    init.contains(&format!("            {name}) P_{name}=")),
                    "{}: init does not read {name}",
                    s.name
                );
            }
        }
        assert!(init.contains("scenario_row \"$P_scenario\""), "init does not apply rdma_emu.scenario");
    }

    #[test]
    fn a_step_on_a_device_is_expected_only_when_the_guest_lists_that_device() {
        let row = find("demo").unwrap();
        let only_hfi1 = RunOptions { guest_devices: Some(vec!["hfi1".into()]), ..RunOptions::default() };
        assert_eq!(row.expected_steps(&only_hfi1), ["mount", "modules", "iommu", "demo-hfi1"]);
        let both = RunOptions { guest_devices: Some(vec!["hfi1".into(), "irdma".into()]), ..RunOptions::default() };
        assert_eq!(
            row.expected_steps(&both),
            ["mount", "modules", "iommu", "demo-hfi1", "demo-irdma", "demo-irdma-irq"]
        );
    }

    #[test]
    fn the_fabric_expects_the_link_bounce_only_on_the_rtl_icode_and_perftest_only_when_asked() {
        let row = find("fabric").unwrap();
        let none = RunOptions { guest_devices: Some(vec![]), ..RunOptions::default() };
        let steps = row.expected_steps(&none);
        assert!(!steps.contains(&"fabric-link-bounce") && !steps.contains(&"fabric-perf"), "{steps:?}");
        assert_eq!(row.kernel_params(&none), ["rdma_emu.scenario=fabric"]);
        let rtl_perf = RunOptions { rtl_icode: true, fabric_perf: true, ..none };
        let steps = row.expected_steps(&rtl_perf);
        assert_eq!(steps[steps.len() - 4..], ["fabric-perf", "fabric-link-bounce", "fabric-peer-loss", "fabric-rmmod"]);
        assert_eq!(row.kernel_params(&rtl_perf), ["rdma_emu.scenario=fabric", "rdma_emu.fabric_perf=1"]);
    }
}
