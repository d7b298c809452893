//! Trace filters in the `RUST_LOG` style: comma-separated directives `TARGET=LEVEL`, `TARGET` or `LEVEL`.
//!
//! A target is `DEVICE`, `DEVICE::BLOCK` or `*::BLOCK` (`hfi1`, `irdma::cqp`, `*::dma`); a bare `LEVEL`
//! applies to everything and a bare `TARGET` means `TARGET=trace`. The most specific directive that matches
//! an event's device and block decides: `DEVICE::BLOCK`, then `*::BLOCK`, then `DEVICE`, then the bare level;
//! among equals the last one wins. Examples: `hfi1::flow=debug`, `irdma=info,irdma::dma=trace`, `off`.

#![forbid(unsafe_code)]

use std::fmt;

use super::kinds::{Block, Level};

#[derive(Debug, Clone, PartialEq, Eq)]
struct Directive {
    /// `None`: any device (`*` or a bare level).
    device: Option<String>,
    block: Option<Block>,
    level: Level,
}

impl Directive {
    /// Higher is more specific.
    fn rank(&self) -> u8 {
        match (&self.device, &self.block) {
            (Some(_), Some(_)) => 3,
            (None, Some(_)) => 2,
            (Some(_), None) => 1,
            (None, None) => 0,
        }
    }
}

/// A parsed filter; [`Filter::levels`] compiles it for one device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    directives: Vec<Directive>,
    text: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("trace filter directive \"{0}\": unknown level (off, error, warn, info, debug, trace)")]
    Level(String),
    #[error("trace filter directive \"{directive}\": unknown block \"{block}\" (blocks: {known})")]
    Block { directive: String, block: String, known: String },
    #[error("trace filter directive \"{0}\": a target is DEVICE, DEVICE::BLOCK or *::BLOCK")]
    Target(String),
}

impl Filter {
    /// Parses a filter; an empty string is "off".
    pub fn parse(text: &str) -> Result<Filter, FilterError> {
        let mut directives = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (target, level) = match part.split_once('=') {
                Some((t, l)) => {
                    (Some(t.trim()), Level::parse(l.trim()).ok_or_else(|| FilterError::Level(part.into()))?)
                }
                None => match Level::parse(part) {
                    Some(l) => (None, l),
                    None => (Some(part), Level::Trace),
                },
            };
            let (device, block) = match target {
                None => (None, None),
                Some(t) => {
                    let (dev, blk) = match t.split_once("::") {
                        Some((d, b)) => (d, Some(b)),
                        None => (t, None),
                    };
                    let valid_dev = !dev.is_empty() && dev.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
                    let wildcard = dev == "*" && blk.is_some();
                    if !valid_dev && !wildcard {
                        return Err(FilterError::Target(part.into()));
                    }
                    let block = blk
                        .map(|b| {
                            Block::parse(b).ok_or_else(|| FilterError::Block {
                                directive: part.into(),
                                block: b.into(),
                                known: Block::ALL.iter().map(|b| b.name()).collect::<Vec<_>>().join(", "),
                            })
                        })
                        .transpose()?;
                    ((dev != "*").then(|| dev.to_string()), block)
                }
            };
            directives.push(Directive { device, block, level });
        }
        Ok(Filter { directives, text: text.trim().to_string() })
    }

    /// The level each block of `device` is traced at.
    pub fn levels(&self, device: &str) -> [Level; Block::COUNT] {
        let mut out = [Level::Off; Block::COUNT];
        for (slot, block) in out.iter_mut().zip(Block::ALL) {
            let mut best: Option<&Directive> = None;
            for d in &self.directives {
                let dev_ok = d.device.as_deref().is_none_or(|x| x == device);
                let blk_ok = d.block.is_none_or(|b| b == block);
                if dev_ok && blk_ok && best.is_none_or(|b| d.rank() >= b.rank()) {
                    best = Some(d);
                }
            }
            *slot = best.map_or(Level::Off, |d| d.level);
        }
        out
    }

    /// Whether the filter names `device` (or every device).
    pub fn mentions(&self, device: &str) -> bool {
        self.directives.iter().any(|d| d.device.as_deref().is_none_or(|x| x == device))
    }
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.text.is_empty() { "off" } else { &self.text })
    }
}
