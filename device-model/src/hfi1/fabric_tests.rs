//! Two chip-personality functions on one cable, driven the way the Linux hfi1 driver drives them: the link
//! trains when both 8051s poll, an SMP written into one HFI's VL15 send context arrives in the other's
//! control context, and a port going offline takes the other down. Expected values are the driver's
//! (chip.c, pio.c, driver.c), not the model's.

#![forbid(unsafe_code)]

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use vfio_user_proto::device::{irq, region, Device, DeviceContext, IrqTrigger};
use vfio_user_proto::dma::{DmaAccess, HeapMemory};

use super::config::Hfi1Config;
use super::device::Hfi1;
use super::regs::*;
use super::wfr::csr::*;
use super::wfr::pio::*;
use super::wfr::TXE_PIO_SEND;
use crate::pci::{Function, PciIds};

#[derive(Default)]
struct Irqs {
    got: Mutex<Vec<u32>>,
    changed: Condvar,
}
impl IrqTrigger for Irqs {
    fn trigger(&self, index: u32, vector: u32) {
        assert_eq!(index, irq::MSIX);
        self.got.lock().unwrap().push(vector);
        self.changed.notify_all();
    }
}
impl Irqs {
    /// Waits (bounded) for an interrupt on `vector`, and takes it.
    fn wait(&self, vector: u32) -> bool {
        let got = self.got.lock().unwrap();
        let (mut got, _) =
            self.changed.wait_timeout_while(got, Duration::from_secs(5), |g| !g.contains(&vector)).unwrap();
        match got.iter().position(|&v| v == vector) {
            Some(i) => {
                got.remove(i);
                true
            }
            None => false,
        }
    }
}

struct Hfi {
    f: Arc<Function>,
    irqs: Arc<Irqs>,
    mem: Arc<HeapMemory>,
    probe: Arc<crate::probe::Probe>,
    engine: Arc<Hfi1>,
}

impl Hfi {
    fn counter(&self, name: &str) -> u64 {
        self.engine.counters().into_iter().find(|(n, _)| *n == name).map(|(_, v)| v).unwrap()
    }

    fn r(&self, off: u64) -> u64 {
        let mut b = [0u8; 8];
        self.f.region_read(region::BAR0, off, &mut b).unwrap();
        u64::from_le_bytes(b)
    }
    fn w(&self, off: u64, v: u64) {
        self.f.region_write(region::BAR0, off, &v.to_le_bytes()).unwrap();
    }
    /// do_8051_command: request, REQ_NEW, poll COMPLETED, clear.
    fn cmd_8051(&self, kind: u64, data: u64) {
        let req = (kind << 8) | (data << 16);
        self.w(DC_DC8051_CFG_HOST_CMD_0, req);
        self.w(DC_DC8051_CFG_HOST_CMD_0, req | 1);
        assert_ne!(self.r(DC_DC8051_CFG_HOST_CMD_1) & 1, 0, "COMPLETED");
        self.w(DC_DC8051_CFG_HOST_CMD_0, 0);
    }
    /// read_8051_config of a general field: RAM address field * 4 (chip.c read_8051_data).
    fn ram_field(&self, field: u64) -> u64 {
        let addr = field * 4;
        self.w(DC_DC8051_CFG_RAM_ACCESS_CTRL, addr & !7);
        self.w(DC_DC8051_CFG_RAM_ACCESS_CTRL, (addr & !7) | 0x1_0000);
        let q = self.r(DC_DC8051_CFG_RAM_ACCESS_RD_DATA);
        if addr & 4 != 0 {
            q >> 32
        } else {
            q & 0xFFFF_FFFF
        }
    }
    /// Unmasks interrupt `source` and maps it to MSI-X `vector` (set_intr_bits, remap_intr).
    fn route_irq(&self, source: u64, vector: u64) {
        let mask = CCE_INT_MASK + 8 * (source / 64);
        self.w(mask, self.r(mask) | 1 << (source % 64));
        let map = CCE_INT_MAP + 8 * (source / 8);
        let shift = 8 * (source % 8);
        self.w(map, (self.r(map) & !(0xFF << shift)) | (vector << shift));
    }
}

const PLS_POLLING: u64 = 0x20;
const PLS_LINKUP: u64 = 0x50;
const PLS_OFFLINE: u64 = 0x90;
const HCMD_CHANGE_PHY_STATE: u64 = 0x03;
/// IS_DC_START + 2: the 8051's interrupt (chip.c dc_errs[2]).
const DC8051_SOURCE: u64 = 250;
/// IS_RCVAVAIL_START, IS_SENDCREDIT_START.
const RCVAVAIL_SOURCE: u64 = 256;
const SENDCREDIT_SOURCE: u64 = 576;
const LINKUP_ACHIEVED: u64 = 1 << 7;
const LINK_GOING_DOWN: u64 = 1 << 8;

fn pair() -> (Hfi, Hfi) {
    let new = |i| Hfi1::new(Hfi1Config::wfr_instance(i).inline()).unwrap();
    let (ea, eb) = (new(0), new(1));
    Hfi1::connect(&ea, &eb, Duration::ZERO).unwrap();
    let hfi = |e: Hfi1| {
        let probe = crate::engine::Engine::probe(&e);
        let engine = Arc::new(e);
        let f = Function::try_new(engine.clone(), PciIds::hfi1_wfr_default()).unwrap();
        let (irqs, mem) = (Arc::new(Irqs::default()), Arc::new(HeapMemory::new()));
        f.attach(DeviceContext { dma: mem.clone() as Arc<dyn DmaAccess>, irq: irqs.clone() });
        // pci_enable_device, bus master, MSI-X on.
        f.region_write(region::CONFIG, 0x04, &0x0006u16.to_le_bytes()).unwrap();
        f.region_write(region::CONFIG, 0xB2, &0x8000u16.to_le_bytes()).unwrap();
        Hfi { f, irqs, mem, probe, engine }
    };
    (hfi(ea), hfi(eb))
}

/// What the driver does for the link until the 8051 reports: interrupts on (init_other sets
/// DC_DC8051_ERR_EN to ~0), then start_link's CHANGE_PHY_STATE(POLLING) and log_physical_state's read.
fn start_link(h: &Hfi) {
    h.w(DC_DC8051_ERR_EN, !0);
    h.route_irq(DC8051_SOURCE, 0);
    h.cmd_8051(HCMD_CHANGE_PHY_STATE, PLS_POLLING);
    assert_eq!(h.r(DC_DC8051_STS_CUR_STATE) & 0xFF, PLS_POLLING);
}

/// general_interrupt clears the source (CCE_INT_CLEAR), then handle_8051_interrupt: the flag set, the host
/// message read once, the flag cleared.
fn host_message(h: &Hfi) -> u64 {
    assert!(h.irqs.wait(0), "8051 interrupt");
    h.w(CCE_INT_CLEAR + 8 * (DC8051_SOURCE / 64), 1 << (DC8051_SOURCE % 64));
    assert_ne!(h.r(DC_DC8051_ERR_FLG) & 1, 0, "SET_BY_8051");
    let info = h.r(DC_DC8051_DBG_ERR_INFO_SET_BY_8051);
    h.w(DC_DC8051_ERR_CLR, 1);
    info & 0xFFFF
}

fn link_up(a: &Hfi, b: &Hfi) {
    start_link(a);
    start_link(b);
    assert_eq!(host_message(a), LINKUP_ACHIEVED);
    assert_eq!(host_message(b), LINKUP_ACHIEVED);
}

#[test]
fn the_link_trains_when_both_ports_poll_and_each_port_reads_its_neighbour() {
    let (a, b) = pair();
    start_link(&a);
    // Alone, the port keeps polling.
    assert_eq!(a.r(DC_DC8051_STS_CUR_STATE) & 0xFF, PLS_POLLING);
    start_link(&b);
    for (h, peer_guid) in [(&a, 0x0011_7501_0100_0002), (&b, 0x0011_7501_0100_0001)] {
        assert_eq!(host_message(h), LINKUP_ACHIEVED);
        // handle_link_up waits for these two (set_link_state HLS_UP_INIT).
        assert_eq!(h.r(DC_DC8051_STS_CUR_STATE) & 0xFF, PLS_LINKUP);
        assert_eq!((h.r(DCC_CFG_PORT_CONFIG) >> 48) & 7, 2, "logical INIT");
        // handle_linkup_change reads the neighbour.
        assert_eq!(h.r(DC_DC8051_STS_REMOTE_GUID), peer_guid);
        assert_eq!(h.r(DC_DC8051_STS_REMOTE_NODE_TYPE) & 3, 0, "an HFI");
        assert_eq!(h.r(DC_DC8051_STS_REMOTE_PORT_NO) & 0xFF, 1);
        // The message is shown once.
        assert_eq!(h.r(DC_DC8051_DBG_ERR_INFO_SET_BY_8051), 0);
    }
}

#[test]
fn the_logical_state_reads_back_what_the_sma_wrote() {
    let (a, b) = pair();
    link_up(&a, &b);
    // set_logical_state(LSTATE_ARMED), then ACTIVE: read-modify-write, polled back.
    for state in [3u64, 4] {
        let reg = (a.r(DCC_CFG_PORT_CONFIG) & !(7 << 48)) | (state << 48);
        a.w(DCC_CFG_PORT_CONFIG, reg);
        assert_eq!((a.r(DCC_CFG_PORT_CONFIG) >> 48) & 7, state);
    }
}

#[test]
fn a_port_going_offline_takes_the_other_down_with_its_reason() {
    let (a, b) = pair();
    link_up(&a, &b);
    // goto_offline: CHANGE_PHY_STATE((rem_reason << 8) | PLS_OFFLINE).
    a.cmd_8051(HCMD_CHANGE_PHY_STATE, (5 << 8) | PLS_OFFLINE);
    assert_eq!(a.r(DC_DC8051_STS_CUR_STATE) & 0xF0, PLS_OFFLINE, "wait_phys_link_offline_substates");
    assert_eq!((a.r(DCC_CFG_PORT_CONFIG) >> 48) & 7, 1, "wait_logical_linkstate(IB_PORT_DOWN)");
    assert_eq!(host_message(&b), LINK_GOING_DOWN);
    assert_eq!(b.r(DC_DC8051_STS_CUR_STATE) & 0xFF, PLS_OFFLINE);
    // handle_link_down: LINK_DOWN_REASON 0x16 byte 0, LINK_QUALITY_INFO 0x14 bits 23:16.
    assert_eq!(b.ram_field(0x16) & 0xFF, 0xb, "LDR_RECEIVED_LINKDOWN_IDLE_MSG");
    assert_eq!((b.ram_field(0x14) >> 16) & 0xFF, 5);
    assert_eq!(b.r(DC_DC8051_STS_REMOTE_GUID), 0);
    // Both poll again: the link comes back.
    link_up(&a, &b);
}

#[test]
fn a_reset_of_one_hfi_drops_the_link_of_the_other() {
    let (a, b) = pair();
    link_up(&a, &b);
    // _dc_shutdown: DC_DC8051_CFG_RST.
    a.w(DC_DC8051_CFG_RST, 1);
    assert_eq!(host_message(&b), LINK_GOING_DOWN);
    assert_eq!(b.ram_field(0x16) & 0xFF, 0xa, "LDR_LINK_TRANSFER_ACTIVE_LOW: no word from the neighbour");
}

// --- an SMP across the cable -------------------------------------------------------------------------------

/// The VL15 send context (init_pervl_scs gives kernel contexts the highest hardware numbers).
const SEND_CTXT: u64 = 159;
const CREDITS: u64 = 102;
const CR_BASE: u64 = 0x1_0000;
const HDRQ: u64 = 0x10_0000;
const TAIL: u64 = 0x11_0000;
const EAGER: u64 = 0x20_0000;
const EGR_SIZE: u64 = 16 * 1024;

/// sc_alloc + sc_enable of the VL15 context on `h`, its credit return at CR_BASE, CREDIT_INTR on.
fn send_context(h: &Hfi) {
    h.mem.map(CR_BASE, 4096);
    let k = |reg| reg + 0x100 * SEND_CTXT;
    h.w(k(SEND_CTXT_CTRL), CREDITS << SEND_CTXT_CTRL_CTXT_DEPTH_SHIFT);
    h.w(k(SEND_CTXT_CREDIT_RETURN_ADDR), CR_BASE);
    h.w(k(SEND_CTXT_CREDIT_CTRL), SEND_CTXT_CREDIT_CTRL_CREDIT_INTR_SMASK | 51);
    h.w(SEND_PIO_INIT_CTXT, (SEND_CTXT << 8) | SEND_PIO_INIT_CTXT_PIO_SINGLE_CTXT_INIT_SMASK);
    h.w(k(SEND_CTXT_CTRL), (CREDITS << SEND_CTXT_CTRL_CTXT_DEPTH_SHIFT) | SEND_CTXT_CTRL_CTXT_ENABLE_SMASK);
    h.route_irq(SENDCREDIT_SOURCE + SEND_CTXT, 2);
}

/// hfi1_rcvctrl for the control context 0: DMA'd tail, 64 entries of 32 dwords, 8 eager buffers of 16 KiB;
/// RCV_VL15 names it; the port is enabled (set_link_state HLS_UP_INIT).
fn control_context(h: &Hfi) {
    h.mem.map(HDRQ, 64 * 128);
    h.mem.map(TAIL, 4096);
    h.mem.map(EAGER, (8 * EGR_SIZE) as usize);
    let k = |reg| kctxt_csr(reg, 0);
    h.w(k(RCV_HDR_CNT), 64 >> 5);
    h.w(k(RCV_HDR_ENT_SIZE), 4);
    h.w(k(RCV_HDR_ADDR), HDRQ);
    h.w(k(RCV_HDR_TAIL_ADDR), TAIL);
    h.w(k(RCV_EGR_CTRL), 1 << 32);
    for i in 0..8 {
        h.w(RCV_ARRAY + 8 * i, (1 << 63) | (3 << 36) | ((EAGER + i * EGR_SIZE) >> 12));
    }
    let ctrl = RCV_CTXT_CTRL_ENABLE_SMASK
        | RCV_CTXT_CTRL_INTR_AVAIL_SMASK
        | RCV_CTXT_CTRL_TAIL_UPD_SMASK
        | RCV_CTXT_CTRL_DONT_DROP_RHQ_FULL_SMASK
        | RCV_CTXT_CTRL_DONT_DROP_EGR_FULL_SMASK
        | (3 << RCV_CTXT_CTRL_EGR_BUF_SIZE_SHIFT);
    h.w(k(RCV_CTXT_CTRL), ctrl);
    h.w(RCV_VL15, 0);
    h.w(RCV_CTRL, RCV_CTRL_RCV_PORT_ENABLE_SMASK | RCV_CTRL_RCV_QP_MAP_ENABLE_SMASK);
    h.route_irq(RCVAVAIL_SOURCE, 1);
}

/// A directed-route SMP as hfi1_make_ud_req builds it on QP0: LRH (VL 15, permissive LIDs), BTH (UD SEND_ONLY,
/// pkey 0xffff, QP 0), DETH, 256 bytes of MAD whose bytes count up.
fn smp() -> Vec<u8> {
    let mut p = vec![0u8; 28 + 256];
    let dwords = ((p.len() + 4) / 4) as u16;
    p[0] = 0xF0;
    p[1] = 0x2;
    p[2..4].copy_from_slice(&[0xFF, 0xFF]);
    p[4..6].copy_from_slice(&dwords.to_be_bytes());
    p[6..8].copy_from_slice(&[0xFF, 0xFF]);
    p[8] = 0x64;
    p[10..12].copy_from_slice(&[0xFF, 0xFF]);
    for (i, b) in p[28..].iter_mut().enumerate() {
        *b = i as u8;
    }
    p
}

/// pio_copy: the PBC and the first 56 bytes through the SOP alias, the rest plain, the last block padded.
fn pio_copy(h: &Hfi, packet: &[u8]) {
    let pbc = (15 << 12) | ((packet.len() / 4 + 2) as u64);
    let mut bytes = pbc.to_le_bytes().to_vec();
    bytes.extend_from_slice(packet);
    bytes.resize(bytes.len().div_ceil(64) * 64, 0);
    let base = TXE_PIO_SEND + (SEND_CTXT << 16);
    for (q, chunk) in bytes.chunks(8).enumerate() {
        let sop = if q < 8 { SOP_DISTANCE } else { 0 };
        h.w(base + sop + 8 * q as u64, u64::from_le_bytes(chunk.try_into().unwrap()));
    }
}

fn read(h: &Hfi, at: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0; len];
    h.mem.read(at, &mut b).unwrap();
    b
}

#[test]
fn an_smp_sent_by_pio_lands_in_the_peers_control_context() {
    let (a, b) = pair();
    link_up(&a, &b);
    send_context(&a);
    control_context(&b);
    let packet = smp();
    pio_copy(&a, &packet);
    assert!(b.irqs.wait(1), "RcvAvail on the peer");
    // The RHF at the end of entry 0 (rhf_offset = entsize - 2).
    let rhf = u64::from_le_bytes(read(&b, HDRQ + 30 * 4, 8).try_into().unwrap());
    assert_eq!(rhf & 0xFFF, ((packet.len() + 4) / 4) as u64, "PktLen: the wire's dwords with the ICRC");
    assert_eq!((rhf >> 12) & 7, 2, "RHF_RCV_TYPE_IB");
    assert_eq!((rhf >> 28) & 0xF, 1, "RcvSeq 1");
    let hdrq_offset = (rhf >> 44) & 0x1FF;
    assert_eq!(hdrq_offset, 30 - 7, "the 28-byte header right against the RHF");
    assert_eq!(read(&b, HDRQ + hdrq_offset * 4, 28), packet[..28]);
    assert_ne!(rhf & (1 << 15), 0, "UseEgrBfr");
    assert_eq!(read(&b, EAGER, 256), packet[28..], "the MAD in eager buffer 0 at offset 0");
    // The DMA'd tail in dwords, and the CSR the same (check_packet_present).
    assert_eq!(u64::from_le_bytes(read(&b, TAIL, 8).try_into().unwrap()), 32);
    assert_eq!(b.r(uctxt_csr(RCV_HDR_TAIL, 0)), 32);
    // The sender got its 5 blocks back, with the SendCredit interrupt.
    assert!(a.irqs.wait(2), "SendCredit");
    let cr = u64::from_le_bytes(read(&a, CR_BASE + 8 * (SEND_CTXT % 8), 8).try_into().unwrap());
    assert_eq!(cr & 0x7FF, 5);
}

#[test]
fn nothing_leaves_while_the_link_is_down_and_the_credits_still_come_back() {
    let (a, b) = pair();
    send_context(&a);
    control_context(&b);
    pio_copy(&a, &smp());
    assert!(a.irqs.wait(2), "SendCredit");
    assert_eq!(u64::from_le_bytes(read(&a, CR_BASE + 8 * (SEND_CTXT % 8), 8).try_into().unwrap()) & 0x7FF, 5);
    assert_eq!(b.r(uctxt_csr(RCV_HDR_TAIL, 0)), 0);
}

/// A PIO packet counts as a user's launch when its send context checks a user's job key (chip.c
/// hfi1_set_ctxt_jkey: SEND_CTXT_CHECK_JOB_KEY with MASK all ones, CHECK_JOB_KEY in SEND_CTXT_CHECK_ENABLE);
/// the kernel's TID RDMA key 32 and hfi1_clear_ctxt_jkey's 0 are not a user's.
#[test]
fn pio_packets_from_a_user_send_context_count_as_user_launches() {
    const CHECK_ENABLE: u64 = 0x1;
    const CHECK_JOB_KEY: u64 = 0x4;
    let table = [
        (0xFFFF_0000 | 1000, CHECK_ENABLE | CHECK_JOB_KEY, 1),
        (0xFFFF_0000 | 32, CHECK_ENABLE | CHECK_JOB_KEY, 0),
        (0, CHECK_ENABLE, 0),
    ];
    for (job_key, enable, user_launches) in table {
        let (a, _b) = pair();
        // init_kdeth_qp: KDETH QPs are 0x80xxxx; the SMP (QP 0) is no KDETH packet.
        a.w(SEND_BTH_QP, 0x80 << 16);
        a.w(SEND_CTXT_CHECK_JOB_KEY + 0x100 * SEND_CTXT, job_key);
        a.w(SEND_CTXT_CHECK_ENABLE + 0x100 * SEND_CTXT, enable);
        send_context(&a);
        pio_copy(&a, &smp());
        assert!(a.irqs.wait(2), "SendCredit: the worker is done with the launch");
        assert_eq!(a.counter("pio_user_launches"), user_launches, "{job_key:#x}");
    }
}

// --- a UD packet through an SDMA engine ---------------------------------------------------------------------

const RING: u64 = 0x40_0000;
const HEAD_HOME: u64 = 0x41_0000;
const BUFS: u64 = 0x50_0000;

/// init_sdma_regs and sdma_setlengen for engine 0 (2048 descriptors), then running with interrupts; the
/// idle source routed to vector 3.
fn sdma_engine(h: &Hfi) {
    h.mem.map(RING, 2048 * 16);
    h.mem.map(HEAD_HOME, 4096);
    h.mem.map(BUFS, 64 * 1024);
    h.w(SEND_DMA_BASE_ADDR, RING);
    h.w(SEND_DMA_LEN_GEN, (2048 / 64) << 6);
    h.w(SEND_DMA_LEN_GEN, ((2048 / 64) << 6) | (4 << 16));
    h.w(SEND_DMA_TAIL, 0);
    h.w(SEND_DMA_HEAD_ADDR, HEAD_HOME);
    h.w(SEND_DMA_CTRL, 0x1 | 0x8); // ENABLE | INT_ENABLE (s99_running)
    h.route_irq(224, 3); // IS_SDMA_IDLE_START + 0
}

/// The verbs context 1 behind the QP map (init_qpmap_table: every QPN to context 1), no DMA'd tail.
fn verbs_context(h: &Hfi) {
    h.mem.map(HDRQ, 64 * 128);
    h.mem.map(EAGER, (8 * EGR_SIZE) as usize);
    let k = |reg| kctxt_csr(reg, 1);
    h.w(k(RCV_HDR_CNT), 64 >> 5);
    h.w(k(RCV_HDR_ENT_SIZE), 4);
    h.w(k(RCV_HDR_ADDR), HDRQ);
    h.w(k(RCV_EGR_CTRL), 1 << 32);
    for i in 0..8 {
        h.w(RCV_ARRAY + 8 * i, (1 << 63) | (3 << 36) | ((EAGER + i * EGR_SIZE) >> 12));
    }
    let ctrl = RCV_CTXT_CTRL_ENABLE_SMASK | RCV_CTXT_CTRL_INTR_AVAIL_SMASK | (3 << RCV_CTXT_CTRL_EGR_BUF_SIZE_SHIFT);
    h.w(k(RCV_CTXT_CTRL), ctrl);
    for r in 0..32 {
        h.w(RCV_QP_MAP_TABLE + 8 * r, 0x0101_0101_0101_0101);
    }
    h.w(RCV_CTRL, RCV_CTRL_RCV_PORT_ENABLE_SMASK | RCV_CTRL_RCV_QP_MAP_ENABLE_SMASK);
    h.route_irq(RCVAVAIL_SOURCE + 1, 1);
}

/// A UD packet as two descriptors at ring index `at` (sdma.h): FIRST with PBC and header; LAST with the payload,
/// HEAD_TO_HOST, and INT_REQ when asked; generation 0. Its LRH: VL 0, DLID 2, SLID 1; BTH: UD SEND_ONLY, QP 5;
/// then DETH and 1000 bytes of payload, pad 0. Returns the payload and the packet's length in dwords.
fn ud_packet_by_sdma(a: &Hfi, at: u64, int_req: bool) -> (Vec<u8>, u16) {
    let mut hdr = vec![0u8; 28];
    let payload: Vec<u8> = (0..1000).map(|i| (i * 7 + at as usize) as u8).collect();
    let dwords = ((hdr.len() + payload.len() + 4) / 4) as u16;
    hdr[1] = 0x2;
    hdr[2..4].copy_from_slice(&2u16.to_be_bytes());
    hdr[4..6].copy_from_slice(&dwords.to_be_bytes());
    hdr[6..8].copy_from_slice(&1u16.to_be_bytes());
    hdr[8] = 0x64;
    hdr[15] = 5;
    let pbc = (((hdr.len() + payload.len()) / 4) + 2) as u64;
    let mut first = pbc.to_le_bytes().to_vec();
    first.extend_from_slice(&hdr);
    let (buf0, buf1) = (BUFS + at * 0x2000, BUFS + at * 0x2000 + 0x1000);
    a.mem.write(buf0, &first).unwrap();
    a.mem.write(buf1, &payload).unwrap();
    let d0 = (1u64 << 63) | ((first.len() as u64) << 48) | buf0;
    let d1 = (1u64 << 62) | ((payload.len() as u64) << 48) | buf1;
    let last = 1 | if int_req { 1 << 1 } else { 0 }; // HEAD_TO_HOST, INT_REQ
    for (i, (q0, q1)) in [(d0, 0u64), (d1, last)].into_iter().enumerate() {
        let slot = RING + 16 * (at + i as u64);
        a.mem.write(slot, &q0.to_le_bytes()).unwrap();
        a.mem.write(slot + 8, &q1.to_le_bytes()).unwrap();
    }
    (payload, dwords)
}

#[test]
fn a_ud_packet_gathered_by_sdma_lands_in_the_peers_verbs_context() {
    let (a, b) = pair();
    link_up(&a, &b);
    sdma_engine(&a);
    verbs_context(&b);
    let (payload, dwords) = ud_packet_by_sdma(&a, 0, false);
    a.w(SEND_DMA_TAIL, 2); // sdma_update_tail: the doorbell
    assert!(a.irqs.wait(3), "SDmaIdle");
    assert_eq!(a.r(SEND_DMA_HEAD), 2, "the live head");
    assert_eq!(u64::from_le_bytes(read(&a, HEAD_HOME, 8).try_into().unwrap()), 2, "HEAD_TO_HOST");
    assert!(b.irqs.wait(1), "RcvAvail on context 1");
    let rhf = u64::from_le_bytes(read(&b, HDRQ + 30 * 4, 8).try_into().unwrap());
    assert_eq!(rhf & 0xFFF, u64::from(dwords));
    assert_eq!(read(&b, EAGER, 1000), payload);
}

#[test]
fn the_sources_one_sdma_completion_raises_reach_the_host_as_one_interrupt() {
    let (a, b) = pair();
    link_up(&a, &b);
    sdma_engine(&a);
    verbs_context(&b);
    // The engine's SDMA (INT_REQ), progress and idle sources on its one vector, as the driver maps them.
    a.route_irq(192, 3); // IS_SDMA_START + 0
    a.route_irq(208, 3); // IS_SDMA_PROGRESS_START + 0
    const STATUS_WORD: u64 = 8 * (192 / 64);
    for round in 0..2u64 {
        ud_packet_by_sdma(&a, 2 * round, true);
        a.w(SEND_DMA_TAIL, 2 * (round + 1));
        assert!(a.irqs.wait(3), "round {round}: the engine's vector");
        // sdma_interrupt: read the status word under the engine's mask, clear what was read.
        let status = a.r(CCE_INT_STATUS + STATUS_WORD);
        assert_eq!(status & (1 << 0 | 1 << 32), 1 << 0 | 1 << 32, "round {round}: INT_REQ and idle both pending");
        a.w(CCE_INT_CLEAR + STATUS_WORD, status);
    }
    // Round 1's doorbell is walked after every message of round 0 went out: a second message for round 0's
    // sources would still be here.
    assert_eq!(*a.irqs.got.lock().unwrap(), Vec::<u32>::new(), "one message per completion");
}

#[test]
fn a_descriptor_of_the_wrong_generation_halts_the_engine() {
    let (a, b) = pair();
    link_up(&a, &b);
    sdma_engine(&a);
    a.route_irq(16, 4); // IS_SDMAENG_ERR_START + 0
    let d0 = (3u64 << 62) | (64u64 << 48) | BUFS; // FIRST | LAST
    a.mem.write(RING, &d0.to_le_bytes()).unwrap();
    a.mem.write(RING + 8, &(1u64 << 2).to_le_bytes()).unwrap(); // generation 1 on the first lap
    a.w(SEND_DMA_TAIL, 1);
    assert!(a.irqs.wait(4), "SDmaEngErr");
    assert_eq!(a.r(SEND_DMA_ENG_ERR_STATUS) & 0x2, 0x2, "SDMA_GEN_MISMATCH_ERR");
    assert_ne!(a.r(SEND_DMA_STATUS) & (1 << 56), 0, "ENG_HALTED");
    assert_eq!(a.r(SEND_DMA_HEAD), 0);
}

// --- a TID RDMA READ response segment -----------------------------------------------------------------------

const KHDRQ: u64 = 0x60_0000;
const TID_EVEN: u64 = 0x70_0000;
const TID_ODD: u64 = 0x80_0000;
/// The requester's kernel context 2: RcvArray entries 2048.. (RCV_TID_CTRL base 256 >> 3, 128 groups).
const KCTXT: u64 = 2;
const KFLOW: u64 = 3;
const KGEN: u64 = 0x12345;

/// hfi1_rcvctrl of kernel context 2 with TID RDMA on (TID_FLOW_ENABLE), RCV_HDR_SIZE 9, RCV_BTH_QP 0x80
/// (chip.c init_kdeth_qp), TID pair 2 programmed as kern_program_rcv_group does (8 KiB even, 4 KiB odd), flow
/// 3 as kern_set_hw_flow(0x12345) writes it; every other QPN still maps to context 1.
fn tid_context(h: &Hfi) {
    h.mem.map(KHDRQ, 64 * 128);
    h.mem.map(TID_EVEN, 8192);
    h.mem.map(TID_ODD, 4096);
    let k = |reg| kctxt_csr(reg, KCTXT);
    h.w(k(RCV_HDR_CNT), 64 >> 5);
    h.w(k(RCV_HDR_ENT_SIZE), 4);
    h.w(k(RCV_HDR_SIZE), 9);
    h.w(k(RCV_HDR_ADDR), KHDRQ);
    h.w(k(RCV_TID_CTRL), (128 << 32) | (2048 >> 3));
    h.w(RCV_ARRAY + 8 * (2048 + 4), (1 << 63) | (2 << 36) | (TID_EVEN >> 12));
    h.w(RCV_ARRAY + 8 * (2048 + 5), (1 << 63) | (1 << 36) | (TID_ODD >> 12));
    h.w(tid_flow_csr(KCTXT, KFLOW), (KGEN << 11) | (0x6F << 32));
    let ctrl = RCV_CTXT_CTRL_ENABLE_SMASK | RCV_CTXT_CTRL_INTR_AVAIL_SMASK | RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK;
    h.w(k(RCV_CTXT_CTRL), ctrl);
    h.w(RCV_BTH_QP, 0x80 << 16);
    h.route_irq(RCVAVAIL_SOURCE + KCTXT, 5);
}

/// A READ_RESP data packet as hfi1_build_tid_rdma_read_resp builds it: BTH QP = the flow's tid_qpn
/// (0x80 << 16 | flow << 11 | ctxt), PSN generation << 11 | seq; KDETH0 with KVER 1, SH = !last, TIDCTRL,
/// TID, OM 64, OFFSET; `payload` behind the 36-byte TID RDMA header.
fn read_resp(seq: u64, tidctrl: u32, offset_64: u32, last: bool, payload: &[u8]) -> Vec<u8> {
    let mut h = vec![0u8; 56];
    h[1] = 0x2;
    h[2..4].copy_from_slice(&2u16.to_be_bytes());
    h[4..6].copy_from_slice(&(((56 + payload.len() + 4) / 4) as u16).to_be_bytes());
    h[6..8].copy_from_slice(&1u16.to_be_bytes());
    h[8] = 0xE5;
    let qp = (0x80 << 16) | (KFLOW << 11) | KCTXT;
    h[12..16].copy_from_slice(&(qp as u32).to_be_bytes());
    h[16..20].copy_from_slice(&(((KGEN << 11) | seq) as u32).to_be_bytes());
    let kdeth0 = (1u32 << 30) | (u32::from(!last) << 29) | (tidctrl << 26) | (2 << 16) | (1 << 15) | offset_64;
    h[20..24].copy_from_slice(&kdeth0.to_le_bytes());
    h.extend_from_slice(payload);
    h
}

#[test]
fn a_tid_rdma_read_response_segment_lands_in_the_requesters_tids_with_one_header_queue_entry() {
    let (a, b) = pair();
    link_up(&a, &b);
    sdma_engine(&a);
    verbs_context(&b);
    tid_context(&b);
    let data: Vec<u8> = (0..12288u32).map(|i| (i * 31 % 251) as u8).collect();
    // 4 KiB into the even buffer at 0 and 4096, the last 4 KiB into the odd one.
    let packets = [
        read_resp(0, 1, 0, false, &data[..4096]),
        read_resp(1, 1, 64, false, &data[4096..8192]),
        read_resp(2, 2, 0, true, &data[8192..]),
    ];
    for (i, p) in packets.iter().enumerate() {
        let mut first = ((p.len() / 4 + 2) as u64).to_le_bytes().to_vec();
        first.extend_from_slice(p);
        let at = BUFS + 0x4000 * i as u64;
        a.mem.write(at, &first).unwrap();
        let d = (3u64 << 62) | ((first.len() as u64) << 48) | at; // FIRST | LAST
        let q1 = if i == 2 { 1u64 } else { 0 }; // HEAD_TO_HOST on the last
        a.mem.write(RING + 16 * i as u64, &d.to_le_bytes()).unwrap();
        a.mem.write(RING + 16 * i as u64 + 8, &q1.to_le_bytes()).unwrap();
    }
    let sink = crate::trace::Sink::memory();
    b.probe.trace.set_sink(sink.clone());
    b.probe.trace.set_filter(&crate::trace::Filter::parse("*::rhq=info").unwrap());
    a.w(SEND_DMA_TAIL, 3);
    assert!(b.irqs.wait(5), "RcvAvail on context 2 for the last packet");
    // The trace names each placement (two suppressed), then the one entry.
    let lines = sink.take_lines();
    let events: Vec<&str> = lines.iter().filter_map(|l| l.split("] ").nth(1)?.split(' ').nth(1)).collect();
    assert_eq!(events, ["kdeth-expected", "kdeth-expected", "kdeth-expected", "rhq-write"], "{lines:?}");
    assert!(lines[0].contains(&format!("iova={TID_EVEN:#x}")) && lines[0].contains("suppressed=yes"), "{lines:?}");
    assert!(lines[2].contains("suppressed=no"), "{lines:?}");
    assert_eq!(read(&b, TID_EVEN, 8192), data[..8192]);
    assert_eq!(read(&b, TID_ODD, 4096), data[8192..]);
    // Only the last packet (SH clear) has an entry: the first of context 2, RcvSeq 1.
    let rhf = u64::from_le_bytes(read(&b, KHDRQ + 30 * 4, 8).try_into().unwrap());
    assert_eq!((rhf >> 12) & 7, 0, "RHF_RCV_TYPE_EXPECTED");
    assert_eq!(rhf & (0x7FF << 53), 0, "no error flag (rhf_err_flags)");
    assert_eq!((rhf >> 28) & 0xF, 1);
    assert_eq!(rhf & 0xFFF, (56 + 4096 + 4) / 4);
    assert_eq!((rhf >> 44) & 0x1FF, 30 - 14, "LRH, BTH and RCV_HDR_SIZE 9 dwords");
    assert_eq!(read(&b, KHDRQ + (30 - 14) * 4, 56), packets[2][..56]);
    assert_eq!(b.r(uctxt_csr(RCV_HDR_TAIL, KCTXT)), 32, "one entry of 32 dwords");
    // read_r_next_psn: generation and the next sequence.
    assert_eq!(b.r(tid_flow_csr(KCTXT, KFLOW)) & 0x7FFF_FFFF, (KGEN << 11) | 3);
    // Nothing reached the verbs context.
    assert_eq!(b.r(uctxt_csr(RCV_HDR_TAIL, 1)), 0);
    // The counters the guest's TID RDMA steps read: the pair and the flow tid_context programmed, and
    // every byte of the segment placed as READ response data.
    assert_eq!(b.counter("rcv_array_expected_programmed"), 2);
    assert_eq!(b.counter("flows_programmed"), 1);
    assert_eq!(b.counter("wire_rx_kdeth_read_resp_bytes"), 12288);
    assert_eq!(b.counter("wire_rx_kdeth_write_data_bytes"), 0);
}

/// The control requests a session file holds.
fn recorded_requests(path: &std::path::Path) -> Vec<serde_json::Value> {
    use vfio_user_proto::record::{Record, RecordingReader};
    let (_, records, _) = RecordingReader::new(std::fs::File::open(path).unwrap()).unwrap().records().unwrap();
    records
        .into_iter()
        .filter_map(|r| match r {
            Record::ControlRequest { text, .. } => Some(serde_json::from_str(&text).unwrap()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_packet_from_the_cable_is_recorded_as_the_wire_request_that_replays_it() {
    let (a, b) = pair();
    link_up(&a, &b);
    send_context(&a);
    control_context(&b);
    let dir = std::env::temp_dir().join(format!("dm-fabric-record-{}", std::process::id()));
    let rec = vfio_user_proto::record::Recorder::idle("hfi1-wfr1", serde_json::json!({}));
    assert!(b.probe.set_recorder(rec.clone()));
    rec.set_dir(Some(&dir)).unwrap();
    let path = rec.begin().unwrap().expect("a session").path().to_path_buf();
    let packet = smp();
    pio_copy(&a, &packet);
    assert!(b.irqs.wait(1), "RcvAvail on the peer");
    rec.end();
    let wires: Vec<_> = recorded_requests(&path).into_iter().filter(|r| r["cmd"] == "wire").collect();
    assert_eq!(wires.len(), 1, "{wires:?}");
    let hex: String = packet.iter().map(|b| format!("{b:02x}")).collect();
    let got = wires[0]["packet_hex"].as_str().unwrap();
    assert!(got.starts_with(&hex), "the packet as sent (then its ICRC): {got}");
    assert_eq!(wires[0]["device"], b.probe.device());
    let _ = std::fs::remove_dir_all(&dir);
}

/// IS_RCVURGENT_START (chip.h).
const RCVURGENT_SOURCE: u64 = 416;

/// A header-only KDETH packet for context 2 with KDETH.INTR (exp_rcv.h KDETH_INTR_SHIFT 28) set or clear, as
/// PSM2 marks the packets its receive thread must wake for, given to SDMA engine 0 at ring index 0.
fn kdeth_by_sdma(a: &Hfi, intr: bool) {
    let mut p = vec![0u8; 56];
    p[1] = 0x2;
    p[2..4].copy_from_slice(&2u16.to_be_bytes());
    p[4..6].copy_from_slice(&(((56 + 4) / 4) as u16).to_be_bytes());
    p[6..8].copy_from_slice(&1u16.to_be_bytes());
    p[8] = 0xC0;
    let qp = (0x80u32 << 16) | KCTXT as u32;
    p[12..16].copy_from_slice(&qp.to_be_bytes());
    let kdeth0 = (1u32 << 30) | (u32::from(intr) << 28);
    p[20..24].copy_from_slice(&kdeth0.to_le_bytes());
    let mut first = ((p.len() / 4 + 2) as u64).to_le_bytes().to_vec();
    first.extend_from_slice(&p);
    a.mem.write(BUFS, &first).unwrap();
    let d = (3u64 << 62) | ((first.len() as u64) << 48) | BUFS; // FIRST | LAST
    a.mem.write(RING, &d.to_le_bytes()).unwrap();
    a.mem.write(RING + 8, &1u64.to_le_bytes()).unwrap(); // HEAD_TO_HOST
}

/// RcvUrgent: a KDETH.INTR packet sets its context's source 416 + context in CCE_INT_STATUS and interrupts
/// where the driver unmasked it (hfi1_rcvctrl URGENT_ENB for user contexts: set_intr_bits, chip.c:12133-12138;
/// is_rcv_urgent_int wakes the waiting process, chip.c:8199, intr.c:202). A packet without INTR raises none.
#[test]
fn a_kdeth_packet_marked_intr_raises_its_contexts_urgent_interrupt_where_unmasked() {
    // (KDETH.INTR, urgent source unmasked, urgent vector 6 sent)
    let table = [(true, true, true), (false, true, false), (true, false, false)];
    for (intr, unmasked, sent) in table {
        let (a, b) = pair();
        link_up(&a, &b);
        sdma_engine(&a);
        verbs_context(&b);
        tid_context(&b);
        if unmasked {
            b.route_irq(RCVURGENT_SOURCE + KCTXT, 6);
        }
        kdeth_by_sdma(&a, intr);
        a.w(SEND_DMA_TAIL, 1);
        assert!(b.irqs.wait(5), "RcvAvail on context 2: the entry is written");
        // The urgent vector goes out before RcvAvail's, so it is there by now if it was sent.
        assert_eq!(b.irqs.got.lock().unwrap().contains(&6), sent, "intr {intr} unmasked {unmasked}");
        let status = b.r(CCE_INT_STATUS + 8 * ((RCVURGENT_SOURCE + KCTXT) / 64));
        assert_eq!(status >> ((RCVURGENT_SOURCE + KCTXT) % 64) & 1, u64::from(intr), "pending whatever the mask");
        assert_eq!(b.counter("wire_rx_kdeth_urgent"), u64::from(intr));
    }
}

#[path = "hostile_tests.rs"]
mod hostile;
