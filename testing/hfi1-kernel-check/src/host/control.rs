//! A client of the device model's control socket: JSON lines over a UNIX socket, request
//! `{"device":NAME,"cmd":...}`, reply `{"ok":true,"result":...}` or `{"ok":false,"error":"..."}`.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::dump::{DmaMaps, Dump, DumpError};
use crate::channel::{ChannelError, LineChannel};
use crate::errno::io_error_name;

/// Longest reply taken: a dump of a full RcvArray (65536 valid entries) is some megabytes.
const MAX_REPLY: usize = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("connect to the device model's control socket {path}: {errno}")]
    Connect { path: String, errno: String },
    #[error("control socket, {cmd}: {source}")]
    Channel { cmd: String, source: ChannelError },
    #[error("the device model refused {cmd}: {error}")]
    Refused { cmd: String, error: String },
    #[error("the device model's reply to {cmd} has no result: {reply}")]
    BadReply { cmd: String, reply: String },
    #[error(transparent)]
    Parse(#[from] DumpError),
    #[error("device {device:?} is not on the control socket (devices: {names})")]
    NoDevice { device: String, names: String },
}

pub struct ControlClient {
    chan: LineChannel<UnixStream>,
    device: String,
    timeout: Duration,
}

/// One expected-receive packet as `inject` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectPacket {
    pub ctxt: u32,
    pub flow: u32,
    pub tid: u32,
    pub tidctrl: u32,
    /// KDETH OFFSET, in OM units.
    pub offset: u32,
    pub om: bool,
    pub generation: u32,
    pub sequence: u32,
    pub payload: Vec<u8>,
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

impl ControlClient {
    pub fn connect(path: &Path, device: &str, timeout: Duration) -> Result<Self, ControlError> {
        let stream = UnixStream::connect(path)
            .map_err(|e| ControlError::Connect { path: path.display().to_string(), errno: io_error_name(&e) })?;
        let chan = LineChannel::new(stream)
            .map_err(|source| ControlError::Channel { cmd: "connect".into(), source })?
            .with_max_line(MAX_REPLY);
        Ok(Self { chan, device: device.to_string(), timeout })
    }

    /// Sends a request and returns the reply's `result`.
    fn request(&mut self, cmd: &str, request: Value) -> Result<Value, ControlError> {
        let channel = |source| ControlError::Channel { cmd: cmd.to_string(), source };
        self.chan.send(&request, self.timeout).map_err(channel)?;
        let reply: Value = self.chan.recv(&format!("the reply to {cmd}"), self.timeout).map_err(channel)?;
        match reply.get("ok").and_then(Value::as_bool) {
            Some(true) => reply
                .get("result")
                .cloned()
                .ok_or_else(|| ControlError::BadReply { cmd: cmd.to_string(), reply: reply.to_string() }),
            Some(false) => Err(ControlError::Refused {
                cmd: cmd.to_string(),
                error: reply.get("error").and_then(Value::as_str).unwrap_or("(no error text)").to_string(),
            }),
            None => Err(ControlError::BadReply { cmd: cmd.to_string(), reply: reply.to_string() }),
        }
    }

    /// `cmd` for our device, with extra fields.
    fn call(&mut self, cmd: &str, fields: Map<String, Value>) -> Result<Value, ControlError> {
        let mut req = fields;
        req.insert("device".into(), json!(self.device));
        req.insert("cmd".into(), json!(cmd));
        self.request(cmd, Value::Object(req))
    }

    /// Fails unless our device is on the socket.
    pub fn check_device(&mut self) -> Result<(), ControlError> {
        let list = self.request("list", json!({"cmd": "list"}))?;
        let names: Vec<String> = list
            .as_array()
            .map(|a| a.iter().filter_map(|d| d.get("name").and_then(Value::as_str)).map(String::from).collect())
            .unwrap_or_default();
        if names.contains(&self.device) {
            return Ok(());
        }
        Err(ControlError::NoDevice { device: self.device.clone(), names: names.join(", ") })
    }

    pub fn dump(&mut self) -> Result<Dump, ControlError> {
        Ok(Dump::parse(&self.call("dump", Map::new())?)?)
    }

    pub fn dma_maps(&mut self) -> Result<DmaMaps, ControlError> {
        Ok(DmaMaps::parse(&self.call("dma_maps", Map::new())?)?)
    }

    /// Injects one packet; returns the result name (`placed`, `gen_mismatch`, …).
    pub fn inject(&mut self, p: &InjectPacket) -> Result<String, ControlError> {
        let mut fields = Map::new();
        for (k, v) in [
            ("ctxt", p.ctxt),
            ("flow", p.flow),
            ("tid", p.tid),
            ("tidctrl", p.tidctrl),
            ("offset", p.offset),
            ("om", u32::from(p.om)),
            ("generation", p.generation),
            ("sequence", p.sequence),
        ] {
            fields.insert(k.into(), json!(v));
        }
        fields.insert("payload_hex".into(), json!(hex(&p.payload)));
        let result = self.call("inject", fields)?;
        result
            .get("result")
            .and_then(Value::as_str)
            .map(String::from)
            .ok_or_else(|| ControlError::BadReply { cmd: "inject".into(), reply: result.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_hex_is_two_lowercase_digits_per_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
    }

    #[test]
    fn a_missing_control_socket_is_a_connect_error_with_the_errno() {
        let e = ControlClient::connect(Path::new("/nonexistent/dm.sock"), "hfi1-wfr", Duration::from_secs(1)).err();
        assert!(matches!(e, Some(ControlError::Connect { ref errno, .. }) if errno == "ENOENT"), "{e:?}");
    }
}
