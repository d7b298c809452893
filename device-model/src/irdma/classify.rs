//! TCP segment classification against the quad-hash table.
//!
//! A SYN without ACK goes to the QP of the TCP_SYN listener for (local IP, local port, VLAN); any other
//! segment goes to the TCP_ESTABLISHED entry matching its full quad and VLAN; anything else goes to the
//! host stack. Matches are exact: a listener on a specific address does not catch other addresses (the
//! kernel's CM adds one listener entry per local address).

#![forbid(unsafe_code)]

use std::net::IpAddr;

use serde_json::{json, Value};

use super::qhash::{ip_to_string, EntryType, QhashKey, QhashTable};

/// An incoming TCP segment as the classifier sees it: the loopback descriptor's content, so one type from
/// the project's ABI. IP words as in the qhash table (`[0]` most significant, IPv4 in `[0]`).
pub use emu_abi::irdma::LbSegment as Segment;

/// Where a segment goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassifyTarget {
    ToHost,
    Established { qpn: u32 },
    Listener { qpn: u32 },
}

impl ClassifyTarget {
    /// Code in the loopback RESULT register: 0 = to host, otherwise the matched entry type's value.
    pub fn code(&self) -> u64 {
        match self {
            ClassifyTarget::ToHost => 0,
            ClassifyTarget::Established { .. } => EntryType::TcpEstablished as u64,
            ClassifyTarget::Listener { .. } => EntryType::TcpSyn as u64,
        }
    }

    pub fn qpn(&self) -> Option<u32> {
        match self {
            ClassifyTarget::ToHost => None,
            ClassifyTarget::Established { qpn } | ClassifyTarget::Listener { qpn } => Some(*qpn),
        }
    }

    pub fn to_json(&self) -> Value {
        match self {
            ClassifyTarget::ToHost => json!({"target": "host"}),
            ClassifyTarget::Established { qpn } => json!({"target": "established", "qpn": qpn}),
            ClassifyTarget::Listener { qpn } => json!({"target": "listener", "qpn": qpn}),
        }
    }
}

/// Classifies `seg` against `table`.
pub fn classify(table: &QhashTable, seg: &Segment) -> ClassifyTarget {
    if seg.syn && !seg.ack {
        let key = QhashKey {
            entry_type: EntryType::TcpSyn,
            ipv4: seg.ipv4,
            vlan: seg.vlan,
            dest_ip: seg.dst_ip,
            dest_port: seg.dst_port,
            src_ip: [0; 4],
            src_port: 0,
        };
        return table.get(&key).map_or(ClassifyTarget::ToHost, |d| ClassifyTarget::Listener { qpn: d.qpn });
    }
    let key = QhashKey {
        entry_type: EntryType::TcpEstablished,
        ipv4: seg.ipv4,
        vlan: seg.vlan,
        dest_ip: seg.dst_ip,
        dest_port: seg.dst_port,
        src_ip: seg.src_ip,
        src_port: seg.src_port,
    };
    table.get(&key).map_or(ClassifyTarget::ToHost, |d| ClassifyTarget::Established { qpn: d.qpn })
}

fn ip_words(addr: IpAddr) -> (bool, [u32; 4]) {
    match addr {
        IpAddr::V4(a) => (true, [u32::from(a), 0, 0, 0]),
        IpAddr::V6(a) => {
            let b = u128::from(a);
            (false, [(b >> 96) as u32, (b >> 64) as u32, (b >> 32) as u32, b as u32])
        }
    }
}

fn field<'a>(v: &'a Value, name: &str) -> Result<&'a Value, String> {
    v.get(name).ok_or_else(|| format!("missing field \"{name}\""))
}

fn port(v: &Value, name: &str) -> Result<u16, String> {
    field(v, name)?
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .ok_or_else(|| format!("\"{name}\" must be an integer 0..=65535"))
}

fn flag(v: &Value, name: &str) -> Result<bool, String> {
    match v.get(name) {
        None => Ok(false),
        Some(f) => f.as_bool().ok_or_else(|| format!("\"{name}\" must be a boolean")),
    }
}

fn ip(v: &Value, name: &str) -> Result<IpAddr, String> {
    field(v, name)?
        .as_str()
        .and_then(|s| s.parse::<IpAddr>().ok())
        .ok_or_else(|| format!("\"{name}\" must be an IPv4 or IPv6 address string"))
}

/// A segment as the control socket writes it.
pub trait SegmentJson: Sized {
    fn from_json(v: &Value) -> Result<Self, String>;
    fn to_json(&self) -> Value;
}

impl SegmentJson for Segment {
    /// From control JSON: `src_ip`, `dst_ip` (strings, same family), `src_port`, `dst_port`, optional
    /// `vlan` (0..=4095), optional booleans `syn`, `ack`.
    fn from_json(v: &Value) -> Result<Segment, String> {
        let (src_v4, src_ip) = ip_words(ip(v, "src_ip")?);
        let (dst_v4, dst_ip) = ip_words(ip(v, "dst_ip")?);
        if src_v4 != dst_v4 {
            return Err("src_ip and dst_ip must be the same IP version".into());
        }
        let vlan = match v.get("vlan") {
            None | Some(Value::Null) => None,
            Some(x) => Some(
                x.as_u64().filter(|id| *id < 4096).map(|id| id as u16).ok_or("\"vlan\" must be an integer 0..=4095")?,
            ),
        };
        Ok(Segment {
            ipv4: src_v4,
            src_ip,
            dst_ip,
            src_port: port(v, "src_port")?,
            dst_port: port(v, "dst_port")?,
            vlan,
            syn: flag(v, "syn")?,
            ack: flag(v, "ack")?,
        })
    }

    fn to_json(&self) -> Value {
        json!({
            "src_ip": ip_to_string(self.ipv4, &self.src_ip),
            "dst_ip": ip_to_string(self.ipv4, &self.dst_ip),
            "src_port": self.src_port,
            "dst_port": self.dst_port,
            "vlan": self.vlan,
            "syn": self.syn,
            "ack": self.ack,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::qhash::QhashData;
    use super::*;

    const LOCAL: [u32; 4] = [0x0A00_0001, 0, 0, 0];
    const REMOTE: [u32; 4] = [0x0A00_0002, 0, 0, 0];

    fn table() -> QhashTable {
        let mut t = QhashTable::new(8);
        let data = |qpn| QhashData { qpn, mac: 0x0011_2233_4455, qs_handle: 0 };
        let listener = QhashKey {
            entry_type: EntryType::TcpSyn,
            ipv4: true,
            vlan: None,
            dest_ip: LOCAL,
            dest_port: 4791,
            src_ip: [0; 4],
            src_port: 0,
        };
        t.add(listener, data(7)).unwrap();
        t.add(QhashKey { vlan: Some(100), ..listener }, data(8)).unwrap();
        let est = QhashKey { entry_type: EntryType::TcpEstablished, src_ip: REMOTE, src_port: 5000, ..listener };
        t.add(est, data(5)).unwrap();
        t
    }

    fn seg(syn: bool, ack: bool, src_port: u16, vlan: Option<u16>) -> Segment {
        Segment { ipv4: true, src_ip: REMOTE, dst_ip: LOCAL, src_port, dst_port: 4791, vlan, syn, ack }
    }

    #[test]
    fn segments_go_to_listener_established_qp_or_host() {
        let t = table();
        let cases = [
            (seg(true, false, 6000, None), ClassifyTarget::Listener { qpn: 7 }),
            (seg(true, false, 6000, Some(100)), ClassifyTarget::Listener { qpn: 8 }),
            (seg(true, false, 6000, Some(101)), ClassifyTarget::ToHost),
            (seg(false, true, 5000, None), ClassifyTarget::Established { qpn: 5 }),
            (seg(false, false, 5000, None), ClassifyTarget::Established { qpn: 5 }),
            // SYN+ACK is not a connection request: it needs the established quad.
            (seg(true, true, 5000, None), ClassifyTarget::Established { qpn: 5 }),
            (seg(true, true, 6000, None), ClassifyTarget::ToHost),
            (seg(false, true, 5001, None), ClassifyTarget::ToHost),
            (seg(false, true, 5000, Some(100)), ClassifyTarget::ToHost),
            (Segment { dst_port: 4792, ..seg(true, false, 6000, None) }, ClassifyTarget::ToHost),
        ];
        for (s, want) in cases {
            assert_eq!(classify(&t, &s), want, "{s:?}");
        }
    }

    #[test]
    fn ipv6_established_quads_match_with_their_vlan() {
        let local = [0xFE80_0000, 0, 0, 1];
        let remote = [0xFE80_0000, 0, 0, 2];
        let mut t = QhashTable::new(4);
        let key = QhashKey {
            entry_type: EntryType::TcpEstablished,
            ipv4: false,
            vlan: Some(7),
            dest_ip: local,
            dest_port: 80,
            src_ip: remote,
            src_port: 9000,
        };
        t.add(key, QhashData { qpn: 11, mac: 0, qs_handle: 0 }).unwrap();
        let s = Segment {
            ipv4: false,
            src_ip: remote,
            dst_ip: local,
            src_port: 9000,
            dst_port: 80,
            vlan: Some(7),
            syn: false,
            ack: true,
        };
        assert_eq!(classify(&t, &s), ClassifyTarget::Established { qpn: 11 });
        // The same words read as IPv4 are a different key.
        assert_eq!(classify(&t, &Segment { ipv4: true, ..s }), ClassifyTarget::ToHost);
        assert_eq!(classify(&t, &Segment { vlan: None, ..s }), ClassifyTarget::ToHost);
    }

    #[test]
    fn segment_json_parses_ipv6_words_most_significant_first() {
        let v =
            json!({"src_ip": "fe80::2", "dst_ip": "fe80::1", "src_port": 1, "dst_port": 2, "vlan": 100, "syn": true});
        let s = Segment::from_json(&v).unwrap();
        assert!(!s.ipv4);
        assert_eq!(s.dst_ip, [0xFE80_0000, 0, 0, 1]);
        assert_eq!((s.vlan, s.syn, s.ack), (Some(100), true, false));
    }

    #[test]
    fn hostile_segment_json_is_an_error_not_a_panic() {
        let bad = [
            json!({}),
            json!({"src_ip": "10.0.0.2", "dst_ip": "fe80::1", "src_port": 1, "dst_port": 2}),
            json!({"src_ip": "10.0.0.2", "dst_ip": "10.0.0.1", "src_port": 70000, "dst_port": 2}),
            json!({"src_ip": "10.0.0.2", "dst_ip": "10.0.0.1", "src_port": -1, "dst_port": 2}),
            json!({"src_ip": "10.0.0.2", "dst_ip": "10.0.0.1", "src_port": 1, "dst_port": 2, "vlan": 4096}),
            json!({"src_ip": "10.0.0.2", "dst_ip": "10.0.0.1", "src_port": 1, "dst_port": 2, "syn": "yes"}),
            json!({"src_ip": 5, "dst_ip": "10.0.0.1", "src_port": 1, "dst_port": 2}),
            json!([1, 2, 3]),
        ];
        for v in bad {
            assert!(Segment::from_json(&v).is_err(), "{v}");
        }
    }
}
