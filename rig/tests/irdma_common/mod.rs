//! Shared data of the irdma integration tests.

use udriver::irdma::qhash::{IrdmaQhashTableInfo, IrdmaQuadEntryType, IrdmaQuadHashManageType, IrdmaVsiQos};

/// G9's IPv4 SYN listener (hardware-facts.md, golden examples): QP 5, MAC 00:11:22:33:44:55, local
/// 10.0.0.1, on `port`.
pub fn listener(manage: IrdmaQuadHashManageType, port: u16) -> IrdmaQhashTableInfo {
    IrdmaQhashTableInfo {
        vsi: IrdmaVsiQos::default(),
        manage,
        entry_type: IrdmaQuadEntryType::IrdmaQhashTypeTcpSyn,
        vlan_valid: false,
        ipv4_valid: true,
        mac_addr: [0x00, 0x11, 0x22, 0x33, 0x44, 0x55],
        vlan_id: 0,
        user_pri: 0,
        qp_num: 5,
        dest_ip: [0x0A00_0001, 0, 0, 0],
        src_ip: [0; 4],
        dest_port: port,
        src_port: 0,
    }
}
