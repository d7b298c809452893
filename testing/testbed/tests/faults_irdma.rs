//! udriver's irdma control path against the device model with faults injected (docs/observe.md, "Faults"):
//! for each fault, the errno the kernel's function returns, then recovery or a clean failure, and no DMA
//! mapping, CQP or quad-hash entry left behind. Every test runs in-process and over a real vfio-user socket.
//! The errnos are the kernel's: irdma_handle_cqp_op gives -EIO for a completion with the error bit and
//! -ETIMEDOUT when none comes (utils.c irdma_wait_event), irdma_sc_cqp_create -ETIMEDOUT when CCQPSTATUS
//! never says done (ctrl.c), a failed DMA map -ENOMEM.

mod irdma_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use device_model::fault::FaultSpec;
use device_model::irdma::{Irdma, IrdmaConfig};
use device_model::pci::{Function, PciIds};
use serde_json::{json, Value};
use testbed::{InProcess, Served};
use udriver::access::DeviceAccess;
use udriver::backend::vfio_user::VfioUserBackend;
use udriver::dma::DmaPool;
use udriver::irdma::process::irdma_manage_qhash;
use udriver::irdma::*;

use irdma_common::listener;

/// How the rig reaches the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    InProcess,
    VfioUser,
}

const BACKENDS: [Backend; 2] = [Backend::InProcess, Backend::VfioUser];

/// Device-defined codes (docs/irdma-device.md, "Error codes").
const MAJ_QHASH: u16 = 0x8002;
const MIN_DUPLICATE: u16 = 0x0001;
const OP_MANAGE_QHASH: u8 = 0x25;

struct Rig {
    function: Arc<Function>,
    inproc: Option<Arc<InProcess>>,
    access: Arc<dyn DeviceAccess>,
    /// Declared last: the client goes before the server stops.
    _served: Option<Served>,
}

impl Rig {
    fn new(backend: Backend) -> Rig {
        let engine = Arc::new(Irdma::new(IrdmaConfig::default()));
        let function = Function::try_new(engine, PciIds::irdma_default()).unwrap();
        let (inproc, access, served): (_, Arc<dyn DeviceAccess>, _) = match backend {
            Backend::InProcess => {
                let ip = Arc::new(InProcess::new(function.clone()));
                (Some(ip.clone()), ip, None)
            }
            Backend::VfioUser => {
                let s = Served::function(function.clone()).unwrap();
                (None, Arc::new(VfioUserBackend::connect(s.path(), true).unwrap()), Some(s))
            }
        };
        access.pci_enable_device().unwrap();
        Rig { function, inproc, access, _served: served }
    }

    fn fault(&self, spec: &str) -> u64 {
        self.function.arm_fault(FaultSpec::parse(spec).unwrap()).unwrap()
    }

    fn config(&self, wait_mode: IrdmaCqpWaitMode, cqp_timeout: Duration) -> IrdmaDevConfig {
        IrdmaDevConfig {
            hw_attrs: IrdmaHwAttrs { pe_ready_delay: Duration::from_millis(1), ..Default::default() },
            sq_size: 16,
            ccq_size: 16,
            wait_mode,
            cqp_timeout,
            irq_slice: Duration::from_millis(20),
            ..Default::default()
        }
    }

    fn up_with(&self, cfg: IrdmaDevConfig) -> udriver::irdma::Result<IrdmaDev> {
        IrdmaDev::new(Arc::new(DmaPool::new(self.access.clone(), false)), cfg)
    }

    fn up(&self) -> IrdmaDev {
        self.up_with(self.config(IrdmaCqpWaitMode::Poll, Duration::from_secs(2))).unwrap()
    }

    fn dump(&self) -> Value {
        self.function.engine().control(&json!({"cmd": "dump"})).unwrap()
    }

    /// DMA mappings the device can reach: the server's view over vfio-user, the rig's in-process.
    fn mappings(&self) -> usize {
        match &self.inproc {
            Some(ip) => ip.mappings(),
            None => self.function.dma_maps()["maps"].as_array().map_or(0, Vec::len),
        }
    }

    /// Nothing left: no CQP or CCQ on the device, no quad-hash entry, no DMA mapping.
    fn assert_clean(&self, what: &str) {
        let d = self.dump();
        assert_eq!((d["cqp"].clone(), d["ccq"].clone()), (Value::Null, Value::Null), "{what}: CQP/CCQ left");
        assert_eq!(d["qhash"]["len"], 0, "{what}: quad-hash entries left");
        assert_eq!(self.mappings(), 0, "{what}: DMA mappings left");
    }

    /// Waits (bounded) until the device's worker has done all it was given.
    fn idle(&self) {
        let until = Instant::now() + Duration::from_secs(5);
        while !self.function.engine().idle() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn fired(&self, id: u64) -> u64 {
        let list = self.function.probe().faults.list();
        list.as_array().unwrap().iter().find(|f| f["id"] == id).map_or(0, |f| f["fired"].as_u64().unwrap())
    }
}

/// Function-level reset through Device Control (PCIe capability at 0x40), then the function re-enabled, as
/// `pci_reset_function` and the next probe's `pci_enable_device` do.
fn flr(rig: &Rig) {
    const DEVCTL: u64 = 0x40 + 0x8;
    const INITIATE_FLR: u16 = 1 << 15;
    rig.access.config_write(DEVCTL, &INITIATE_FLR.to_le_bytes()).unwrap();
    rig.access.pci_enable_device().unwrap();
}

/// A TCP_SYN listener on local port `port`, as `irdma_manage_qhash` fills it.
const ADD: IrdmaQuadHashManageType = IrdmaQuadHashManageType::IrdmaQhashManageTypeAdd;
const DELETE: IrdmaQuadHashManageType = IrdmaQuadHashManageType::IrdmaQhashManageTypeDelete;

fn errno<T>(r: udriver::irdma::Result<T>) -> i32 {
    r.err().map_or(0, |e| e.to_errno())
}

/// Deletes the listeners on `ports` and tears the device down.
fn teardown(rig: &Rig, dev: IrdmaDev, ports: &[u16], what: &str) {
    for &p in ports {
        irdma_manage_qhash(&dev, &listener(DELETE, p)).unwrap_or_else(|e| panic!("{what}: delete {p}: {e}"));
    }
    dev.destroy().unwrap();
    rig.assert_clean(what);
}

#[test]
fn a_failed_cqp_operation_is_eio_with_the_devices_codes_and_the_retry_succeeds() {
    for backend in BACKENDS {
        let rig = Rig::new(backend);
        let dev = rig.up();
        let id = rig.fault("cqp-fail,op=manage-qhash,major=0x8002,minor=1,nth=2");
        irdma_manage_qhash(&dev, &listener(ADD, 4791)).unwrap();
        let r = irdma_manage_qhash(&dev, &listener(ADD, 4792));
        assert!(
            matches!(r, Err(IrdmaError::CqeError { op: OP_MANAGE_QHASH, maj: MAJ_QHASH, min: MIN_DUPLICATE })),
            "{backend:?}: {r:?}"
        );
        assert_eq!(errno(r), -libc::EIO);
        assert_eq!(rig.dump()["qhash"]["len"], 1, "{backend:?}: the failed add changed nothing");
        assert_eq!(rig.fired(id), 1);
        irdma_manage_qhash(&dev, &listener(ADD, 4792)).unwrap();
        assert_eq!(rig.dump()["qhash"]["len"], 2);
        teardown(&rig, dev, &[4791, 4792], &format!("{backend:?}"));
    }
}

#[test]
fn a_failed_wqe_fetch_is_eio_with_the_dma_codes_and_the_retry_succeeds() {
    // docs/irdma-device.md, "Error codes": 0x8004 DMA, minor 1 the WQE fetch.
    const MAJ_DMA: u16 = 0x8004;
    const MIN_WQE_FETCH: u16 = 0x0001;
    for backend in BACKENDS {
        let rig = Rig::new(backend);
        let dev = rig.up();
        // The next DMA read of the device is the next command's WQE fetch (a polled CCQ is never full here).
        let id = rig.fault("dma-read-fail");
        let r = irdma_manage_qhash(&dev, &listener(ADD, 4791));
        assert!(matches!(r, Err(IrdmaError::CqeError { maj: MAJ_DMA, min: MIN_WQE_FETCH, .. })), "{backend:?}: {r:?}");
        assert_eq!(errno(r), -libc::EIO);
        assert_eq!(rig.fired(id), 1);
        assert_eq!(rig.dump()["qhash"]["len"], 0, "{backend:?}: the unread WQE changed nothing");
        irdma_manage_qhash(&dev, &listener(ADD, 4791)).unwrap();
        teardown(&rig, dev, &[4791], &format!("{backend:?}"));
    }
}

#[test]
fn a_late_completion_within_the_timeout_succeeds_and_one_beyond_it_is_etimedout_then_dropped() {
    for backend in BACKENDS {
        let rig = Rig::new(backend);
        let dev = rig.up_with(rig.config(IrdmaCqpWaitMode::Poll, Duration::from_millis(600))).unwrap();
        rig.fault("cqe-delay,ms=200");
        let start = Instant::now();
        irdma_manage_qhash(&dev, &listener(ADD, 1)).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(200), "{backend:?}: the completion came late");
        rig.fault("cqe-delay,ms=1500");
        let r = irdma_manage_qhash(&dev, &listener(ADD, 2));
        assert!(matches!(r, Err(IrdmaError::Timeout(_))), "{backend:?}: {r:?}");
        assert_eq!(errno(r), -libc::ETIMEDOUT);
        // The device finishes the add after all; the driver drops the late CQE of the command it gave up.
        std::thread::sleep(Duration::from_millis(1200));
        irdma_manage_qhash(&dev, &listener(ADD, 3)).unwrap();
        assert_eq!(rig.dump()["qhash"]["len"], 3);
        teardown(&rig, dev, &[1, 2, 3], &format!("{backend:?}"));
    }
}

#[test]
fn a_dropped_cqe_is_etimedout_for_its_command_and_the_ring_goes_on_past_its_slot() {
    for backend in BACKENDS {
        let rig = Rig::new(backend);
        let dev = rig.up_with(rig.config(IrdmaCqpWaitMode::Poll, Duration::from_millis(300))).unwrap();
        rig.fault("cqe-drop,nth=2");
        irdma_manage_qhash(&dev, &listener(ADD, 10)).unwrap();
        let r = irdma_manage_qhash(&dev, &listener(ADD, 11));
        assert_eq!(errno(r), -libc::ETIMEDOUT, "{backend:?}");
        assert_eq!(rig.dump()["qhash"]["len"], 2, "{backend:?}: the device did execute it");
        // 15 adds and 17 deletes wrap the 16-entry SQ twice over the slot whose completion never came.
        for port in 12..27 {
            irdma_manage_qhash(&dev, &listener(ADD, port)).unwrap_or_else(|e| panic!("{backend:?} add {port}: {e}"));
        }
        teardown(&rig, dev, &(10..27).collect::<Vec<_>>(), &format!("{backend:?}"));
    }
}

#[test]
fn a_stalled_cqptail_makes_the_ccq_destroy_etimedout_and_teardown_still_frees_everything() {
    for backend in BACKENDS {
        let rig = Rig::new(backend);
        let dev = rig.up();
        // The CCQ's destroy is polled through CQPTAIL (irdma_cqp_poll_registers); CQEs do not need it.
        let id = rig.fault("cqptail-stall");
        irdma_manage_qhash(&dev, &listener(ADD, 1)).unwrap();
        irdma_manage_qhash(&dev, &listener(DELETE, 1)).unwrap();
        let r = dev.destroy();
        assert!(matches!(r, Err(IrdmaError::Timeout(_))), "{backend:?}: {r:?}");
        assert_eq!(errno(r), -libc::ETIMEDOUT);
        assert!(rig.fired(id) >= 3);
        // The CQP was destroyed all the same (CCQPSTATUS, not CQPTAIL), and the memory given back.
        rig.assert_clean(&format!("{backend:?}"));
    }
}

#[test]
fn a_corrupted_cqe_is_eio_and_the_ring_goes_on() {
    for (field, xor) in [("ctx", "0x40"), ("wqe-idx", "0x5")] {
        for backend in BACKENDS {
            let what = format!("{backend:?} {field}");
            let rig = Rig::new(backend);
            let dev = rig.up();
            rig.fault(&format!("cqe-corrupt,field={field},xor={xor}"));
            let r = irdma_manage_qhash(&dev, &listener(ADD, 7));
            assert!(matches!(r, Err(IrdmaError::BadCqe(_))), "{what}: {r:?}");
            assert_eq!(errno(r), -libc::EIO, "{what}");
            // The device executed the add; the driver consumed the bad CQE and carries on.
            assert_eq!(rig.dump()["qhash"]["len"], 1, "{what}");
            irdma_manage_qhash(&dev, &listener(ADD, 8)).unwrap();
            teardown(&rig, dev, &[7, 8], &what);
        }
    }
}

#[test]
fn a_stuck_ccqp_done_bit_makes_cqp_create_etimedout_and_nothing_stays_mapped() {
    for backend in BACKENDS {
        let rig = Rig::new(backend);
        let id = rig.fault("reg-stuck,reg=CCQPSTATUS,mask=0x1,value=0");
        let r = rig.up_with(rig.config(IrdmaCqpWaitMode::Poll, Duration::from_secs(1))).err();
        assert!(matches!(r, Some(IrdmaError::Timeout(_))), "{backend:?}: {r:?}");
        assert_eq!(r.map(|e| e.to_errno()), Some(-libc::ETIMEDOUT));
        assert!(rig.fired(id) > 1, "every CCQPSTATUS read saw the stuck bit");
        assert_eq!(rig.mappings(), 0, "{backend:?}: the CQP's memory was unmapped");
        // As in the kernel (irdma_create_cqp frees its memory and tells the device nothing), the device still
        // holds the CQP: a second create is refused until a function reset, which the next probe does.
        assert!(rig.function.probe().faults.remove(id));
        let again = rig.up_with(rig.config(IrdmaCqpWaitMode::Poll, Duration::from_secs(1))).err();
        assert!(
            matches!(again, Some(IrdmaError::CqpCreate { maj: 0x8005, min: 0x0004, .. })),
            "{backend:?}: {again:?}"
        );
        flr(&rig);
        teardown(&rig, rig.up(), &[], &format!("{backend:?}"));
    }
}

#[test]
fn a_surprise_removed_device_reads_all_ones_and_the_driver_fails_without_hanging() {
    for backend in BACKENDS {
        let rig = Rig::new(backend);
        let dev = rig.up_with(rig.config(IrdmaCqpWaitMode::Poll, Duration::from_millis(300))).unwrap();
        irdma_manage_qhash(&dev, &listener(ADD, 1)).unwrap();
        rig.fault("removed");
        let hw = udriver::irdma::regs::IrdmaHw::new(rig.access.clone());
        assert_eq!(hw.rd32(udriver::irdma::regs::IrdmaRegisters::IRDMA_CQPTAIL).unwrap(), u32::MAX);
        let r = irdma_manage_qhash(&dev, &listener(ADD, 2));
        assert_eq!(errno(r), -libc::ETIMEDOUT, "{backend:?}: the doorbell went nowhere");
        // Teardown polls CQPTAIL and CCQPSTATUS, which read all-ones: it fails, and gives the memory back.
        let start = Instant::now();
        let d = dev.destroy();
        assert!(d.is_err(), "{backend:?}: teardown of a removed device succeeded");
        assert!(start.elapsed() < Duration::from_secs(10), "{backend:?}: bounded");
        assert_eq!(rig.mappings(), 0, "{backend:?}");
    }
}

#[test]
fn a_suppressed_interrupt_delays_an_event_driven_wait_by_one_slice_and_nothing_more() {
    for backend in BACKENDS {
        let rig = Rig::new(backend);
        let dev = rig.up_with(rig.config(IrdmaCqpWaitMode::Event { vector: 1 }, Duration::from_secs(2))).unwrap();
        irdma_manage_qhash(&dev, &listener(ADD, 1)).unwrap();
        let id = rig.fault("msix-drop,vector=1");
        // The driver arms only when its first look finds no CQE (process.rs wait_for): a device that completes
        // before the arm raises no interrupt to lose. So commands go until one interrupt was raised and lost;
        // the waiter re-checks the CCQ every irq_slice, so each completes all the same. On a loaded machine the
        // device can finish before the first look dozens of times in a row (a clean-clone CI run saw 20), so
        // the commands are many; the loop ends at the first lost interrupt.
        let mut keys = vec![1];
        for key in 2..=401 {
            irdma_manage_qhash(&dev, &listener(ADD, key)).unwrap();
            keys.push(key);
            // The waiter may have seen the CQE before the device raised (and lost) the interrupt that follows it.
            rig.idle();
            if rig.fired(id) > 0 {
                break;
            }
        }
        assert_eq!(rig.fired(id), 1, "{backend:?}: the CCQ's interrupt was suppressed once (count=1)");
        let next = keys.last().unwrap() + 1;
        irdma_manage_qhash(&dev, &listener(ADD, next)).unwrap();
        keys.push(next);
        teardown(&rig, dev, &keys, &format!("{backend:?}"));
    }
}

#[test]
fn a_refused_dma_map_fails_bring_up_with_enomem_and_a_second_bring_up_works() {
    for backend in BACKENDS {
        for nth in 1..=3 {
            let what = format!("{backend:?} map {nth}");
            let rig = Rig::new(backend);
            let id = rig.fault(&format!("dma-map-refuse,errno=ENOMEM,nth={nth}"));
            let r = rig.up_with(rig.config(IrdmaCqpWaitMode::Poll, Duration::from_secs(1)));
            assert_eq!(errno(r), -libc::ENOMEM, "{what}");
            assert_eq!(rig.fired(id), 1, "{what}");
            rig.assert_clean(&what);
            teardown(&rig, rig.up(), &[], &what);
        }
    }
}
