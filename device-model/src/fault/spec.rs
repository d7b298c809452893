//! The fault spec language: `[DEVICE:]FAULT[,KEY=VALUE]...` (docs/observe.md, "Faults").
//!
//! Trigger keys, for every fault: `nth=N` (the first matching event that fires, default 1), `count=K` (how
//! many events fire from then on, default 1; `forever` for `reg-stuck`, `cqptail-stall` and `removed`),
//! `prob=P` with `seed=S` (each matching event from the Nth on fires with probability P, drawn from a
//! generator seeded with S, default 0: the same session fires the same events). The other keys belong to the
//! fault (`op=`, `major=`, `ms=`, ...); numbers are decimal or 0x-hex.

#![forbid(unsafe_code)]

use std::fmt;

/// What a fault does, and which events count for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// irdma: a WQE of `op` completes with `major`/`minor` instead of executing. Event: each WQE of `op`.
    CqpFail,
    /// irdma: a completion (CQE and CQPTAIL) is published `ms` late. Event: each completion.
    CqeDelay,
    /// irdma: the WQE executes and the tail advances, but no CQE is written. Event: each CQE.
    CqeDrop,
    /// irdma: a field of the CQE is XORed with `xor`. Event: each CQE.
    CqeCorrupt,
    /// irdma: CQPTAIL stops following completions. Event: each completion.
    CqptailStall,
    /// hfi1: a write to an RcvArray entry (`index`, or any) is ignored. Event: each RcvArray write.
    RcvarrayIgnore,
    /// hfi1: the device adds `add` to a flow's generation before judging a packet. Event: each packet
    /// of (`ctxt`, `flow`).
    FlowGeneration,
    /// hfi1: a packet never arrives. Event: each packet (of `ctxt`).
    PacketDrop,
    /// hfi1: a packet arrives twice. Event: each packet.
    PacketDup,
    /// hfi1: a packet arrives after the one behind it. Event: each packet.
    PacketReorder,
    /// A DMA write of the device fails (as an unmapped IOVA does). Event: each DMA write.
    DmaWriteFail,
    /// A DMA read of the device fails. Event: each DMA read.
    DmaReadFail,
    /// Reads of a register return `value` in the bits of `mask`. Event: each read of the register.
    RegStuck,
    /// Surprise removal: every read returns all-ones, writes, DMA and interrupts are dropped. Event: each
    /// register or config access.
    Removed,
    /// An interrupt (of `vector`, or any) is not delivered. Event: each interrupt raised.
    MsixDrop,
    /// A DMA_MAP is refused with `errno`. Event: each DMA_MAP.
    DmaMapRefuse,
    /// hfi1 cable: a packet to this device is lost on the wire. Event: each packet the cable carries to it.
    CableDrop,
    /// hfi1 cable: a packet to this device arrives `ms` late (later packets overtake it). Event: each packet.
    CableDelay,
    /// hfi1 cable: byte `byte` (default the middle one) of a packet to this device is XORed with `xor`, so
    /// its ICRC no longer matches. Event: each packet.
    CableCorrupt,
    /// hfi1 cable: a packet to this device arrives after the next one. Event: each packet.
    CableReorder,
    /// hfi1 chip: the RHF of a header-queue entry (of `ctxt`) is edited before it is written. Event: each
    /// header-queue entry written.
    Rhf,
    /// hfi1 chip: the RcvHdrTail DMA'd to a context's tail address (TAIL_UPD) is edited. Event: each tail
    /// write-back (of `ctxt`).
    RcvhdrtailWb,
    /// hfi1 chip: an SDMA engine's head write-back (SEND_DMA_HEAD_ADDR) is edited. Event: each head
    /// write-back (of `engine`).
    SdmaHeadWb,
    /// hfi1 chip: a send context's credit return DMA'd to host memory is edited. Event: each credit return
    /// written (of send context `ctxt`).
    CreditReturn,
    /// hfi1 chip: the 8051's reply to a host command (DC_DC8051_CFG_HOST_CMD_1) is edited. Event: each reply
    /// (to commands of type `cmd`).
    Dc8051Reply,
}

impl FaultKind {
    pub const ALL: [FaultKind; 25] = [
        FaultKind::CqpFail,
        FaultKind::CqeDelay,
        FaultKind::CqeDrop,
        FaultKind::CqeCorrupt,
        FaultKind::CqptailStall,
        FaultKind::RcvarrayIgnore,
        FaultKind::FlowGeneration,
        FaultKind::PacketDrop,
        FaultKind::PacketDup,
        FaultKind::PacketReorder,
        FaultKind::DmaWriteFail,
        FaultKind::DmaReadFail,
        FaultKind::RegStuck,
        FaultKind::Removed,
        FaultKind::MsixDrop,
        FaultKind::DmaMapRefuse,
        FaultKind::CableDrop,
        FaultKind::CableDelay,
        FaultKind::CableCorrupt,
        FaultKind::CableReorder,
        FaultKind::Rhf,
        FaultKind::RcvhdrtailWb,
        FaultKind::SdmaHeadWb,
        FaultKind::CreditReturn,
        FaultKind::Dc8051Reply,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::CqpFail => "cqp-fail",
            FaultKind::CqeDelay => "cqe-delay",
            FaultKind::CqeDrop => "cqe-drop",
            FaultKind::CqeCorrupt => "cqe-corrupt",
            FaultKind::CqptailStall => "cqptail-stall",
            FaultKind::RcvarrayIgnore => "rcvarray-ignore",
            FaultKind::FlowGeneration => "flow-generation",
            FaultKind::PacketDrop => "packet-drop",
            FaultKind::PacketDup => "packet-dup",
            FaultKind::PacketReorder => "packet-reorder",
            FaultKind::DmaWriteFail => "dma-write-fail",
            FaultKind::DmaReadFail => "dma-read-fail",
            FaultKind::RegStuck => "reg-stuck",
            FaultKind::Removed => "removed",
            FaultKind::MsixDrop => "msix-drop",
            FaultKind::DmaMapRefuse => "dma-map-refuse",
            FaultKind::CableDrop => "cable-drop",
            FaultKind::CableDelay => "cable-delay",
            FaultKind::CableCorrupt => "cable-corrupt",
            FaultKind::CableReorder => "cable-reorder",
            FaultKind::Rhf => "rhf",
            FaultKind::RcvhdrtailWb => "rcvhdrtail-wb",
            FaultKind::SdmaHeadWb => "sdma-head-wb",
            FaultKind::CreditReturn => "credit-return",
            FaultKind::Dc8051Reply => "dc8051-reply",
        }
    }

    /// The device kinds the fault applies to (`None`: every device).
    pub fn devices(self) -> Option<&'static [&'static str]> {
        match self {
            FaultKind::CqpFail
            | FaultKind::CqeDelay
            | FaultKind::CqeDrop
            | FaultKind::CqeCorrupt
            | FaultKind::CqptailStall => Some(&["irdma"]),
            FaultKind::RcvarrayIgnore | FaultKind::FlowGeneration => Some(&["hfi1", "hfi1-wfr"]),
            FaultKind::PacketDrop | FaultKind::PacketDup | FaultKind::PacketReorder => Some(&["hfi1", "hfi1-wfr"]),
            FaultKind::CableDrop | FaultKind::CableDelay | FaultKind::CableCorrupt | FaultKind::CableReorder => {
                Some(&["hfi1-wfr"])
            }
            // Only the chip personality has a header queue the wire fills, SDMA engines, PIO send contexts
            // and an 8051.
            k if k.edits_a_word() && k != FaultKind::RegStuck => Some(&["hfi1-wfr"]),
            _ => None,
        }
    }

    /// The fault's own keys, and a one-line description for `help`.
    pub fn usage(self) -> (&'static [&'static str], &'static str) {
        match self {
            FaultKind::CqpFail => (&["op", "major", "minor"], "a WQE of opcode op completes with major/minor"),
            FaultKind::CqeDelay => (&["ms"], "a completion is published ms milliseconds late"),
            FaultKind::CqeDrop => (&[], "a WQE executes but its CQE is never written"),
            FaultKind::CqeCorrupt => {
                (&["field", "xor"], "XOR a CQE field (wqe-idx, op-ret, major, minor, error, valid, ctx) with xor")
            }
            FaultKind::CqptailStall => (&[], "CQPTAIL stops following completions"),
            FaultKind::RcvarrayIgnore => (&["index"], "a write to an RcvArray entry is ignored"),
            FaultKind::FlowGeneration => (&["ctxt", "flow", "add"], "the flow's generation changes before a packet"),
            FaultKind::PacketDrop => (&["ctxt"], "a packet is lost"),
            FaultKind::PacketDup => (&["ctxt"], "a packet arrives twice"),
            FaultKind::PacketReorder => (&["ctxt"], "a packet arrives after the next one"),
            FaultKind::DmaWriteFail => (&[], "a DMA write of the device fails"),
            FaultKind::DmaReadFail => (&[], "a DMA read of the device fails"),
            FaultKind::RegStuck => (
                &["reg", "offset", "bar", "mask", "value", "xor"],
                "reads return value in the bits of mask, then XORed with xor",
            ),
            FaultKind::Removed => (&[], "surprise removal: reads all-ones, nothing else reaches the device"),
            FaultKind::MsixDrop => (&["vector"], "an interrupt is not delivered"),
            FaultKind::DmaMapRefuse => (&["errno"], "a DMA_MAP is refused with errno (default ENOMEM)"),
            FaultKind::CableDrop => {
                (&["opcode"], "a packet to the device (of BTH opcode, if given) is lost on the cable")
            }
            FaultKind::CableDelay => {
                (&["ms", "opcode"], "a packet to the device (of BTH opcode, if given) arrives ms milliseconds late")
            }
            FaultKind::CableCorrupt => (
                &["byte", "xor", "opcode"],
                "byte (default the middle one) of a packet to the device (of BTH opcode, if given) is XORed with xor",
            ),
            FaultKind::CableReorder => {
                (&["opcode"], "a packet to the device (of BTH opcode, if given) arrives after the next one")
            }
            FaultKind::Rhf => (
                &["ctxt", "mask", "value", "xor"],
                "the RHF of a header-queue entry (of receive context ctxt) gets value in the bits of mask, then XOR xor",
            ),
            FaultKind::RcvhdrtailWb => (
                &["ctxt", "mask", "value", "xor"],
                "the RcvHdrTail DMA'd for receive context ctxt gets value (in mask, default all bits), then XOR xor",
            ),
            FaultKind::SdmaHeadWb => (
                &["engine", "mask", "value", "xor"],
                "the SDMA head written back for engine gets value (in mask, default all bits), then XOR xor",
            ),
            FaultKind::CreditReturn => (
                &["ctxt", "mask", "value", "xor"],
                "the credit return of send context ctxt gets value (in mask, default all bits), then XOR xor",
            ),
            FaultKind::Dc8051Reply => (
                &["cmd", "mask", "value", "xor"],
                "the 8051's DC_DC8051_CFG_HOST_CMD_1 after a command (of type cmd) gets value in mask, then XOR xor",
            ),
        }
    }

    /// Faults that rewrite a 64-bit word the driver reads (`mask`, `value`, `xor`: [`Params::edit`]).
    pub fn edits_a_word(self) -> bool {
        matches!(
            self,
            FaultKind::RegStuck
                | FaultKind::Rhf
                | FaultKind::RcvhdrtailWb
                | FaultKind::SdmaHeadWb
                | FaultKind::CreditReturn
                | FaultKind::Dc8051Reply
        )
    }

    /// Faults that describe a state rather than an event: they fire for ever unless `count` says otherwise.
    fn lasting(self) -> bool {
        matches!(self, FaultKind::RegStuck | FaultKind::CqptailStall | FaultKind::Removed)
    }

    pub fn parse(s: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// A CQE field `cqe-corrupt` changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqeField {
    /// qw3 WQEIDX.
    WqeIdx,
    /// qw2 op return value.
    OpRet,
    /// qw3 MAJERR.
    Major,
    /// qw3 MINERR.
    Minor,
    /// qw3 ERROR bit (`xor` is ignored: the bit flips).
    Error,
    /// qw3 VALID bit (flips).
    Valid,
    /// qw1: the completion context (the driver's CQP pointer).
    Ctx,
}

impl CqeField {
    fn parse(s: &str) -> Option<CqeField> {
        Some(match s {
            "wqe-idx" => CqeField::WqeIdx,
            "op-ret" => CqeField::OpRet,
            "major" => CqeField::Major,
            "minor" => CqeField::Minor,
            "error" => CqeField::Error,
            "valid" => CqeField::Valid,
            "ctx" => CqeField::Ctx,
            _ => return None,
        })
    }
}

/// A register a fault names: by the kernel's name (resolved by the device's engine) or by offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegRef {
    Name(String),
    Offset { bar: u32, offset: u64 },
}

/// The fault's own parameters; each kind reads the ones it accepts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Params {
    pub op: Option<u8>,
    pub major: u16,
    pub minor: u16,
    pub ms: u64,
    pub field: Option<CqeField>,
    pub xor: u64,
    pub index: Option<u64>,
    pub ctxt: Option<u32>,
    pub flow: Option<u32>,
    pub add: u32,
    pub reg: Option<RegRef>,
    pub mask: u64,
    pub value: u64,
    pub vector: Option<u16>,
    pub errno: i32,
    /// Which byte of a packet `cable-corrupt` changes.
    pub byte: Option<u64>,
    /// Cable faults: only packets of this BTH opcode count as events (e.g. 0xE3, TID RDMA WRITE DATA LAST).
    pub opcode: Option<u8>,
    /// `sdma-head-wb`: only this SDMA engine's write-backs count.
    pub engine: Option<u32>,
    /// `dc8051-reply`: only replies to host commands of this type (HCMD_*) count.
    pub cmd: Option<u8>,
}

impl Params {
    /// A word as a word-editing fault leaves it: `value` in the bits of `mask`, then XORed with `xor`.
    pub fn edit(&self, word: u64) -> u64 {
        ((word & !self.mask) | (self.value & self.mask)) ^ self.xor
    }
}

/// When a fault fires.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trigger {
    /// The first matching event that may fire (1-based).
    pub nth: u64,
    /// Events that fire at most; `None`: for ever.
    pub count: Option<u64>,
    /// Probability of each event from the Nth on (1.0: every one).
    pub prob: f64,
    pub seed: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FaultSpec {
    /// `None` when the spec leaves it to where it is armed (`{"device":..,"cmd":"fault"}`).
    pub device: Option<String>,
    pub kind: FaultKind,
    pub params: Params,
    pub trigger: Trigger,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("fault spec is empty")]
    Empty,
    #[error("unknown fault \"{0}\" (see `device-model --help` or {{\"cmd\":\"help\"}})")]
    Unknown(String),
    #[error("fault {fault}: \"{item}\" is not KEY=VALUE")]
    Item { fault: &'static str, item: String },
    #[error("fault {fault}: unknown key \"{key}\" (its keys: {keys}; trigger keys: nth, count, prob, seed)")]
    Key { fault: &'static str, key: String, keys: String },
    #[error("fault {fault}: bad value \"{value}\" for {key}: {why}")]
    Value { fault: &'static str, key: String, value: String, why: &'static str },
    #[error("fault {fault}: missing {key}")]
    Missing { fault: &'static str, key: &'static str },
    #[error("fault {fault} does not apply to {device} (only {only})")]
    Device { fault: &'static str, device: String, only: String },
}

fn number(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(&h.replace('_', ""), 16).ok(),
        None => s.replace('_', "").parse().ok(),
    }
}

/// CQP opcodes by the kernel's names (IRDMA_CQP_OP_*), for `op=`.
const OPCODES: &[(&str, u8)] =
    &[("create-cq", 0x03), ("destroy-cq", 0x05), ("nop", 0x24), ("manage-qhash", 0x25), ("qhash", 0x25)];

/// 8051 host command types by the kernel's names (chip.h HCMD_*), for `cmd=`.
const HCMDS: &[(&str, u8)] = &[
    ("load-config-data", 0x01),
    ("read-config-data", 0x02),
    ("change-phy-state", 0x03),
    ("send-lcb-idle-msg", 0x04),
    ("misc", 0x05),
    ("read-lcb-idle-msg", 0x06),
    ("read-lcb-csr", 0x07),
    ("write-lcb-csr", 0x08),
    ("interface-test", 0xff),
];

/// SDMA engines of the chip (chip.h TXE_NUM_SDMA_ENGINES), for `engine=`.
const SDMA_ENGINES: u64 = 16;

/// Errno names `dma-map-refuse` accepts.
const ERRNOS: &[(&str, i32)] = &[
    ("ENOMEM", libc::ENOMEM),
    ("EFAULT", libc::EFAULT),
    ("EINVAL", libc::EINVAL),
    ("ENOSPC", libc::ENOSPC),
    ("EBUSY", libc::EBUSY),
    ("EPERM", libc::EPERM),
    ("EIO", libc::EIO),
];

impl FaultSpec {
    /// Parses `[DEVICE:]FAULT[,KEY=VALUE]...`. DEVICE is a name the caller resolves to a device; whether the
    /// fault applies to that device's kind is [`FaultSpec::check_device`]'s, called by whoever knows the kind.
    pub fn parse(text: &str) -> Result<FaultSpec, SpecError> {
        let mut parts = text.trim().split(',').map(str::trim);
        let head = parts.next().filter(|h| !h.is_empty()).ok_or(SpecError::Empty)?;
        let (device, name) = match head.split_once(':') {
            Some((d, n)) => (Some(d.trim().to_string()), n.trim()),
            None => (None, head),
        };
        let kind = FaultKind::parse(name).ok_or_else(|| SpecError::Unknown(name.to_string()))?;
        let fault = kind.name();
        let (keys, _) = kind.usage();
        let mut p = Params { add: 1, xor: 1, errno: libc::ENOMEM, ..Params::default() };
        let mut trigger = Trigger { nth: 1, count: (!kind.lasting()).then_some(1), prob: 1.0, seed: 0 };
        let mut seen_major = false;
        let mut seen_minor = false;
        let (mut seen_mask, mut seen_value, mut seen_xor) = (false, false, false);
        for item in parts.filter(|s| !s.is_empty()) {
            let (key, value) = item.split_once('=').ok_or_else(|| SpecError::Item { fault, item: item.to_string() })?;
            let (key, value) = (key.trim(), value.trim());
            let bad = |why| SpecError::Value { fault, key: key.to_string(), value: value.to_string(), why };
            let num = |max: u64| number(value).filter(|n| *n <= max).ok_or_else(|| bad("not a number in range"));
            match key {
                "nth" => {
                    trigger.nth = num(u64::MAX).and_then(|n| if n == 0 { Err(bad("counts from 1")) } else { Ok(n) })?
                }
                "count" if value == "forever" => trigger.count = None,
                "count" => trigger.count = Some(num(u64::MAX)?),
                "prob" => {
                    trigger.prob = value
                        .parse::<f64>()
                        .ok()
                        .filter(|p| (0.0..=1.0).contains(p))
                        .ok_or_else(|| bad("a probability in 0..=1"))?;
                    // A probability keeps drawing: it is bounded by count only when given.
                    if !item_given(text, "count") {
                        trigger.count = None;
                    }
                }
                "seed" => trigger.seed = num(u64::MAX)?,
                k if !keys.contains(&k) => {
                    return Err(SpecError::Key { fault, key: k.to_string(), keys: keys.join(", ") });
                }
                "op" => {
                    let op = OPCODES.iter().find(|(n, _)| *n == value).map(|(_, o)| u64::from(*o));
                    p.op = Some(op.map_or_else(|| num(0x3F), Ok)? as u8);
                }
                "major" => {
                    p.major = num(0xFFFF)? as u16;
                    seen_major = true;
                }
                "minor" => {
                    p.minor = num(0xFFFF)? as u16;
                    seen_minor = true;
                }
                "ms" => p.ms = num(60_000)?,
                "field" => {
                    p.field = Some(
                        CqeField::parse(value)
                            .ok_or_else(|| bad("wqe-idx, op-ret, major, minor, error, valid or ctx"))?,
                    )
                }
                "xor" => {
                    p.xor = num(u64::MAX)?;
                    seen_xor = true;
                }
                "index" => p.index = Some(num(u64::from(u32::MAX))?),
                "ctxt" => p.ctxt = Some(num(0xFF)? as u32),
                "flow" => p.flow = Some(num(0x1F)? as u32),
                "add" => p.add = num(0xF_FFFF)? as u32,
                "reg" => p.reg = Some(RegRef::Name(value.to_string())),
                "offset" => {
                    let bar = match &p.reg {
                        Some(RegRef::Offset { bar, .. }) => *bar,
                        _ => 0,
                    };
                    p.reg = Some(RegRef::Offset { bar, offset: num(u64::MAX)? });
                }
                "bar" => {
                    let bar = num(5)? as u32;
                    p.reg = Some(match p.reg.take() {
                        Some(RegRef::Offset { offset, .. }) => RegRef::Offset { bar, offset },
                        Some(other) => other,
                        None => RegRef::Offset { bar, offset: 0 },
                    });
                }
                "mask" => {
                    p.mask = num(u64::MAX)?;
                    seen_mask = true;
                }
                "value" => {
                    p.value = num(u64::MAX)?;
                    seen_value = true;
                }
                "engine" => p.engine = Some(num(SDMA_ENGINES - 1)? as u32),
                "cmd" => {
                    let c = HCMDS.iter().find(|(n, _)| *n == value).map(|(_, c)| u64::from(*c));
                    p.cmd = Some(c.map_or_else(|| num(0xFF), Ok)? as u8);
                }
                "vector" => p.vector = Some(num(2047)? as u16),
                "byte" => p.byte = Some(num(u64::from(u16::MAX))?),
                "opcode" => p.opcode = Some(num(0xFF)? as u8),
                "errno" => {
                    p.errno = match ERRNOS.iter().find(|(n, _)| n.eq_ignore_ascii_case(value)) {
                        Some((_, e)) => *e,
                        None => num(4095).and_then(|n| if n == 0 { Err(bad("an errno is positive")) } else { Ok(n) })?
                            as i32,
                    }
                }
                _ => return Err(SpecError::Key { fault, key: key.to_string(), keys: keys.join(", ") }),
            }
        }
        let missing = |key| SpecError::Missing { fault, key };
        if kind.edits_a_word() {
            if !seen_xor {
                p.xor = 0;
            }
            // A value without a mask replaces the whole word (reg-stuck keeps its mask mandatory).
            if seen_value && !seen_mask && kind != FaultKind::RegStuck {
                p.mask = u64::MAX;
            }
            if p.mask == 0 && p.xor == 0 {
                return Err(missing(if kind == FaultKind::RegStuck { "mask" } else { "value, mask or xor" }));
            }
            if p.value & !p.mask != 0 {
                return Err(SpecError::Value {
                    fault,
                    key: "value".into(),
                    value: format!("{:#x}", p.value),
                    why: "bits outside mask",
                });
            }
        }
        match kind {
            FaultKind::CqpFail if p.op.is_none() => return Err(missing("op")),
            FaultKind::CqpFail if !seen_major => return Err(missing("major")),
            FaultKind::CqpFail if !seen_minor => return Err(missing("minor")),
            FaultKind::CqeDelay | FaultKind::CableDelay if p.ms == 0 => return Err(missing("ms")),
            FaultKind::CqeCorrupt if p.field.is_none() => return Err(missing("field")),
            FaultKind::RegStuck if p.reg.is_none() => return Err(missing("reg or offset")),
            _ => {}
        }
        Ok(FaultSpec { device, kind, params: p, trigger })
    }

    /// Refuses a fault armed on a device it cannot apply to. `kind` is the device's kind as its engine states
    /// it (`Engine::kind`): the caller knows its device; the fault layer reads no engine's names.
    pub fn check_device(&self, kind: &str) -> Result<(), SpecError> {
        match self.kind.devices() {
            Some(only) if !only.contains(&kind) => {
                Err(SpecError::Device { fault: self.kind.name(), device: kind.to_string(), only: only.join(", ") })
            }
            _ => Ok(()),
        }
    }
}

/// A word edit's keys: `mask` and `value` while the mask has bits, `xor` while it has.
fn edit_keys(p: &Params, kv: &mut impl FnMut(&str, String) -> fmt::Result) -> fmt::Result {
    if p.mask != 0 {
        kv("mask", format!("{:#x}", p.mask))?;
        kv("value", format!("{:#x}", p.value))?;
    }
    if p.xor != 0 {
        kv("xor", format!("{:#x}", p.xor))?;
    }
    Ok(())
}

/// Whether `key=` appears among the items of `text`.
fn item_given(text: &str, key: &str) -> bool {
    text.split(',').skip(1).any(|i| i.trim().split_once('=').is_some_and(|(k, _)| k.trim() == key))
}

impl fmt::Display for FaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(d) = &self.device {
            write!(f, "{d}:")?;
        }
        f.write_str(self.kind.name())?;
        let p = &self.params;
        let mut kv = |k: &str, v: String| write!(f, ",{k}={v}");
        match self.kind {
            FaultKind::CqpFail => {
                kv("op", format!("{:#x}", p.op.unwrap_or(0)))?;
                kv("major", format!("{:#x}", p.major))?;
                kv("minor", format!("{:#x}", p.minor))?;
            }
            FaultKind::CqeDelay | FaultKind::CableDelay => kv("ms", p.ms.to_string())?,
            FaultKind::CableCorrupt => {
                if let Some(b) = p.byte {
                    kv("byte", b.to_string())?;
                }
                kv("xor", format!("{:#x}", p.xor))?;
            }
            FaultKind::CqeCorrupt => {
                let name = match p.field {
                    Some(CqeField::WqeIdx) => "wqe-idx",
                    Some(CqeField::OpRet) => "op-ret",
                    Some(CqeField::Major) => "major",
                    Some(CqeField::Minor) => "minor",
                    Some(CqeField::Error) => "error",
                    Some(CqeField::Valid) => "valid",
                    Some(CqeField::Ctx) | None => "ctx",
                };
                kv("field", name.into())?;
                kv("xor", format!("{:#x}", p.xor))?;
            }
            FaultKind::RcvarrayIgnore => {
                if let Some(i) = p.index {
                    kv("index", i.to_string())?;
                }
            }
            FaultKind::FlowGeneration => {
                if let Some(c) = p.ctxt {
                    kv("ctxt", c.to_string())?;
                }
                if let Some(fl) = p.flow {
                    kv("flow", fl.to_string())?;
                }
                kv("add", p.add.to_string())?;
            }
            FaultKind::PacketDrop | FaultKind::PacketDup | FaultKind::PacketReorder => {
                if let Some(c) = p.ctxt {
                    kv("ctxt", c.to_string())?;
                }
            }
            FaultKind::RegStuck => {
                match &p.reg {
                    Some(RegRef::Name(n)) => kv("reg", n.clone())?,
                    Some(RegRef::Offset { bar, offset }) => {
                        kv("bar", bar.to_string())?;
                        kv("offset", format!("{offset:#x}"))?;
                    }
                    None => {}
                }
                edit_keys(p, &mut kv)?;
            }
            FaultKind::Rhf | FaultKind::RcvhdrtailWb | FaultKind::CreditReturn => {
                if let Some(c) = p.ctxt {
                    kv("ctxt", c.to_string())?;
                }
                edit_keys(p, &mut kv)?;
            }
            FaultKind::SdmaHeadWb => {
                if let Some(e) = p.engine {
                    kv("engine", e.to_string())?;
                }
                edit_keys(p, &mut kv)?;
            }
            FaultKind::Dc8051Reply => {
                if let Some(c) = p.cmd {
                    kv("cmd", format!("{c:#x}"))?;
                }
                edit_keys(p, &mut kv)?;
            }
            FaultKind::MsixDrop => {
                if let Some(v) = p.vector {
                    kv("vector", v.to_string())?;
                }
            }
            FaultKind::DmaMapRefuse => kv("errno", p.errno.to_string())?,
            FaultKind::CqeDrop
            | FaultKind::CqptailStall
            | FaultKind::DmaWriteFail
            | FaultKind::DmaReadFail
            | FaultKind::Removed
            | FaultKind::CableDrop
            | FaultKind::CableReorder => {}
        }
        if let Some(o) = p.opcode {
            kv("opcode", format!("{o:#x}"))?;
        }
        let t = &self.trigger;
        kv("nth", t.nth.to_string())?;
        kv("count", t.count.map_or("forever".into(), |c| c.to_string()))?;
        if t.prob < 1.0 {
            kv("prob", t.prob.to_string())?;
            kv("seed", t.seed.to_string())?;
        }
        Ok(())
    }
}
