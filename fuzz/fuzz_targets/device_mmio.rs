//! Device MMIO and DMA, in process, against all three engines at once.
//!
//! The input is a sequence of register reads and writes and of stores into the DMA memory the engines
//! see: RcvArray and flow programming, loopback descriptors and injected packets for hfi1; the whole
//! register file of the hfi1 chip personality (every CSR the kernel names, the per-context and per-engine
//! families, raw offsets over its 64 MiB BAR0) with RcvArray, flows and injected packets; host
//! contexts, CQP WQEs, shadow areas and loopback segments for irdma; for the chip personality also the PIO
//! send buffers, send and receive contexts, SDMA engines and their descriptor rings, packets from the cable
//! and its link news, and KDETH packets with hostile flows, generations, PSNs, TIDs and offsets. Oracles: no panic, no hang (every
//! wait is bounded and a missed deadline is a crash; an operation that never returns, such as an engine's walk
//! that never ends, fails at libFuzzer's `-timeout`, which ci/fuzz.sh sets to 5 s, after the watchdog below
//! has named the operation), register invariants, and no device write outside what the programming allows at
//! the moment of the write (`hfi1_oracle`: for a packet from the cable only the queues, eager buffers and
//! named TIDs of the context its header routes it to; SDMA head and credit-return slots; programmed TIDs for
//! loopback; CCQ rings named by a fetched CREATE_CQ for irdma), checked at each write and again by comparing
//! memory with the harness's copy at the end.
#![no_main]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

use device_model::engine::{Engine, Interrupt};
use device_model::hfi1::wfr::{self, csr as wcsr};
use device_model::hfi1::{self, regs as hregs, Hfi1, Hfi1Config, Packet, WorkerMode};
use device_model::irdma::{self, regs as iregs, Irdma, IrdmaConfig};
use emu_abi::hfi1::LbDescHeader;
use rdma_emu_fuzz::dma_oracle::GuardedMemory;
use rdma_emu_fuzz::hfi1_oracle::{Hfi1Oracle, Pending, Shape};
use rdma_emu_fuzz::mmio_input::{build_wqe, irdma_read_hook, Addr, Width, WqeCmd, IDLE_DEADLINE, MAX_OPS, WIN};

#[derive(Arbitrary, Debug)]
enum HfiReg {
    Global(u8),
    Ctxt { ctxt: u8, reg: u8 },
    Uctxt { ctxt: u8, reg: u8 },
    RcvArray(u16),
    Flow { ctxt: u8, flow: u8 },
    Loopback(u8),
    Raw(u32),
}

#[derive(Arbitrary, Debug)]
struct HfiPacket {
    kdeth0: u32,
    dest_qp: u32,
    psn: u32,
}

#[derive(Arbitrary, Debug)]
enum HfiOp {
    Write {
        reg: HfiReg,
        width: Width,
        value: u64,
    },
    Read {
        reg: HfiReg,
        width: Width,
    },
    /// RcvArray entry with WRITE_ENABLE: a buffer the device may then fill.
    Program {
        index: u16,
        buf: Addr,
        code: u8,
    },
    Context {
        ctxt: u8,
        ctrl: u8,
        tid_base: u16,
        tid_pairs: u16,
    },
    Flow {
        ctxt: u8,
        flow: u8,
        generation: u32,
        sequence: u16,
        ctrl: u8,
    },
    Descriptor {
        at: Addr,
        packet: HfiPacket,
        payload: Vec<u8>,
        len_delta: i16,
        next: Option<Addr>,
    },
    Doorbell {
        desc: Addr,
    },
    Inject {
        packet: HfiPacket,
        payload: Vec<u8>,
    },
}

#[derive(Arbitrary, Debug)]
enum IrdmaReg {
    Named(u8),
    CeqCtl(u8),
    Loopback(u8),
    DoorbellPage(u16),
    Raw(u32),
}

#[derive(Arbitrary, Debug)]
enum IrdmaOp {
    Write {
        reg: IrdmaReg,
        width: Width,
        value: u32,
    },
    Read {
        reg: IrdmaReg,
        width: Width,
    },
    /// Host context at `at`, then CCQPHIGH/CCQPLOW (the create trigger).
    HostContext {
        at: Addr,
        sq: Addr,
        sq_size_code: u8,
        protocol: u8,
        hmc_profile: u8,
        maj: u16,
        qw3: u64,
    },
    Destroy,
    Wqe {
        slot: u16,
        cmd: WqeCmd,
        valid: bool,
    },
    Doorbell {
        head: u16,
    },
    Shadow {
        at: Addr,
        consumer: u32,
        arm: bool,
        seq: u8,
    },
    Arm,
    Segment {
        at: Addr,
        qw0: u64,
        src: [u32; 4],
        dst: [u32; 4],
    },
}

/// A register of the chip personality.
#[derive(Arbitrary, Debug)]
enum WfrReg {
    /// A register the kernel names (outside the RXE), by index in its list.
    Named(u16),
    /// A member of a per-send-context (0) or per-SDMA-engine (1) block.
    Family { engine: bool, index: u8, member: u8 },
    /// An RXE register of the RXE model.
    Rxe(HfiReg),
    /// Anywhere in BAR0.
    Raw(u32),
}

#[derive(Arbitrary, Debug)]
enum WfrOp {
    /// The driver only writes whole registers; other widths are counted and dropped.
    Write {
        reg: WfrReg,
        value: u64,
        width: Width,
    },
    Read {
        reg: WfrReg,
        width: Width,
    },
    /// RCV_ARRAY, context, flow and injected packets as for the project's function.
    Rxe(HfiOp),
    Reset,
    Control(u8),
    /// One qword into the PIO send buffers: context window, block, qword, through the SOP alias or not.
    Pio {
        ctxt: u8,
        block: u8,
        qw: u8,
        sop: bool,
        value: u64,
    },
    /// A whole packet as pio_copy writes it: PBC (with this length in dwords and flags), then the bytes.
    PioPacket {
        ctxt: u8,
        start: u8,
        pbc_flags: u32,
        len_delta: i8,
        body: Vec<u8>,
    },
    /// sc_alloc + sc_enable of a send context: depth, credit-return address, CREDIT_INTR.
    SendContext {
        ctxt: u8,
        depth: u16,
        credit: Addr,
        intr: bool,
    },
    /// hfi1_rcvctrl of a receive context: header queue, entry size code, tail address, control bits.
    RecvContext {
        ctxt: u8,
        hdrq: Addr,
        cnt: u8,
        entsize: u8,
        tail: Addr,
        egr_cnt: u8,
        ctrl: u16,
    },
    /// RCV_CTRL (port enable, QP map) and RCV_VL15.
    Port {
        rcv_ctrl: u8,
        vl15: u8,
    },
    /// A packet from the cable (the control socket's `wire`).
    Wire {
        bytes: Vec<u8>,
        sc4: bool,
        ebp: bool,
        lrh: Option<[u8; 8]>,
    },
    /// A KDETH packet from the cable, as a TID RDMA peer sends one to receive context `ctxt` (one beyond the
    /// last too): flow, PSN, TID, TIDCTRL, offset, SH, version and length are the input's. `psn: None` takes
    /// the flow's next PSN as read_r_next_psn reads it, so in-sequence packets happen; `hdr_size` rewrites
    /// the context's RCV_HDR_SIZE first.
    Kdeth {
        ctxt: u8,
        flow: u8,
        psn: Option<u32>,
        opcode: u8,
        tid: u16,
        tidctrl: u8,
        offset: u16,
        om: bool,
        sh: bool,
        kver: Option<u8>,
        len: u16,
        pad: u8,
        hdr_size: Option<u8>,
    },
    /// The cable's link news (`link-event`).
    Link {
        up: bool,
    },
    /// init_sdma_regs of engine `engine` (ring of 64 << `len_code` descriptors at `ring`), then running.
    SdmaEngine {
        engine: bool,
        ring: Addr,
        len_code: u8,
        head_addr: Addr,
        ctrl: u8,
    },
    /// A packet's descriptors written into the engine's ring `slot` descriptors past its tail (0: at the tail,
    /// as sdma.c submit_tx writes), FIRST and LAST, AHG modes, and the generation of each slot's lap plus `gen`
    /// (0: the right one, add_gen); then SEND_DMA_TAIL moved past them, or to `tail`. Counted from the tail, so
    /// that a copied operation sends the next packet. `repeat % 64` more times the same, each at the new tail:
    /// a run of packets walks the head round the ring.
    SdmaPacket {
        engine: bool,
        slot: u16,
        descs: Vec<(Addr, u16, u8)>,
        gen: u8,
        pbc: Option<u16>,
        tail: Option<u16>,
        repeat: u8,
    },
}

#[derive(Arbitrary, Debug)]
enum Op {
    Hfi1(HfiOp),
    Irdma(IrdmaOp),
    Poke { irdma: bool, at: Addr, bytes: Vec<u8> },
    Wait,
    Reset { irdma: bool },
    Reattach { irdma: bool },
    Control { irdma: bool, which: u8 },
    Wfr(WfrOp),
}

impl Op {
    /// The operation's name, for the hang watchdog.
    fn name(&self) -> &'static str {
        match self {
            Op::Hfi1(o) => o.name(),
            Op::Irdma(o) => o.name(),
            Op::Poke { .. } => "poke",
            Op::Wait => "wait",
            Op::Reset { .. } => "reset",
            Op::Reattach { .. } => "reattach",
            Op::Control { .. } => "control",
            Op::Wfr(o) => o.name(),
        }
    }
}

impl HfiOp {
    fn name(&self) -> &'static str {
        match self {
            HfiOp::Write { .. } => "hfi1-write",
            HfiOp::Read { .. } => "hfi1-read",
            HfiOp::Program { .. } => "hfi1-program",
            HfiOp::Context { .. } => "hfi1-context",
            HfiOp::Flow { .. } => "hfi1-flow",
            HfiOp::Descriptor { .. } => "hfi1-descriptor",
            HfiOp::Doorbell { .. } => "hfi1-doorbell",
            HfiOp::Inject { .. } => "hfi1-inject",
        }
    }
}

impl IrdmaOp {
    fn name(&self) -> &'static str {
        match self {
            IrdmaOp::Write { .. } => "irdma-write",
            IrdmaOp::Read { .. } => "irdma-read",
            IrdmaOp::HostContext { .. } => "irdma-host-context",
            IrdmaOp::Destroy => "irdma-destroy",
            IrdmaOp::Wqe { .. } => "irdma-wqe",
            IrdmaOp::Doorbell { .. } => "irdma-doorbell",
            IrdmaOp::Shadow { .. } => "irdma-shadow",
            IrdmaOp::Arm => "irdma-arm",
            IrdmaOp::Segment { .. } => "irdma-segment",
        }
    }
}

impl WfrOp {
    fn name(&self) -> &'static str {
        match self {
            WfrOp::Write { .. } => "wfr-write",
            WfrOp::Read { .. } => "wfr-read",
            WfrOp::Rxe(_) => "wfr-rxe",
            WfrOp::Reset => "wfr-reset",
            WfrOp::Control(_) => "wfr-control",
            WfrOp::Pio { .. } => "wfr-pio",
            WfrOp::PioPacket { .. } => "wfr-pio-packet",
            WfrOp::SendContext { .. } => "wfr-send-context",
            WfrOp::RecvContext { .. } => "wfr-recv-context",
            WfrOp::Port { .. } => "wfr-port",
            WfrOp::Wire { .. } => "wfr-wire",
            WfrOp::Kdeth { .. } => "wfr-kdeth",
            WfrOp::Link { .. } => "wfr-link",
            WfrOp::SdmaEngine { .. } => "wfr-sdma-engine",
            WfrOp::SdmaPacket { .. } => "wfr-sdma-packet",
        }
    }
}

/// The hang detector's witness. The engines' jobs run inline, so a job that never ends (an SDMA walk that finds
/// nothing to do and walks again) keeps the fuzzing thread inside the operation that queued it; libFuzzer's
/// `-timeout` then fails the input and writes it out as `timeout-<sha1>`. Before that, this watchdog prints
/// which operation of the input has not returned (`fuzz-hang: op-<index>-<name>`, which ci/fuzz.sh names the
/// regression input after). It only prints: whether it is a hang is libFuzzer's call, at its timeout.
mod watchdog {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    /// Far above any operation's run time (microseconds to milliseconds), below ci/fuzz.sh's 5 s timeout.
    const NOTE_AFTER: Duration = Duration::from_secs(2);
    const LOOK_EVERY: Duration = Duration::from_millis(250);

    /// What runs now: (input counter, operation index or none for the harness's own steps, name); no name
    /// between inputs.
    pub static NOW: Mutex<(u64, Option<usize>, &'static str)> = Mutex::new((0, None, ""));

    pub fn enter(index: Option<usize>, name: &'static str) {
        let mut now = NOW.lock().unwrap_or_else(|p| p.into_inner());
        *now = (now.0, index, name);
    }

    /// Between inputs: nothing to watch until the next `enter`.
    pub fn leave() {
        let mut now = NOW.lock().unwrap_or_else(|p| p.into_inner());
        *now = (now.0 + 1, None, "");
    }

    pub fn spawn() {
        let watch = || {
            let mut seen = (u64::MAX, None, "");
            let mut since = Instant::now();
            let mut told = false;
            loop {
                std::thread::sleep(LOOK_EVERY);
                let now = *NOW.lock().unwrap_or_else(|p| p.into_inner());
                if now != seen {
                    (seen, since, told) = (now, Instant::now(), false);
                } else if !told && !now.2.is_empty() && since.elapsed() >= NOTE_AFTER {
                    let op = now.1.map_or(String::new(), |i| format!("op-{i}-"));
                    eprintln!("fuzz-hang: {op}{} has not returned after {NOTE_AFTER:?}", now.2);
                    told = true;
                }
            }
        };
        // Without the watchdog a hang is still a timeout, just not named.
        let _ = std::thread::Builder::new().name("hang-watchdog".into()).spawn(watch);
    }
}

#[derive(Default)]
struct Irqs(AtomicU64);
impl Interrupt for Irqs {
    fn raise(&self, _vector: u16) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// The engines run their jobs inline, on the fuzzing thread inside the access that queued them: no hand-off
/// to a worker thread (a futex wake-up and a wait per doorbell), and a run is deterministic.
fn hfi_config() -> Hfi1Config {
    Hfi1Config {
        rcv_contexts: 4,
        rcv_array_count: 512,
        doorbell_queue: 8,
        worker: WorkerMode::Inline,
        ..Default::default()
    }
}

/// The chip that loads 8051 firmware: its security engine, code RAM, LCB relays and idle messages are inputs too.
fn wfr_config() -> Hfi1Config {
    let shape =
        wfr::WfrShape { send_contexts: 8, sdma_engines: 2, icode: wfr::Icode::RtlSimulation, ..Default::default() };
    Hfi1Config { personality: hfi1::Personality::Wfr(shape), ..hfi_config() }
}

/// The engines and their memories live across inputs (starting workers, allocating and faulting in fresh
/// memory per input would dominate the run time, as a snapshot fuzzer's restore would not): each input starts
/// with a detach, which resets the engines to power-on, a reset of the memories (every byte written zeroed,
/// no allowance) and an attach.
struct Engines {
    hfi: Hfi1,
    wfr: Hfi1,
    ird: Irdma,
    hmem: Arc<GuardedMemory>,
    wmem: Arc<GuardedMemory>,
    imem: Arc<GuardedMemory>,
    hor: Arc<Hfi1Oracle>,
    wor: Arc<Hfi1Oracle>,
}

static ENGINES: std::sync::OnceLock<Option<Engines>> = std::sync::OnceLock::new();

struct Rig {
    hfi: &'static Hfi1,
    hmem: Arc<GuardedMemory>,
    /// What the project function may write: the RcvArray it was given, the packet injected.
    hor: Arc<Hfi1Oracle>,
    /// The chip personality, with its own memory and oracle.
    wfr: &'static Hfi1,
    wmem: Arc<GuardedMemory>,
    wor: Arc<Hfi1Oracle>,
    ird: &'static Irdma,
    imem: Arc<GuardedMemory>,
    irq: Arc<Irqs>,
    /// SQ base and size of the last host context written (for WQE slots).
    sq: (u64, u64),
    /// Where the harness keeps the CCQ shadow area (for the arm).
    doorbells: u64,
    /// Whether an operation since the last check may have changed the project function's flow table or
    /// the chip personality's registers: the invariant scans (over a hundred reads) run only then, as
    /// state no operation reached is the power-on state the previous check already saw.
    hfi_touched: bool,
    wfr_touched: bool,
    /// Which engines (project hfi1, chip personality, irdma) answered a dump, counters or access-log request
    /// in this input. One per engine and input: serialising a dump cost a third of the run time when inputs
    /// asked for several, and a second dump of the same input adds little the first did not reach.
    observed: [bool; 3],
    /// Descriptors handed to each SDMA engine of the chip personality since its ring was programmed
    /// (sdma.c's descq_tail): the laps, hence the generations, of the slots it writes next.
    sdma_tail: [u64; 2],
}

impl Rig {
    fn new() -> Option<Rig> {
        let engines = ENGINES.get_or_init(|| {
            rdma_emu_fuzz::timing::precise_sleeps();
            watchdog::spawn();
            let hfi = Hfi1::new(hfi_config()).ok()?;
            let wfr = Hfi1::new(wfr_config()).ok()?;
            let ird = Irdma::new(IrdmaConfig {
                qhash_capacity: 16,
                msix_vectors: 4,
                // Inline, nothing can consume a CQE while the worker waits: one look, then the error.
                ccq_full_wait: Duration::ZERO,
                max_ccq_size: 4096,
                worker: WorkerMode::Inline,
            });
            let shape = |wfr| Shape {
                wfr,
                rcv_contexts: hfi_config().rcv_contexts as u64,
                send_contexts: if wfr { 8 } else { 0 },
                sdma_engines: if wfr { 2 } else { 0 },
            };
            let (hor, wor) = (Arc::new(Hfi1Oracle::new(shape(false))), Arc::new(Hfi1Oracle::new(shape(true))));
            let hmem = Arc::new(GuardedMemory::with_policy(&WIN, hor.clone()));
            let wmem = Arc::new(GuardedMemory::with_policy(&WIN, wor.clone()));
            let imem = Arc::new(GuardedMemory::new(&WIN, Some(irdma_read_hook())));
            Some(Engines { hfi, wfr, ird, hmem, wmem, imem, hor, wor })
        });
        let Engines { hfi, wfr, ird, hmem, wmem, imem, hor, wor } = engines.as_ref()?;
        // The oracles read the registers of the functions at each write (the engines live for the process).
        hor.connect(move |off| read64(hfi, off));
        wor.connect(move |off| read64(wfr, off));
        hfi.detach();
        wfr.detach();
        ird.detach();
        for m in [hmem, wmem, imem] {
            m.reset();
        }
        let (hmem, wmem, imem, hor, wor) = (hmem.clone(), wmem.clone(), imem.clone(), hor.clone(), wor.clone());
        let irq = Arc::new(Irqs::default());
        hfi.attach(hmem.clone(), irq.clone());
        wfr.attach(wmem.clone(), irq.clone());
        ird.attach(imem.clone(), irq.clone());
        Some(Rig {
            hfi,
            hmem,
            hor,
            wfr,
            wmem,
            wor,
            ird,
            imem,
            irq,
            sq: (WIN[0].0, 4),
            doorbells: 0,
            hfi_touched: false,
            wfr_touched: false,
            observed: [false; 3],
            sdma_tail: [0; 2],
        })
    }

    fn hfi_offset(reg: &HfiReg) -> u64 {
        let ctxts = hfi_config().rcv_contexts as u64 + 1;
        match *reg {
            HfiReg::Global(i) => [
                hregs::RCV_CTRL,
                hregs::RCV_STATUS,
                hregs::RCV_CONTEXTS,
                hregs::RCV_ARRAY_CNT,
                hregs::RCV_BTH_QP,
                hregs::RCV_VL15,
            ][usize::from(i) % 6],
            HfiReg::Ctxt { ctxt, reg } => {
                hregs::RXE_KCTXT_BASE + (u64::from(ctxt) % ctxts) * hregs::KCTXT_STRIDE + u64::from(reg % 12) * 8
            }
            HfiReg::Uctxt { ctxt, reg } => {
                let r = [hregs::RCV_HDR_TAIL, hregs::RCV_HDR_HEAD, hregs::RCV_EGR_INDEX_HEAD][usize::from(reg) % 3];
                r + (u64::from(ctxt) % ctxts) * hregs::UCTXT_STRIDE
            }
            HfiReg::RcvArray(i) => hregs::RCV_ARRAY + u64::from(i % 1024) * hregs::RCV_ARRAY_ENTRY_SIZE,
            HfiReg::Flow { ctxt, flow } => {
                hregs::RCV_TID_FLOW_TABLE + (u64::from(ctxt) % ctxts) * hregs::UCTXT_STRIDE + u64::from(flow % 33) * 8
            }
            HfiReg::Loopback(i) => hfi1::LB_BASE + u64::from(i % 9) * 8,
            HfiReg::Raw(o) => u64::from(o),
        }
    }

    /// The engine contract: the PCI layer has already checked the range against the BAR.
    fn in_bar(offset: u64, width: usize, size: u64) -> u64 {
        (offset % size).min(size - width as u64)
    }

    /// Records what a 64-bit RcvArray store programs, for the oracle.
    fn note_hfi_write(oracle: &Hfi1Oracle, offset: u64, data: &[u8]) {
        let Ok(b) = <[u8; 8]>::try_from(data) else { return };
        let value = u64::from_le_bytes(b);
        let count = hfi_config().rcv_array_count as u64;
        if offset < hregs::RCV_ARRAY || offset >= hregs::RCV_ARRAY + count * 8 || !offset.is_multiple_of(8) {
            return;
        }
        let code = (value >> hregs::RCV_ARRAY_RT_BUF_SIZE_SHIFT) & hregs::RCV_ARRAY_RT_BUF_SIZE_MASK;
        if value & hregs::RCV_ARRAY_RT_WRITE_ENABLE_SMASK == 0 {
            return;
        }
        // What the entry names from now on: a buffer, or nothing (size 0 or a reserved code invalidates it).
        let index = (offset - hregs::RCV_ARRAY) / 8;
        if (1..=0xA).contains(&code) {
            let addr = (value & hregs::RCV_ARRAY_RT_ADDR_MASK) << hregs::RT_ADDR_SHIFT;
            oracle.program(index, Some((addr, 4096u64 << (code - 1))));
        } else {
            oracle.program(index, None);
        }
    }

    fn hfi_write(&self, offset: u64, data: &[u8]) {
        let offset = Self::in_bar(offset, data.len(), hfi1::HFI1_BAR0_SIZE);
        Self::note_hfi_write(&self.hor, offset, data);
        self.hfi.mmio_write(hfi1::HFI1_BAR, offset, data);
    }

    fn wfr_write(&self, offset: u64, data: &[u8]) {
        let offset = Self::in_bar(offset, data.len(), wfr::WFR_BAR0_SIZE);
        Self::note_hfi_write(&self.wor, offset, data);
        self.wfr.mmio_write(hfi1::HFI1_BAR, offset, data);
    }

    /// A packet to the chip personality's port through the control socket's `wire`, announced to the oracle:
    /// its writes may go where its header routes it.
    fn wire(&self, bytes: Vec<u8>, sc4: bool, ebp: bool) {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        self.wor.arrive(Pending::Wire { bytes, sc4 });
        let reply =
            self.wfr.control(&serde_json::json!({"cmd": "wire", "packet_hex": hex, "sc4": sc4, "test_ebp": ebp}));
        if reply.ok().and_then(|r| r["queued"].as_bool()) != Some(true) {
            self.wor.withdraw();
        }
    }

    fn wfr_write64(&self, offset: u64, value: u64) {
        self.wfr_write(offset, &value.to_le_bytes());
    }

    fn wfr_read64(&self, offset: u64) -> u64 {
        let mut b = [0u8; 8];
        self.wfr.mmio_read(hfi1::HFI1_BAR, offset, &mut b);
        u64::from_le_bytes(b)
    }

    fn wfr_offset(reg: &WfrReg) -> u64 {
        match reg {
            WfrReg::Named(i) => wcsr::NAMES[usize::from(*i) % wcsr::NAMES.len()].0,
            WfrReg::Family { engine, index, member } => {
                let (base, count) = if *engine {
                    (wcsr::SEND_DMA_CTRL, wfr::TXE_NUM_SDMA_ENGINES)
                } else {
                    (wcsr::SEND_CTXT_CTRL, wfr::TXE_NUM_CONTEXTS)
                };
                base + 0x100 * (u64::from(*index) % u64::from(count)) + 8 * u64::from(member % 32)
            }
            WfrReg::Rxe(r) => Self::hfi_offset(r),
            WfrReg::Raw(o) => u64::from(*o),
        }
    }

    fn wfr_op(&mut self, op: WfrOp) {
        self.wfr_touched = true;
        match op {
            WfrOp::Write { reg, value, width } => {
                let w = width.bytes();
                self.wfr_write(Self::wfr_offset(&reg) & !7, &value.to_le_bytes()[..w]);
            }
            WfrOp::Read { reg, width } => {
                let mut b = vec![0u8; width.bytes()];
                let off = Self::in_bar(Self::wfr_offset(&reg), b.len(), wfr::WFR_BAR0_SIZE);
                self.wfr.mmio_read(hfi1::HFI1_BAR, off, &mut b);
            }
            WfrOp::Rxe(op) => {
                // The project function's operations, aimed at the chip personality's RXE.
                std::mem::swap(&mut self.hfi, &mut self.wfr);
                std::mem::swap(&mut self.hmem, &mut self.wmem);
                std::mem::swap(&mut self.hor, &mut self.wor);
                self.hfi_op(op);
                std::mem::swap(&mut self.hfi, &mut self.wfr);
                std::mem::swap(&mut self.hmem, &mut self.wmem);
                std::mem::swap(&mut self.hor, &mut self.wor);
            }
            WfrOp::Pio { ctxt, block, qw, sop, value } => {
                let at = (u64::from(ctxt % 8) << wfr::pio::PIO_ADDR_CONTEXT_SHIFT)
                    | (u64::from(block) * wfr::pio::PIO_BLOCK_SIZE)
                    | (u64::from(qw % 8) * 8);
                let sop = if sop { wfr::pio::SOP_DISTANCE } else { 0 };
                self.wfr_write64(wfr::TXE_PIO_SEND + sop + at, value);
            }
            WfrOp::PioPacket { ctxt, start, pbc_flags, len_delta, body } => {
                let body = &body[..body.len().min(2048)];
                let dws = ((body.len().div_ceil(4) + 2) as i64 + i64::from(len_delta)).clamp(0, 0xFFF) as u64;
                let pbc = ((u64::from(pbc_flags) << 12) & 0xFFFF_F000) | dws;
                let mut bytes = pbc.to_le_bytes().to_vec();
                bytes.extend_from_slice(body);
                bytes.resize(bytes.len().div_ceil(64) * 64, 0);
                let base = wfr::TXE_PIO_SEND + (u64::from(ctxt % 8) << wfr::pio::PIO_ADDR_CONTEXT_SHIFT);
                for (q, chunk) in bytes.chunks(8).enumerate() {
                    let block = (u64::from(start) + q as u64 / 8) % 1024;
                    let sop = if q < 8 { wfr::pio::SOP_DISTANCE } else { 0 };
                    let at = base + sop + block * wfr::pio::PIO_BLOCK_SIZE + (q as u64 % 8) * 8;
                    self.wfr_write64(at, u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8])));
                }
            }
            WfrOp::SendContext { ctxt, depth, credit, intr } => {
                let k = |reg| reg + 0x100 * u64::from(ctxt % 8);
                let depth = u64::from(depth % 0x800) << wfr::pio::SEND_CTXT_CTRL_CTXT_DEPTH_SHIFT;
                self.wfr_write64(k(wcsr::SEND_CTXT_CTRL), depth);
                self.wfr_write64(k(wcsr::SEND_CTXT_CREDIT_RETURN_ADDR), credit.iova());
                let intr = if intr { wfr::pio::SEND_CTXT_CREDIT_CTRL_CREDIT_INTR_SMASK } else { 0 };
                self.wfr_write64(k(wcsr::SEND_CTXT_CREDIT_CTRL), intr);
                let init = wfr::pio::SEND_PIO_INIT_CTXT_PIO_SINGLE_CTXT_INIT_SMASK | (u64::from(ctxt % 8) << 8);
                self.wfr_write64(wcsr::SEND_PIO_INIT_CTXT, init);
                self.wfr_write64(k(wcsr::SEND_CTXT_CTRL), depth | wfr::pio::SEND_CTXT_CTRL_CTXT_ENABLE_SMASK);
            }
            WfrOp::RecvContext { ctxt, hdrq, cnt, entsize, tail, egr_cnt, ctrl } => {
                let c = u64::from(ctxt) % wfr_config().rcv_contexts as u64;
                let k = |reg| hregs::kctxt_csr(reg, c);
                self.wfr_write64(k(hregs::RCV_HDR_ADDR), hdrq.iova());
                self.wfr_write64(k(hregs::RCV_HDR_CNT), u64::from(cnt % 4));
                self.wfr_write64(k(hregs::RCV_HDR_ENT_SIZE), u64::from(entsize % 8));
                self.wfr_write64(k(hregs::RCV_HDR_TAIL_ADDR), tail.iova());
                self.wfr_write64(k(hregs::RCV_EGR_CTRL), u64::from(egr_cnt % 4) << 32);
                self.wfr_write64(k(hregs::RCV_CTXT_CTRL), u64::from(ctrl));
            }
            WfrOp::Port { rcv_ctrl, vl15 } => {
                self.wfr_write64(hregs::RCV_CTRL, u64::from(rcv_ctrl));
                self.wfr_write64(hregs::RCV_VL15, u64::from(vl15) % wfr_config().rcv_contexts as u64);
            }
            WfrOp::Wire { bytes, sc4, ebp, lrh } => {
                let mut bytes = bytes;
                bytes.truncate(4096);
                if let Some(l) = lrh {
                    bytes.splice(0..bytes.len().min(8), l);
                }
                bytes.resize(bytes.len().max(24).div_ceil(4) * 4, 0);
                self.wire(bytes, sc4, ebp);
            }
            WfrOp::Kdeth { ctxt, flow, psn, opcode, tid, tidctrl, offset, om, sh, kver, len, pad, hdr_size } => {
                let c = u64::from(ctxt) % (wfr_config().rcv_contexts as u64 + 1);
                if let Some(h) = hdr_size {
                    self.wfr_write64(hregs::kctxt_csr(hregs::RCV_HDR_SIZE, c), u64::from(h % 32));
                }
                // init_kdeth_qp: the KDETH QP prefix 0x80.
                self.wfr_write64(hregs::RCV_BTH_QP, 0x80 << hregs::RCV_BTH_QP_KDETH_QP_SHIFT);
                let flow = u64::from(flow % 32);
                let psn = psn.unwrap_or_else(|| self.wfr_read64(hregs::tid_flow_csr(c, flow)) as u32) & 0x7FFF_FFFF;
                let (tidctrl, pad) = (u32::from(tidctrl % 4), pad % 4);
                let kdeth0 = u32::from(offset & 0x7FFF)
                    | (u32::from(om) << 15)
                    | (u32::from(tid & 0x3FF) << 16)
                    | (tidctrl << 26)
                    | (u32::from(sh) << 29)
                    | (u32::from(kver.unwrap_or(1) & 3) << 30);
                // LRH (VL 0, BTH next, permissive DLID), BTH, the 36-byte TID RDMA header, payload, pad.
                let len = usize::from(len) % (10240 - 56 - 8);
                let mut b = vec![0u8; 56];
                b[1] = 0x2;
                b[2..4].copy_from_slice(&[0xFF, 0xFF]);
                b[4..6].copy_from_slice(&(((56 + len + usize::from(pad) + 4) / 4) as u16).to_be_bytes());
                b[8] = 0xE0 | (opcode & 7);
                b[9] = pad << 4;
                b[10..12].copy_from_slice(&[0xFF, 0xFF]);
                let qp = (0x80u32 << 16) | ((flow as u32) << 11) | c as u32;
                b[12..16].copy_from_slice(&qp.to_be_bytes());
                b[16..20].copy_from_slice(&psn.to_be_bytes());
                b[20..24].copy_from_slice(&kdeth0.to_le_bytes());
                b.extend((0..len + usize::from(pad)).map(|i| i as u8));
                b.resize(b.len().div_ceil(4) * 4 + 4, 0);
                self.wire(b, false, false);
            }
            WfrOp::Link { up } => {
                let req = if up {
                    serde_json::json!({"cmd": "link-event", "event": "up", "neighbor_guid": 2})
                } else {
                    serde_json::json!({"cmd": "link-event", "event": "down", "reason": null})
                };
                let _ = self.wfr.control(&req);
            }
            WfrOp::SdmaEngine { engine, ring, len_code, head_addr, ctrl } => {
                let k = |reg| reg + 0x100 * u64::from(engine);
                let len = (u64::from(len_code % 4) + 1) << 6; // (1..=4) * 64 descriptors: the count is the field
                self.wfr_write64(k(wcsr::SEND_DMA_BASE_ADDR), ring.iova());
                self.wfr_write64(k(wcsr::SEND_DMA_LEN_GEN), len);
                self.wfr_write64(k(wcsr::SEND_DMA_LEN_GEN), len | (4 << 16));
                self.wfr_write64(k(wcsr::SEND_DMA_TAIL), 0);
                self.wfr_write64(k(wcsr::SEND_DMA_HEAD_ADDR), head_addr.iova());
                self.wfr_write64(k(wcsr::SEND_DMA_DESC_CNT), 8);
                self.wfr_write64(k(wcsr::SEND_DMA_CTRL), u64::from(ctrl & 0xF));
                self.sdma_tail[usize::from(engine)] = 0;
            }
            WfrOp::SdmaPacket { engine, slot, descs, gen, pbc, tail, repeat } => {
                let k = |reg| reg + 0x100 * u64::from(engine);
                let base = self.wfr_read64(k(wcsr::SEND_DMA_BASE_ADDR));
                let ring = ((self.wfr_read64(k(wcsr::SEND_DMA_LEN_GEN)) >> 6) & 0x3FF) * 64;
                if ring == 0 {
                    return;
                }
                let n = descs.len().clamp(1, 8);
                // The packet's PBC at its first buffer, when asked: the length its descriptors add up to.
                let total: u64 = descs.iter().take(n).map(|d| u64::from(d.1 % 2048)).sum();
                if let (Some(flags), Some(d)) = (pbc, descs.first()) {
                    let v = ((u64::from(flags) << 12) & 0xFFFF_F000) | ((total / 4) & 0xFFF);
                    self.wmem.host_write(d.0.iova(), &v.to_le_bytes());
                }
                // The same packet again at each new tail: a run of packets in one operation, so that the head
                // can go round the ring (64 descriptors and more) within an input.
                for _ in 0..=repeat % 64 {
                    // Where the harness's count says the tail is, in the lap it counted; a tail moved by a
                    // register write of the input's own wins, in the same lap.
                    let counted = self.sdma_tail[usize::from(engine)];
                    let csr_tail = self.wfr_read64(k(wcsr::SEND_DMA_TAIL)) % ring;
                    let start = counted - counted % ring + csr_tail + u64::from(slot) % ring;
                    for (i, (at, len, mode)) in descs.iter().take(n).enumerate() {
                        let at_desc = start + i as u64;
                        let s = at_desc % ring;
                        let mut qw0 = (u64::from(len % 2048) << 48) | (at.iova() & ((1 << 48) - 1));
                        if i == 0 {
                            qw0 |= 1 << 63;
                        }
                        if i == n - 1 {
                            qw0 |= 1 << 62;
                        }
                        let generation = (at_desc / ring + u64::from(gen)) % 4;
                        let qw1 = (generation << 2) | (u64::from(*mode) << 8) | 1;
                        self.wmem.host_write(base.wrapping_add(16 * s), &qw0.to_le_bytes());
                        self.wmem.host_write(base.wrapping_add(16 * s + 8), &qw1.to_le_bytes());
                    }
                    self.sdma_tail[usize::from(engine)] = start + n as u64;
                    let t = tail.map_or((start + n as u64) % ring, u64::from);
                    self.wfr_write64(k(wcsr::SEND_DMA_TAIL), t);
                }
            }
            WfrOp::Reset => {
                self.wfr.reset();
                self.wor.forget();
            }
            WfrOp::Control(which) => {
                let req = match which % 4 {
                    3 => {
                        self.wor.forget();
                        serde_json::json!({"cmd": "reset"})
                    }
                    _ if std::mem::replace(&mut self.observed[1], true) => return,
                    0 => serde_json::json!({"cmd": "dump"}),
                    1 => serde_json::json!({"cmd": "counters"}),
                    _ => serde_json::json!({"cmd": "accesses"}),
                };
                let _ = self.wfr.control(&req);
            }
        }
    }

    /// What must hold of the chip personality whatever was written: identity and sizes, and nothing the
    /// driver polls without a timeout left pending.
    fn wfr_check(&self) {
        let cfg = wfr_config();
        let hfi1::Personality::Wfr(shape) = cfg.personality else { unreachable!() };
        let fixed = [
            (hregs::RCV_CONTEXTS, cfg.rcv_contexts as u64),
            (hregs::RCV_ARRAY_CNT, cfg.rcv_array_count as u64),
            (wcsr::SEND_CONTEXTS, u64::from(shape.send_contexts)),
            (wcsr::SEND_DMA_ENGINES, u64::from(shape.sdma_engines)),
            (wcsr::DC_DC8051_CFG_LOCAL_GUID, shape.guid),
        ];
        for (offset, want) in fixed {
            assert_eq!(self.wfr_read64(offset), want, "wfr: {offset:#x}");
        }
        // ICODE_RTL_VCS_SIMULATION (chip.h): the chip wfr_config asks for.
        assert_eq!(self.wfr_read64(wcsr::CCE_REVISION2) >> 8 & 0xFF, 1, "wfr: implementation code");
        assert_eq!(self.wfr_read64(wcsr::SEND_PIO_INIT_CTXT) & 0xC, 0, "wfr: PIO init left in progress");
        assert_eq!(self.wfr_read64(wcsr::SEND_CTRL) & 0x4, 0, "wfr: CM_RESET not self-cleared");
        assert_ne!(self.wfr_read64(wcsr::DC_DC8051_CFG_RAM_ACCESS_STATUS) & 0x1_0000, 0, "wfr: 8051 RAM access");
        for e in 0..u64::from(shape.sdma_engines) {
            let ctrl = self.wfr_read64(wcsr::SEND_DMA_CTRL + 0x100 * e);
            assert_eq!(ctrl & 0x4, 0, "wfr: SDMA CLEANUP is a pulse");
        }
    }

    fn hfi_write64(&self, offset: u64, value: u64) {
        self.hfi_write(offset, &value.to_le_bytes());
    }

    fn hfi_read64(&self, offset: u64) -> u64 {
        let mut b = [0u8; 8];
        self.hfi.mmio_read(hfi1::HFI1_BAR, offset, &mut b);
        u64::from_le_bytes(b)
    }

    fn hfi_op(&mut self, op: HfiOp) {
        // Reads have no side effect on flows or contexts.
        self.hfi_touched |= !matches!(op, HfiOp::Read { .. });
        match op {
            HfiOp::Write { reg, width, value } => {
                let w = width.bytes();
                self.hfi_write(Self::hfi_offset(&reg), &value.to_le_bytes()[..w]);
            }
            HfiOp::Read { reg, width } => {
                let mut b = vec![0u8; width.bytes()];
                let off = Self::in_bar(Self::hfi_offset(&reg), b.len(), hfi1::HFI1_BAR0_SIZE);
                self.hfi.mmio_read(hfi1::HFI1_BAR, off, &mut b);
            }
            HfiOp::Program { index, buf, code } => {
                let addr = (buf.iova() >> hregs::RT_ADDR_SHIFT) & hregs::RCV_ARRAY_RT_ADDR_MASK;
                let value = hregs::RCV_ARRAY_RT_WRITE_ENABLE_SMASK
                    | (u64::from(code & 0xF) << hregs::RCV_ARRAY_RT_BUF_SIZE_SHIFT)
                    | addr;
                self.hfi_write64(hregs::RCV_ARRAY + u64::from(index % 640) * 8, value);
            }
            HfiOp::Context { ctxt, ctrl, tid_base, tid_pairs } => {
                let c = u64::from(ctxt % 5);
                self.hfi_write64(
                    hregs::RCV_TID_CTRL + c * hregs::KCTXT_STRIDE,
                    (u64::from(tid_pairs) << 32) | u64::from(tid_base),
                );
                self.hfi_write64(hregs::RCV_CTXT_CTRL + c * hregs::KCTXT_STRIDE, u64::from(ctrl));
            }
            HfiOp::Flow { ctxt, flow, generation, sequence, ctrl } => {
                let value = u64::from(sequence & 0x7FF)
                    | (u64::from(generation & 0xF_FFFF) << hregs::RCV_TID_FLOW_TABLE_GEN_SHIFT)
                    | (u64::from(ctrl) << 32);
                let off =
                    hregs::RCV_TID_FLOW_TABLE + u64::from(ctxt % 5) * hregs::UCTXT_STRIDE + u64::from(flow % 32) * 8;
                self.hfi_write64(off, value);
            }
            HfiOp::Descriptor { at, packet, payload, len_delta, next } => {
                let payload_len = (payload.len() as i64 + i64::from(len_delta)).clamp(0, u32::MAX as i64) as u32;
                let (kdeth0, dest_qp, psn) = (packet.kdeth0, packet.dest_qp, packet.psn);
                let next = next.map_or(0, Addr::iova);
                let mut d = LbDescHeader { kdeth0, dest_qp, psn, payload_len, next }.to_bytes().to_vec();
                d.extend_from_slice(&payload);
                self.hmem.host_write(at.iova(), &d);
            }
            HfiOp::Doorbell { desc } => {
                self.hfi_write64(hfi1::LB_BASE + hfi1::LB_DESC_ADDR, desc.iova());
                self.hfi_write64(hfi1::LB_BASE + hfi1::LB_DOORBELL, 1);
            }
            HfiOp::Inject { packet, payload } => {
                let p = Packet { kdeth0: packet.kdeth0, dest_qp: packet.dest_qp, psn: packet.psn };
                let (ctxt, tid, tidctrl) =
                    (u64::from(p.dest_qp & 0xFF), u64::from((p.kdeth0 >> 16) & 0x3FF), p.kdeth0 >> 26 & 3);
                self.hor.arrive(Pending::Tid { ctxt, tid, tidctrl });
                // An error here is the engine declining (stopped worker, full queue): fine, just not a panic.
                let _ = self.hfi.inject(p, payload);
                // Judged and placed before inject returns.
                self.hor.withdraw();
            }
        }
    }

    fn irdma_offset(reg: &IrdmaReg) -> u64 {
        match *reg {
            IrdmaReg::Named(i) => [
                iregs::IRDMA_CQPTAIL,
                iregs::IRDMA_CQPDB,
                iregs::IRDMA_CCQPSTATUS,
                iregs::IRDMA_CCQPHIGH,
                iregs::IRDMA_CCQPLOW,
                iregs::IRDMA_CQARM,
                iregs::IRDMA_CQACK,
                iregs::IRDMA_AEQALLOC,
                iregs::IRDMA_CQPERRCODES,
                iregs::IRDMA_WQEALLOC,
                iregs::IRDMA_GLPCI_LBARCTRL,
                iregs::IRDMA_GLPE_CPUSTATUS0,
                iregs::IRDMA_GLPE_CPUSTATUS1,
                iregs::IRDMA_GLPE_CPUSTATUS2,
            ][usize::from(i) % 14],
            IrdmaReg::CeqCtl(i) => iregs::IRDMA_GLINT_CEQCTL + u64::from(i % 6) * 4,
            IrdmaReg::Loopback(i) => iregs::IRDMA_EMU_LB_BASE + u64::from(i % 7) * 4,
            IrdmaReg::DoorbellPage(o) => iregs::IRDMA_DB_ADDR_OFFSET + u64::from(o),
            IrdmaReg::Raw(o) => u64::from(o),
        }
    }

    fn ird_write(&self, offset: u64, data: &[u8]) {
        let offset = Self::in_bar(offset, data.len(), iregs::IRDMA_BAR0_SIZE);
        self.ird.mmio_write(0, offset, data);
    }

    fn ird_write32(&self, offset: u64, value: u32) {
        self.ird_write(offset, &value.to_le_bytes());
    }

    fn ird_read32(&self, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        self.ird.mmio_read(0, offset, &mut b);
        u32::from_le_bytes(b)
    }

    fn irdma_op(&mut self, op: IrdmaOp) {
        match op {
            IrdmaOp::Write { reg, width, value } => {
                let w = width.bytes().min(4);
                self.ird_write(Self::irdma_offset(&reg), &value.to_le_bytes()[..w]);
            }
            IrdmaOp::Read { reg, width } => {
                let mut b = vec![0u8; width.bytes()];
                let off = Self::in_bar(Self::irdma_offset(&reg), b.len(), iregs::IRDMA_BAR0_SIZE);
                self.ird.mmio_read(0, off, &mut b);
            }
            IrdmaOp::HostContext { at, sq, sq_size_code, protocol, hmc_profile, maj, qw3 } => {
                let code = u64::from(sq_size_code % 12);
                let sq_base = sq.iova() & !(irdma::cqp::IRDMA_CQP_ALIGNMENT - 1);
                let mut qw = [0u64; 8];
                qw[0] = irdma::cqp::IRDMA_CQPHC_SQSIZE.put(code)
                    | irdma::cqp::IRDMA_CQPHC_PROTOCOL_USED.put(u64::from(protocol % 4));
                qw[1] = sq_base;
                qw[2] = irdma::cqp::IRDMA_CQPHC_HMC_PROFILE.put(u64::from(hmc_profile % 4));
                qw[3] = qw3;
                qw[4] = irdma::cqp::IRDMA_CQPHC_HW_MAJVER.put(u64::from(maj % 3));
                let bytes: Vec<u8> = qw.iter().flat_map(|q| q.to_le_bytes()).collect();
                let ctx = at.iova() & !0x3F;
                self.imem.host_write(ctx, &bytes);
                // SQ of 2^(code + 1) entries (4 .. 2048).
                self.sq = (sq_base, 1u64 << (code + 1).min(11));
                self.ird_write32(iregs::IRDMA_CCQPHIGH, (ctx >> 32) as u32);
                self.ird_write32(iregs::IRDMA_CCQPLOW, ctx as u32);
            }
            IrdmaOp::Destroy => {
                self.ird_write32(iregs::IRDMA_CCQPHIGH, 0);
                self.ird_write32(iregs::IRDMA_CCQPLOW, 0);
            }
            IrdmaOp::Wqe { slot, cmd, valid } => {
                let qw = build_wqe(cmd, valid);
                let bytes: Vec<u8> = qw.iter().flat_map(|q| q.to_le_bytes()).collect();
                let at = self.sq.0.wrapping_add((u64::from(slot) % self.sq.1) * irdma::wqe::IRDMA_CQP_WQE_SIZE as u64);
                self.imem.host_write(at, &bytes);
            }
            IrdmaOp::Doorbell { head } => {
                self.doorbells += 1;
                self.ird_write32(iregs::IRDMA_CQPDB, u32::from(head) % (self.sq.1 as u32 + 1));
            }
            IrdmaOp::Shadow { at, consumer, arm, seq } => {
                let qw0 = u64::from(consumer & 0xF_FFFF);
                let qw4 = if arm { irdma::ccq::IRDMA_CQ_DBSA_ARM_NEXT.put(1) } else { 0 }
                    | irdma::ccq::IRDMA_CQ_DBSA_ARM_SEQ_NUM.put(u64::from(seq & 3));
                let base = at.iova() & !7;
                self.imem.host_write(base, &qw0.to_le_bytes());
                self.imem.host_write(base.wrapping_add(32), &qw4.to_le_bytes());
            }
            IrdmaOp::Arm => self.ird_write32(iregs::IRDMA_CQARM, 0),
            IrdmaOp::Segment { at, qw0, src, dst } => {
                let mut d = qw0.to_le_bytes().to_vec();
                d.extend(src.iter().chain(dst.iter()).flat_map(|w| w.to_le_bytes()));
                let iova = at.iova();
                self.imem.host_write(iova, &d);
                self.ird_write32(iregs::IRDMA_EMU_LB_DESC_HIGH, (iova >> 32) as u32);
                self.ird_write32(iregs::IRDMA_EMU_LB_DESC_LOW, iova as u32);
                self.ird_write32(iregs::IRDMA_EMU_LB_DOORBELL, 1);
            }
        }
    }

    /// Waits for both engines to go idle, then checks register invariants. A missed deadline is a hang.
    fn wait_and_check(&mut self) {
        let start = Instant::now();
        loop {
            let done = self.hfi_read64(hfi1::LB_BASE + hfi1::LB_DB_DONE);
            let submitted = self.hfi_read64(hfi1::LB_BASE + hfi1::LB_DB_SUBMITTED);
            assert!(done <= submitted, "hfi1: LB_DB_DONE {done} > LB_DB_SUBMITTED {submitted}");
            if done == submitted {
                break;
            }
            assert!(start.elapsed() < IDLE_DEADLINE, "hfi1: loopback doorbells not finished after {IDLE_DEADLINE:?}");
            // The worker usually finishes within microseconds: yield first, sleep only if it takes longer.
            if start.elapsed() < Duration::from_micros(200) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        let (descs, errs) =
            (self.hfi_read64(hfi1::LB_BASE + hfi1::LB_DESC_DONE), self.hfi_read64(hfi1::LB_BASE + hfi1::LB_DESC_ERR));
        assert!(errs <= descs, "hfi1: LB_DESC_ERR {errs} > LB_DESC_DONE {descs}");
        if std::mem::take(&mut self.wfr_touched) {
            self.wfr_check();
        }
        assert!(self.ird.wait_idle(IDLE_DEADLINE), "irdma: worker not idle after {IDLE_DEADLINE:?}");
        let tail = u64::from(self.ird_read32(iregs::IRDMA_CQPTAIL));
        let status = self.ird_read32(iregs::IRDMA_CCQPSTATUS);
        // The engine's shape, read directly: a JSON dump per check cost more than the device code it checks.
        let (len, cap, sq_size) = self.ird.shape();
        if status == 1 {
            // A live CQP: its tail is a slot of its ring.
            if let Some(size) = sq_size.map(u64::from) {
                assert!(
                    iregs::IRDMA_CQPTAIL_WQTAIL.get(tail) < size.max(1),
                    "irdma: CQPTAIL {tail:#x} outside SQ of {size}"
                );
            }
        }
        assert!(len <= cap, "irdma: qhash holds {len} > capacity {cap}");
    }

    /// Sizes fixed by the configuration, and the flow entries' reserved bits (31, 36 and 63:39), which
    /// read 0 whatever was written or advanced.
    fn hfi_check(&self) {
        let cfg = hfi_config();
        assert_eq!(self.hfi_read64(hregs::RCV_CONTEXTS), cfg.rcv_contexts as u64);
        assert_eq!(self.hfi_read64(hregs::RCV_ARRAY_CNT), cfg.rcv_array_count as u64);
        let reserved = (1u64 << 31) | (1 << 36) | !((1u64 << 39) - 1);
        for c in 0..cfg.rcv_contexts as u64 {
            for f in 0..hfi1::RXE_NUM_TID_FLOWS as u64 {
                let v = self.hfi_read64(hregs::RCV_TID_FLOW_TABLE + c * hregs::UCTXT_STRIDE + f * 8);
                assert_eq!(v & reserved, 0, "hfi1: flow {c}/{f} = {v:#x} has reserved bits");
            }
        }
    }

    /// The irdma dump a control client gets agrees with the engine's shape, once the worker is idle. Run
    /// when the input asks for a dump: serialising the whole state cost more than the device code of a
    /// typical input when every input did it.
    fn irdma_dump_check(&self) {
        assert!(self.ird.wait_idle(IDLE_DEADLINE), "irdma: worker not idle after {IDLE_DEADLINE:?}");
        let (len, _, sq_size) = self.ird.shape();
        let d = self.ird.control(&serde_json::json!({"cmd": "dump"}));
        let d = d.as_ref().ok();
        assert_eq!(d.and_then(|d| d["qhash"]["len"].as_u64()), Some(len as u64), "irdma: dump and shape differ");
        assert_eq!(
            d.and_then(|d| d["cqp"]["sq_size"].as_u64()),
            sq_size.map(u64::from),
            "irdma: dump and shape differ"
        );
    }

    /// What holds at the end of every input: the `Wait` checks, the project function's flow table (a scan of
    /// over a hundred trapped reads, so once per input rather than at every `Wait`: a reserved bit is derived
    /// from stored state and stays visible until that flow is written again), and the memories.
    fn end_check(&mut self) {
        self.wait_and_check();
        if std::mem::take(&mut self.hfi_touched) {
            self.hfi_check();
        }
        for (name, mem) in [("hfi1", &self.hmem), ("hfi1-wfr", &self.wmem), ("irdma", &self.imem)] {
            let v = mem.violations();
            assert!(v.is_empty(), "{name}: device wrote outside allowed buffers: {v:?}");
            // Only the device's writes and the harness's own change these memories, and the harness's are in
            // the snapshot: with no device write in this input the comparison could not find anything.
            if mem.device_writes() > 0 {
                assert_eq!(mem.check_snapshot(), None, "{name}: memory changed outside allowed buffers");
            }
        }
    }
}

fuzz_target!(|ops: Vec<Op>| {
    watchdog::enter(None, "engine-reset");
    let Some(mut rig) = Rig::new() else { return };
    for (index, op) in ops.into_iter().take(MAX_OPS).enumerate() {
        watchdog::enter(Some(index), op.name());
        match op {
            Op::Hfi1(o) => rig.hfi_op(o),
            Op::Irdma(o) => rig.irdma_op(o),
            Op::Poke { irdma, at, bytes } => {
                let m = if irdma { &rig.imem } else { &rig.hmem };
                m.host_write(at.iova(), &bytes);
            }
            Op::Wait => rig.wait_and_check(),
            Op::Reset { irdma } => {
                if irdma {
                    rig.ird.reset();
                } else {
                    rig.hfi_touched = true;
                    rig.hfi.reset();
                    rig.hor.forget();
                }
            }
            Op::Reattach { irdma } => {
                rig.hfi_touched |= !irdma;
                if irdma {
                    rig.ird.detach();
                    rig.ird.attach(rig.imem.clone(), rig.irq.clone());
                } else {
                    rig.hfi.detach();
                    rig.hor.forget();
                    rig.hfi.attach(rig.hmem.clone(), rig.irq.clone());
                }
            }
            Op::Wfr(o) => {
                rig.wfr_op(o);
                // What the port did not keep is done: written or dropped.
                rig.wor.settle(rig.wfr.ingress_queued());
            }
            Op::Control { irdma, which } => {
                rig.hfi_touched |= !irdma;
                let req = match which % 3 {
                    2 => {
                        if !irdma {
                            rig.hor.forget();
                        }
                        serde_json::json!({"cmd": "reset"})
                    }
                    _ if std::mem::replace(&mut rig.observed[if irdma { 2 } else { 0 }], true) => continue,
                    0 if irdma => {
                        rig.irdma_dump_check();
                        continue;
                    }
                    0 => serde_json::json!({"cmd": "dump"}),
                    _ => serde_json::json!({"cmd": "counters"}),
                };
                let engine: &dyn Engine = if irdma { rig.ird } else { rig.hfi };
                let _ = engine.control(&req);
            }
        }
    }
    watchdog::enter(None, "end-check");
    rig.end_check();
    watchdog::leave();
    // No detach here: the next input's Rig::new resets the engines anyway.
});

/// A 64-bit register of `hfi` (what the oracles read at each write).
fn read64(hfi: &Hfi1, offset: u64) -> u64 {
    let mut b = [0u8; 8];
    hfi.mmio_read(hfi1::HFI1_BAR, offset, &mut b);
    u64::from_le_bytes(b)
}
