//! What the host reads from the device model, parsed in one place: the hfi1 `dump` (contexts, flows,
//! valid RcvArray entries, counters; see device-model `Rxe::dump`) and the `dma_maps` reply (the DMA_MAPs
//! the device model received from QEMU).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::abi::RCV_CTXT_CTRL_ENABLE_SMASK;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("device-model {what}: {error}")]
pub struct DumpError {
    pub what: &'static str,
    pub error: String,
}

/// A u64 the device model writes as a hex string ("0x1f") or a plain number.
fn hex_or_number<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match Value::deserialize(d)? {
        Value::Number(n) => n.as_u64().ok_or_else(|| serde::de::Error::custom(format!("{n} is not a u64"))),
        Value::String(s) => {
            let t = s.trim();
            let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => t.parse(),
            };
            parsed.map_err(|e| serde::de::Error::custom(format!("{s:?}: {e}")))
        }
        other => Err(serde::de::Error::custom(format!("{other} is not a number or hex string"))),
    }
}

fn hex_map<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, u64>, D::Error> {
    #[derive(Deserialize)]
    struct H(#[serde(deserialize_with = "hex_or_number")] u64);
    let m = BTreeMap::<String, H>::deserialize(d)?;
    Ok(m.into_iter().map(|(k, H(v))| (k, v)).collect())
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Flow {
    pub flow: u32,
    #[serde(deserialize_with = "hex_or_number")]
    pub raw: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Context {
    pub ctxt: u32,
    #[serde(default, deserialize_with = "hex_map")]
    pub csrs: BTreeMap<String, u64>,
    /// First RcvArray entry of the expected range and its length, from RCV_TID_CTRL.
    pub tid_base: u64,
    pub tid_count: u64,
    #[serde(default)]
    pub flows: Vec<Flow>,
}

impl Context {
    pub fn rcv_ctxt_ctrl(&self) -> Option<u64> {
        self.csrs.get("RCV_CTXT_CTRL").copied()
    }

    pub fn enabled(&self) -> bool {
        self.rcv_ctxt_ctrl().is_some_and(|c| c & RCV_CTXT_CTRL_ENABLE_SMASK != 0)
    }

    /// The flow's raw value; the dump lists only non-zero flows, so a missing one reads 0.
    pub fn flow(&self, flow: u32) -> u64 {
        self.flows.iter().find(|f| f.flow == flow).map_or(0, |f| f.raw)
    }

    /// Whether absolute RcvArray index `index` is in this context's expected range.
    pub fn owns(&self, index: u64) -> bool {
        index >= self.tid_base && index < self.tid_base + self.tid_count
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Entry {
    pub index: u64,
    #[serde(deserialize_with = "hex_or_number")]
    pub addr: u64,
    /// Bytes.
    pub buf_size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dump {
    pub global: BTreeMap<String, u64>,
    pub contexts: Vec<Context>,
    /// Valid entries by absolute index.
    pub entries: BTreeMap<u64, Entry>,
    pub counters: BTreeMap<String, u64>,
}

#[derive(Deserialize)]
struct RawDump {
    #[serde(default, deserialize_with = "hex_map")]
    global: BTreeMap<String, u64>,
    contexts: Vec<Context>,
    rcv_array: Vec<Entry>,
    #[serde(default)]
    counters: BTreeMap<String, u64>,
}

impl Dump {
    pub fn parse(result: &Value) -> Result<Self, DumpError> {
        let raw = RawDump::deserialize(result).map_err(|e| DumpError { what: "dump", error: e.to_string() })?;
        Ok(Self {
            global: raw.global,
            contexts: raw.contexts,
            entries: raw.rcv_array.into_iter().map(|e| (e.index, e)).collect(),
            counters: raw.counters,
        })
    }

    pub fn context(&self, ctxt: u32) -> Option<&Context> {
        self.contexts.iter().find(|c| c.ctxt == ctxt)
    }

    pub fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    /// Valid entries in `ctxt`'s expected range.
    pub fn context_entries<'a>(&'a self, ctxt: &'a Context) -> impl Iterator<Item = &'a Entry> + 'a {
        self.entries.range(ctxt.tid_base..ctxt.tid_base + ctxt.tid_count).map(|(_, e)| e)
    }
}

/// vfio-user DMA_MAP flags: VFIO_USER_F_DMA_REGION_READ (bit 0), VFIO_USER_F_DMA_REGION_WRITE (bit 1).
pub const DMA_REGION_WRITE: u64 = 1 << 1;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct DmaMap {
    #[serde(deserialize_with = "hex_or_number")]
    pub iova: u64,
    #[serde(deserialize_with = "hex_or_number")]
    pub size: u64,
    /// Whether the map came with a file (guest RAM's memfd): then `offset` is the file offset, which is the
    /// guest-physical address for q35 RAM below 4 GiB.
    pub fd: bool,
    #[serde(default, deserialize_with = "hex_or_number")]
    pub offset: u64,
    #[serde(deserialize_with = "hex_or_number")]
    pub flags: u64,
}

impl DmaMap {
    /// The file offset of `iova` (inside this map).
    pub fn offset_of(&self, iova: u64) -> u64 {
        self.offset + (iova - self.iova)
    }
}

/// The DMA_MAPs in force, by IOVA.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DmaMaps {
    by_iova: BTreeMap<u64, DmaMap>,
}

impl DmaMaps {
    /// `{"maps":[{"iova":"0x…","size":"0x…","fd":true,"offset":"0x…","flags":3}, …]}`.
    pub fn parse(result: &Value) -> Result<Self, DumpError> {
        #[derive(Deserialize)]
        struct Raw {
            maps: Vec<DmaMap>,
        }
        let raw = Raw::deserialize(result).map_err(|e| DumpError { what: "dma_maps", error: e.to_string() })?;
        Ok(Self::from_maps(raw.maps))
    }

    pub fn from_maps(maps: Vec<DmaMap>) -> Self {
        Self { by_iova: maps.into_iter().filter(|m| m.size > 0).map(|m| (m.iova, m)).collect() }
    }

    pub fn len(&self) -> usize {
        self.by_iova.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_iova.is_empty()
    }

    /// The map holding `iova` (maps do not overlap: the device model refuses overlapping DMA_MAPs).
    pub fn lookup(&self, iova: u64) -> Option<&DmaMap> {
        self.by_iova.range(..=iova).next_back().map(|(_, m)| m).filter(|m| iova - m.iova < m.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dump_fields_parse_from_hex_strings_and_numbers() {
        let v = json!({
            "global": {"RCV_CONTEXTS": "0x8", "RCV_ARRAY_CNT": "0x1000"},
            "contexts": [{"ctxt": 2, "csrs": {"RCV_CTXT_CTRL": "0x11"}, "tid_base": 512, "tid_count": 256,
                          "flows": [{"flow": 3, "raw": "0xf091a2800", "decoded": {}}]}],
            "rcv_array": [{"index": 512, "raw": "0x8000001000012345", "buf_size_code": 1, "buf_size": 4096,
                           "addr": "0x12345000"}],
            "loopback": {}, "counters": {"rx_placed": 7}
        });
        let d = Dump::parse(&v).unwrap();
        assert_eq!(d.global["RCV_CONTEXTS"], 8);
        let c = d.context(2).unwrap();
        assert!(c.enabled() && c.owns(512) && c.owns(767) && !c.owns(768));
        assert_eq!((c.flow(3), c.flow(4)), (0xf_091a_2800, 0));
        assert_eq!(d.entries[&512], Entry { index: 512, addr: 0x1234_5000, buf_size: 4096 });
        assert_eq!(d.counter("rx_placed"), 7);
        assert_eq!(d.context_entries(c).count(), 1);
    }

    #[test]
    fn a_dump_without_the_rcv_array_is_an_error() {
        let e = Dump::parse(&json!({"contexts": []})).unwrap_err();
        assert_eq!(e.what, "dump");
    }

    #[test]
    fn dma_maps_are_looked_up_by_any_iova_inside_them() {
        let v = json!({"maps": [
            {"iova": "0x10000", "size": "0x1000", "fd": true, "offset": "0x7f000", "flags": 3},
            {"iova": "0x12000", "size": "0x2000", "fd": false, "offset": "0x0", "flags": 1}
        ]});
        let m = DmaMaps::parse(&v).unwrap();
        assert_eq!(m.lookup(0x10fff).map(|m| m.offset_of(0x10fff)), Some(0x7ffff));
        assert_eq!(m.lookup(0x11000), None);
        assert_eq!(m.lookup(0x13fff).map(|m| m.fd), Some(false));
        assert_eq!(m.lookup(0xffff), None);
        assert!(DmaMaps::parse(&json!({"maps": [{"iova": "zz", "size": 1, "fd": true, "flags": 3}]})).is_err());
    }
}
