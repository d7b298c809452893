//! `udriver bench`: what a driver inside the guest sees, over VFIO (issue 17). Every function is a PCI device
//! bound to vfio-pci; the same trapped reads go to our hfi1 function, to the same hfi1 function behind
//! rust-vmm's vfio-user server (the peer), to ours plain (no busy-poll, no keep-warm: the device model has
//! both on by default), and to QEMU's in-process
//! `edu` device (the floor for an emulated register under TCG). Variants alternate in rounds, so a burst of
//! load from elsewhere hits them all alike. Then mapped RcvArray stores/s, qhash ops/s and loopback placement
//! against memcpy, on our functions. Nothing here asserts a time.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use super::loopback::{Hfi1Driver, Loopback, PACKET, SEGMENT};
use super::qhash::qhash_rates;
use super::report::{BenchReport, Better, Case, Machine, Target};
use super::stats::{sample, Samples};
use crate::access::DeviceAccess;
use crate::hfi1::regs::{rcv_array_offset, HFI1_BAR, RCV_ARRAY_CNT, RCV_VL15};

/// edu's identification register (RO 0x010000ed) and its liveness register (reads back the inverse).
const EDU_IDENT: u64 = 0x00;
const EDU_LIVENESS: u64 = 0x04;
/// Our trapped read at most this fraction of the peer's (issue 17).
const TARGET_PEER_RATIO: f64 = 0.8;
/// Alternating rounds of the trapped-access variants.
const ROUNDS: u32 = 8;
/// RcvArray stores per timed batch: each is a few ns when mapped, so the clock read must not dominate.
const STORE_BATCH: u32 = 1024;
/// Loopback placement per doorbell in the guest: 16 MiB, as case (e) on the host.
const PLACE_ENTRIES: usize = 64;

/// The functions the guest mode measures; every one but `hfi1` may be absent (its rows are then skipped).
pub struct GuestDevices {
    /// Our hfi1 function (device-model).
    pub hfi1: Arc<dyn DeviceAccess>,
    /// Our irdma function (device-model).
    pub irdma: Option<Arc<dyn DeviceAccess>>,
    /// An hfi1 function served by rust-vmm's vfio-user server (`testbed serve-peers`).
    pub peer: Option<Arc<dyn DeviceAccess>>,
    /// An hfi1 function served by our server plain: no busy-poll, no keep-warm (`testbed serve-peers`).
    pub polled: Option<Arc<dyn DeviceAccess>>,
    /// QEMU's `edu` device.
    pub edu: Option<Arc<dyn DeviceAccess>>,
}

/// One trapped-access target: how to read it and how to write it.
struct Trapped {
    name: &'static str,
    dev: Arc<dyn DeviceAccess>,
    edu: bool,
}

impl Trapped {
    fn read(&self) -> Result<(), String> {
        if self.edu {
            let v = self.dev.read32(0, EDU_IDENT).map_err(|e| e.to_string())?;
            return if v & 0xff == 0xed { Ok(()) } else { Err(format!("edu ident read {v:#x}")) };
        }
        match self.dev.read64(HFI1_BAR, RCV_ARRAY_CNT).map_err(|e| e.to_string())? {
            0 | u64::MAX => Err(format!("{}: RCV_ARRAY_CNT read as 0 or all-ones", self.name)),
            _ => Ok(()),
        }
    }

    fn write(&self) -> Result<(), String> {
        if self.edu {
            return self.dev.write32(0, EDU_LIVENESS, 0x5a5a_5a5a).map_err(|e| e.to_string());
        }
        self.dev.write64(HFI1_BAR, RCV_VL15, 3).map_err(|e| e.to_string())
    }
}

/// Median trapped reads and writes of each target, alternating in rounds.
fn trapped(budget: Duration, targets: &[Trapped]) -> Result<Vec<(Samples, Samples)>, String> {
    let slice = budget / ROUNDS;
    let mut out: Vec<(Samples, Samples)> = targets.iter().map(|_| Default::default()).collect();
    for t in targets {
        t.dev.pci_enable_device().map_err(|e| format!("{}: pci_enable_device: {e}", t.name))?;
    }
    for _ in 0..ROUNDS {
        for (t, (r, w)) in targets.iter().zip(out.iter_mut()) {
            r.extend(sample(slice, 20, 20, usize::MAX, || t.read()).map_err(|e| format!("{}: {e}", t.name))?);
            w.extend(sample(slice, 20, 20, usize::MAX, || t.write()).map_err(|e| format!("{}: {e}", t.name))?);
        }
    }
    Ok(out)
}

fn trapped_case(budget: Duration, devs: &GuestDevices) -> Case {
    Case::new("guest-a", "in the guest: trapped register read/write round trip, ours vs rust-vmm's peer vs QEMU edu")
        .run(|case| {
            let mut targets = vec![Trapped { name: "ours", dev: devs.hfi1.clone(), edu: false }];
            for (name, dev, edu) in
                [("peer", &devs.peer, false), ("ours, plain", &devs.polled, false), ("edu", &devs.edu, true)]
            {
                if let Some(d) = dev {
                    targets.push(Trapped { name, dev: d.clone(), edu });
                }
            }
            let s = trapped(budget, &targets)?;
            for (t, (r, w)) in targets.iter().zip(&s) {
                case.metric(&format!("{}: trapped read, median", t.name), r.median(), "ns");
                case.metric(&format!("{}: trapped read, p99", t.name), r.quantile(0.99), "ns");
                case.metric(&format!("{}: trapped write, median", t.name), w.median(), "ns");
            }
            let median = |name: &str, read: bool| {
                targets.iter().zip(&s).find(|(t, _)| t.name == name).map(
                    |(_, (r, w))| {
                        if read {
                            r.median()
                        } else {
                            w.median()
                        }
                    },
                )
            };
            let ours = (median("ours", true).unwrap_or(0.0), median("ours", false).unwrap_or(0.0));
            if let Some(edu) = median("edu", true) {
                case.metric("ours / edu, read", ours.0 / edu.max(1.0), "x");
                case.metric("ours / edu, write", ours.1 / median("edu", false).unwrap_or(1.0).max(1.0), "x");
            }
            if let Some(p) = median("ours, plain", true) {
                case.metric("plain / ours, read", p / ours.0.max(1.0), "x");
                case.metric("plain / ours, write", median("ours, plain", false).unwrap_or(0.0) / ours.1.max(1.0), "x");
            }
            if let Some(peer) = median("peer", true) {
                case.metric("ours / peer, write", ours.1 / median("peer", false).unwrap_or(1.0).max(1.0), "x");
                case.target(Target::new(
                    "ours / peer, trapped read",
                    ours.0 / peer.max(1.0),
                    TARGET_PEER_RATIO,
                    "x",
                    Better::Lower,
                ));
            }
            case.note(format!(
                "each access is one guest pread/pwrite on the vfio-pci device fd or one load/store to a BAR the \
                 guest mmapped: either way a TCG MMIO exit to QEMU, then a vfio-user message for ours and the \
                 peer, or QEMU's own edu callback; hfi1 registers are read and written 64-bit (RCV_ARRAY_CNT, \
                 RCV_VL15), edu's 32-bit (ident, liveness); {ROUNDS} alternating rounds"
            ));
            Ok(())
        })
}

/// Mapped RcvArray stores/s on our hfi1 function, and the placement run after it on the same driver.
fn hfi1_cases(budget: Duration, dev: Arc<dyn DeviceAccess>, trapped_write_ns: Option<f64>) -> (Case, Case) {
    let mut drv = None;
    let stores =
        Case::new("guest-b", "in the guest: RcvArray programming (hfi1_put_tid) through the guest's BAR mapping").run(
            |case| {
                let d = Hfi1Driver::probe(dev.clone())?;
                let mapped = d.dev.identity().mapped_bars.contains(&HFI1_BAR);
                let (base, count) = (d.rcd.expected_base, d.rcd.expected_count);
                let mut next = 0u32;
                let s = sample(budget, 2, 3, usize::MAX, || d.program_expected(&mut next, STORE_BATCH))?;
                // The stores were taken: every entry programmed reads back valid through the same mapping.
                let programmed = if s.len() as u64 * u64::from(STORE_BATCH) >= u64::from(count) { count } else { next };
                for i in 0..programmed {
                    let v = d.dev.read64(HFI1_BAR, rcv_array_offset(base + i)).map_err(|e| e.to_string())?;
                    if v == 0 {
                        return Err(format!("RcvArray entry {} reads 0 after programming", base + i));
                    }
                }
                let rate = s.per_second() * f64::from(STORE_BATCH);
                case.metric("entries/s", rate, "1/s");
                case.metric("ns per entry", 1e9 / rate.max(1e-9), "ns");
                if let Some(w) = trapped_write_ns {
                    case.metric("speed-up over one trapped write each (guest-a)", rate * w / 1e9, "x");
                }
                case.note(format!(
                    "BAR{HFI1_BAR} {} in the guest; batches of {STORE_BATCH}; entries read back valid afterwards",
                    if mapped {
                        "mmapped through vfio-pci (QEMU maps the server's RcvArray area)"
                    } else {
                        "not mapped: every store trapped"
                    }
                ));
                drv = Some(d);
                Ok(())
            },
        );
    let place = Case::new("guest-e", "in the guest: loopback TID placement vs memcpy, 16 MiB doorbell").run(|case| {
        let d = drv.as_ref().ok_or("no driver: the RcvArray case failed")?;
        let mut lb = Loopback::new(d, SEGMENT, PLACE_ENTRIES, PACKET)?;
        lb.ring()?;
        lb.verify()?;
        let bytes = lb.bytes();
        let src = vec![0x5au8; bytes];
        let mut dst = vec![0u8; bytes];
        let (mut p, mut m) = (Samples::default(), Samples::default());
        for _ in 0..4 {
            p.extend(sample(budget / 4, 0, 3, usize::MAX, || lb.ring())?);
            m.extend(sample(budget / 4, 0, 3, usize::MAX, || {
                dst.copy_from_slice(std::hint::black_box(&src));
                Ok::<(), String>(())
            })?);
        }
        let gbps = |s: &Samples| bytes as f64 / s.median().max(1.0);
        case.metric("placement, median doorbell", gbps(&p), "GB/s");
        case.metric("memcpy in the guest, median", gbps(&m), "GB/s");
        case.metric("placement / guest memcpy", gbps(&p) / gbps(&m).max(1e-9), "x");
        case.note("the device model copies between the guest's shared RAM pages on the host; memcpy runs in TCG");
        Ok(())
    });
    (stores, place)
}

fn qhash_case(budget: Duration, dev: Arc<dyn DeviceAccess>) -> Case {
    Case::new("guest-d", "in the guest: qhash add+delete through the CQP by WQEs per doorbell (CCQ polled)").run(
        |case| {
            for r in qhash_rates(dev, budget)? {
                let n = r.wqes_per_doorbell;
                case.metric(&format!("{n} WQE(s) per doorbell: ops/s"), r.ops_per_second, "1/s");
            }
            Ok(())
        },
    )
}

/// Runs every guest case; `budget` is the wall time per variant.
pub fn run(devs: &GuestDevices, budget: Duration, date: String) -> BenchReport {
    let budget = budget.max(Duration::from_millis(1));
    let a = trapped_case(budget, devs);
    let write_ns = a.metrics.iter().find(|m| m.name == "ours: trapped write, median").map(|m| m.value);
    let (b, e) = hfi1_cases(budget, devs.hfi1.clone(), write_ns);
    let mut cases = vec![a, b];
    if let Some(irdma) = &devs.irdma {
        cases.push(qhash_case(budget, irdma.clone()));
    }
    cases.push(e);
    BenchReport {
        tool: "udriver",
        date,
        machine: Machine::this(),
        build: if cfg!(debug_assertions) { "debug" } else { "release" },
        budget_ms: budget.as_millis() as u64,
        cases,
    }
}
