//! The vocabulary of traces: levels, blocks, events and register names.

#![forbid(unsafe_code)]

/// How much of a block is traced. Events come at three levels: `info` (doorbells, WQEs, CQEs, packets,
/// interrupts, faults), `debug` (register accesses) and `trace` (DMA accesses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    Off = 0,
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
    Trace = 5,
}

impl Level {
    /// In order, so `ALL[level as usize] == level`.
    pub const ALL: [Level; 6] = [Level::Off, Level::Error, Level::Warn, Level::Info, Level::Debug, Level::Trace];

    pub fn parse(s: &str) -> Option<Level> {
        Some(match s.to_ascii_lowercase().as_str() {
            "off" => Level::Off,
            "error" => Level::Error,
            "warn" => Level::Warn,
            "info" => Level::Info,
            "debug" => Level::Debug,
            "trace" => Level::Trace,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Level::Off => "off",
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        }
    }
}

macro_rules! blocks {
    ($($variant:ident = $name:literal: $doc:literal,)*) => {
        /// The hardware block an event belongs to: the second part of a filter target (`hfi1::flow`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Block { $(#[doc = $doc] $variant,)* }
        impl Block {
            pub const ALL: [Block; [$(Block::$variant),*].len()] = [$(Block::$variant),*];
            pub const COUNT: usize = Self::ALL.len();
            pub fn name(self) -> &'static str {
                match self { $(Block::$variant => $name,)* }
            }
            pub fn parse(s: &str) -> Option<Block> {
                match s { $($name => Some(Block::$variant),)* _ => None }
            }
            pub fn doc(self) -> &'static str {
                match self { $(Block::$variant => $doc,)* }
            }
        }
    };
}

blocks! {
    Pci = "pci": "config space and the MSI-X table",
    Dma = "dma": "every DMA read, write and copy of the device",
    Irq = "irq": "interrupts raised, delivered, pended or dropped",
    Fault = "fault": "injected faults as they fire",
    Other = "other": "register offsets no block names",
    Rxe = "rxe": "hfi1 receive CSRs (global and per context)",
    RcvArray = "rcvarray": "hfi1 RcvArray entries",
    Flow = "flow": "hfi1 TID flow table",
    Rcv = "rcv": "hfi1 packets judged and placed",
    Loopback = "loopback": "hfi1 loopback send block and its doorbells",
    Cce = "cce": "hfi1 chip personality: CCE (revision, interrupts)",
    Asic = "asic": "hfi1 chip personality: ASIC (SBus, EPROM, QSFP, mutex)",
    Misc = "misc": "hfi1 chip personality: MISC",
    Dc = "dc": "hfi1 chip personality: DC, LCB and the 8051",
    Txe = "txe": "hfi1 chip personality: TXE (send contexts, SDMA engines and their halts)",
    Pio = "pio": "hfi1 chip personality: PIO send buffers, packets launched (by PIO or SDMA) and credits returned",
    Link = "link": "hfi1 chip personality: the port's physical and logical link state",
    Cable = "cable": "hfi1 cable: link training and every packet on the wire",
    Rhq = "rhq": "hfi1 chip personality: receive header queue entries and eager buffers written",
    Cqp = "cqp": "irdma control QP: CQPDB, CQPTAIL, CCQPSTATUS, doorbells and WQEs",
    Ccq = "ccq": "irdma CCQ: arming and CQEs",
    Ceq = "ceq": "irdma GLINT_CEQCTL routing",
    Qhash = "qhash": "irdma quad-hash table operations",
    Classify = "classify": "irdma loopback classification",
    Pe = "pe": "irdma PE status and BAR size registers",
    Db = "db": "irdma doorbells with no emulated queue behind them",
}

/// One field of an event.
#[derive(Debug, Clone)]
pub enum Val<'a> {
    Hex(u64),
    Dec(u64),
    Str(&'a str),
    Owned(String),
    Bool(bool),
}

impl std::fmt::Display for Val<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Val::Hex(v) => write!(f, "{v:#x}"),
            Val::Dec(v) => write!(f, "{v}"),
            Val::Str(s) => f.write_str(s),
            Val::Owned(s) => f.write_str(s),
            Val::Bool(b) => write!(f, "{b}"),
        }
    }
}

impl Val<'_> {
    pub(super) fn json(&self) -> serde_json::Value {
        match self {
            Val::Hex(v) => serde_json::Value::String(format!("{v:#x}")),
            Val::Dec(v) => (*v).into(),
            Val::Str(s) => (*s).into(),
            Val::Owned(s) => s.as_str().into(),
            Val::Bool(b) => (*b).into(),
        }
    }
}

/// An event to write: text lines show `head` when given (the register form `W NAME = 0xVALUE fields`),
/// else `kind` and the fields as `k=v`; JSON lines carry the kind and every field.
pub struct Event<'a> {
    pub kind: &'static str,
    pub head: Option<String>,
    pub fields: &'a [(&'static str, Val<'a>)],
}

/// The kernel's name of a register and its decoded fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterName {
    pub block: Block,
    /// `None` where the offset is no register the driver knows.
    pub name: Option<String>,
    /// Set fields as `name=0x..` and flags by name, space-separated; empty when there are none.
    pub fields: String,
}

impl RegisterName {
    pub fn unnamed() -> Self {
        RegisterName { block: Block::Other, name: None, fields: String::new() }
    }
}

/// `NAME` for each set flag of `flags` ((mask, name) pairs).
pub fn flag_names(value: u64, flags: &[(u64, &str)]) -> Vec<String> {
    flags.iter().filter(|(m, _)| value & m != 0).map(|(_, n)| (*n).to_string()).collect()
}
