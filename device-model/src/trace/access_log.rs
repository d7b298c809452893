//! The register accesses of a client session: totals, and the last few with the kernel's names, so that a
//! driver that stalls can be shown where it stood (`{"cmd":"accesses"}`). Kept by the PCI function for every
//! engine that asks for it (the hfi1 chip personality) or when the control socket turns it on. A FLR does
//! not clear it (it is the session's record, not device state); a new client does.

#![forbid(unsafe_code)]

use std::collections::VecDeque;

use super::kinds::RegisterName;

/// Accesses kept for the dump.
pub const RECENT: usize = 64;

#[derive(Debug, Clone, Copy)]
struct Entry {
    seq: u64,
    write: bool,
    bar: u32,
    offset: u64,
    value: u64,
}

#[derive(Debug, Default)]
pub struct AccessLog {
    reads: u64,
    writes: u64,
    /// Accesses to offsets the engine's register list does not name: gaps in what the model knows.
    unnamed: u64,
    recent: VecDeque<Entry>,
}

impl AccessLog {
    pub fn record(&mut self, write: bool, bar: u32, offset: u64, value: u64, named: bool) {
        let seq = self.reads + self.writes;
        if write {
            self.writes += 1;
        } else {
            self.reads += 1;
        }
        if !named {
            self.unnamed += 1;
        }
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(Entry { seq, write, bar, offset, value });
    }

    /// Totals and the recent accesses, oldest first, e.g.
    /// `{"seq":7,"op":"W","offset":"0x1800000","csr":"SEND_CTRL","value":"0x0","fields":""}`.
    pub fn dump(&self, name: impl Fn(u32, u64, u64) -> RegisterName) -> serde_json::Value {
        let recent: Vec<serde_json::Value> = self
            .recent
            .iter()
            .map(|e| {
                let n = name(e.bar, e.offset, e.value);
                serde_json::json!({
                    "seq": e.seq,
                    "op": if e.write { "W" } else { "R" },
                    "bar": e.bar,
                    "offset": format!("{:#x}", e.offset),
                    "csr": n.name,
                    "block": n.block.name(),
                    "value": format!("{:#x}", e.value),
                    "fields": n.fields,
                })
            })
            .collect();
        serde_json::json!({"reads": self.reads, "writes": self.writes, "unnamed": self.unnamed, "recent": recent})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::kinds::Block;

    #[test]
    fn keeps_totals_and_the_last_accesses_by_name() {
        let mut log = AccessLog::default();
        for i in 0..(RECENT as u64 + 10) {
            log.record(i % 2 == 0, 0, 0x1800000, i, true);
        }
        let name = |_, o, _| RegisterName {
            block: Block::Txe,
            name: (o == 0x1800000).then(|| "SEND_CTRL".to_string()),
            fields: String::new(),
        };
        let d = log.dump(name);
        assert_eq!((d["reads"].as_u64(), d["writes"].as_u64()), (Some(37), Some(37)));
        let recent = d["recent"].as_array().unwrap();
        assert_eq!(recent.len(), RECENT);
        assert_eq!(recent[0]["seq"], 10);
        assert_eq!(recent[RECENT - 1]["csr"], "SEND_CTRL");
        assert_eq!(recent[RECENT - 1]["block"], "txe");
        assert_eq!(d["unnamed"], 0);
        log.record(false, 0, 0x70_0000, 0, false);
        assert_eq!(log.dump(name)["unnamed"], 1);
    }
}
