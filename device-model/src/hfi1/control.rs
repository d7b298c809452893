//! Control-socket commands of the hfi1 engine (JSON objects): inject, dump, reset, counters, and on a
//! chip-personality function link, capture, wire, wire-batch and link-event.
//! Every field is checked; a hostile request gets an error, never a panic.

#![forbid(unsafe_code)]

use serde_json::Value;

use super::datapath::batch::{WIRE_BATCH_MAX, WIRE_BATCH_WAIT_DEFAULT_MS, WIRE_BATCH_WAIT_MAX_MS};
use super::datapath::loopback::LB_MAX_PAYLOAD;
use super::error::{Hfi1Error, Result};
use super::rxe::rcv::{Packet, GENERATION_MASK, HFI1_KDETH_BTH_SEQ_MASK, KDETH_OFFSET_MASK, PSN_MASK};

fn err(msg: impl Into<String>) -> Hfi1Error {
    Hfi1Error::Control(msg.into())
}

/// A required unsigned field no larger than `max`.
fn field(req: &Value, name: &str, max: u64) -> Result<u64> {
    let v = req.get(name).ok_or_else(|| err(format!("missing field \"{name}\"")))?;
    let n = v.as_u64().ok_or_else(|| err(format!("\"{name}\" must be an unsigned integer")))?;
    if n > max {
        return Err(err(format!("\"{name}\" = {n} exceeds {max}")));
    }
    Ok(n)
}

/// An optional field with a default.
fn field_or(req: &Value, name: &str, max: u64, default: u64) -> Result<u64> {
    match req.get(name) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(u64::from(*b).min(max)),
        Some(_) => field(req, name, max),
    }
}

fn decode_hex(s: &str) -> Result<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 2 * LB_MAX_PAYLOAD {
        return Err(err(format!("payload_hex must be an even number of hex digits, at most {LB_MAX_PAYLOAD} bytes")));
    }
    let digit = |c: u8| -> Result<u8> {
        (c as char).to_digit(16).map(|d| d as u8).ok_or_else(|| err("payload_hex has a non-hex character"))
    };
    s.as_bytes().chunks_exact(2).map(|p| Ok((digit(p[0])? << 4) | digit(p[1])?)).collect()
}

/// Hex bytes of any length (the caller bounds it).
fn decode_hex_any(s: &str) -> Result<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return Err(err("packet_hex must be an even number of hex digits"));
    }
    let digit = |c: u8| -> Result<u8> {
        (c as char).to_digit(16).map(|d| d as u8).ok_or_else(|| err("packet_hex has a non-hex character"))
    };
    s.as_bytes().chunks_exact(2).map(|p| Ok((digit(p[0])? << 4) | digit(p[1])?)).collect()
}

/// `{"cmd":"inject","ctxt":2,"flow":3,"tid":2,"tidctrl":1,"offset":16,"om":0,"psn":152709123,"payload_hex":"0102"}`.
/// `psn` may be replaced by `generation` + `sequence`.
fn parse_inject(req: &Value) -> Result<(Packet, Vec<u8>)> {
    let ctxt = field(req, "ctxt", 0xFF)? as u32;
    let flow = field(req, "flow", 0x1F)? as u32;
    let tid = field(req, "tid", 0x3FF)? as u32;
    let tidctrl = field(req, "tidctrl", 3)? as u32;
    let offset = field_or(req, "offset", u64::from(KDETH_OFFSET_MASK), 0)? as u32;
    let om = field_or(req, "om", 1, 0)? == 1;
    let psn = if req.get("psn").is_some() {
        field(req, "psn", u64::from(PSN_MASK))? as u32
    } else {
        let generation = field(req, "generation", u64::from(GENERATION_MASK))? as u32;
        let sequence = field(req, "sequence", u64::from(HFI1_KDETH_BTH_SEQ_MASK))? as u32;
        super::full_flow_psn(generation, sequence)
    };
    let hex =
        req.get("payload_hex").map_or(Some(""), Value::as_str).ok_or_else(|| err("payload_hex must be a string"))?;
    let payload = decode_hex(hex)?;
    let packet = Packet { kdeth0: Packet::kdeth0(offset, om, tid, tidctrl), dest_qp: Packet::dest_qp(ctxt, flow), psn };
    Ok((packet, payload))
}

/// `{"packet_hex":"..","sc4":0|1,"test_ebp":0|1}`: the wire's bytes, ICRC included, and the PBC's flags.
fn wire_packet(req: &Value) -> Result<crate::hfi1::cable::WirePacket> {
    use crate::hfi1::cable::wire::{MAX_PACKET_BYTES, MIN_PACKET_BYTES};
    let hex = req.get("packet_hex").and_then(Value::as_str).ok_or_else(|| err("wire needs \"packet_hex\""))?;
    if hex.len() > 2 * MAX_PACKET_BYTES {
        return Err(err(format!("packet_hex: at most {MAX_PACKET_BYTES} bytes")));
    }
    let bytes = decode_hex_any(hex)?;
    if bytes.len() < MIN_PACKET_BYTES || !bytes.len().is_multiple_of(4) {
        return Err(err(format!("a wire packet has at least {MIN_PACKET_BYTES} bytes in whole dwords")));
    }
    let flag = |name| field_or(req, name, 1, 0).map(|v| v == 1);
    Ok(crate::hfi1::cable::WirePacket { bytes, sc4: flag("sc4")?, test_ebp: flag("test_ebp")? })
}

/// A control request, checked field by field; the engine carries it out.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Command {
    Inject {
        packet: Packet,
        payload: Vec<u8>,
    },
    Dump,
    Reset,
    Counters,
    /// The port's link and the cable's counters.
    Link,
    /// A packet as if from the cable (the wire's bytes, ICRC included).
    Wire {
        packet: crate::hfi1::cable::WirePacket,
    },
    /// Packets as if from the cable, then a wait of at most `wait` for the driver to read them
    /// (datapath/batch.rs).
    WireBatch {
        packets: Vec<crate::hfi1::cable::WirePacket>,
        wait: std::time::Duration,
    },
    /// Link news as if from the cable.
    LinkEvent(crate::hfi1::cable::LinkEvent),
    /// Starts a wire capture into `file` (at most `max_bytes`), or stops it.
    Capture {
        file: Option<std::path::PathBuf>,
        max_bytes: u64,
    },
}

/// A capture file's default and largest size.
pub const CAPTURE_DEFAULT_MIB: u64 = 1024;
pub const CAPTURE_MAX_MIB: u64 = 1 << 20;

pub(super) fn parse(req: &Value) -> Result<Command> {
    let cmd = req.get("cmd").and_then(Value::as_str).ok_or_else(|| err("request needs a string \"cmd\""))?;
    Ok(match cmd {
        "inject" => {
            let (packet, payload) = parse_inject(req)?;
            Command::Inject { packet, payload }
        }
        "dump" => Command::Dump,
        "reset" => Command::Reset,
        "counters" => Command::Counters,
        "link" => Command::Link,
        "wire" => Command::Wire { packet: wire_packet(req)? },
        "wire-batch" => {
            let list = req
                .get("packets")
                .and_then(Value::as_array)
                .ok_or_else(|| err("wire-batch needs \"packets\": [...]"))?;
            if list.len() > WIRE_BATCH_MAX {
                return Err(err(format!("a batch holds at most {WIRE_BATCH_MAX} packets, not {}", list.len())));
            }
            let packets = list
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let packet = match p {
                        Value::String(_) => wire_packet(&serde_json::json!({ "packet_hex": p })),
                        Value::Object(_) => wire_packet(p),
                        _ => Err(err("a packet is a hex string or {\"packet_hex\":...}")),
                    };
                    packet.map_err(|e| match e {
                        Hfi1Error::Control(why) => err(format!("packets[{i}]: {why}")),
                        other => other,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let wait_ms = match req.get("wait_ms") {
                None => WIRE_BATCH_WAIT_DEFAULT_MS,
                Some(_) => field(req, "wait_ms", WIRE_BATCH_WAIT_MAX_MS)?,
            };
            Command::WireBatch { packets, wait: std::time::Duration::from_millis(wait_ms) }
        }
        "link-event" => {
            use crate::hfi1::cable::{LinkEvent, Neighbor, VerifyCapFrame};
            let u32_field = |name| field_or(req, name, u64::from(u32::MAX), 0).map(|v| v as u32);
            Command::LinkEvent(match req.get("event").and_then(Value::as_str) {
                Some("up") => LinkEvent::Up(Neighbor {
                    guid: field(req, "neighbor_guid", u64::MAX)?,
                    node_type: field_or(req, "node_type", 3, 0)? as u8,
                    port: field_or(req, "port", 0xFF, 1)? as u8,
                    verify_cap: VerifyCapFrame {
                        phy: u32_field("vc_phy")?,
                        fabric: u32_field("vc_fabric")?,
                        link_mode: u32_field("vc_link_mode")?,
                        device_id: u32_field("vc_device_id")?,
                        tx_rate: field_or(req, "vc_tx_rate", 0xFF, 0)? as u8,
                    },
                }),
                Some("idle") => LinkEvent::Idle(field(req, "message", u64::MAX)?),
                Some("down") => LinkEvent::Down {
                    reason: match req.get("reason") {
                        None | Some(Value::Null) => None,
                        Some(_) => Some(field(req, "reason", 0xFF)? as u8),
                    },
                },
                _ => return Err(err("link-event needs \"event\": \"up\", \"down\" or \"idle\"")),
            })
        }
        "capture" => {
            let file = match (req.get("file"), req.get("stop")) {
                (Some(Value::String(f)), None) if !f.is_empty() => Some(std::path::PathBuf::from(f)),
                (None, Some(Value::Bool(true))) => None,
                _ => return Err(err("capture needs \"file\": PATH or \"stop\": true")),
            };
            let mib = field_or(req, "max_mib", CAPTURE_MAX_MIB, CAPTURE_DEFAULT_MIB)?.max(1);
            Command::Capture { file, max_bytes: mib << 20 }
        }
        other => {
            return Err(err(format!(
            "unknown command \"{other}\" (inject, dump, reset, counters, link, capture, wire, wire-batch, link-event)"
        )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hex_payload_decodes_and_bad_hex_is_an_error() {
        assert_eq!(decode_hex("00ff10").ok(), Some(vec![0, 0xFF, 0x10]));
        for bad in ["0", "zz", "0g", "é0"] {
            assert!(matches!(decode_hex(bad), Err(Hfi1Error::Control(_))), "{bad}");
        }
        assert!(decode_hex(&"00".repeat(LB_MAX_PAYLOAD + 1)).is_err());
    }

    #[test]
    fn capture_takes_a_file_or_stop_and_refuses_anything_else() {
        let ok = [
            (json!({"cmd":"capture","file":"/tmp/w.pcap"}), Some("/tmp/w.pcap"), CAPTURE_DEFAULT_MIB << 20),
            (json!({"cmd":"capture","file":"/tmp/w.pcap","max_mib":2}), Some("/tmp/w.pcap"), 2 << 20),
            (json!({"cmd":"capture","stop":true}), None, CAPTURE_DEFAULT_MIB << 20),
        ];
        for (req, file, max_bytes) in ok {
            let want = Command::Capture { file: file.map(Into::into), max_bytes };
            assert_eq!(parse(&req).unwrap(), want, "{req}");
        }
        for bad in [
            json!({"cmd":"capture"}),
            json!({"cmd":"capture","file":""}),
            json!({"cmd":"capture","file":3}),
            json!({"cmd":"capture","file":"/x","stop":true}),
            json!({"cmd":"capture","file":"/x","max_mib":-1}),
        ] {
            assert!(matches!(parse(&bad), Err(Hfi1Error::Control(_))), "{bad}");
        }
    }

    #[test]
    fn wire_and_link_event_stand_in_for_the_cable() {
        use crate::hfi1::cable::{LinkEvent, Neighbor};
        let req = json!({"cmd":"wire","packet_hex":"f002ffff0007ffff64000000000000000000000001020304","sc4":1});
        let Command::Wire { packet } = parse(&req).unwrap() else { panic!() };
        assert_eq!((packet.bytes.len(), packet.sc4, packet.test_ebp), (24, true, false));
        let up = json!({"cmd":"link-event","event":"up","neighbor_guid":17});
        assert_eq!(
            parse(&up).unwrap(),
            Command::LinkEvent(LinkEvent::Up(Neighbor { guid: 17, node_type: 0, port: 1, ..Neighbor::default() }))
        );
        let down = json!({"cmd":"link-event","event":"down","reason":null});
        assert_eq!(parse(&down).unwrap(), Command::LinkEvent(LinkEvent::Down { reason: None }));
        let idle = json!({"cmd":"link-event","event":"idle","message":0x103});
        assert_eq!(parse(&idle).unwrap(), Command::LinkEvent(LinkEvent::Idle(0x103)));
        for bad in [
            json!({"cmd":"wire"}),
            json!({"cmd":"wire","packet_hex":"f0"}),
            json!({"cmd":"wire","packet_hex":"zz"}),
            json!({"cmd":"wire","packet_hex":"00".repeat(23)}),
            json!({"cmd":"link-event","event":"sideways"}),
            json!({"cmd":"link-event","event":"up"}),
            json!({"cmd":"link-event","event":"down","reason":300}),
        ] {
            assert!(matches!(parse(&bad), Err(Hfi1Error::Control(_))), "{bad}");
        }
    }

    #[test]
    fn inject_fields_build_the_packet() {
        let req = json!({"cmd":"inject","ctxt":2,"flow":3,"tid":2,"tidctrl":2,"offset":3,"om":1,
                         "generation":0x12345,"sequence":3,"payload_hex":"0506"});
        let (p, payload) = parse_inject(&req).unwrap();
        assert_eq!((p.ctxt(), p.flow(), p.tid(), p.tidctrl(), p.offset_bytes()), (2, 3, 2, 2, 192));
        assert_eq!(p.psn, 0x091A2803);
        assert_eq!(payload, [5, 6]);
    }
}
