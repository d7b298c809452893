//! The reference's golden quad-hash entries (hardware-facts.md, golden example G9), for tests and demos of
//! this driver and of its users: the ESTABLISHED entry and the two listeners whose WQEs G9 gives bit for bit.

#![forbid(unsafe_code)]

use super::qhash::{IrdmaQhashTableInfo, IrdmaQuadEntryType, IrdmaQuadHashManageType, IrdmaVsiQos};

/// G9's ESTABLISHED entry: local 10.0.0.1:4791, remote 10.0.0.2:5000, QP 5, MAC 00:11:22:33:44:55.
pub fn g9_established() -> IrdmaQhashTableInfo {
    IrdmaQhashTableInfo {
        vsi: IrdmaVsiQos::default(),
        manage: IrdmaQuadHashManageType::IrdmaQhashManageTypeAdd,
        entry_type: IrdmaQuadEntryType::IrdmaQhashTypeTcpEstablished,
        vlan_valid: false,
        ipv4_valid: true,
        mac_addr: [0x00, 0x11, 0x22, 0x33, 0x44, 0x55],
        vlan_id: 0,
        user_pri: 0,
        qp_num: 5,
        dest_ip: [0x0A00_0001, 0, 0, 0],
        src_ip: [0x0A00_0002, 0, 0, 0],
        dest_port: 4791,
        src_port: 5000,
    }
}

/// G9's IPv4 SYN listener: the ESTABLISHED entry without its remote end.
pub fn g9_syn_listener() -> IrdmaQhashTableInfo {
    IrdmaQhashTableInfo {
        entry_type: IrdmaQuadEntryType::IrdmaQhashTypeTcpSyn,
        src_ip: [0; 4],
        src_port: 0,
        ..g9_established()
    }
}

/// G9's IPv6 listener on fe80::1, VLAN 100.
pub fn g9_ipv6_vlan_listener() -> IrdmaQhashTableInfo {
    IrdmaQhashTableInfo {
        ipv4_valid: false,
        vlan_valid: true,
        vlan_id: 100,
        dest_ip: [0xFE80_0000, 0, 0, 1],
        ..g9_syn_listener()
    }
}
