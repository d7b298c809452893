//! Device-level tests: a small driver (mirroring the kernel's CQP/CCQ routines) drives the engine through
//! MMIO, with `HeapMemory` as the client's memory.

#![forbid(unsafe_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use serde_json::{json, Value};
use vfio_user_proto::dma::{DmaAccess, DmaError, HeapMemory};

use super::ccq::{IRDMA_CQ_VALID, IRDMA_CQ_WQEIDX};
use super::classify::Segment;
use super::loopback::encode_descriptor;
use super::regs::*;
use super::{Irdma, IrdmaConfig, WorkerMode};
use crate::engine::{Engine, Interrupt};

const CTX_PA: u64 = 0x0000_0001_2345_6000; // G10
const SQ_PA: u64 = 0x20_0000;
const CCQ_PA: u64 = 0x40_0000;
const SHADOW_PA: u64 = 0x60_0000;
const DESC_PA: u64 = 0x70_0000;
const COMPLETION_CTX: u64 = 0xFFFF_8880_0BAD_CAFE;
const IDLE: Duration = Duration::from_secs(5);

const OP_CREATE_CQ: u64 = 0x03;
const OP_DESTROY_CQ: u64 = 0x05;
const OP_NOP: u64 = 0x24;
const OP_QHASH: u64 = 0x25;
const ADD: u64 = 1;
const DELETE: u64 = 0;
const MODIFY: u64 = 2;
const ESTABLISHED: u64 = 1;
const SYN: u64 = 2;

#[derive(Default)]
struct Irqs(Mutex<Vec<u16>>);
impl Interrupt for Irqs {
    fn raise(&self, vector: u16) {
        self.0.lock().unwrap().push(vector);
    }
}
impl Irqs {
    fn seen(&self) -> Vec<u16> {
        self.0.lock().unwrap().clone()
    }
}

/// The driver side: SQ and CCQ positions as the kernel keeps them.
struct Rig {
    dev: Arc<Irdma>,
    mem: Arc<HeapMemory>,
    irqs: Arc<Irqs>,
    sq_size: u32,
    head: u32,
    polarity: bool,
    ccq_size: u32,
    ccq_head: u32,
    ccq_polarity: bool,
}

/// (major, minor) of an error CQE.
type Codes = Option<(u64, u64)>;

/// A CQE as the driver reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cqe {
    ctx: u64,
    qw3: u64,
}

impl Cqe {
    fn idx(&self) -> u64 {
        IRDMA_CQ_WQEIDX.get(self.qw3)
    }
    /// (major, minor) if the ERROR bit is set.
    fn error(&self) -> Option<(u64, u64)> {
        (self.qw3 & (1 << 55) != 0).then_some(((self.qw3 >> 16) & 0xFFFF, self.qw3 & 0xFFFF))
    }
}

fn sq_code(size: u32) -> u64 {
    u64::from(size.trailing_zeros() - 1)
}

/// G10 host context for `sq_size` entries.
fn host_context(sq_size: u32) -> [u64; 8] {
    [(sq_code(sq_size) << 8) | (2 << 3), SQ_PA, 1, COMPLETION_CTX, 1 << 16, 0, 0, 0]
}

fn qhash_wqe(manage: u64, ty: u64, port: u16, remote_port: u16, qpn: u64) -> [u64; 8] {
    let est = ty == ESTABLISHED;
    let src_port = if est { u64::from(remote_port) << 16 } else { 0 };
    [
        0x0011_2233_4455,
        (qpn << 32) | src_port | u64::from(port),
        0,
        (manage << 61) | (1 << 60) | (ty << 42) | (OP_QHASH << 32),
        if est { 0x0A00_0002 } else { 0 },
        0,
        0x0A00_0001,
        0,
    ]
}

fn nop() -> [u64; 8] {
    [0, 0, 0, OP_NOP << 32, 0, 0, 0, 0]
}

fn create_cq_wqe(size: u64, ring: u64, ceq: Option<u64>) -> [u64; 8] {
    let ceq_bits = ceq.map_or(0, |c| (1 << 49) | (c << 22));
    [size, 0, 16, ceq_bits | (OP_CREATE_CQ << 32), ring, SHADOW_PA, 0, 0]
}

impl Rig {
    fn with_config(config: IrdmaConfig) -> Rig {
        Rig::with_dma(config, |_, mem| mem)
    }

    /// The device sees the client's memory through what `dma` makes of it (given the device and the memory).
    fn with_dma(config: IrdmaConfig, dma: impl FnOnce(&Arc<Irdma>, Arc<HeapMemory>) -> Arc<dyn DmaAccess>) -> Rig {
        let mem = Arc::new(HeapMemory::new());
        assert!(mem.map(CTX_PA, 0x1000));
        assert!(mem.map(SQ_PA, 0x2_0000));
        assert!(mem.map(CCQ_PA, 0x2_0000));
        assert!(mem.map(SHADOW_PA, 0x1000));
        assert!(mem.map(DESC_PA, 0x1000));
        let irqs = Arc::new(Irqs::default());
        let dev = Arc::new(Irdma::new(config));
        dev.attach(dma(&dev, mem.clone()), irqs.clone());
        Rig { dev, mem, irqs, sq_size: 0, head: 0, polarity: false, ccq_size: 0, ccq_head: 0, ccq_polarity: true }
    }

    fn new() -> Rig {
        Rig::with_config(IrdmaConfig::default())
    }

    fn w32(&self, offset: u64, value: u32) {
        self.dev.mmio_write(0, offset, &value.to_le_bytes());
    }

    fn r32(&self, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        self.dev.mmio_read(0, offset, &mut b);
        u32::from_le_bytes(b)
    }

    fn idle(&self) {
        assert!(self.dev.wait_idle(IDLE), "worker did not go idle");
    }

    fn counter(&self, name: &str) -> u64 {
        self.dev.counters()[name].as_u64().unwrap()
    }

    fn write_qws(&self, pa: u64, qw: &[u64]) {
        for (i, q) in qw.iter().enumerate() {
            self.mem.write_u64(pa + 8 * i as u64, *q).unwrap();
        }
    }

    /// irdma_sc_cqp_init register writes, then irdma_sc_cqp_create.
    fn create_cqp_with(&mut self, sq_size: u32, ctx: [u64; 8]) -> u32 {
        self.w32(IRDMA_CQPTAIL, 0);
        self.w32(IRDMA_CQPDB, 0);
        self.w32(IRDMA_CCQPSTATUS, 0);
        self.write_qws(CTX_PA, &ctx);
        self.w32(IRDMA_CCQPHIGH, (CTX_PA >> 32) as u32);
        self.w32(IRDMA_CCQPLOW, CTX_PA as u32);
        self.idle();
        (self.sq_size, self.head, self.polarity) = (sq_size, 0, false);
        self.r32(IRDMA_CCQPSTATUS)
    }

    fn create_cqp(&mut self, sq_size: u32) {
        assert_eq!(self.create_cqp_with(sq_size, host_context(sq_size)), 0x0000_0001);
    }

    /// irdma_sc_cqp_get_next_send_wqe_idx + the op-specific writes, header (valid bit) last.
    fn post(&mut self, mut wqe: [u64; 8]) -> u32 {
        let idx = self.head;
        self.head = (self.head + 1) % self.sq_size;
        if idx == 0 {
            self.polarity = !self.polarity;
        }
        wqe[3] = (wqe[3] & !(1 << 63)) | (u64::from(self.polarity) << 63);
        self.write_qws(SQ_PA + 64 * u64::from(idx), &wqe);
        idx
    }

    /// irdma_sc_cqp_post_sq.
    fn ring(&self) {
        self.w32(IRDMA_CQPDB, self.head);
        self.idle();
    }

    fn create_ccq(&mut self, size: u32) -> Cqe {
        self.post(create_cq_wqe(u64::from(size), CCQ_PA, Some(0)));
        self.ring();
        (self.ccq_size, self.ccq_head, self.ccq_polarity) = (size, 0, true);
        self.poll().expect("CREATE_CQ completes into the new CCQ")
    }

    /// irdma_sc_ccq_get_cqe_info: consume one CQE and publish the consumer index in shadow qw0.
    fn poll(&mut self) -> Option<Cqe> {
        let slot = CCQ_PA + 32 * u64::from(self.ccq_head);
        let qw3 = self.mem.read_u64(slot + 24).unwrap();
        if IRDMA_CQ_VALID.is_set(qw3) != self.ccq_polarity {
            return None;
        }
        let ctx = self.mem.read_u64(slot + 8).unwrap();
        self.ccq_head = (self.ccq_head + 1) % self.ccq_size;
        if self.ccq_head == 0 {
            self.ccq_polarity = !self.ccq_polarity;
        }
        self.mem.write_u64(SHADOW_PA, u64::from(self.ccq_head)).unwrap();
        Some(Cqe { ctx, qw3 })
    }

    /// irdma_sc_ccq_arm.
    fn arm(&self) {
        let qw4 = self.mem.read_u64(SHADOW_PA + 32).unwrap();
        let seq = (((qw4 >> 16) & 3) + 1) & 3;
        self.mem.write_u64(SHADOW_PA + 32, (qw4 & 0xBFFF) | (seq << 16) | (1 << 14)).unwrap();
        self.w32(IRDMA_CQARM, 0);
        self.idle();
    }

    fn dump(&self) -> Value {
        self.dev.control(&json!({"cmd": "dump"})).unwrap()
    }
}

#[test]
fn g10_ccqphigh_then_ccqplow_creates_the_cqp_from_the_host_context() {
    let mut rig = Rig::new();
    rig.create_cqp(2048);
    let cqp = &rig.dump()["cqp"];
    assert_eq!(cqp["sq_size"], 2048);
    assert_eq!(cqp["sq_base"], format!("{SQ_PA:#x}"));
    assert_eq!(cqp["protocol_used"], 2);
    assert_eq!(cqp["polarity"], 1);
    assert_eq!(rig.r32(IRDMA_CCQPHIGH), 1);
    assert_eq!(rig.r32(IRDMA_CCQPLOW), 0x2345_6000);
}

#[test]
fn bad_host_contexts_fail_create_with_ccqp_err_and_codes() {
    let cases: [(usize, u64, u32); 4] = [
        (0, 0x0010, 0x8005_0001),                // SQSIZE 0
        (1, SQ_PA + 0x100, 0x8005_0002),         // SQ base not 0x200-aligned
        (4, 0x0000_0000_0000_0000, 0x8005_0003), // HW_MAJVER GEN1
        (2, 0x7, 0x8005_0006),                   // HMC_PROFILE 7
    ];
    for (qw, value, codes) in cases {
        let mut rig = Rig::new();
        let mut ctx = host_context(16);
        ctx[qw] = value;
        assert_eq!(rig.create_cqp_with(16, ctx), 0x8000_0001, "G10 error status, qw{qw}");
        assert_eq!(rig.r32(IRDMA_CQPERRCODES), codes, "qw{qw}");
        assert_eq!(rig.dump()["cqp"], Value::Null);
    }
}

#[test]
fn host_context_in_unmapped_memory_fails_create_with_a_dma_code() {
    let rig = Rig::new();
    rig.w32(IRDMA_CCQPHIGH, 0x55);
    rig.w32(IRDMA_CCQPLOW, 0);
    rig.idle();
    assert_eq!(rig.r32(IRDMA_CCQPSTATUS), 0x8000_0001);
    assert_eq!(rig.r32(IRDMA_CQPERRCODES), 0x8004_0003);
    assert_eq!(rig.counter("dma_errors"), 1);
}

#[test]
fn zero_to_ccqphigh_and_ccqplow_destroys_and_clears_done() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    rig.w32(IRDMA_CCQPHIGH, 0);
    rig.w32(IRDMA_CCQPLOW, 0);
    rig.idle();
    assert_eq!(rig.r32(IRDMA_CCQPSTATUS) & 1, 0);
    assert_eq!(rig.dump()["cqp"], Value::Null);
    // A doorbell without a CQP is ignored (as was the init sequence's CQPDB <- 0), and a new CQP can be created.
    rig.w32(IRDMA_CQPDB, 1);
    assert_eq!(rig.counter("doorbells_ignored"), 2);
    rig.create_cqp(16);
}

#[test]
fn a_second_create_is_refused_and_the_running_cqp_keeps_working() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    rig.w32(IRDMA_CCQPLOW, CTX_PA as u32);
    rig.idle();
    assert_eq!(rig.r32(IRDMA_CCQPSTATUS), 0x8000_0001);
    assert_eq!(rig.r32(IRDMA_CQPERRCODES), 0x8005_0004);
    rig.post(nop());
    rig.ring();
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 1);
}

#[test]
fn identification_registers_and_unimplemented_offsets() {
    let rig = Rig::new();
    for off in [IRDMA_GLPE_CPUSTATUS0, IRDMA_GLPE_CPUSTATUS1, IRDMA_GLPE_CPUSTATUS2] {
        assert_eq!(rig.r32(off), 0x80);
    }
    assert_eq!((rig.r32(IRDMA_GLPCI_LBARCTRL) >> 4) & 3, 2, "PE_DB_SIZE = 8 MiB");
    assert_eq!(rig.r32(0x0050_0000), u32::MAX);
    let mut wide = [0u8; 8];
    rig.dev.mmio_read(0, IRDMA_CQPTAIL, &mut wide);
    assert_eq!(wide, [0xff; 8], "registers are 32-bit");
    let mut byte = [0u8; 1];
    rig.dev.mmio_read(0, IRDMA_GLPE_CPUSTATUS0, &mut byte);
    assert_eq!(byte, [0x80]);
    rig.w32(IRDMA_GLPE_CPUSTATUS0, 0);
    rig.w32(IRDMA_CQPERRCODES, 5);
    assert_eq!(rig.r32(IRDMA_GLPE_CPUSTATUS0), 0x80);
    assert_eq!(rig.counter("ro_writes_ignored"), 2);
    rig.w32(0x0050_0004, 1);
    assert_eq!(rig.counter("unknown_writes"), 1);
    let bar = &rig.dev.bars()[0];
    assert_eq!((bar.index, bar.size, bar.is_64bit), (0, 8 << 20, true));
}

#[test]
fn doorbells_beyond_the_ring_and_arms_of_other_cqs_are_counted_and_ignored() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    rig.w32(IRDMA_CQARM, 0);
    assert_eq!(rig.counter("arms_ignored"), 1, "no CCQ yet");
    rig.create_ccq(16);
    rig.w32(IRDMA_CQPDB, 16);
    rig.w32(IRDMA_CQARM, 1);
    rig.idle();
    assert_eq!(rig.counter("doorbells_ignored"), 2, "init CQPDB <- 0 and head 16");
    assert_eq!(rig.counter("arms_ignored"), 2);
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 1);
}

#[test]
fn g11_valid_bit_polarity_holds_across_two_ring_passes() {
    let mut rig = Rig::new();
    rig.create_cqp(4);
    for i in 0..8u32 {
        let idx = rig.post(nop());
        assert_eq!(idx, i % 4);
        rig.ring();
        assert_eq!(rig.r32(IRDMA_CQPTAIL), (i + 1) % 4, "WQE {i}");
    }
    assert_eq!(rig.counter("wqes"), 8);
    assert_eq!(rig.dump()["cqp"]["wraps"], 2);
    // A doorbell over a slot still holding the previous pass's valid bit stalls until the WQE is written.
    rig.w32(IRDMA_CQPDB, 1);
    rig.idle();
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 0);
    assert_eq!(rig.counter("polarity_stalls"), 1);
    rig.post(nop());
    rig.ring();
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 1);
}

#[test]
fn before_the_ccq_exists_completions_show_only_in_cqptail() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    let writes = rig.mem.write_count();
    rig.post(nop());
    rig.ring();
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 1);
    assert_eq!(rig.mem.write_count(), writes + 8, "only the driver's own eight qword writes");
    rig.post([0, 0, 0, 0x3F << 32, 0, 0, 0, 0]);
    rig.ring();
    // G12: CQP_OP_ERR with the tail, poll_registers returns -EIO.
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 0x8000_0002);
    assert_eq!(rig.r32(IRDMA_CQPERRCODES), 0x8001_0001);
    rig.post(nop());
    rig.ring();
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 3, "OP_ERR follows the latest completion");
}

#[test]
fn create_cq_completes_into_the_new_ccq_with_the_completion_context() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    let cqe = rig.create_ccq(2050);
    assert_eq!(cqe, Cqe { ctx: COMPLETION_CTX, qw3: 0x8000_0000_0000_0000 });
    let ccq = &rig.dump()["ccq"];
    assert_eq!((ccq["size"].as_u64(), ccq["head"].as_u64()), (Some(2050), Some(1)));
    // A second CREATE_CQ for the CCQ is an error completion.
    rig.post(create_cq_wqe(2050, CCQ_PA, Some(0)));
    rig.ring();
    assert_eq!(rig.poll().unwrap().error(), Some((0x8003, 0x0002)));
}

#[test]
fn destroy_cq_removes_the_ccq_and_completes_in_cqptail() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    rig.create_ccq(8);
    rig.post([0, 0, 0, OP_DESTROY_CQ << 32, 0, 0, 0, 0]);
    rig.ring();
    assert_eq!(rig.poll(), None);
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 2);
    assert_eq!(rig.dump()["ccq"], Value::Null);
}

#[test]
fn inline_worker_completes_each_command_before_its_register_write_returns() {
    let mut rig = Rig::with_config(IrdmaConfig { worker: WorkerMode::Inline, ..IrdmaConfig::default() });
    // irdma_sc_cqp_init and irdma_sc_cqp_create, with no wait: CCQP_DONE is set when CCQPLOW's write returns.
    for reg in [IRDMA_CQPTAIL, IRDMA_CQPDB, IRDMA_CCQPSTATUS] {
        rig.w32(reg, 0);
    }
    rig.write_qws(CTX_PA, &host_context(16));
    rig.w32(IRDMA_CCQPHIGH, (CTX_PA >> 32) as u32);
    rig.w32(IRDMA_CCQPLOW, CTX_PA as u32);
    assert_eq!(rig.r32(IRDMA_CCQPSTATUS), 0x0000_0001);
    (rig.sq_size, rig.head, rig.polarity) = (16, 0, false);
    // CREATE_CQ, then a quad-hash add: each CQE is in the CCQ when the doorbell's write returns.
    rig.post(create_cq_wqe(64, CCQ_PA, Some(0)));
    rig.w32(IRDMA_CQPDB, rig.head);
    (rig.ccq_size, rig.ccq_head, rig.ccq_polarity) = (64, 0, true);
    let cqe = rig.poll().expect("CREATE_CQ completed inside the doorbell write");
    assert_eq!((cqe.ctx, cqe.error()), (COMPLETION_CTX, None));
    let idx = rig.post(qhash_wqe(ADD, SYN, 4791, 0, 5));
    rig.w32(IRDMA_CQPDB, rig.head);
    let cqe = rig.poll().expect("the quad-hash add completed inside the doorbell write");
    assert_eq!((cqe.idx(), cqe.error()), (u64::from(idx), None));
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 2);
    assert!(rig.dev.idle());
}

#[test]
fn qhash_operations_complete_with_the_documented_codes() {
    let mut rig = Rig::with_config(IrdmaConfig { qhash_capacity: 2, ..IrdmaConfig::default() });
    rig.create_cqp(16);
    rig.create_ccq(64);
    let cases: [([u64; 8], Codes); 8] = [
        (qhash_wqe(ADD, SYN, 4791, 0, 5), None),
        (qhash_wqe(ADD, SYN, 4791, 0, 6), Some((0x8002, 0x0001))), // duplicate
        (qhash_wqe(ADD, ESTABLISHED, 4791, 5000, 7), None),
        (qhash_wqe(ADD, SYN, 4792, 0, 8), Some((0x8002, 0x0003))), // full
        (qhash_wqe(MODIFY, SYN, 4791, 0, 9), None),
        (qhash_wqe(MODIFY, SYN, 4793, 0, 9), Some((0x8002, 0x0002))), // missing
        (qhash_wqe(DELETE, ESTABLISHED, 4791, 5000, 0), None),
        (qhash_wqe(DELETE, ESTABLISHED, 4791, 5000, 0), Some((0x8002, 0x0002))), // missing
    ];
    let first = rig.head;
    for (wqe, _) in &cases {
        rig.post(*wqe);
    }
    rig.ring();
    for (i, (_, want)) in cases.iter().enumerate() {
        let cqe = rig.poll().expect("one CQE per WQE");
        assert_eq!(cqe.idx(), u64::from(first) + i as u64);
        assert_eq!(cqe.error(), *want, "WQE {i}");
    }
    let entries = rig.dump()["qhash"]["entries"].clone();
    assert_eq!(entries.as_array().unwrap().len(), 1);
    assert_eq!(entries[0]["entry_type"], "IRDMA_QHASH_TYPE_TCP_SYN");
    assert_eq!(entries[0]["qpn"], 9);
    assert_eq!(entries[0]["dest_ip"], "10.0.0.1");
    assert_eq!(entries[0]["mac"], "00:11:22:33:44:55");
}

#[test]
fn quad_hash_operations_are_traced_with_their_key_and_result() {
    use crate::trace::{Filter, Sink};
    let mut rig = Rig::new();
    let sink = Sink::memory();
    let probe = rig.dev.probe();
    probe.trace.set_sink(sink.clone());
    probe.trace.set_filter(&Filter::parse("irdma::qhash=info").unwrap());
    rig.create_cqp(16);
    rig.create_ccq(16);
    rig.post(qhash_wqe(ADD, SYN, 4791, 0, 5));
    rig.post(qhash_wqe(ADD, SYN, 4791, 0, 6));
    rig.post(qhash_wqe(DELETE, ESTABLISHED, 4791, 5000, 0));
    rig.ring();
    let lines = sink.take_lines();
    let tail = |i: usize| lines[i].split("] ").nth(1).unwrap_or_default().to_string();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(
        tail(0),
        "irdma qhash manage=add type=IRDMA_QHASH_TYPE_TCP_SYN dest=10.0.0.1:4791 src=0.0.0.0:0 vlan=none qpn=5 \
         result=ok entries=1"
    );
    assert!(tail(1).contains("qpn=6 result=0x8002/0x0001 ("), "the duplicate add: {}", tail(1));
    assert!(tail(1).ends_with("entries=1"));
    assert!(
        tail(2).starts_with(
            "irdma qhash manage=delete type=IRDMA_QHASH_TYPE_TCP_ESTABLISHED dest=10.0.0.1:4791 src=10.0.0.2:5000"
        ),
        "{}",
        tail(2)
    );
    assert!(tail(2).contains("result=0x8002/0x0002 ("), "deleting a missing entry: {}", tail(2));
}

#[test]
fn all_six_entry_types_ipv6_and_vlan_are_stored() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    rig.create_ccq(64);
    for ty in 1..=6u64 {
        rig.post(qhash_wqe(ADD, ty, 100, 200, ty));
    }
    // G9 IPv6 VLAN 100 listener on fe80::1.
    rig.post([
        0x0011_2233_4455,
        0x0000_0005_0000_12B7,
        0x0000_0064_0000_0000,
        0xA800_0825_0000_0000,
        0,
        0,
        1,
        0xFE80_0000_0000_0000,
    ]);
    rig.ring();
    for _ in 0..7 {
        assert_eq!(rig.poll().unwrap().error(), None);
    }
    let dump = rig.dump();
    assert_eq!(dump["qhash"]["len"], 7);
    let v6 = dump["qhash"]["entries"].as_array().unwrap().iter().find(|e| e["ipv4"] == false).unwrap().clone();
    assert_eq!(
        (v6["dest_ip"].as_str(), v6["vlan"].as_u64(), v6["dest_port"].as_u64()),
        (Some("fe80::1"), Some(100), Some(4791))
    );
}

#[test]
fn both_rings_wrap_several_times_with_every_completion_checked() {
    let mut rig = Rig::new();
    rig.create_cqp(4);
    rig.create_ccq(5);
    let mut expected_idx = rig.head;
    for round in 0..12u64 {
        // Three WQEs per doorbell: the most a 4-entry SQ holds.
        let ops = [
            qhash_wqe(ADD, SYN, 1000 + round as u16, 0, round),
            qhash_wqe(MODIFY, SYN, 1000 + round as u16, 0, round + 100),
            qhash_wqe(DELETE, SYN, 1000 + round as u16, 0, 0),
        ];
        for op in ops {
            rig.post(op);
        }
        rig.ring();
        for _ in 0..3 {
            let cqe = rig.poll().expect("completion");
            assert_eq!((cqe.idx(), cqe.error(), cqe.ctx), (u64::from(expected_idx), None, COMPLETION_CTX));
            expected_idx = (expected_idx + 1) % 4;
        }
        assert_eq!(rig.poll(), None);
    }
    let dump = rig.dump();
    assert!(dump["cqp"]["wraps"].as_u64().unwrap() >= 9);
    assert!(dump["ccq"]["wraps"].as_u64().unwrap() >= 7);
    assert_eq!(dump["qhash"]["len"], 0);
    assert_eq!(rig.counter("wqe_errors"), 0);
}

#[test]
fn a_bad_wqe_gets_an_error_completion_and_the_next_one_still_executes() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    rig.create_ccq(16);
    let mut bad_manage = qhash_wqe(ADD, SYN, 1, 0, 1);
    bad_manage[3] |= 3 << 61;
    let mut bad_type = qhash_wqe(ADD, SYN, 1, 0, 1);
    bad_type[3] |= 7 << 42;
    let mut reserved = nop();
    reserved[3] |= 1;
    let cases = [
        ([0, 0, 0, 0x00 << 32, 0, 0, 0, 0], Some((0x8001, 1))), // CREATE_QP: unsupported
        (bad_manage, Some((0x8001, 2))),
        (bad_type, Some((0x8001, 3))),
        (reserved, Some((0x8001, 4))),
        (qhash_wqe(ADD, SYN, 1, 0, 1), None),
    ];
    for (w, _) in &cases {
        rig.post(*w);
    }
    rig.ring();
    for (i, (_, want)) in cases.iter().enumerate() {
        assert_eq!(rig.poll().unwrap().error(), *want, "WQE {i}");
    }
    assert_eq!(rig.dump()["qhash"]["len"], 1);
}

#[test]
fn unmapped_sq_gives_an_error_completion_and_the_device_keeps_working() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    rig.create_ccq(16);
    rig.mem.unmap(SQ_PA);
    rig.head = 3;
    rig.ring();
    for i in 1..3 {
        let cqe = rig.poll().unwrap();
        assert_eq!((cqe.idx(), cqe.error()), (i, Some((0x8004, 0x0001))));
    }
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 3, "the errors travelled in CQEs, so CQP_OP_ERR stays clear");
    assert_eq!(rig.r32(IRDMA_CQPERRCODES), 0x8004_0001);
    assert!(rig.mem.map(SQ_PA, 0x2_0000));
    rig.post(nop());
    rig.ring();
    assert_eq!(rig.poll().unwrap().error(), None);
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 4);
}

/// The client's memory as the device sees it, with CQPTAIL read before every write into the CCQ ring (as a
/// driver polling it between the device's steps would see it) and those writes failing while `fail` is set.
struct RingWatch {
    mem: Arc<HeapMemory>,
    dev: std::sync::Weak<Irdma>,
    fail: std::sync::atomic::AtomicBool,
    /// (offset of the write in its 32-byte slot, CQPTAIL just before it).
    seen: Mutex<Vec<(u64, u32)>>,
}

impl DmaAccess for RingWatch {
    fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        self.mem.read(iova, buf)
    }
    fn write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
        if (CCQ_PA..CCQ_PA + 0x2_0000).contains(&iova) {
            if let Some(dev) = self.dev.upgrade() {
                let mut b = [0u8; 4];
                // The worker holds no lock over its DMA (the deadlock rule), so a register read here is a
                // driver's read between two of its steps.
                dev.mmio_read(0, IRDMA_CQPTAIL, &mut b);
                self.seen.lock().unwrap().push(((iova - CCQ_PA) % 32, u32::from_le_bytes(b)));
            }
            if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(DmaError::Unmapped { iova, len: buf.len() as u64 });
            }
        }
        self.mem.write(iova, buf)
    }
}

fn ring_watch_rig() -> (Rig, Arc<RingWatch>) {
    let mut watch = None;
    let rig = Rig::with_dma(IrdmaConfig::default(), |dev, mem| {
        let w = Arc::new(RingWatch { mem, dev: Arc::downgrade(dev), fail: Default::default(), seen: Mutex::default() });
        watch = Some(w.clone());
        w
    });
    (rig, watch.unwrap())
}

#[test]
fn a_cqe_becomes_valid_only_after_cqptail_has_moved_past_it() {
    let (mut rig, watch) = ring_watch_rig();
    rig.create_cqp(16);
    rig.create_ccq(16);
    watch.seen.lock().unwrap().clear();
    rig.post(nop());
    rig.ring();
    assert_eq!(rig.poll().map(|c| c.idx()), Some(1));
    // The body (qwords 0..2) lands while the tail still stands at the CQE's WQE; qword 3 with the valid bit
    // after it moved: a driver that sees the CQE samples the tail past it (irdma_sc_ccq_destroy).
    assert_eq!(*watch.seen.lock().unwrap(), [(0, 1), (24, 2)]);
}

#[test]
fn a_cqe_that_cannot_be_written_shows_the_tail_with_cqp_op_err_never_the_tail_alone() {
    let (mut rig, watch) = ring_watch_rig();
    rig.create_cqp(16);
    rig.create_ccq(16);
    watch.seen.lock().unwrap().clear();
    watch.fail.store(true, std::sync::atomic::Ordering::SeqCst);
    rig.post(nop());
    rig.ring();
    // While the device tried the CQE, the tail had not moved; once it did, CQP_OP_ERR came with it.
    assert_eq!(*watch.seen.lock().unwrap(), [(0, 1)]);
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 0x8000_0002);
    assert_eq!(rig.r32(IRDMA_CQPERRCODES), 0x8004_0002);
    assert_eq!(rig.counter("cqe_write_errors"), 1);
    assert_eq!(rig.poll(), None, "nothing reached the ring");
}

#[test]
fn unmapped_ccq_memory_is_refused_at_create_and_cqe_write_failures_are_flagged() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    rig.post(create_cq_wqe(16, 0x7700_0000, Some(0)));
    rig.ring();
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 0x8000_0001);
    assert_eq!(rig.r32(IRDMA_CQPERRCODES), 0x8004_0005);
    rig.create_ccq(16);
    rig.mem.unmap(CCQ_PA);
    rig.post(nop());
    rig.ring();
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 0x8000_0003);
    assert_eq!(rig.r32(IRDMA_CQPERRCODES), 0x8004_0002);
    assert_eq!(rig.counter("cqe_write_errors"), 1);
    assert!(rig.mem.map(CCQ_PA, 0x2_0000));
    rig.post(nop());
    rig.ring();
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 4);
}

#[test]
fn a_full_ccq_is_never_overwritten_and_processing_resumes_once_consumed() {
    let cfg = IrdmaConfig { ccq_full_wait: Duration::from_millis(2), ..IrdmaConfig::default() };
    let mut rig = Rig::with_config(cfg);
    rig.create_cqp(8);
    rig.create_ccq(3); // holds 2 CQEs; one is already consumed (the CREATE_CQ completion)
    for _ in 0..4 {
        rig.post(nop());
    }
    rig.ring();
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 0x8000_0003, "two NOPs completed, then CCQ full");
    assert_eq!(rig.r32(IRDMA_CQPERRCODES), 0x8003_0004);
    assert_eq!(rig.counter("ccq_overflows"), 1);
    let got: Vec<u64> = std::iter::from_fn(|| rig.poll()).map(|c| c.idx()).collect();
    assert_eq!(got, [1, 2]);
    rig.ring();
    let got: Vec<u64> = std::iter::from_fn(|| rig.poll()).map(|c| c.idx()).collect();
    assert_eq!(got, [3, 4]);
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 5);
}

#[test]
fn an_arm_gives_exactly_one_interrupt() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    // icrdma_cfg_ceq(dev, 0, 0, true): CEQ 0 to MSI-X 0, ITR_INDX 3, CAUSE_ENA.
    rig.w32(IRDMA_GLINT_CEQCTL, (1 << 30) | (3 << 11));
    rig.create_ccq(16);
    rig.post(nop());
    rig.ring();
    assert!(rig.irqs.seen().is_empty(), "not armed");
    rig.poll();
    rig.arm();
    // G12: the first arm from a zeroed shadow writes qw4 = 0x14000.
    assert_eq!(rig.mem.read_u64(SHADOW_PA + 32).unwrap(), 0x0000_0000_0001_4000);
    rig.post(nop());
    rig.ring();
    rig.post(nop());
    rig.ring();
    assert_eq!(rig.irqs.seen(), [0]);
    rig.poll();
    rig.poll();
    rig.arm();
    rig.post(nop());
    rig.ring();
    assert_eq!(rig.irqs.seen(), [0, 0]);
    assert_eq!(rig.counter("arms"), 2);
}

#[test]
fn arming_over_unconsumed_cqes_interrupts_at_once_on_the_routed_vector() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    // GLINT_CEQCTL(0): CAUSE_ENA, MSIX_INDX 3.
    rig.w32(IRDMA_GLINT_CEQCTL, (1 << 30) | 3);
    rig.create_ccq(16);
    rig.post(nop());
    rig.ring();
    rig.poll();
    rig.post(nop());
    rig.ring();
    rig.arm();
    assert_eq!(rig.irqs.seen(), [3]);
    // An arm word without ARM_NEXT is not an arm.
    rig.mem.write_u64(SHADOW_PA + 32, 0).unwrap();
    rig.w32(IRDMA_CQARM, 0);
    rig.idle();
    assert_eq!(rig.counter("arms_ignored"), 1);
}

#[test]
fn a_ceq_whose_cause_is_not_enabled_raises_no_interrupt() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    // Power-on GLINT_CEQCTL(0) = 0: MSIX_INDX 0 but CAUSE_ENA clear.
    rig.create_ccq(16);
    rig.poll();
    rig.arm();
    rig.post(nop());
    rig.ring();
    assert!(rig.poll().is_some(), "the CQE is written all the same");
    assert!(rig.irqs.seen().is_empty());
    assert_eq!((rig.counter("interrupts"), rig.counter("interrupts_dropped")), (0, 1));
    // Enabling the cause routes the next one.
    rig.w32(IRDMA_GLINT_CEQCTL, (1 << 30) | 2);
    rig.arm();
    rig.post(nop());
    rig.ring();
    assert_eq!(rig.irqs.seen(), [2]);
}

fn write_descriptor(rig: &Rig, seg: &Segment) {
    rig.mem.write(DESC_PA, &encode_descriptor(seg)).unwrap();
    rig.w32(IRDMA_EMU_LB_DESC_LOW, DESC_PA as u32);
    rig.w32(IRDMA_EMU_LB_DESC_HIGH, (DESC_PA >> 32) as u32);
    rig.w32(IRDMA_EMU_LB_DOORBELL, 1);
    rig.idle();
}

#[test]
fn loopback_and_control_classify_syn_established_and_to_host() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    rig.create_ccq(16);
    rig.post(qhash_wqe(ADD, SYN, 4791, 0, 7));
    rig.post(qhash_wqe(ADD, ESTABLISHED, 4791, 5000, 5));
    rig.ring();
    let seg = |syn, ack, src_port| Segment {
        ipv4: true,
        src_ip: [0x0A00_0002, 0, 0, 0],
        dst_ip: [0x0A00_0001, 0, 0, 0],
        src_port,
        dst_port: 4791,
        vlan: None,
        syn,
        ack,
    };
    let cases = [(seg(true, false, 6000), 0x0702), (seg(false, true, 5000), 0x0501), (seg(false, true, 6000), 0)];
    for (i, (s, result)) in cases.iter().enumerate() {
        write_descriptor(&rig, s);
        assert_eq!(rig.r32(IRDMA_EMU_LB_STATUS), 1);
        assert_eq!(rig.r32(IRDMA_EMU_LB_RESULT), *result, "segment {i}");
        assert_eq!(rig.r32(IRDMA_EMU_LB_SEQ), i as u32 + 1);
    }
    let req = json!({"cmd": "classify", "src_ip": "10.0.0.2", "dst_ip": "10.0.0.1", "src_port": 6000, "dst_port": 4791, "syn": true});
    assert_eq!(rig.dev.control(&req), Ok(json!({"target": "listener", "qpn": 7})));
    let req = json!({"cmd": "classify", "src_ip": "10.0.0.2", "dst_ip": "10.0.0.1", "src_port": 5000, "dst_port": 4791, "ack": true});
    assert_eq!(rig.dev.control(&req), Ok(json!({"target": "established", "qpn": 5})));
    let counters = rig.dev.control(&json!({"cmd": "counters"})).unwrap();
    assert_eq!((counters["classify_listener"].as_u64(), counters["classify_established"].as_u64()), (Some(2), Some(2)));
    assert_eq!(counters["classify_to_host"], 1);
    assert_eq!(rig.dump()["last_results"].as_array().unwrap().len(), 5);
    // A descriptor in unmapped memory is an error status, not a crash.
    rig.w32(IRDMA_EMU_LB_DESC_HIGH, 0x99);
    rig.w32(IRDMA_EMU_LB_DOORBELL, 1);
    rig.idle();
    assert_eq!(rig.r32(IRDMA_EMU_LB_STATUS), 0x8000_0100);
}

#[test]
fn reset_returns_registers_tables_and_rings_to_power_on() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    rig.create_ccq(16);
    rig.post(qhash_wqe(ADD, SYN, 4791, 0, 7));
    rig.ring();
    assert_eq!(rig.dev.control(&json!({"cmd": "reset"})), Ok(json!({"ok": true})));
    rig.idle();
    let dump = rig.dump();
    assert_eq!((dump["cqp"].clone(), dump["ccq"].clone()), (Value::Null, Value::Null));
    assert_eq!(dump["qhash"]["len"], 0);
    assert_eq!(rig.r32(IRDMA_CCQPSTATUS), 0);
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 0);
    rig.create_cqp(16);
    rig.create_ccq(16);
}

/// Memory whose reads of one address block until the test releases them.
struct Gated {
    inner: Arc<HeapMemory>,
    gated: u64,
    release: crossbeam_channel::Receiver<()>,
}
impl DmaAccess for Gated {
    fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        if iova == self.gated {
            let _ = self.release.recv_timeout(IDLE);
        }
        self.inner.read(iova, buf)
    }
    fn write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
        self.inner.write(iova, buf)
    }
}

/// Memory whose write to one address lands, then holds the writer until the test releases it.
struct HeldAfterWrite {
    inner: Arc<HeapMemory>,
    gated: u64,
    release: crossbeam_channel::Receiver<()>,
}
impl DmaAccess for HeldAfterWrite {
    fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        self.inner.read(iova, buf)
    }
    fn write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
        let r = self.inner.write(iova, buf);
        if iova == self.gated {
            let _ = self.release.recv_timeout(IDLE);
        }
        r
    }
}

/// Attaches memory that holds the device after its write to `gated`; the sender releases it.
fn hold_after_write(rig: &Rig, gated: u64) -> crossbeam_channel::Sender<()> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let held = HeldAfterWrite { inner: rig.mem.clone(), gated, release: rx };
    rig.dev.attach(Arc::new(held), rig.irqs.clone());
    tx
}

/// Polls the CCQ until a CQE is visible, while the device may still be held mid-command.
fn wait_cqe(rig: &mut Rig, what: &str) -> Cqe {
    let deadline = std::time::Instant::now() + IDLE;
    loop {
        if let Some(cqe) = rig.poll() {
            return cqe;
        }
        assert!(std::time::Instant::now() < deadline, "no {what} completion");
        std::thread::yield_now();
    }
}

#[test]
fn an_arm_the_moment_the_create_cq_completion_is_visible_is_accepted() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    rig.w32(IRDMA_GLINT_CEQCTL, (1 << 30) | (3 << 11));
    let tx = hold_after_write(&rig, CCQ_PA + 24);
    rig.post(create_cq_wqe(16, CCQ_PA, Some(0)));
    rig.w32(IRDMA_CQPDB, rig.head);
    // irdma_sc_ccq_create_done sees the CQE while the device has yet to publish the rest of the WQE.
    (rig.ccq_size, rig.ccq_head, rig.ccq_polarity) = (16, 0, true);
    let cqe = wait_cqe(&mut rig, "CREATE_CQ");
    assert_eq!(cqe.error(), None);
    let qw4 = rig.mem.read_u64(SHADOW_PA + 32).unwrap();
    rig.mem.write_u64(SHADOW_PA + 32, (qw4 & 0xBFFF) | (1 << 16) | (1 << 14)).unwrap();
    rig.w32(IRDMA_CQARM, 0);
    assert_eq!(rig.counter("arms_ignored"), 0, "the arm found the CCQ its completion came from");
    tx.send(()).unwrap();
    rig.idle();
    assert_eq!(rig.counter("arms"), 1);
    rig.post(nop());
    rig.ring();
    assert_eq!(rig.irqs.seen(), [0]);
}

#[test]
fn cqptail_has_moved_past_a_wqe_by_the_time_its_cqe_is_visible() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    rig.create_ccq(16);
    let tx = hold_after_write(&rig, CCQ_PA + 32 + 24);
    let idx = rig.post(nop());
    rig.w32(IRDMA_CQPDB, rig.head);
    let cqe = wait_cqe(&mut rig, "NOP");
    assert_eq!(cqe.idx(), u64::from(idx));
    // irdma_sc_ccq_destroy samples CQPTAIL now, before it posts, and waits for it to move on from there.
    assert_eq!(rig.r32(IRDMA_CQPTAIL), idx + 1);
    tx.send(()).unwrap();
    rig.idle();
    assert_eq!(rig.r32(IRDMA_CQPTAIL), idx + 1);
}

#[test]
fn the_dumped_ccq_head_is_past_a_cqe_by_the_time_the_cqe_is_visible() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    rig.create_ccq(16);
    // Slot 0 holds CREATE_CQ's own completion; the NOP's lands in slot 1, held after its valid qword.
    let tx = hold_after_write(&rig, CCQ_PA + 32 + 24);
    rig.post(nop());
    rig.w32(IRDMA_CQPDB, rig.head);
    wait_cqe(&mut rig, "NOP");
    let d = rig.dev.control(&json!({"cmd": "dump"})).unwrap();
    assert_eq!(d["ccq"]["head"], 2, "the device is past the CQE the driver sees");
    tx.send(()).unwrap();
    rig.idle();
    let d = rig.dev.control(&json!({"cmd": "dump"})).unwrap();
    assert_eq!(d["ccq"]["head"], 2);
}

#[test]
fn cqperrcodes_holds_an_error_cqes_codes_by_the_time_the_cqe_is_visible() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    rig.create_ccq(16);
    let tx = hold_after_write(&rig, CCQ_PA + 32 + 24);
    // Deleting an entry that does not exist: 0x8002/0x0002 (docs/irdma-device.md, "Error codes").
    rig.post(qhash_wqe(DELETE, SYN, 4791, 0, 0));
    rig.w32(IRDMA_CQPDB, rig.head);
    let cqe = wait_cqe(&mut rig, "DELETE");
    assert_eq!(cqe.error(), Some((0x8002, 0x0002)));
    // irdma_sc_ccq_get_cqe_info reads CQPERRCODES as soon as it sees the error bit.
    assert_eq!(rig.r32(IRDMA_CQPERRCODES), 0x8002_0002);
    tx.send(()).unwrap();
    rig.idle();
}

#[test]
fn ccqpstatus_reads_are_served_while_the_create_dma_is_in_flight() {
    let rig = Rig::new();
    let (tx, rx) = crossbeam_channel::bounded(1);
    rig.dev.attach(Arc::new(Gated { inner: rig.mem.clone(), gated: CTX_PA, release: rx }), rig.irqs.clone());
    rig.write_qws(CTX_PA, &host_context(16));
    rig.w32(IRDMA_CCQPHIGH, (CTX_PA >> 32) as u32);
    rig.w32(IRDMA_CCQPLOW, CTX_PA as u32);
    assert!(!rig.dev.wait_idle(Duration::from_millis(20)), "create is blocked in DMA");
    assert_eq!(rig.r32(IRDMA_CCQPSTATUS), 0, "served while the worker waits");
    tx.send(()).unwrap();
    rig.idle();
    assert_eq!(rig.r32(IRDMA_CCQPSTATUS), 1);
}

#[test]
fn a_doorbell_returns_while_the_wqe_fetch_is_in_flight() {
    let mut rig = Rig::new();
    rig.create_cqp(16);
    let (tx, rx) = crossbeam_channel::bounded(1);
    rig.dev.attach(Arc::new(Gated { inner: rig.mem.clone(), gated: SQ_PA, release: rx }), rig.irqs.clone());
    rig.post(nop());
    rig.w32(IRDMA_CQPDB, rig.head);
    assert!(!rig.dev.wait_idle(Duration::from_millis(20)), "the fetch is blocked in DMA");
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 0, "CQPTAIL is served meanwhile");
    assert_eq!(rig.r32(IRDMA_CCQPSTATUS), 1);
    tx.send(()).unwrap();
    rig.idle();
    assert_eq!(rig.r32(IRDMA_CQPTAIL), 1);
}

#[test]
fn detach_during_a_create_publishes_nothing_and_the_next_client_starts_clean() {
    let mut rig = Rig::new();
    let (tx, rx) = crossbeam_channel::bounded(1);
    rig.dev.attach(Arc::new(Gated { inner: rig.mem.clone(), gated: CTX_PA, release: rx }), rig.irqs.clone());
    rig.write_qws(CTX_PA, &host_context(16));
    rig.w32(IRDMA_CCQPHIGH, (CTX_PA >> 32) as u32);
    rig.w32(IRDMA_CCQPLOW, CTX_PA as u32);
    assert!(!rig.dev.wait_idle(Duration::from_millis(20)), "create is blocked in DMA");
    rig.dev.detach();
    tx.send(()).unwrap();
    rig.idle();
    assert_eq!(rig.r32(IRDMA_CCQPSTATUS), 0);
    assert_eq!(rig.dump()["cqp"], Value::Null);
    rig.dev.attach(rig.mem.clone(), rig.irqs.clone());
    rig.create_cqp(16);
}

#[test]
fn hostile_control_requests_are_errors() {
    let rig = Rig::new();
    let bad = [
        json!(null),
        json!({}),
        json!({"cmd": 5}),
        json!({"cmd": "explode"}),
        json!({"cmd": "classify"}),
        json!({"cmd": "classify", "src_ip": "1.2.3.4", "dst_ip": "::1", "src_port": 1, "dst_port": 1}),
        json!({"cmd": "classify", "src_ip": "1.2.3.4", "dst_ip": "1.2.3.5", "src_port": 1e99, "dst_port": 1}),
        json!(["cmd", "dump"]),
    ];
    for req in bad {
        assert!(rig.dev.control(&req).is_err(), "{req}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_mmio_never_panics_and_tail_stays_in_range(
        ops in prop::collection::vec((any::<bool>(), 0u64..(8 << 20), prop::sample::select(vec![1usize, 2, 4, 8]), any::<u32>()), 1..64)
    ) {
        let mut rig = Rig::new();
        rig.create_cqp(16);
        rig.create_ccq(16);
        let hot = [IRDMA_CQPDB, IRDMA_CCQPHIGH, IRDMA_CCQPLOW, IRDMA_CQARM, IRDMA_EMU_LB_DOORBELL, IRDMA_CQPTAIL];
        for (i, (write, offset, width, value)) in ops.into_iter().enumerate() {
            let offset = if i % 2 == 0 { hot[(value as usize) % hot.len()] } else { offset };
            if write {
                let bytes = u64::from(value).to_le_bytes();
                rig.dev.mmio_write(0, offset, &bytes[..width]);
            } else {
                let mut buf = vec![0u8; width];
                rig.dev.mmio_read(0, offset, &mut buf);
            }
        }
        prop_assert!(rig.dev.wait_idle(IDLE));
        let tail = rig.r32(IRDMA_CQPTAIL) & 0x7FF;
        let dump = rig.dump();
        if let Some(size) = dump["cqp"]["sq_size"].as_u64() {
            prop_assert!(u64::from(tail) < size);
        }
        if let Some(ccq) = dump["ccq"].as_object() {
            prop_assert!(ccq["head"].as_u64() < ccq["size"].as_u64());
        }
    }

    #[test]
    fn random_wqes_each_get_exactly_one_completion(
        wqes in prop::collection::vec(prop::array::uniform8(any::<u64>()), 1..40),
        opcodes in prop::collection::vec(prop::sample::select(vec![0x03u64, 0x05, 0x24, 0x25, 0x3F]), 40)
    ) {
        let mut rig = Rig::new();
        rig.create_cqp(8);
        rig.create_ccq(16);
        let mut expected = rig.head;
        for (mut w, op) in wqes.into_iter().zip(opcodes) {
            w[3] = (w[3] & !(0x3F << 32)) | (op << 32);
            // A random CREATE/DESTROY_CQ could replace the CCQ under us: keep the CQ id non-zero.
            if op == 0x03 || op == 0x05 {
                w[3] |= 1;
            }
            rig.post(w);
            rig.ring();
            let cqe = rig.poll();
            prop_assert!(cqe.is_some(), "every WQE completes");
            prop_assert_eq!(cqe.map(|c| c.idx()), Some(u64::from(expected)));
            expected = (expected + 1) % 8;
            prop_assert_eq!(rig.r32(IRDMA_CQPTAIL) & 0x7FF, rig.head);
        }
        let dump = rig.dump();
        prop_assert!(dump["qhash"]["len"].as_u64() <= dump["qhash"]["capacity"].as_u64());
    }
}
