//! The host's own records of a run, in its log directory: the device model's access totals at the edges of
//! each step with a deadline (`step-accesses`), what it saw when a step stalled (`stall-*.json`), and the host
//! times of the console markers (`host-times`).

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

use crate::pyfmt;

/// Trapped CSR reads and writes of the chip personality during one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Accesses {
    pub reads: i64,
    pub writes: i64,
    /// Accesses to offsets the chip's register list does not name.
    pub unnamed: i64,
}

/// A JSON object whose members keep the order they were added in.
#[derive(Debug, Clone, PartialEq)]
pub struct Ordered<T>(pub Vec<(String, T)>);

impl<T> Default for Ordered<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T> Ordered<T> {
    /// Sets `key`, in its old place if it had one.
    pub fn set(&mut self, key: &str, value: T) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key.to_string(), value)),
        }
    }

    pub fn get(&self, key: &str) -> Option<&T> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<T: Serialize> Serialize for Ordered<T> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let mut map = ser.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// `step-accesses`: lines `NAME start|end READS WRITES UNNAMED` (ci/run-qemu.sh writes them when the guest
/// announces a step's deadline and its end; `- - -` when the device model did not answer). A step's accesses
/// are the difference between its end and its start.
pub fn step_accesses(text: &str) -> Ordered<Accesses> {
    let mut starts: Ordered<[i64; 3]> = Ordered::default();
    let mut out = Ordered::default();
    for line in pyfmt::splitlines(text) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [name, edge, counts @ ..] = parts.as_slice() else { continue };
        let counts: Option<Vec<i64>> =
            counts.iter().map(|p| if p.bytes().all(|b| b.is_ascii_digit()) { p.parse().ok() } else { None }).collect();
        let Some(&[r, w, u]) = counts.as_deref() else { continue };
        match *edge {
            "start" => starts.set(name, [r, w, u]),
            "end" => {
                if let Some(i) = starts.0.iter().position(|(k, _)| k == name) {
                    let (_, [r0, w0, u0]) = starts.0.remove(i);
                    out.set(name, Accesses { reads: r - r0, writes: w - w0, unnamed: u - u0 });
                }
            }
            _ => {}
        }
    }
    out
}

/// The device model's last `n` CSR accesses of a chip-personality HFI (its `accesses` reply), one line each.
pub fn last_accesses(accesses: Option<&Value>, n: usize) -> Vec<String> {
    let recent = recent(accesses.and_then(|a| a.get("recent")));
    recent[recent.len().saturating_sub(n)..]
        .iter()
        .map(|a| {
            let at = if pyfmt::truthy(a.get("csr")) { a.get("csr") } else { a.get("offset") };
            format!(
                "#{} {} {} = {}",
                pyfmt::str_of(a.get("seq")),
                pyfmt::str_of(a.get("op")),
                pyfmt::str_of(at),
                pyfmt::str_of(a.get("value"))
            )
        })
        .collect()
}

/// The last `n` packets on the cable, as the device model's `link` reply lists them.
pub fn last_packets(link: Option<&Value>, n: usize) -> Vec<String> {
    let recent = recent(link.and_then(|l| l.get("cable")).and_then(|c| c.get("recent_packets")));
    recent[recent.len().saturating_sub(n)..].iter().map(|p| pyfmt::str_of(Some(p))).collect()
}

fn recent(v: Option<&Value>) -> &[Value] {
    v.and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[])
}

/// `host-times`: `MARK EPOCH-SECONDS` lines (`init`, `result_end`); the first of each mark counts.
pub fn host_marks(text: &str) -> Ordered<f64> {
    let mut marks = Ordered::default();
    for line in pyfmt::splitlines(text) {
        let (k, v) = line.split_once(' ').unwrap_or((line, ""));
        if marks.get(k).is_none() {
            if let Ok(t) = v.trim().parse::<f64>() {
                marks.set(k, t);
            }
        }
    }
    marks
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_steps_accesses_are_its_end_totals_less_its_start_totals() {
        let log = "kdriver-modprobe start 100 50 0\nkdriver-modprobe end 1100 450 2\n\
                   kdriver-rmmod start - - -\nkdriver-rmmod end 2000 900 2\nfabric-sm end 1 1 1\n";
        let got = step_accesses(log);
        assert_eq!(got.0, [("kdriver-modprobe".to_string(), Accesses { reads: 1000, writes: 400, unnamed: 2 })]);
    }

    #[test]
    fn the_stall_report_lists_the_last_accesses_by_csr_name_or_offset() {
        let acc = json!({"recent": [
            {"seq": 1, "op": "read", "csr": null, "offset": "0x10", "value": "0x0"},
            {"seq": 2, "op": "write", "csr": "SEND_DMA_STATUS[engine 0]", "offset": "0x2000", "value": "0x1"},
        ]});
        assert_eq!(last_accesses(Some(&acc), 16), ["#1 read 0x10 = 0x0", "#2 write SEND_DMA_STATUS[engine 0] = 0x1"]);
        assert_eq!(last_accesses(Some(&acc), 1).len(), 1);
        assert!(last_accesses(None, 16).is_empty());
    }
}
