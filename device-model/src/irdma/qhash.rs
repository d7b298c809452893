//! The quad-hash table the MANAGE_QUAD_HASH_TABLE_ENTRY WQE manages (hardware-facts §3.7).
//!
//! An entry is identified by everything the WQE says about the connection (type, IP version, VLAN, both
//! addresses and ports); the QPN, MAC and QS handle are its data, which MODIFY replaces.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use serde_json::{json, Value};

use super::{WqeError, IRDMA_EMU_MAX_QHASH_CAPACITY};

/// `enum irdma_quad_entry_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryType {
    TcpEstablished = 1,
    TcpSyn = 2,
    UdpUnicast = 3,
    UdpMcast = 4,
    RoceMcast = 5,
    Rocev2Hw = 6,
}

impl EntryType {
    pub const ALL: [EntryType; 6] = [
        EntryType::TcpEstablished,
        EntryType::TcpSyn,
        EntryType::UdpUnicast,
        EntryType::UdpMcast,
        EntryType::RoceMcast,
        EntryType::Rocev2Hw,
    ];

    pub fn from_code(code: u64) -> Option<Self> {
        Self::ALL.into_iter().find(|t| *t as u64 == code)
    }

    /// The kernel's enumerator name.
    pub fn name(self) -> &'static str {
        match self {
            EntryType::TcpEstablished => "IRDMA_QHASH_TYPE_TCP_ESTABLISHED",
            EntryType::TcpSyn => "IRDMA_QHASH_TYPE_TCP_SYN",
            EntryType::UdpUnicast => "IRDMA_QHASH_TYPE_UDP_UNICAST",
            EntryType::UdpMcast => "IRDMA_QHASH_TYPE_UDP_MCAST",
            EntryType::RoceMcast => "IRDMA_QHASH_TYPE_ROCE_MCAST",
            EntryType::Rocev2Hw => "IRDMA_QHASH_TYPE_ROCEV2_HW",
        }
    }
}

/// What identifies an entry. IP addresses are host-order u32 words, `[0]` most significant; an IPv4
/// address is word `[0]` alone (the others are 0). `dest` is the local side, `src` the remote side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QhashKey {
    pub entry_type: EntryType,
    pub ipv4: bool,
    /// VLAN id when VLANVALID.
    pub vlan: Option<u16>,
    pub dest_ip: [u32; 4],
    pub dest_port: u16,
    pub src_ip: [u32; 4],
    pub src_port: u16,
}

/// What an entry steers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QhashData {
    pub qpn: u32,
    /// 48-bit MAC, mac[0] in bits 47:40.
    pub mac: u64,
    pub qs_handle: u16,
}

/// A table with a fixed capacity.
#[derive(Debug)]
pub struct QhashTable {
    map: HashMap<QhashKey, QhashData>,
    capacity: usize,
}

impl QhashTable {
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.min(IRDMA_EMU_MAX_QHASH_CAPACITY);
        // Twice the capacity so that churn at a full table rehashes in place rather than reallocating
        // (no allocation per WQE in steady state).
        Self { map: HashMap::with_capacity(capacity * 2), capacity }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }

    pub fn get(&self, key: &QhashKey) -> Option<&QhashData> {
        self.map.get(key)
    }

    pub fn add(&mut self, key: QhashKey, data: QhashData) -> Result<(), WqeError> {
        if self.map.contains_key(&key) {
            return Err(WqeError::QhashDuplicate);
        }
        if self.map.len() >= self.capacity {
            return Err(WqeError::QhashFull);
        }
        self.map.insert(key, data);
        Ok(())
    }

    pub fn delete(&mut self, key: &QhashKey) -> Result<QhashData, WqeError> {
        self.map.remove(key).ok_or(WqeError::QhashMissing)
    }

    pub fn modify(&mut self, key: &QhashKey, data: QhashData) -> Result<(), WqeError> {
        let slot = self.map.get_mut(key).ok_or(WqeError::QhashMissing)?;
        *slot = data;
        Ok(())
    }

    /// Entries in key order, decoded for the control socket.
    pub fn to_json(&self) -> Value {
        let mut entries: Vec<_> = self.map.iter().collect();
        entries.sort_by_key(|(k, _)| **k);
        Value::Array(entries.into_iter().map(|(k, d)| entry_json(k, d)).collect())
    }
}

/// An address as text: `ip[0]` alone for IPv4, all four words for IPv6.
pub fn ip_to_string(ipv4: bool, ip: &[u32; 4]) -> String {
    if ipv4 {
        Ipv4Addr::from(ip[0]).to_string()
    } else {
        let bits = ip.iter().fold(0u128, |acc, w| (acc << 32) | u128::from(*w));
        Ipv6Addr::from(bits).to_string()
    }
}

pub fn mac_to_string(mac: u64) -> String {
    let b = mac.to_be_bytes();
    format!("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", b[2], b[3], b[4], b[5], b[6], b[7])
}

fn entry_json(k: &QhashKey, d: &QhashData) -> Value {
    json!({
        "entry_type": k.entry_type.name(),
        "ipv4": k.ipv4,
        "vlan": k.vlan,
        "dest_ip": ip_to_string(k.ipv4, &k.dest_ip),
        "dest_port": k.dest_port,
        "src_ip": ip_to_string(k.ipv4, &k.src_ip),
        "src_port": k.src_port,
        "qpn": d.qpn,
        "mac": mac_to_string(d.mac),
        "qs_handle": d.qs_handle,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(entry_type: EntryType, port: u16) -> QhashKey {
        QhashKey {
            entry_type,
            ipv4: true,
            vlan: None,
            dest_ip: [0x0A00_0001, 0, 0, 0],
            dest_port: port,
            src_ip: [0; 4],
            src_port: 0,
        }
    }

    const DATA: QhashData = QhashData { qpn: 5, mac: 0x0011_2233_4455, qs_handle: 0 };

    #[test]
    fn add_then_duplicate_add_is_refused() {
        let mut t = QhashTable::new(4);
        assert_eq!(t.add(key(EntryType::TcpSyn, 1), DATA), Ok(()));
        assert_eq!(t.add(key(EntryType::TcpSyn, 1), DATA), Err(WqeError::QhashDuplicate));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn same_addresses_with_another_entry_type_are_a_different_entry() {
        let mut t = QhashTable::new(8);
        for ty in EntryType::ALL {
            assert_eq!(t.add(key(ty, 1), DATA), Ok(()));
        }
        assert_eq!(t.len(), 6);
    }

    #[test]
    fn delete_and_modify_of_a_missing_entry_fail() {
        let mut t = QhashTable::new(4);
        assert_eq!(t.delete(&key(EntryType::TcpSyn, 1)), Err(WqeError::QhashMissing));
        assert_eq!(t.modify(&key(EntryType::TcpSyn, 1), DATA), Err(WqeError::QhashMissing));
    }

    #[test]
    fn modify_replaces_the_data_and_delete_removes_the_entry() {
        let mut t = QhashTable::new(4);
        t.add(key(EntryType::TcpSyn, 1), DATA).unwrap();
        let new = QhashData { qpn: 9, ..DATA };
        assert_eq!(t.modify(&key(EntryType::TcpSyn, 1), new), Ok(()));
        assert_eq!(t.get(&key(EntryType::TcpSyn, 1)), Some(&new));
        assert_eq!(t.delete(&key(EntryType::TcpSyn, 1)), Ok(new));
        assert!(t.is_empty());
    }

    #[test]
    fn a_full_table_refuses_adds_until_an_entry_is_deleted() {
        let mut t = QhashTable::new(2);
        t.add(key(EntryType::TcpSyn, 1), DATA).unwrap();
        t.add(key(EntryType::TcpSyn, 2), DATA).unwrap();
        assert_eq!(t.add(key(EntryType::TcpSyn, 3), DATA), Err(WqeError::QhashFull));
        // A duplicate of a present entry is reported as a duplicate even when full.
        assert_eq!(t.add(key(EntryType::TcpSyn, 2), DATA), Err(WqeError::QhashDuplicate));
        t.delete(&key(EntryType::TcpSyn, 1)).unwrap();
        assert_eq!(t.add(key(EntryType::TcpSyn, 3), DATA), Ok(()));
    }

    #[test]
    fn addresses_and_macs_print_in_their_usual_notation() {
        assert_eq!(ip_to_string(true, &[0x0A00_0002, 0, 0, 0]), "10.0.0.2");
        assert_eq!(ip_to_string(false, &[0xFE80_0000, 0, 0, 1]), "fe80::1");
        assert_eq!(mac_to_string(0x0011_2233_4455), "00:11:22:33:44:55");
    }
}
