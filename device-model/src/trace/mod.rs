//! Named traces: every register access, DMA access, interrupt and engine event of a device, with the kernel's
//! register names and decoded fields, as text or JSON lines (docs/observe.md, "Traces").
//!
//! Each device has a [`Tracer`] holding one level per [`Block`], compiled from a [`Filter`]. A trace point
//! costs one relaxed atomic load and a compare while its block is off, so tracing off is free (benchmark
//! case (a), docs/bench.md); formatting happens only for events that pass.

#![forbid(unsafe_code)]

pub mod access_log;
mod filter;
mod kinds;
mod sink;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, RwLock};

pub use filter::{Filter, FilterError};
pub use kinds::{flag_names, Block, Event, Level, RegisterName, Val};
pub use sink::{Format, Sink, DEFAULT_MAX_FILE_BYTES};

/// One device's trace switches and where its events go.
pub struct Tracer {
    device: &'static str,
    levels: [AtomicU8; Block::COUNT],
    /// The highest of `levels`: the check of trace points whose block is known only later.
    max: AtomicU8,
    sink: RwLock<Arc<Sink>>,
}

impl Tracer {
    /// All blocks off, events to the process-wide sink.
    pub fn new(device: &'static str) -> Self {
        Tracer {
            device,
            levels: std::array::from_fn(|_| AtomicU8::new(0)),
            max: AtomicU8::new(0),
            sink: RwLock::new(Sink::global()),
        }
    }

    pub fn device(&self) -> &'static str {
        self.device
    }

    /// Whether events of `block` at `level` are written: the check every trace point makes first.
    #[inline]
    pub fn on(&self, block: Block, level: Level) -> bool {
        self.levels[block as usize].load(Ordering::Relaxed) >= level as u8
    }

    /// Whether any block is traced at `level` or more.
    #[inline]
    pub fn any(&self, level: Level) -> bool {
        self.max.load(Ordering::Relaxed) >= level as u8
    }

    /// Applies `filter` to this device.
    pub fn set_filter(&self, filter: &Filter) {
        let levels = filter.levels(self.device);
        for (slot, level) in self.levels.iter().zip(levels) {
            slot.store(level as u8, Ordering::Relaxed);
        }
        let max = levels.iter().max().copied().unwrap_or(Level::Off);
        self.max.store(max as u8, Ordering::Relaxed);
    }

    /// The level of each block that is on, for `{"cmd":"trace"}`.
    pub fn enabled(&self) -> Vec<(Block, Level)> {
        Block::ALL
            .iter()
            .zip(&self.levels)
            .filter_map(|(b, l)| {
                let level = Level::ALL.get(usize::from(l.load(Ordering::Relaxed))).copied()?;
                (level != Level::Off).then_some((*b, level))
            })
            .collect()
    }

    /// Sends this device's events to `sink` (tests, or a sink of its own).
    pub fn set_sink(&self, sink: Arc<Sink>) {
        *self.sink.write().unwrap_or_else(|e| e.into_inner()) = sink;
    }

    pub fn sink(&self) -> Arc<Sink> {
        self.sink.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Writes `event` of `block`; callers check [`Tracer::on`] first.
    pub fn emit(&self, block: Block, event: &Event) {
        self.sink().write(self.device, block, event);
    }

    /// A generic event: `kind` and its fields.
    pub fn event(&self, block: Block, level: Level, kind: &'static str, fields: &[(&'static str, Val)]) {
        if self.on(block, level) {
            self.emit(block, &Event { kind, head: None, fields });
        }
    }

    /// A register access, as `hfi1 W RCV_TID_FLOW_TABLE[ctxt 0][3] = 0x6f00000800 gen=0x1 FLOW_VALID`.
    pub fn register(&self, name: &RegisterName, write: bool, bar: u32, offset: u64, width: usize, value: u64) {
        let op = if write { "W" } else { "R" };
        let shown = name.name.clone().unwrap_or_else(|| format!("BAR{bar}+{offset:#x}"));
        let mut head = format!("{op} {shown} = {value:#x}");
        if !name.fields.is_empty() {
            head.push(' ');
            head.push_str(&name.fields);
        }
        let fields = [
            ("op", Val::Str(op)),
            ("reg", Val::Str(&shown)),
            ("bar", Val::Dec(u64::from(bar))),
            ("offset", Val::Hex(offset)),
            ("width", Val::Dec(width as u64)),
            ("value", Val::Hex(value)),
            ("fields", Val::Str(&name.fields)),
        ];
        self.emit(name.block, &Event { kind: "mmio", head: Some(head), fields: &fields });
    }
}

#[cfg(test)]
mod tests;
