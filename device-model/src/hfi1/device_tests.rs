//! The hfi1 function through the `Engine` contract only: MMIO, the shared RcvArray file, loopback doorbells
//! with HeapMemory as the client's memory, control commands, attach/detach/reset. The worker runs inline
//! except in the tests about the worker thread (a doorbell that returns while its DMA waits, a reset during
//! a DMA, the doorbell queue's bound), which wait on events.

#![forbid(unsafe_code)]

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde_json::json;
use vfio_user_proto::dma::{DmaAccess, DmaError, HeapMemory};

use super::*;
use crate::engine::{Engine, Interrupt};
use crate::hfi1::regs::*;
use crate::hfi1::rxe::rcv::{full_flow_psn, TIDCTRL_EVEN, TIDCTRL_ODD};
use crate::hfi1::{
    Descriptor, LB_BASE, LB_DB_DONE, LB_DB_DROPPED, LB_DB_SUBMITTED, LB_DESC_DONE, LB_DESC_ERR, LB_DESC_HDR_LEN,
    LB_LAST_RESULT, LB_MAX_CHAIN, LB_MSIX_VECTOR,
};

/// Records raised vectors (the wire-batch tests use it too).
#[derive(Default)]
pub(super) struct Irqs(Mutex<Vec<u16>>, Condvar);
impl Interrupt for Irqs {
    fn raise(&self, vector: u16) {
        self.0.lock().unwrap().push(vector);
        self.1.notify_all();
    }
}
impl Irqs {
    /// Waits (bounded: a hang guard) until `n` vectors were raised; how many were.
    fn wait(&self, n: usize) -> usize {
        let g = self.0.lock().unwrap();
        self.1.wait_timeout_while(g, Duration::from_secs(5), |v| v.len() < n).unwrap().0.len()
    }

    /// Waits (bounded: a hang guard) for vector `v`; whether it came.
    pub(super) fn wait_for(&self, v: u16) -> bool {
        let g = self.0.lock().unwrap();
        !self.1.wait_timeout_while(g, Duration::from_secs(10), |got| !got.contains(&v)).unwrap().1.timed_out()
    }
}

/// HeapMemory whose reads wait until `open` (bounded), to hold the worker inside a DMA.
struct Gated {
    mem: HeapMemory,
    open: Mutex<bool>,
    cv: Condvar,
    reads: AtomicU64,
}
impl Gated {
    fn new() -> Arc<Gated> {
        Arc::new(Gated { mem: HeapMemory::new(), open: Mutex::new(false), cv: Condvar::new(), reads: 0.into() })
    }
    /// Waits (bounded) until the worker is inside a read.
    fn wait_read(&self) {
        let g = self.open.lock().unwrap();
        let _g = self.cv.wait_timeout_while(g, Duration::from_secs(5), |_| self.reads.load(Ordering::SeqCst) == 0);
        assert_ne!(self.reads.load(Ordering::SeqCst), 0, "the worker reads");
    }
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}
impl DmaAccess for Gated {
    fn read(&self, iova: u64, buf: &mut [u8]) -> std::result::Result<(), DmaError> {
        let g = self.open.lock().unwrap();
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.cv.notify_all();
        let _g = self.cv.wait_timeout_while(g, Duration::from_secs(5), |o| !*o).unwrap();
        self.mem.read(iova, buf)
    }
    fn write(&self, iova: u64, buf: &[u8]) -> std::result::Result<(), DmaError> {
        self.mem.write(iova, buf)
    }
}

const EVEN_BUF: u64 = 0x12345000;
const ODD_BUF: u64 = 0x20000000;
const DESC: u64 = 0x4000_0000;

fn w(dev: &Hfi1, offset: u64, value: u64) {
    dev.mmio_write(HFI1_BAR, offset, &value.to_le_bytes());
}
fn r(dev: &Hfi1, offset: u64) -> u64 {
    let mut b = [0u8; 8];
    dev.mmio_read(HFI1_BAR, offset, &mut b);
    u64::from_le_bytes(b)
}
fn counter(dev: &Hfi1, name: &str) -> u64 {
    dev.counters().into_iter().find(|(n, _)| *n == name).map_or(u64::MAX, |(_, v)| v)
}

/// Context 2 enabled with TID flows, expected range 2048+1024 (G7), pair 2 = G1 buffer (trapped write) and a
/// 4 KiB buffer (stored through the shared file, as a client mapping would), flow 3 = G3.
fn programmed(mem: Arc<dyn DmaAccess>) -> (Hfi1, Arc<Irqs>) {
    programmed_with(mem, Hfi1Config::default().inline())
}

fn programmed_with(mem: Arc<dyn DmaAccess>, config: Hfi1Config) -> (Hfi1, Arc<Irqs>) {
    let dev = Hfi1::new(config).unwrap();
    let irqs = Arc::new(Irqs::default());
    dev.attach(mem, irqs.clone());
    w(&dev, kctxt_csr(RCV_CTXT_CTRL, 2), RCV_CTXT_CTRL_ENABLE_SMASK | RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK);
    w(&dev, kctxt_csr(RCV_TID_CTRL, 2), 0x0000008000000100);
    w(&dev, RCV_ARRAY + 8 * 2052, 0x8000002000012345);
    let bars = dev.bars();
    let mmap = bars[0].mmap.as_ref().unwrap();
    let file = std::fs::File::from(mmap.fd.fd.try_clone().unwrap());
    file.write_all_at(&0x8000001000020000u64.to_le_bytes(), mmap.fd.fd_offset + RCV_ARRAY + 8 * 2053).unwrap();
    w(&dev, tid_flow_csr(2, 3), 0x0000006F091A2800);
    (dev, irqs)
}

fn heap() -> Arc<HeapMemory> {
    let m = Arc::new(HeapMemory::new());
    assert!(m.map(EVEN_BUF, 8192) && m.map(ODD_BUF, 4096) && m.map(DESC, 0x10000));
    m
}

/// Writes a descriptor at `at` with `payload`, chained to `next`.
fn put_desc(mem: &HeapMemory, at: u64, kdeth0: u32, seq: u32, payload: &[u8], next: u64) {
    let d = Descriptor {
        packet: Packet { kdeth0, dest_qp: Packet::dest_qp(2, 3), psn: full_flow_psn(0x12345, seq) },
        payload_len: payload.len() as u32,
        next,
    };
    mem.write(at, &d.to_bytes()).unwrap();
    mem.write(at + LB_DESC_HDR_LEN as u64, payload).unwrap();
}

/// Rings the doorbell for the chain at `desc`; on the inline worker the chain has run when the write returns,
/// the `want_done`th doorbell done.
fn ring(dev: &Hfi1, desc: u64, want_done: u64) {
    w(dev, LB_BASE + LB_DESC_ADDR, desc);
    w(dev, LB_BASE + LB_DOORBELL, 1);
    assert_eq!(r(dev, LB_BASE + LB_DB_DONE), want_done, "doorbells done");
}

fn bytes(mem: &HeapMemory, iova: u64, n: usize) -> Vec<u8> {
    let mut b = vec![0; n];
    mem.read(iova, &mut b).unwrap();
    b
}

#[test]
fn bar0_is_64_bit_with_the_rcv_array_as_a_mappable_area() {
    let dev = Hfi1::new(Hfi1Config::default().inline()).unwrap();
    let bars = dev.bars();
    assert_eq!(bars.len(), 1);
    let b = &bars[0];
    assert_eq!((b.index, b.size, b.is_64bit), (0, 0x200_0000, true));
    let m = b.mmap.as_ref().unwrap();
    assert_eq!(m.areas, vec![(0x1200000, 0x8000)]);
    let file = std::fs::File::from(m.fd.fd.try_clone().unwrap());
    assert!(file.metadata().unwrap().len() >= m.fd.fd_offset + 0x1208000);
    assert_eq!(dev.msix_vectors(), 1);
}

#[test]
fn unimplemented_reads_are_all_ones_and_narrow_reads_see_part_of_a_register() {
    let dev = Hfi1::new(Hfi1Config::default().inline()).unwrap();
    for offset in [CCE, TXE, 0x1000020, kctxt_csr(RCV_CTXT_CTRL, 8), LB_BASE + 0x40, HFI1_BAR0_SIZE - 8] {
        assert_eq!(r(&dev, offset), u64::MAX, "{offset:#x}");
    }
    let mut b4 = [0u8; 4];
    dev.mmio_read(HFI1_BAR, RCV_ARRAY_CNT, &mut b4);
    assert_eq!(u32::from_le_bytes(b4), 4096);
    dev.mmio_read(HFI1_BAR, RCV_ARRAY_CNT + 4, &mut b4);
    assert_eq!(b4, [0; 4]);
    // A read crossing two registers, or of another BAR, is all-ones.
    dev.mmio_read(HFI1_BAR, RCV_ARRAY_CNT + 6, &mut b4);
    assert_eq!(b4, [0xFF; 4]);
    dev.mmio_read(2, RCV_ARRAY_CNT, &mut b4);
    assert_eq!(b4, [0xFF; 4]);
}

#[test]
fn writes_that_are_not_aligned_64_bit_are_counted_and_ignored() {
    let dev = Hfi1::new(Hfi1Config::default().inline()).unwrap();
    dev.mmio_write(HFI1_BAR, kctxt_csr(RCV_CTXT_CTRL, 0), &[1, 0, 0, 0]);
    dev.mmio_write(HFI1_BAR, kctxt_csr(RCV_CTXT_CTRL, 0) + 4, &[1; 8]);
    dev.mmio_write(3, kctxt_csr(RCV_CTXT_CTRL, 0), &[1; 8]);
    assert_eq!(r(&dev, kctxt_csr(RCV_CTXT_CTRL, 0)), 0);
    assert_eq!(counter(&dev, "mmio_bad_width"), 3);
    w(&dev, RCV_STATUS, 1);
    w(&dev, CCE, 1);
    assert_eq!(counter(&dev, "mmio_ignored_writes"), 2);
}

#[test]
fn loopback_chain_places_payloads_at_the_right_offsets_and_raises_vector_0() {
    let mem = heap();
    let (dev, irqs) = programmed(mem.clone());
    put_desc(&mem, DESC, Packet::kdeth0(16, false, 2, TIDCTRL_EVEN), 0, &[1, 2, 3, 4], DESC + 0x100);
    put_desc(&mem, DESC + 0x100, Packet::kdeth0(3, true, 2, TIDCTRL_ODD), 1, &[5, 6], 0);
    ring(&dev, DESC, 1);
    assert_eq!(bytes(&mem, EVEN_BUF + 64, 5), [1, 2, 3, 4, 0]);
    assert_eq!(bytes(&mem, ODD_BUF + 192, 3), [5, 6, 0]);
    assert_eq!((r(&dev, LB_BASE + LB_DESC_DONE), r(&dev, LB_BASE + LB_DESC_ERR)), (2, 0));
    assert_eq!(r(&dev, LB_BASE + LB_LAST_RESULT), RxResult::Placed.code() as u64);
    assert_eq!(r(&dev, LB_BASE + LB_DB_SUBMITTED), 1);
    assert_eq!(*irqs.0.lock().unwrap(), vec![LB_MSIX_VECTOR]);
    // The flow expects sequence 2 now.
    assert_eq!(r(&dev, tid_flow_csr(2, 3)) & RCV_TID_FLOW_TABLE_SEQ_MASK, 2);
}

#[test]
fn inline_worker_places_the_chain_before_the_doorbell_write_returns() {
    let mem = heap();
    let (dev, irqs) = programmed(mem.clone());
    put_desc(&mem, DESC, Packet::kdeth0(16, false, 2, TIDCTRL_EVEN), 0, &[1, 2, 3, 4], DESC + 0x100);
    put_desc(&mem, DESC + 0x100, Packet::kdeth0(3, true, 2, TIDCTRL_ODD), 1, &[5, 6], 0);
    w(&dev, LB_BASE + LB_DESC_ADDR, DESC);
    w(&dev, LB_BASE + LB_DOORBELL, 1);
    // No wait: the doorbell's job ran on this thread inside the write.
    assert_eq!((r(&dev, LB_BASE + LB_DB_SUBMITTED), r(&dev, LB_BASE + LB_DB_DONE)), (1, 1));
    assert_eq!(bytes(&mem, EVEN_BUF + 64, 5), [1, 2, 3, 4, 0]);
    assert_eq!(bytes(&mem, ODD_BUF + 192, 3), [5, 6, 0]);
    assert_eq!(*irqs.0.lock().unwrap(), vec![LB_MSIX_VECTOR]);
    assert!(dev.idle());
    // An inject gets its result from the same thread too: sequence 2 is next on flow 3 (G3).
    let p = Packet {
        kdeth0: Packet::kdeth0(0, false, 2, TIDCTRL_EVEN),
        dest_qp: Packet::dest_qp(2, 3),
        psn: full_flow_psn(0x12345, 2),
    };
    assert_eq!(dev.inject(p, vec![7; 8]).unwrap(), RxResult::Placed);
    assert_eq!(bytes(&mem, EVEN_BUF, 8), [7; 8]);
}

#[test]
fn loopback_generation_and_sequence_mismatches_set_status_bits_and_place_nothing() {
    let mem = heap();
    let (dev, _) = programmed(mem.clone());
    // Sequence 5 while 0 is expected, then generation 0x12346.
    put_desc(&mem, DESC, Packet::kdeth0(0, false, 2, TIDCTRL_EVEN), 5, &[9; 16], DESC + 0x100);
    let d = Descriptor {
        packet: Packet {
            kdeth0: Packet::kdeth0(0, false, 2, TIDCTRL_EVEN),
            dest_qp: Packet::dest_qp(2, 3),
            psn: full_flow_psn(0x12346, 0),
        },
        payload_len: 0,
        next: 0,
    };
    mem.write(DESC + 0x100, &d.to_bytes()).unwrap();
    let writes = mem.write_count();
    ring(&dev, DESC, 1);
    assert_eq!(mem.write_count(), writes);
    let flow = r(&dev, tid_flow_csr(2, 3));
    assert_ne!(flow & RCV_TID_FLOW_TABLE_STATUS_SEQ_MISMATCH_SMASK, 0);
    assert_ne!(flow & RCV_TID_FLOW_TABLE_STATUS_GEN_MISMATCH_SMASK, 0);
    assert_eq!(r(&dev, LB_BASE + LB_DESC_ERR), 2);
    assert_eq!(r(&dev, LB_BASE + LB_LAST_RESULT), RxResult::GenMismatch.code() as u64);
    // W1C through MMIO, as kern_set_hw_flow does by writing both status bits as 1.
    w(&dev, tid_flow_csr(2, 3), 0x0000006F091A2800);
    assert_eq!(r(&dev, tid_flow_csr(2, 3)), 0x0000000F091A2800);
}

#[test]
fn unreadable_descriptor_is_an_error_and_the_device_keeps_working() {
    let mem = heap();
    let (dev, _) = programmed(mem.clone());
    ring(&dev, 0xdead_0000, 1);
    assert_eq!(r(&dev, LB_BASE + LB_LAST_RESULT), RxResult::BadDescriptor.code() as u64);
    // Payload length beyond the maximum.
    let d = Descriptor { payload_len: LB_MAX_PAYLOAD as u32 + 1, ..Default::default() };
    mem.write(DESC, &d.to_bytes()).unwrap();
    ring(&dev, DESC, 2);
    assert_eq!(r(&dev, LB_BASE + LB_LAST_RESULT), RxResult::BadDescriptor.code() as u64);
    assert_eq!(counter(&dev, "lb_bad_descriptors"), 2);
    put_desc(&mem, DESC, Packet::kdeth0(0, false, 2, TIDCTRL_EVEN), 0, &[7; 8], 0);
    ring(&dev, DESC, 3);
    assert_eq!(bytes(&mem, EVEN_BUF, 8), [7; 8]);
}

#[test]
fn descriptor_whose_payload_cannot_be_read_is_bad_and_changes_no_flow() {
    let mem = heap();
    let (dev, _) = programmed(mem.clone());
    // The header is the last 24 bytes of the descriptor memory: the payload lies beyond it, unmapped.
    let at = DESC + 0x10000 - LB_DESC_HDR_LEN as u64;
    put_desc(&mem, at, Packet::kdeth0(0, false, 2, TIDCTRL_EVEN), 0, &[], 0);
    let d = Descriptor {
        packet: Packet { kdeth0: Packet::kdeth0(0, false, 2, TIDCTRL_EVEN), dest_qp: Packet::dest_qp(2, 3), psn: 0 },
        payload_len: 8,
        next: 0,
    };
    mem.write(at, &d.to_bytes()).unwrap();
    ring(&dev, at, 1);
    assert_eq!(r(&dev, LB_BASE + LB_LAST_RESULT), RxResult::BadDescriptor.code() as u64);
    assert_eq!(counter(&dev, "lb_bad_descriptors"), 1);
    assert_eq!(counter(&dev, "rx_packets"), 0, "never judged");
    assert_eq!(r(&dev, tid_flow_csr(2, 3)) & 0x7FF, 0, "the flow's sequence did not advance");
    assert_eq!(bytes(&mem, EVEN_BUF, 8), [0; 8]);
}

#[test]
fn cyclic_chain_is_cut_at_the_chain_limit() {
    let mem = heap();
    let (dev, _) = programmed(mem.clone());
    put_desc(&mem, DESC, Packet::kdeth0(0, false, 2, 0), 0, &[], DESC);
    ring(&dev, DESC, 1);
    assert_eq!(r(&dev, LB_BASE + LB_DESC_DONE), LB_MAX_CHAIN as u64);
    assert_eq!(r(&dev, LB_BASE + LB_LAST_RESULT), RxResult::BadDescriptor.code() as u64);
}

#[test]
fn doorbell_returns_at_once_and_registers_are_served_while_a_dma_is_in_flight() {
    let gated = Gated::new();
    assert!(gated.mem.map(DESC, 0x1000) && gated.mem.map(EVEN_BUF, 8192) && gated.mem.map(ODD_BUF, 4096));
    let (dev, irqs) = programmed_with(gated.clone(), Hfi1Config::default());
    put_desc(&gated.mem, DESC, Packet::kdeth0(0, false, 2, TIDCTRL_EVEN), 0, &[3; 8], 0);
    // The gate stays shut until this test opens it below: a doorbell that waited for the DMA would never return.
    w(&dev, LB_BASE + LB_DESC_ADDR, DESC);
    w(&dev, LB_BASE + LB_DOORBELL, 1);
    gated.wait_read();
    // The worker sits inside a DMA read: the register path still answers.
    assert_eq!(r(&dev, LB_BASE + LB_DB_DONE), 0);
    assert_eq!(r(&dev, RCV_ARRAY_CNT), 4096);
    gated.open();
    assert_eq!(irqs.wait(1), 1, "the doorbell's interrupt");
    assert_eq!(r(&dev, LB_BASE + LB_DB_DONE), 1);
    assert_eq!(bytes(&gated.mem, EVEN_BUF, 8), [3; 8]);
}

#[test]
fn reset_during_a_dma_abandons_the_work_and_publishes_nothing() {
    let gated = Gated::new();
    assert!(gated.mem.map(DESC, 0x1000) && gated.mem.map(EVEN_BUF, 8192));
    let (dev, _) = programmed_with(gated.clone(), Hfi1Config::default());
    put_desc(&gated.mem, DESC, Packet::kdeth0(0, false, 2, TIDCTRL_EVEN), 0, &[3; 8], 0);
    w(&dev, LB_BASE + LB_DESC_ADDR, DESC);
    w(&dev, LB_BASE + LB_DOORBELL, 1);
    gated.wait_read();
    dev.reset();
    gated.open();
    // Let the worker finish, then check nothing landed in the registers or memory.
    let _ = dev.inject(Packet::default(), vec![]);
    assert_eq!(r(&dev, LB_BASE + LB_DESC_DONE), 0);
    assert_eq!(r(&dev, LB_BASE + LB_DB_DONE), 0);
    assert_eq!(bytes(&gated.mem, EVEN_BUF, 8), [0; 8]);
}

#[test]
fn detach_resets_and_later_dma_fails_without_crashing() {
    let mem = heap();
    let (dev, _) = programmed(mem.clone());
    dev.detach();
    assert_eq!(r(&dev, kctxt_csr(RCV_TID_CTRL, 2)), 0);
    assert_eq!(r(&dev, RCV_ARRAY + 8 * 2052), 0);
    // Re-program the same and inject: the DMA has no client any more.
    w(&dev, kctxt_csr(RCV_CTXT_CTRL, 2), RCV_CTXT_CTRL_ENABLE_SMASK);
    w(&dev, kctxt_csr(RCV_TID_CTRL, 2), 0x0000008000000100);
    w(&dev, RCV_ARRAY + 8 * 2052, 0x8000002000012345);
    let pkt = Packet { kdeth0: Packet::kdeth0(0, false, 2, TIDCTRL_EVEN), dest_qp: Packet::dest_qp(2, 0), psn: 0 };
    assert_eq!(dev.inject(pkt, vec![1; 8]).ok(), Some(RxResult::DmaError));
    assert_eq!(counter(&dev, "rx_dma_errors"), 1);
    assert_eq!(mem.write_count(), 0);
}

#[test]
fn control_inject_dump_counters_and_reset() {
    let mem = heap();
    let (dev, _) = programmed(mem.clone());
    let req = json!({"cmd":"inject","ctxt":2,"flow":3,"tid":2,"tidctrl":2,"offset":1,"om":0,
                     "psn": 0x091A2800u32,"payload_hex":"a1a2"});
    assert_eq!(dev.control(&req), Ok(json!({"result":"placed","code":0})));
    assert_eq!(bytes(&mem, ODD_BUF + 4, 2), [0xA1, 0xA2]);
    let again = dev.control(&req).unwrap();
    assert_eq!(again["result"], "seq_mismatch");
    let dump = dev.control(&json!({"cmd":"dump"})).unwrap();
    let idx: Vec<u64> = dump["rcv_array"].as_array().unwrap().iter().map(|e| e["index"].as_u64().unwrap()).collect();
    assert_eq!(idx, vec![2052, 2053]);
    assert_eq!(dump["contexts"][2]["flows"][0]["decoded"]["seq_mismatch"], true);
    assert_eq!(dump["contexts"][2]["tid_base"], 2048);
    assert_eq!(dump["counters"]["rx_placed"], 1);
    let counters = dev.control(&json!({"cmd":"counters"})).unwrap();
    assert_eq!(counters["rx_seq_mismatch"], 1);
    assert_eq!(dev.control(&json!({"cmd":"reset"})), Ok(json!({"ok":true})));
    let dump = dev.control(&json!({"cmd":"dump"})).unwrap();
    assert_eq!(dump["rcv_array"], json!([]));
    assert_eq!(dump["counters"]["rx_placed"], 0);
}

#[test]
fn hostile_control_requests_get_errors_not_panics() {
    let dev = Hfi1::new(Hfi1Config::default().inline()).unwrap();
    let bad = [
        json!(null),
        json!([1, 2]),
        json!({"cmd": 5}),
        json!({"cmd": "explode"}),
        json!({"cmd": "inject"}),
        json!({"cmd": "inject", "ctxt": -1, "flow": 0, "tid": 0, "tidctrl": 1, "psn": 0}),
        json!({"cmd": "inject", "ctxt": 256, "flow": 0, "tid": 0, "tidctrl": 1, "psn": 0}),
        json!({"cmd": "inject", "ctxt": 0, "flow": 32, "tid": 0, "tidctrl": 1, "psn": 0}),
        json!({"cmd": "inject", "ctxt": 0, "flow": 0, "tid": 1024, "tidctrl": 1, "psn": 0}),
        json!({"cmd": "inject", "ctxt": 0, "flow": 0, "tid": 0, "tidctrl": 4, "psn": 0}),
        json!({"cmd": "inject", "ctxt": 0, "flow": 0, "tid": 0, "tidctrl": 1, "psn": 1u64 << 40}),
        json!({"cmd": "inject", "ctxt": 0, "flow": 0, "tid": 0, "tidctrl": 1, "generation": 0x100000, "sequence": 0}),
        json!({"cmd": "inject", "ctxt": 0, "flow": 0, "tid": 0, "tidctrl": 1, "psn": 0, "offset": 1.5}),
        json!({"cmd": "inject", "ctxt": 0, "flow": 0, "tid": 0, "tidctrl": 1, "psn": 0, "payload_hex": 12}),
        json!({"cmd": "inject", "ctxt": 0, "flow": 0, "tid": 0, "tidctrl": 1, "psn": 0, "payload_hex": "xyz"}),
        json!({"cmd": "inject", "ctxt": 0, "flow": 0, "tid": 0, "tidctrl": 1, "psn": 0,
               "payload_hex": "00".repeat(LB_MAX_PAYLOAD + 1)}),
    ];
    for req in bad {
        assert!(dev.control(&req).is_err(), "{req}");
    }
}

#[test]
fn doorbells_beyond_the_queue_are_dropped_and_counted() {
    let gated = Gated::new();
    assert!(gated.mem.map(DESC, 0x1000));
    let dev = Hfi1::new(Hfi1Config { doorbell_queue: 2, ..Default::default() }).unwrap();
    let irqs = Arc::new(Irqs::default());
    dev.attach(gated.clone(), irqs.clone());
    w(&dev, LB_BASE + LB_DESC_ADDR, DESC);
    for _ in 0..10 {
        w(&dev, LB_BASE + LB_DOORBELL, 1);
    }
    let submitted = r(&dev, LB_BASE + LB_DB_SUBMITTED);
    let dropped = r(&dev, LB_BASE + LB_DB_DROPPED);
    assert_eq!(submitted + dropped, 10);
    assert!(dropped >= 7, "queue of 2 plus one in the worker");
    assert_eq!(counter(&dev, "lb_doorbell_overruns"), dropped);
    gated.open();
    // Each doorbell taken ends with its interrupt.
    assert_eq!(irqs.wait(submitted as usize), submitted as usize);
    assert_eq!(r(&dev, LB_BASE + LB_DB_DONE), submitted);
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn random_mmio_never_panics(ops in proptest::collection::vec(
            (any::<bool>(), 0u32..3, prop_oneof![0u64..HFI1_BAR0_SIZE, RXE..RXE + 0x310000, LB_BASE..LB_BASE + 0x48,
                                                 Just(u64::MAX - 3)],
             prop_oneof![Just(1usize), Just(2), Just(4), Just(8), 0usize..16], any::<u64>()), 1..200)) {
            let mem = Arc::new(HeapMemory::new());
            assert!(mem.map(0, 0x10000));
            let dev = Hfi1::new(Hfi1Config::default().inline()).unwrap();
            dev.attach(mem, Arc::new(Irqs::default()));
            for (is_write, bar, offset, len, value) in ops {
                let mut bytes = value.to_le_bytes().to_vec();
                bytes.resize(len, 0xA5);
                if is_write {
                    dev.mmio_write(bar, offset, &bytes);
                } else {
                    dev.mmio_read(bar, offset, &mut bytes);
                }
            }
            prop_assert_eq!(r(&dev, RCV_ARRAY_CNT), 4096);
        }
    }
}

/// A packet to context 2, flow 3 (G3's generation 0x12345), TID pair 2's even buffer at `offset` bytes.
fn inject_to_flow_3(dev: &Hfi1, seq: u32, offset: u32, payload: &[u8]) -> serde_json::Value {
    let req = json!({"cmd": "inject", "ctxt": 2, "flow": 3, "tid": 2, "tidctrl": 1, "offset": offset / 4,
                     "generation": 0x12345, "sequence": seq,
                     "payload_hex": payload.iter().map(|b| format!("{b:02x}")).collect::<String>()});
    dev.control(&req).unwrap()
}

fn arm(dev: &Hfi1, spec: &str) {
    dev.probe().faults.arm(crate::fault::FaultSpec::parse(spec).unwrap());
}

/// A fault, the results of three in-order injects, and what the fault reported on each.
type InjectCase<'a> = (&'a str, [&'a str; 3], [Option<&'a str>; 3]);

#[test]
fn injected_packets_can_be_lost_duplicated_or_reordered_and_the_flow_sees_it() {
    let cases: [InjectCase; 4] = [
        ("", ["placed", "placed", "placed"], [None, None, None]),
        ("packet-drop,nth=2", ["placed", "dropped", "seq_mismatch"], [None, Some("packet-drop"), None]),
        ("packet-dup", ["seq_mismatch", "placed", "placed"], [Some("packet-dup"), None, None]),
        ("packet-reorder", ["held", "seq_mismatch", "seq_mismatch"], [Some("packet-reorder"), None, None]),
    ];
    for (fault, results, faults) in cases {
        let mem = heap();
        let (dev, _) = programmed(mem.clone());
        if !fault.is_empty() {
            arm(&dev, fault);
        }
        let replies: Vec<serde_json::Value> =
            (0..3).map(|s| inject_to_flow_3(&dev, s, 64 * s, &[s as u8 + 1; 8])).collect();
        for (k, reply) in replies.iter().enumerate() {
            assert_eq!(reply["result"], results[k], "{fault:?} packet {k}: {reply}");
            assert_eq!(reply["fault"].as_str(), faults[k], "{fault:?} packet {k}: {reply}");
        }
        if fault == "packet-dup" {
            assert_eq!(replies[0]["first"]["result"], "placed", "the first copy was placed");
        }
        if fault == "packet-reorder" {
            // Packet 0, held at the first inject, arrives after packet 1.
            assert_eq!(replies[1]["released"]["result"], "placed");
        }
    }
}

#[test]
fn a_flow_generation_fault_changes_the_generation_before_the_packet_is_judged() {
    let mem = heap();
    let (dev, _) = programmed(mem.clone());
    arm(&dev, "flow-generation,ctxt=2,flow=3,add=2");
    let reply = inject_to_flow_3(&dev, 0, 0, &[7; 8]);
    assert_eq!(reply["result"], "gen_mismatch");
    let d = dev.dump();
    let flow = d["contexts"][2]["flows"].as_array().unwrap().iter().find(|f| f["flow"] == 3).unwrap().clone();
    assert_eq!(flow["decoded"]["generation"], 0x12345 + 2);
    assert_eq!(flow["decoded"]["gen_mismatch"], true);
    assert_eq!(bytes(&mem, EVEN_BUF, 8), [0; 8]);
}
