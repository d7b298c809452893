//! Two chip-personality HFIs on one cable, programmed through their registers as the Linux hfi1 driver
//! programs them, for the `fabric` case (and `tid`, whose tid_rig.rs adds a context on end B): the link started
//! on both ends, a kernel PIO send context with credit return, SDMA engine 0 with its ring and head write-back on
//! end A; on end B a receive context behind the QP map with a DMA'd tail, its header queue and eager buffers.
//! Register accesses are `pci::Function` region accesses, host memory is each function's `HeapMemory`,
//! interrupts arrive as MSI-X vectors. Field values come from the kernel (chip.c, pio.c, sdma.c, init.c,
//! common.h).

#![forbid(unsafe_code)]

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use device_model::engine::Engine;
use device_model::hfi1::cable::wire::{BTH_BYTES, ICRC_BYTES, LNH_BTH, LRH_BYTES};
use device_model::hfi1::regs::*;
use device_model::hfi1::wfr::csr::*;
use device_model::hfi1::wfr::pio::*;
use device_model::hfi1::wfr::sdma::{
    IS_SDMA_IDLE_START, SEND_DMA_CTRL_SDMA_ENABLE_SMASK, SEND_DMA_CTRL_SDMA_INT_ENABLE_SMASK,
    SEND_DMA_LEN_GEN_GENERATION_CHECK, SEND_DMA_LEN_GEN_LENGTH_SHIFT, SEND_DMA_STATUS_ENG_HALTED_SMASK,
};
use device_model::hfi1::wfr::{
    DC_DC8051_INT, IS_DC_START, IS_RCVAVAIL_START, IS_SDMAENG_ERR_START, IS_SENDCREDIT_START, TXE_PIO_SEND,
};
use device_model::hfi1::{
    BufSize, Hfi1, Hfi1Config, DESC_BYTES, HDRQ_SIZE_SHIFT, INGRESS_QUEUE, RCV_BUF_BLOCK_SIZE, RHF_BYTES,
    RHF_EGR_INDEX_MASK, RHF_EGR_INDEX_SHIFT, RHF_EGR_OFFSET_MASK, RHF_EGR_OFFSET_SHIFT, RHF_ERROR_SMASK,
    RHF_HDRQ_OFFSET_MASK, RHF_HDRQ_OFFSET_SHIFT, RHF_MAX_SEQ, RHF_PKT_LEN_MASK, RHF_RCV_SEQ_MASK, RHF_RCV_SEQ_SHIFT,
    RHF_RCV_TYPE_IB, RHF_RCV_TYPE_MASK, RHF_RCV_TYPE_SHIFT, RHF_USE_EGR_BFR, SDMA_DESC0_BYTE_COUNT_SHIFT,
    SDMA_DESC0_FIRST_DESC_FLAG, SDMA_DESC0_LAST_DESC_FLAG, SDMA_DESC1_GENERATION_MASK, SDMA_DESC1_GENERATION_SHIFT,
    SDMA_DESC1_HEAD_TO_HOST_FLAG,
};
use device_model::pci::regs::{
    PCI_COMMAND, PCI_COMMAND_MASTER, PCI_COMMAND_MEMORY, PCI_MSIX_FLAGS, PCI_MSIX_FLAGS_ENABLE,
};
use device_model::pci::{Function, PciIds};
use device_model::worker::WorkerMode;
use vfio_user_proto::device::{irq, region, Device, DeviceContext, IrqTrigger};
use vfio_user_proto::dma::{DmaAccess, HeapMemory};
use vfio_user_proto::sync::Unpoison;

// The 8051 host command and port states (chip.h, chip_registers.h). The model keeps its own copies private
// (hfi1/wfr/dc.rs), so the driver side restates the few it uses.
const HOST_CMD_0_REQ_NEW_SMASK: u64 = 0x1;
const HOST_CMD_0_REQ_TYPE_SHIFT: u32 = 8;
const HOST_CMD_0_REQ_DATA_SHIFT: u32 = 16;
const HOST_CMD_1_COMPLETED_SMASK: u64 = 0x1;
const HCMD_CHANGE_PHY_STATE: u64 = 0x03;
const PHY_STATE_MASK: u64 = 0xFF;
const PLS_POLLING: u64 = 0x20;
const PLS_LINKUP: u64 = 0x50;
/// RCV_HDR_ENT_SIZE for 32-dword entries (encode_rcv_header_entry_size; hdrq_entsize's default, init.c).
pub(super) const RCV_HDR_ENT_SIZE_32: u64 = 4;
/// IBTA: the UD SEND_ONLY opcode and its DETH (ib_hdrs.h).
const IB_OPCODE_UD_SEND_ONLY: u8 = 0x64;
const DETH_BYTES: usize = 8;

/// MSI-X vectors the rig routes its interrupt sources to.
const V_DC: u32 = 0;
const V_RCVAVAIL: u32 = 1;
const V_CREDIT: u32 = 2;
const V_SDMA_IDLE: u32 = 3;
const V_SDMA_ERR: u32 = 4;
/// RcvAvail of a second receive context on end B (the `tid` case's kernel context with TID RDMA): every
/// receive context has a vector of its own, as msix.c gives each one.
pub(super) const V_RCVAVAIL_2: u32 = 5;
const VECTORS: usize = 6;

/// How long a wait for the device may go without progress before the run is declared stalled.
pub(super) const STALL: Duration = Duration::from_secs(2);

/// LRH, BTH and DETH of a UD SEND_ONLY: the header the receive side splits off into the header queue.
pub const HEADER_BYTES: usize = LRH_BYTES + BTH_BYTES + DETH_BYTES;

/// The kernel send context: hardware context 0, sized as pio.c sizes kernel contexts when SDMA is on
/// (init_sc_pools_and_sizes: 3 x (piothreshold + 128) / PIO_BLOCK_SIZE) for piothreshold=2048, the largest
/// packet the case sends by PIO.
const SEND_CTXT: u64 = 0;
pub const PIO_MAX_PAYLOAD: usize = 2048;
pub const SEND_CREDITS: u64 = 3 * (PIO_MAX_PAYLOAD as u64 + 128) / PIO_BLOCK_SIZE;

/// SDMA engine 0 with a ring of 4096 descriptors (`sdma_descq_cnt=4096`; the default 2048 holds one
/// descriptor less than the largest doorbell needs, as the driver keeps one slot free).
const ENGINE: u64 = 0;
const RING_DESCS: u64 = 4096;
/// PBC and header of one SDMA packet, each in a 64-byte slot.
const HDR_SLOT: u64 = 64;
pub const SDMA_PAYLOAD: usize = 4096;
/// The longest burst (a PIO round, an SDMA doorbell): as many packets as the receiving port queues for its
/// worker. Nothing holds the sender back while the peer's worker is behind (the model has no link credits,
/// docs/hfi1-fabric.md "The cable"), so a longer burst loses its tail at the port (`wire_rx_ingress_overflow`).
pub const MAX_BURST: usize = INGRESS_QUEUE;

/// Receive context 1 as the driver's defaults set it up (init.c: rcvhdrcnt=2048 entries of 32 dwords,
/// eager_buffer_size=8M in buffers of 256 KiB, HFI1_MAX_EAGER_BUFFER_SIZE), packets packed into them
/// (MULTI_PKT_EGR). The largest doorbell (4 MiB and its ICRCs) lands without the receiver freeing anything.
const RCV_CTXT: u64 = 1;
pub(super) const RHQ_ENTRIES: u64 = 2048;
pub(super) const ENTRY_DWORDS: u64 = 32;
const EAGER_BUFFERS: u64 = 32;
const EAGER_CODE: u8 = 7;
const EAGER_SIZE: u64 = 256 * 1024;

/// Where each end keeps its memory (each function has its own).
const A_CREDIT_RETURN: u64 = 0x1_0000;
const A_RING: u64 = 0x100_0000;
const A_HEAD_HOME: u64 = 0x110_0000;
const A_HEADERS: u64 = 0x120_0000;
const A_PAYLOAD: u64 = 0x1000_0000;
/// The SDMA payload buffer: one doorbell's worth, plus a page the case slides its window through.
pub const PAYLOAD_BYTES: usize = MAX_BURST * SDMA_PAYLOAD + 4096;
const B_HDRQ: u64 = 0x100_0000;
const B_TAIL: u64 = 0x110_0000;
const B_EAGER: u64 = 0x1000_0000;

/// Interrupt counts per vector; a wait takes them.
#[derive(Default)]
struct Irqs {
    counts: Mutex<[u64; VECTORS]>,
    changed: Condvar,
}

impl IrqTrigger for Irqs {
    fn trigger(&self, index: u32, vector: u32) {
        if index != irq::MSIX {
            return;
        }
        if let Some(c) = self.counts.lock().unpoison().get_mut(vector as usize) {
            *c += 1;
            self.changed.notify_all();
        }
    }
}

impl Irqs {
    /// Waits until `deadline` for an interrupt on `vector` and takes every one it had.
    fn take(&self, vector: u32, deadline: Instant) -> bool {
        let v = vector as usize;
        let counts = self.counts.lock().unpoison();
        let left = deadline.saturating_duration_since(Instant::now());
        let (mut counts, _) = self.changed.wait_timeout_while(counts, left, |c| c[v] == 0).unpoison();
        std::mem::take(&mut counts[v]) > 0
    }
}

/// One HFI as its driver sees it.
pub struct Hfi {
    pub(super) engine: Arc<Hfi1>,
    f: Arc<Function>,
    irqs: Arc<Irqs>,
    pub mem: Arc<HeapMemory>,
}

impl Hfi {
    fn attach(engine: Hfi1) -> Result<Self, String> {
        let msix_cap = u64::from(engine.pci_shape().msix_cap);
        let engine = Arc::new(engine);
        let f = Function::try_new(engine.clone() as Arc<dyn Engine>, PciIds::hfi1_wfr_default())
            .map_err(|e| format!("PCI function: {e}"))?;
        let (irqs, mem) = (Arc::new(Irqs::default()), Arc::new(HeapMemory::new()));
        f.attach(DeviceContext { dma: mem.clone() as Arc<dyn DmaAccess>, irq: irqs.clone() });
        // pci_enable_device and bus mastering; MSI-X on.
        let config = |at: u64, v: u16| {
            f.region_write(region::CONFIG, at, &v.to_le_bytes()).map_err(|e| format!("config write {at:#x}: {e}"))
        };
        config(PCI_COMMAND as u64, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER)?;
        config(msix_cap + PCI_MSIX_FLAGS as u64, PCI_MSIX_FLAGS_ENABLE)?;
        Ok(Hfi { engine, f, irqs, mem })
    }

    pub(super) fn r(&self, off: u64) -> Result<u64, String> {
        let mut b = [0u8; 8];
        self.f.region_read(region::BAR0, off, &mut b).map_err(|e| format!("read {off:#x}: {e}"))?;
        Ok(u64::from_le_bytes(b))
    }

    pub(super) fn w(&self, off: u64, v: u64) -> Result<(), String> {
        self.f.region_write(region::BAR0, off, &v.to_le_bytes()).map_err(|e| format!("write {off:#x}: {e}"))
    }

    /// Unmasks interrupt `source` and maps it to `vector` (set_intr_bits, remap_intr).
    pub(super) fn route_irq(&self, source: u32, vector: u32) -> Result<(), String> {
        let (source, vector) = (u64::from(source), u64::from(vector));
        let mask = CCE_INT_MASK + 8 * (source / 64);
        self.w(mask, self.r(mask)? | 1 << (source % 64))?;
        let map = CCE_INT_MAP + 8 * (source / 8);
        let shift = 8 * (source % 8);
        self.w(map, (self.r(map)? & !(0xFF << shift)) | (vector << shift))
    }

    /// Clears `source`'s status so its next event interrupts again (the handler's CCE_INT_CLEAR).
    pub(super) fn clear_irq(&self, source: u32) -> Result<(), String> {
        let source = u64::from(source);
        self.w(CCE_INT_CLEAR + 8 * (source / 64), 1 << (source % 64))
    }

    /// Waits until `deadline` for an interrupt on `vector`, and takes it.
    pub(super) fn irq(&self, vector: u32, deadline: Instant) -> bool {
        self.irqs.take(vector, deadline)
    }

    pub(super) fn read_u64(&self, at: u64) -> Result<u64, String> {
        let mut b = [0u8; 8];
        self.mem.read(at, &mut b).map_err(|e| format!("host memory {at:#x}: {e}"))?;
        Ok(u64::from_le_bytes(b))
    }

    pub(super) fn map(&self, at: u64, len: usize) -> Result<(), String> {
        self.mem.map(at, len).then_some(()).ok_or_else(|| format!("host memory {at:#x}+{len:#x} not mapped"))
    }

    /// The device's counters that are not zero, and its cable's, for a stall report.
    pub(super) fn state(&self) -> String {
        let counters: Vec<String> =
            self.engine.counters().into_iter().filter(|(_, v)| *v != 0).map(|(k, v)| format!("{k}={v}")).collect();
        format!("counters {}; link {}", counters.join(" "), self.engine.link_status()["cable"])
    }

    /// do_8051_command: request, REQ_NEW, COMPLETED, clear.
    fn cmd_8051(&self, kind: u64, data: u64) -> Result<(), String> {
        let req = (kind << HOST_CMD_0_REQ_TYPE_SHIFT) | (data << HOST_CMD_0_REQ_DATA_SHIFT);
        self.w(DC_DC8051_CFG_HOST_CMD_0, req)?;
        self.w(DC_DC8051_CFG_HOST_CMD_0, req | HOST_CMD_0_REQ_NEW_SMASK)?;
        if self.r(DC_DC8051_CFG_HOST_CMD_1)? & HOST_CMD_1_COMPLETED_SMASK == 0 {
            return Err(format!("8051 command {kind:#x} did not complete"));
        }
        self.w(DC_DC8051_CFG_HOST_CMD_0, 0)
    }

    /// start_link: 8051 interrupts on, CHANGE_PHY_STATE(POLLING), and log_physical_state's read.
    fn start_link(&self) -> Result<(), String> {
        self.w(DC_DC8051_ERR_EN, !0)?;
        self.route_irq(IS_DC_START + DC_DC8051_INT, V_DC)?;
        self.cmd_8051(HCMD_CHANGE_PHY_STATE, PLS_POLLING)?;
        match self.r(DC_DC8051_STS_CUR_STATE)? & PHY_STATE_MASK {
            PLS_POLLING => Ok(()),
            s => Err(format!("port state {s:#x} after CHANGE_PHY_STATE(POLLING)")),
        }
    }

    /// Waits for the 8051's LinkUp (its interrupt, then the port state handle_link_up reads).
    fn await_link_up(&self) -> Result<(), String> {
        let deadline = Instant::now() + STALL;
        loop {
            if self.r(DC_DC8051_STS_CUR_STATE)? & PHY_STATE_MASK == PLS_LINKUP {
                return Ok(());
            }
            if !self.irqs.take(V_DC, deadline) {
                return Err(format!("no LinkUp; {}", self.state()));
            }
            self.clear_irq(IS_DC_START + DC_DC8051_INT)?;
        }
    }
}

/// The driver's side of the PIO send context: its ring position and the credits the chip returned.
struct SendContext {
    /// Blocks written since the context was enabled, and blocks the chip has returned.
    fill: u64,
    freed: u64,
}

impl SendContext {
    /// sc_alloc, sc_enable: depth, credit-return address, CREDIT_INTR, PIO init, enable; SendCredit routed.
    fn enable(a: &Hfi) -> Result<Self, String> {
        a.map(A_CREDIT_RETURN, 4096)?;
        let k = |reg| reg + 0x100 * SEND_CTXT;
        let depth = SEND_CREDITS << SEND_CTXT_CTRL_CTXT_DEPTH_SHIFT;
        a.w(k(SEND_CTXT_CTRL), depth)?;
        a.w(k(SEND_CTXT_CREDIT_RETURN_ADDR), A_CREDIT_RETURN)?;
        a.w(k(SEND_CTXT_CREDIT_CTRL), SEND_CTXT_CREDIT_CTRL_CREDIT_INTR_SMASK | (SEND_CREDITS / 2))?;
        a.w(
            SEND_PIO_INIT_CTXT,
            (SEND_CTXT << SEND_PIO_INIT_CTXT_PIO_CTXT_NUM_SHIFT) | SEND_PIO_INIT_CTXT_PIO_SINGLE_CTXT_INIT_SMASK,
        )?;
        a.w(k(SEND_CTXT_CTRL), depth | SEND_CTXT_CTRL_CTXT_ENABLE_SMASK)?;
        a.route_irq(IS_SENDCREDIT_START + SEND_CTXT as u32, V_CREDIT)?;
        Ok(SendContext { fill: 0, freed: 0 })
    }

    /// sc_release_update: the counter the chip DMA'd (mod 2048) brought forward.
    fn release_update(&mut self, a: &Hfi) -> Result<(), String> {
        let hw = a.read_u64(A_CREDIT_RETURN + 8 * (SEND_CTXT % 8))? & CR_COUNTER_MASK;
        self.freed += (hw.wrapping_sub(self.freed) & CR_COUNTER_MASK).min(self.fill - self.freed);
        Ok(())
    }

    /// sc_buffer_alloc's wait: room for `blocks`, else the credit interrupt.
    fn room(&mut self, a: &Hfi, blocks: u64) -> Result<(), String> {
        let deadline = Instant::now() + STALL;
        while SEND_CREDITS - (self.fill - self.freed) < blocks {
            a.clear_irq(IS_SENDCREDIT_START + SEND_CTXT as u32)?;
            self.release_update(a)?;
            if SEND_CREDITS - (self.fill - self.freed) >= blocks {
                break;
            }
            if !a.irqs.take(V_CREDIT, deadline) {
                return Err(format!("no credits returned; {}", a.state()));
            }
        }
        Ok(())
    }

    /// pio_copy of one packet (PBC first, padded to whole blocks): the first block through the SOP alias,
    /// each qword a `writeq`.
    fn copy(&mut self, a: &Hfi, packet: &[u8]) -> Result<(), String> {
        let blocks = packet.len().div_ceil(PIO_BLOCK_SIZE as usize) as u64;
        self.room(a, blocks)?;
        let base = TXE_PIO_SEND + (SEND_CTXT << PIO_ADDR_CONTEXT_SHIFT);
        for (q, v) in packet.chunks_exact(8).enumerate() {
            let block = (self.fill + q as u64 / 8) % SEND_CREDITS;
            let sop = if q < 8 { SOP_DISTANCE } else { 0 };
            let v = u64::from_le_bytes(v.try_into().map_err(|_| "a qword of 8 bytes")?);
            a.w(base + sop + block * PIO_BLOCK_SIZE + 8 * (q as u64 % 8), v)?;
        }
        self.fill += blocks;
        Ok(())
    }
}

/// The driver's side of SDMA engine 0: descriptors handed over so far.
struct SdmaRing {
    tail: u64,
}

impl SdmaRing {
    /// init_sdma_regs, sdma_setlengen (generation checking on), then running with interrupts; the idle and
    /// error sources routed.
    fn start(a: &Hfi) -> Result<Self, String> {
        a.map(A_RING, (RING_DESCS as usize) * DESC_BYTES)?;
        a.map(A_HEAD_HOME, 4096)?;
        a.map(A_HEADERS, MAX_BURST * HDR_SLOT as usize)?;
        a.map(A_PAYLOAD, PAYLOAD_BYTES)?;
        let k = |reg| reg + 0x100 * ENGINE;
        let len = (RING_DESCS / 64) << SEND_DMA_LEN_GEN_LENGTH_SHIFT;
        a.w(k(SEND_DMA_BASE_ADDR), A_RING)?;
        a.w(k(SEND_DMA_LEN_GEN), len)?;
        a.w(k(SEND_DMA_LEN_GEN), len | SEND_DMA_LEN_GEN_GENERATION_CHECK)?;
        a.w(k(SEND_DMA_TAIL), 0)?;
        a.w(k(SEND_DMA_HEAD_ADDR), A_HEAD_HOME)?;
        a.w(k(SEND_DMA_CTRL), SEND_DMA_CTRL_SDMA_ENABLE_SMASK | SEND_DMA_CTRL_SDMA_INT_ENABLE_SMASK)?;
        a.route_irq(IS_SDMA_IDLE_START + ENGINE as u32, V_SDMA_IDLE)?;
        a.route_irq(IS_SDMAENG_ERR_START + ENGINE as u32, V_SDMA_ERR)?;
        Ok(SdmaRing { tail: 0 })
    }

    /// The descriptor for ring slot `t` (absolute): its generation is the lap (add_gen, sdma.h).
    fn desc(t: u64, first: bool, last: bool, len: usize, addr: u64, head_to_host: bool) -> [u8; DESC_BYTES] {
        let mut q0 = ((len as u64) << SDMA_DESC0_BYTE_COUNT_SHIFT) | addr;
        if first {
            q0 |= SDMA_DESC0_FIRST_DESC_FLAG;
        }
        if last {
            q0 |= SDMA_DESC0_LAST_DESC_FLAG;
        }
        let mut q1 = ((t / RING_DESCS) & SDMA_DESC1_GENERATION_MASK) << SDMA_DESC1_GENERATION_SHIFT;
        if head_to_host {
            q1 |= SDMA_DESC1_HEAD_TO_HOST_FLAG;
        }
        let mut d = [0u8; DESC_BYTES];
        d[..8].copy_from_slice(&q0.to_le_bytes());
        d[8..].copy_from_slice(&q1.to_le_bytes());
        d
    }

    /// Writes descriptors for `headers.len()` packets: each a FIRST descriptor with its PBC and header (in slot
    /// k of the header area) and a LAST one with `SDMA_PAYLOAD` bytes at `payload_at(k)`; the last packet's
    /// asks for the head back in host memory. Returns the tail to write.
    fn post(&mut self, a: &Hfi, headers: &[Vec<u8>], payload_at: impl Fn(usize) -> u64) -> Result<u64, String> {
        let mut slots = vec![0u8; headers.len() * HDR_SLOT as usize];
        let mut descs = Vec::with_capacity(headers.len() * 2 * DESC_BYTES);
        for (k, h) in headers.iter().enumerate() {
            let slot = &mut slots[k * HDR_SLOT as usize..][..PBC_BYTES + h.len()];
            slot[..PBC_BYTES].copy_from_slice(&pbc(h.len() + SDMA_PAYLOAD).to_le_bytes());
            slot[PBC_BYTES..].copy_from_slice(h);
            let t = self.tail + 2 * k as u64;
            let last = k + 1 == headers.len();
            descs.extend(Self::desc(t, true, false, slot.len(), A_HEADERS + k as u64 * HDR_SLOT, false));
            descs.extend(Self::desc(t + 1, false, true, SDMA_PAYLOAD, payload_at(k), last));
        }
        a.mem.write(A_HEADERS, &slots).map_err(|e| format!("headers: {e}"))?;
        // The ring wraps: the part up to its end, then the rest from its start.
        let at = (self.tail % RING_DESCS) as usize * DESC_BYTES;
        let room = RING_DESCS as usize * DESC_BYTES - at;
        let (first, rest) = descs.split_at(descs.len().min(room));
        a.mem.write(A_RING + at as u64, first).map_err(|e| format!("ring: {e}"))?;
        if !rest.is_empty() {
            a.mem.write(A_RING, rest).map_err(|e| format!("ring: {e}"))?;
        }
        self.tail += 2 * headers.len() as u64;
        Ok(self.tail % RING_DESCS)
    }

    /// Waits for the engine's head to reach the tail (the idle interrupt, then SEND_DMA_HEAD and the head the
    /// engine wrote home).
    fn await_idle(&self, a: &Hfi) -> Result<(), String> {
        let deadline = Instant::now() + STALL;
        let tail = self.tail % RING_DESCS;
        loop {
            a.clear_irq(IS_SDMA_IDLE_START + ENGINE as u32)?;
            let head = a.r(SEND_DMA_HEAD + 0x100 * ENGINE)?;
            if head == tail {
                let home = a.read_u64(A_HEAD_HOME)?;
                return (home == tail).then_some(()).ok_or(format!("head written home {home}, engine head {tail}"));
            }
            if a.r(SEND_DMA_STATUS + 0x100 * ENGINE)? & SEND_DMA_STATUS_ENG_HALTED_SMASK != 0 {
                let err = a.r(SEND_DMA_ENG_ERR_STATUS + 0x100 * ENGINE)?;
                return Err(format!("SDMA engine halted, SEND_DMA_ENG_ERR_STATUS {err:#x}"));
            }
            if !a.irqs.take(V_SDMA_IDLE, deadline) {
                return Err(format!("SDMA head {head}, tail {tail}; {}", a.state()));
            }
        }
    }
}

/// The driver's side of the receive context: where it reads next, the RcvSeq it expects, and the eager space
/// the last packet took.
struct RcvContext {
    /// Header-queue entries consumed, modulo the queue.
    head: u64,
    seq: u64,
    /// The eager buffer the last packet used and the block after it.
    egr: Option<(u64, u64)>,
}

/// One packet as the receiver must find it: its header, and the payload behind it in an eager buffer.
pub struct Expected<'a> {
    pub header: &'a [u8],
    pub payload: &'a [u8],
}

impl RcvContext {
    /// hfi1_rcvctrl for context 1 behind the QP map (init_qpmap_table: every QPN to it): header queue, DMA'd
    /// tail, eager buffers in the RcvArray, don't-drop on full (the driver's default), RcvAvail routed; the
    /// port enabled (set_link_state HLS_UP_INIT).
    fn enable(b: &Hfi) -> Result<Self, String> {
        b.map(B_HDRQ, (RHQ_ENTRIES * ENTRY_DWORDS * 4) as usize)?;
        b.map(B_TAIL, 4096)?;
        b.map(B_EAGER, (EAGER_BUFFERS * EAGER_SIZE) as usize)?;
        let size = BufSize::from_code(EAGER_CODE).map(BufSize::bytes);
        if size != Some(EAGER_SIZE) {
            return Err(format!("BUF_SIZE code {EAGER_CODE} is {size:?} bytes, not {EAGER_SIZE}"));
        }
        let k = |reg| kctxt_csr(reg, RCV_CTXT);
        b.w(k(RCV_HDR_CNT), RHQ_ENTRIES >> HDRQ_SIZE_SHIFT)?;
        b.w(k(RCV_HDR_ENT_SIZE), RCV_HDR_ENT_SIZE_32)?;
        b.w(k(RCV_HDR_ADDR), B_HDRQ)?;
        b.w(k(RCV_HDR_TAIL_ADDR), B_TAIL)?;
        b.w(k(RCV_EGR_CTRL), (EAGER_BUFFERS >> RCV_SHIFT) << RCV_EGR_CTRL_EGR_CNT_SHIFT)?;
        for i in 0..EAGER_BUFFERS {
            let addr = (B_EAGER + i * EAGER_SIZE) >> RT_ADDR_SHIFT;
            let entry = RCV_ARRAY_RT_WRITE_ENABLE_SMASK | (u64::from(EAGER_CODE) << RCV_ARRAY_RT_BUF_SIZE_SHIFT) | addr;
            b.w(RCV_ARRAY + RCV_ARRAY_ENTRY_SIZE * i, entry)?;
        }
        let ctrl = RCV_CTXT_CTRL_ENABLE_SMASK
            | RCV_CTXT_CTRL_INTR_AVAIL_SMASK
            | RCV_CTXT_CTRL_TAIL_UPD_SMASK
            | RCV_CTXT_CTRL_DONT_DROP_RHQ_FULL_SMASK
            | RCV_CTXT_CTRL_DONT_DROP_EGR_FULL_SMASK
            | (u64::from(EAGER_CODE) << RCV_CTXT_CTRL_EGR_BUF_SIZE_SHIFT);
        b.w(k(RCV_CTXT_CTRL), ctrl)?;
        let all_to_ctxt = u64::from_le_bytes([RCV_CTXT as u8; 8]);
        for r in 0..RCV_QP_MAP_TABLE_REGS as u64 {
            b.w(RCV_QP_MAP_TABLE + 8 * r, all_to_ctxt)?;
        }
        b.w(RCV_CTRL, RCV_CTRL_RCV_PORT_ENABLE_SMASK | RCV_CTRL_RCV_QP_MAP_ENABLE_SMASK)?;
        b.route_irq(IS_RCVAVAIL_START + RCV_CTXT as u32, V_RCVAVAIL)?;
        Ok(RcvContext { head: 0, seq: 1, egr: None })
    }

    /// Waits until `n` packets past the head are in the queue: the DMA'd tail, read after each RcvAvail is
    /// cleared (the handler's order, so none is missed). Stalled when no packet came for `STALL`.
    fn wait(&self, b: &Hfi, n: usize) -> Result<(), String> {
        let (mut seen, mut deadline) = (None, Instant::now());
        loop {
            b.clear_irq(IS_RCVAVAIL_START + RCV_CTXT as u32)?;
            let tail = b.read_u64(B_TAIL)? / ENTRY_DWORDS;
            let got = (tail + RHQ_ENTRIES - self.head) % RHQ_ENTRIES;
            if got >= n as u64 {
                return Ok(());
            }
            if seen != Some(got) {
                (seen, deadline) = (Some(got), Instant::now() + STALL);
            }
            if !b.irqs.take(V_RCVAVAIL, deadline) {
                return Err(format!("{got} of {n} packets arrived; {}", b.state()));
            }
        }
    }

    /// Checks the `expected.len()` packets past the head, in order: each entry's RHF (length, type, no error,
    /// RcvSeq, the header right against it) and header bytes, and the payload in the eager buffer its RHF names,
    /// packed after the previous packet's; then gives the entries and the eager buffers back (RCV_HDR_HEAD,
    /// RCV_EGR_INDEX_HEAD), as the driver does once it has handled them.
    fn check_and_release(&mut self, b: &Hfi, expected: &[Expected<'_>]) -> Result<(), String> {
        let entry_bytes = (ENTRY_DWORDS * 4) as usize;
        let mut hdrq = vec![0u8; RHQ_ENTRIES as usize * entry_bytes];
        b.mem.read(B_HDRQ, &mut hdrq).map_err(|e| format!("header queue: {e}"))?;
        let mut places = Vec::with_capacity(expected.len());
        for (k, x) in expected.iter().enumerate() {
            let entry = ((self.head + k as u64) % RHQ_ENTRIES) as usize;
            let e = &hdrq[entry * entry_bytes..][..entry_bytes];
            let rhf_at = entry_bytes - RHF_BYTES;
            let rhf = u64::from_le_bytes(e[rhf_at..].try_into().map_err(|_| "short entry")?);
            let field = |shift: u32, mask: u64| (rhf >> shift) & mask;
            let wire = HEADER_BYTES + x.payload.len() + ICRC_BYTES;
            let hdrq_offset = ENTRY_DWORDS - (RHF_BYTES + HEADER_BYTES) as u64 / 4;
            let want = [
                ("PktLen", rhf & RHF_PKT_LEN_MASK, (wire / 4) as u64),
                ("RcvType", field(RHF_RCV_TYPE_SHIFT, RHF_RCV_TYPE_MASK), RHF_RCV_TYPE_IB),
                ("errors", rhf & RHF_ERROR_SMASK, 0),
                ("RcvSeq", field(RHF_RCV_SEQ_SHIFT, RHF_RCV_SEQ_MASK), self.seq),
                ("HdrqOffset", field(RHF_HDRQ_OFFSET_SHIFT, RHF_HDRQ_OFFSET_MASK), hdrq_offset),
                ("UseEgrBfr", rhf & RHF_USE_EGR_BFR, RHF_USE_EGR_BFR),
            ];
            if let Some((what, got, want)) = want.iter().find(|(_, g, w)| g != w) {
                return Err(format!("packet {k} (entry {entry}): RHF {rhf:#x} {what} {got:#x}, expected {want:#x}"));
            }
            if &e[hdrq_offset as usize * 4..rhf_at] != x.header {
                return Err(format!("packet {k} (entry {entry}): the header differs"));
            }
            self.seq = if self.seq >= u64::from(RHF_MAX_SEQ) { 1 } else { self.seq + 1 };
            let index = field(RHF_EGR_INDEX_SHIFT, RHF_EGR_INDEX_MASK);
            let offset = field(RHF_EGR_OFFSET_SHIFT, RHF_EGR_OFFSET_MASK);
            let blocks = (x.payload.len() + ICRC_BYTES).div_ceil(RCV_BUF_BLOCK_SIZE as usize) as u64;
            let packed = match self.egr {
                None => (index, offset) == (0, 0),
                Some((i, end)) => (index == i && offset == end) || (index == (i + 1) % EAGER_BUFFERS && offset == 0),
            };
            if !packed || (offset + blocks) * RCV_BUF_BLOCK_SIZE > EAGER_SIZE {
                return Err(format!(
                    "packet {k}: eager buffer {index} block {offset}, after {:?} (buffer, next block)",
                    self.egr
                ));
            }
            self.egr = Some((index, offset + blocks));
            places.push((index * EAGER_SIZE + offset * RCV_BUF_BLOCK_SIZE) as usize);
        }
        let same = b.mem.inspect(B_EAGER, |egr| {
            expected.iter().zip(&places).position(|(x, at)| egr.get(*at..*at + x.payload.len()) != Some(x.payload))
        });
        match same {
            Some(None) => {}
            Some(Some(k)) => return Err(format!("packet {k}: the payload in its eager buffer differs")),
            None => return Err("no eager memory".into()),
        }
        self.head = (self.head + expected.len() as u64) % RHQ_ENTRIES;
        b.w(uctxt_csr(RCV_HDR_HEAD, RCV_CTXT), self.head * ENTRY_DWORDS)?;
        if let Some((index, _)) = self.egr {
            b.w(uctxt_csr(RCV_EGR_INDEX_HEAD, RCV_CTXT), index)?;
        }
        Ok(())
    }
}

/// LRH (VL 0, DLID 2, SLID 1), BTH (UD SEND_ONLY, P_Key 0xffff, QP 5, `psn`, no pad) and DETH for `payload`
/// bytes, a whole number of dwords.
pub fn ud_header(payload: usize, psn: u32) -> Vec<u8> {
    let mut h = vec![0u8; HEADER_BYTES];
    let dwords = ((HEADER_BYTES + payload + ICRC_BYTES) / 4) as u16;
    h[1] = LNH_BTH;
    h[2..4].copy_from_slice(&2u16.to_be_bytes());
    h[4..6].copy_from_slice(&dwords.to_be_bytes());
    h[6..8].copy_from_slice(&1u16.to_be_bytes());
    h[8] = IB_OPCODE_UD_SEND_ONLY;
    h[10..12].copy_from_slice(&0xFFFFu16.to_be_bytes());
    h[13..16].copy_from_slice(&5u32.to_be_bytes()[1..]);
    h[17..20].copy_from_slice(&psn.to_be_bytes()[1..]);
    h
}

/// The PBC for a packet of `bytes` after it (VL 0): its length in dwords counts the PBC, not the ICRC.
pub fn pbc(bytes: usize) -> u64 {
    ((PBC_BYTES + bytes) / 4) as u64
}

/// Two HFIs on a cable with the link up, end A sending (PIO and SDMA), end B receiving.
pub struct Fabric {
    a: Hfi,
    b: Hfi,
    send: SendContext,
    sdma: SdmaRing,
    rcv: RcvContext,
}

impl Fabric {
    /// Both functions as `device-model --low-latency` serves them (the workers' opt-in spin), joined by a cable
    /// that trains at once, the link up, and the contexts and engine above.
    pub fn new() -> Result<Self, String> {
        let config = |i| Hfi1Config { worker: WorkerMode::LOW_LATENCY, ..Hfi1Config::wfr_instance(i) };
        let ea = Hfi1::new(config(0)).map_err(|e| format!("hfi1 A: {e}"))?;
        let eb = Hfi1::new(config(1)).map_err(|e| format!("hfi1 B: {e}"))?;
        Hfi1::connect(&ea, &eb, Duration::ZERO).map_err(|e| format!("cable: {e}"))?;
        let (a, b) = (Hfi::attach(ea)?, Hfi::attach(eb)?);
        a.start_link()?;
        b.start_link()?;
        a.await_link_up()?;
        b.await_link_up()?;
        let send = SendContext::enable(&a)?;
        let sdma = SdmaRing::start(&a)?;
        let rcv = RcvContext::enable(&b)?;
        Ok(Fabric { a, b, send, sdma, rcv })
    }

    /// Sends `packets` (each as [`pio_packet`] lays it out) by PIO and waits until the last is in B's header
    /// queue. Returns the nanoseconds that took.
    pub fn pio(&mut self, packets: &[Vec<u8>]) -> Result<u64, String> {
        let start = Instant::now();
        for p in packets {
            self.send.copy(&self.a, p)?;
        }
        self.rcv.wait(&self.b, packets.len())?;
        Ok(start.elapsed().as_nanos() as u64)
    }

    /// The SDMA payload buffer's contents, written once.
    pub fn load_payload(&self, bytes: &[u8]) -> Result<(), String> {
        self.a.mem.write(A_PAYLOAD, bytes).map_err(|e| format!("payload: {e}"))
    }

    /// Posts one packet per header, payload k at `offset + k * SDMA_PAYLOAD` of the payload buffer, rings the
    /// doorbell (SEND_DMA_TAIL) and waits until the last packet is in B's header queue, then for the engine
    /// to go idle. Returns the nanoseconds from the doorbell to the last packet's arrival.
    pub fn sdma(&mut self, headers: &[Vec<u8>], offset: usize) -> Result<u64, String> {
        let (rcv, b, n) = (&self.rcv, &self.b, headers.len());
        Self::doorbell(&self.a, &mut self.sdma, headers, offset, || rcv.wait(b, n))
    }

    /// As [`Fabric::sdma`], for packets to another of B's receive contexts: `arrived` waits until the last
    /// packet is where the caller looks for it.
    pub(super) fn sdma_to(
        &mut self,
        headers: &[Vec<u8>],
        offset: usize,
        arrived: impl FnOnce(&Hfi) -> Result<(), String>,
    ) -> Result<u64, String> {
        let b = &self.b;
        Self::doorbell(&self.a, &mut self.sdma, headers, offset, || arrived(b))
    }

    fn doorbell(
        a: &Hfi,
        ring: &mut SdmaRing,
        headers: &[Vec<u8>],
        offset: usize,
        arrived: impl FnOnce() -> Result<(), String>,
    ) -> Result<u64, String> {
        let at = |k: usize| A_PAYLOAD + (offset + k * SDMA_PAYLOAD) as u64;
        let tail = ring.post(a, headers, at)?;
        let start = Instant::now();
        a.w(SEND_DMA_TAIL + 0x100 * ENGINE, tail)?;
        arrived()?;
        let ns = start.elapsed().as_nanos() as u64;
        ring.await_idle(a)?;
        Ok(ns)
    }

    /// End B, the receiver, for a rig that programs more of it.
    pub(super) fn receiver(&self) -> &Hfi {
        &self.b
    }

    /// Checks the packets that arrived since the last check (see [`RcvContext::check_and_release`]).
    pub fn check(&mut self, expected: &[Expected<'_>]) -> Result<(), String> {
        self.rcv.check_and_release(&self.b, expected)
    }
}

/// A packet as pio_copy writes it: PBC, header, payload, zeros to the end of its last block.
pub fn pio_packet(header: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut bytes = pbc(header.len() + payload.len()).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(payload);
    bytes.resize(bytes.len().div_ceil(PIO_BLOCK_SIZE as usize) * PIO_BLOCK_SIZE as usize, 0);
    bytes
}
