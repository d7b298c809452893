//! The live fabric as the guest's QP keeper reports it (testing/qp-keeper): one JSON line per report, the whole
//! current state. The packets are sent into the keeper's port as if from its peer: SLID = `peer_lid`,
//! DLID = `lid`.

use serde::Deserialize;

/// The KDETH QP prefix hfi1 programs into RCV_BTH_QP when the report carries none (RVT_KDETH_QP_PREFIX,
/// include/rdma/rdmavt_qp.h:35; chip.c init_kdeth_qp).
pub const DEFAULT_KDETH_QP: u8 = 0x80;
/// Where KDETH_QP sits in a DestQP (RVT_KDETH_QP_PREFIX_SHIFT, rdmavt_qp.h:38), above the receive context
/// (tid_rdma.c:197).
pub const KDETH_QP_SHIFT: u32 = 16;
pub const KDETH_CTXT_MASK: u32 = 0xFF;
/// QPNs and PSNs are 24-bit on the 9B wire (IB_QPN_MASK; BTH PSN, include/rdma/ib_hdrs.h).
pub const QPN_MASK: u32 = 0x00FF_FFFF;
pub const PSN_MASK: u32 = 0x00FF_FFFF;
/// The largest MTU an OPA port runs (hfi1's max_mtu, 10240).
pub const MAX_MTU: u32 = 10240;
/// The smallest IB MTU (IB_MTU_256).
pub const MIN_MTU: u32 = 256;

/// A QP's transport, as the keeper names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QpType {
    Rc,
    Uc,
    Ud,
}

/// One of the keeper's QPs in RTS.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Qp {
    #[serde(rename = "type")]
    pub kind: QpType,
    pub qpn: u32,
    /// The PSN the QP expects next from its peer (its rq_psn): requests carry it.
    pub psn: u32,
    /// The virtual peer's QPN (the QP's dest_qp_num): the source QP of what we send.
    pub peer_qpn: u32,
    /// The QP's own send PSN (its sq_psn): responses and ACKs for its requests carry PSNs around it.
    pub peer_psn: u32,
}

/// The keeper's memory region, registered for remote read, write and atomics.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Mr {
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
    pub lkey: u32,
}

/// The fabric's dictionary: what the packets draw their fields from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Target {
    pub generation: u64,
    pub device: String,
    pub port: u8,
    pub lid: u16,
    pub sm_lid: u16,
    pub peer_lid: u16,
    /// The port's active MTU in bytes.
    pub mtu: u32,
    /// The port's non-zero P_Key table entries.
    pub pkeys: Vec<u16>,
    /// The Q_Key of the keeper's UD QPs.
    pub qkey: u32,
    pub sl: u8,
    pub qps: Vec<Qp>,
    pub mr: Mr,
    pub recreated: u64,
    /// RCV_BTH_QP.KDETH_QP: DestQP[23:16] of a KDETH packet. Absent or null: the driver's constant (6.12 has
    /// no module parameter for it).
    #[serde(default = "default_kdeth_qp", deserialize_with = "kdeth_qp_or_default")]
    pub kdeth_qp: u8,
}

fn default_kdeth_qp() -> u8 {
    DEFAULT_KDETH_QP
}

fn kdeth_qp_or_default<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u8, D::Error> {
    Ok(Option::<u8>::deserialize(d)?.unwrap_or(DEFAULT_KDETH_QP))
}

/// Why a report line is not a dictionary the packets can use.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("the keeper's report is not the expected JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("the keeper's report has {field} = {value:#x}: {why}")]
    Field { field: String, value: u64, why: &'static str },
}

impl Target {
    /// Parses one report line (extra fields are ignored) and checks its values fit the wire's fields.
    pub fn parse(line: &str) -> Result<Target, TargetError> {
        let t: Target = serde_json::from_str(line.trim())?;
        let bad = |field: String, value: u64, why| Err(TargetError::Field { field, value, why });
        if !(MIN_MTU..=MAX_MTU).contains(&t.mtu) {
            return bad("mtu".into(), t.mtu.into(), "not an MTU an OPA port runs (256..=10240 bytes)");
        }
        if t.sl > 0xF {
            return bad("sl".into(), t.sl.into(), "the 9B LRH holds a 4-bit SL");
        }
        for (i, qp) in t.qps.iter().enumerate() {
            for (name, v, mask, why) in [
                ("qpn", qp.qpn, QPN_MASK, "QPNs are 24-bit"),
                ("peer_qpn", qp.peer_qpn, QPN_MASK, "QPNs are 24-bit"),
                ("psn", qp.psn, PSN_MASK, "PSNs are 24-bit"),
                ("peer_psn", qp.peer_psn, PSN_MASK, "PSNs are 24-bit"),
            ] {
                if v & !mask != 0 {
                    return bad(format!("qps[{i}].{name}"), v.into(), why);
                }
            }
        }
        Ok(t)
    }

    /// The DestQP of a KDETH packet for receive context `ctxt`.
    pub fn kdeth_destqp(&self, ctxt: u32) -> u32 {
        (u32::from(self.kdeth_qp) << KDETH_QP_SHIFT) | (ctxt & KDETH_CTXT_MASK)
    }

    /// The keeper's QPs of one transport, in report order.
    pub fn qps_of(&self, kind: QpType) -> impl Iterator<Item = &Qp> + '_ {
        self.qps.iter().filter(move |q| q.kind == kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"generation":3,"device":"hfi1_0","port":1,"lid":1,"sm_lid":1,"peer_lid":2,"mtu":4096,
        "pkeys":[65535,32767],"qkey":286331153,"sl":0,
        "qps":[{"type":"rc","qpn":18,"psn":100,"peer_qpn":2048,"peer_psn":200},
               {"type":"uc","qpn":19,"psn":300,"peer_qpn":2049,"peer_psn":400},
               {"type":"ud","qpn":20,"psn":0,"peer_qpn":2050,"peer_psn":0}],
        "mr":{"addr":140737488355328,"len":65536,"rkey":4660,"lkey":4661},"recreated":0,"extra":"ignored"}"#;

    #[test]
    fn a_keeper_report_parses_with_the_module_default_kdeth_qp() {
        let t = Target::parse(&LINE.replace('\n', " ")).unwrap();
        assert_eq!((t.lid, t.peer_lid, t.mtu, t.kdeth_qp), (1, 2, 4096, DEFAULT_KDETH_QP));
        assert_eq!(t.pkeys, [0xFFFF, 0x7FFF]);
        assert_eq!(t.qps_of(QpType::Rc).map(|q| q.qpn).collect::<Vec<_>>(), [18]);
        assert_eq!(t.mr.rkey, 0x1234);
        let with_kdeth = LINE.replace("\"recreated\":0", "\"recreated\":0,\"kdeth_qp\":129");
        assert_eq!(Target::parse(&with_kdeth).unwrap().kdeth_qp, 0x81);
        let null_kdeth = LINE.replace("\"recreated\":0", "\"recreated\":0,\"kdeth_qp\":null");
        assert_eq!(Target::parse(&null_kdeth).unwrap().kdeth_qp, DEFAULT_KDETH_QP);
    }

    #[test]
    fn reports_whose_values_do_not_fit_the_wire_are_refused() {
        let cases = [
            ("\"mtu\":4096", "\"mtu\":100", "mtu"),
            ("\"qpn\":18", "\"qpn\":16777216", "qps[0].qpn"),
            ("\"peer_psn\":200", "\"peer_psn\":16777216", "qps[0].peer_psn"),
            ("\"sl\":0", "\"sl\":16", "sl"),
        ];
        for (from, to, field) in cases {
            match Target::parse(&LINE.replace(from, to)) {
                Err(TargetError::Field { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{to}: {other:?}"),
            }
        }
        for bad in
            ["", "{}", "not json", &LINE.replace("\"rc\"", "\"rd\""), &LINE.replace("\"lid\":1,", "\"lid\":65536,")]
        {
            assert!(matches!(Target::parse(bad), Err(TargetError::Json(_))), "{bad}");
        }
    }
}
