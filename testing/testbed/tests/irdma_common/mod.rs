//! Shared data of the irdma integration tests.

use udriver::irdma::golden::g9_syn_listener;
use udriver::irdma::qhash::{IrdmaQhashTableInfo, IrdmaQuadHashManageType};

/// G9's IPv4 SYN listener (hardware-facts.md, golden examples): QP 5, MAC 00:11:22:33:44:55, local
/// 10.0.0.1, on `port`.
pub fn listener(manage: IrdmaQuadHashManageType, port: u16) -> IrdmaQhashTableInfo {
    IrdmaQhashTableInfo { manage, dest_port: port, ..g9_syn_listener() }
}
