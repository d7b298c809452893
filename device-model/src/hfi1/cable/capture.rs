//! The cable's wire capture: a classic pcap file of link type ERF, one ERF record of type OPA_9B per packet,
//! which Wireshark decodes as Omni-Path (its erf dissector hands type 29 to the OPA 9B dissector, which hands
//! management datagrams to its OPA MAD dissector). The ERF record's interface number is the direction.

#![forbid(unsafe_code)]

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::wire::WirePacket;

/// pcap file header fields (pcap-savefile(5)): microsecond magic, version 2.4.
const PCAP_MAGIC_US: u32 = 0xA1B2_C3D4;
const PCAP_VERSION_MAJOR: u16 = 2;
const PCAP_VERSION_MINOR: u16 = 4;
const PCAP_SNAPLEN: u32 = 65535;
/// LINKTYPE_ERF: each pcap packet is one ERF record.
pub const LINKTYPE_ERF: u32 = 197;
const PCAP_FILE_HEADER: usize = 24;
const PCAP_RECORD_HEADER: usize = 16;

/// ERF record type of a bare Omni-Path 9B packet (ERF_TYPE_OPA_9B in Wireshark's wiretap/erf.h).
pub const ERF_TYPE_OPA_9B: u8 = 29;
/// Bytes of the ERF record header: timestamp, type, flags, rlen, lctr, wlen.
pub const ERF_HEADER: usize = 16;
/// ERF flags: bits 1:0 the capture interface; bit 2 a variable-length record.
const ERF_FLAG_VLEN: u8 = 0x4;

/// Which way a packet crossed: the ERF record's interface number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From end A (the first chip-personality function) to end B: interface 0.
    AToB = 0,
    /// From B to A: interface 1.
    BToA = 1,
}

/// An open capture file, bounded in size.
pub struct Capture {
    path: PathBuf,
    out: BufWriter<File>,
    written: u64,
    max_bytes: u64,
    /// Records left out because the file reached `max_bytes`.
    pub skipped: u64,
}

impl Capture {
    /// Creates (or truncates) `path` and writes the pcap header. `max_bytes` bounds the file.
    pub fn create(path: &Path, max_bytes: u64) -> std::io::Result<Capture> {
        let mut out = BufWriter::new(File::create(path)?);
        let mut h = Vec::with_capacity(PCAP_FILE_HEADER);
        h.extend_from_slice(&PCAP_MAGIC_US.to_le_bytes());
        h.extend_from_slice(&PCAP_VERSION_MAJOR.to_le_bytes());
        h.extend_from_slice(&PCAP_VERSION_MINOR.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes()); // thiszone
        h.extend_from_slice(&0u32.to_le_bytes()); // sigfigs
        h.extend_from_slice(&PCAP_SNAPLEN.to_le_bytes());
        h.extend_from_slice(&LINKTYPE_ERF.to_le_bytes());
        out.write_all(&h)?;
        Ok(Capture { path: path.to_path_buf(), out, written: h.len() as u64, max_bytes, skipped: 0 })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records one packet crossing in `dir` now; false if it was left out (the file is full or failed).
    pub fn write(&mut self, dir: Direction, packet: &WirePacket) -> bool {
        let record = erf_record(SystemTime::now(), dir, packet);
        let need = (PCAP_RECORD_HEADER + record.len()) as u64;
        if self.written + need > self.max_bytes {
            self.skipped += 1;
            return false;
        }
        let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let mut h = [0u8; PCAP_RECORD_HEADER];
        h[0..4].copy_from_slice(&(since.as_secs() as u32).to_le_bytes());
        h[4..8].copy_from_slice(&since.subsec_micros().to_le_bytes());
        h[8..12].copy_from_slice(&(record.len() as u32).to_le_bytes());
        h[12..16].copy_from_slice(&(record.len() as u32).to_le_bytes());
        if self.out.write_all(&h).and_then(|()| self.out.write_all(&record)).is_err() {
            self.skipped += 1;
            return false;
        }
        self.written += need;
        true
    }

    pub fn flush(&mut self) {
        let _ = self.out.flush();
    }
}

/// One ERF record: the header (timestamp as 32.32 fixed-point seconds, little-endian; the lengths
/// big-endian) and the packet.
pub fn erf_record(at: SystemTime, dir: Direction, packet: &WirePacket) -> Vec<u8> {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let frac = ((u64::from(since.subsec_nanos())) << 32) / 1_000_000_000;
    let ts = (since.as_secs() << 32) | frac;
    let len = packet.bytes.len();
    let mut r = Vec::with_capacity(ERF_HEADER + len);
    r.extend_from_slice(&ts.to_le_bytes());
    r.push(ERF_TYPE_OPA_9B);
    r.push(ERF_FLAG_VLEN | dir as u8);
    r.extend_from_slice(&((ERF_HEADER + len) as u16).to_be_bytes()); // rlen
    r.extend_from_slice(&0u16.to_be_bytes()); // lctr: no loss
    r.extend_from_slice(&(len as u16).to_be_bytes()); // wlen
    r.extend_from_slice(&packet.bytes);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn packet() -> WirePacket {
        let mut b = vec![0u8; 28 + 256];
        b[0] = 0xF0;
        b[1] = 0x2;
        let dwords = ((b.len() + 4) / 4) as u16;
        b[4..6].copy_from_slice(&dwords.to_be_bytes());
        b[8] = 0x64;
        WirePacket::seal(b, false, false).unwrap()
    }

    #[test]
    fn an_erf_record_carries_type_29_the_direction_and_both_lengths() {
        let at = UNIX_EPOCH + Duration::new(0x1234_5678, 500_000_000);
        let r = erf_record(at, Direction::BToA, &packet());
        assert_eq!(r.len(), 16 + 288);
        assert_eq!(u64::from_le_bytes(r[0..8].try_into().unwrap()), (0x1234_5678u64 << 32) | 0x8000_0000);
        assert_eq!((r[8], r[9]), (29, 0x4 | 1));
        assert_eq!(u16::from_be_bytes([r[10], r[11]]), 304);
        assert_eq!(u16::from_be_bytes([r[14], r[15]]), 288);
        assert_eq!(&r[16..18], &[0xF0, 0x2]);
    }

    #[test]
    fn a_capture_file_starts_with_an_erf_pcap_header_and_stops_at_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.pcap");
        let mut c = Capture::create(&path, 24 + 2 * (16 + 16 + 288)).unwrap();
        assert!(c.write(Direction::AToB, &packet()));
        assert!(c.write(Direction::BToA, &packet()));
        assert!(!c.write(Direction::AToB, &packet()));
        assert_eq!(c.skipped, 1);
        c.flush();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 24 + 2 * 320);
        assert_eq!(u32::from_le_bytes(bytes[0..4].try_into().unwrap()), 0xA1B2_C3D4);
        assert_eq!(u32::from_le_bytes(bytes[20..24].try_into().unwrap()), 197);
        // The second record's ERF flags name interface 1.
        assert_eq!(bytes[24 + 320 + 16 + 9], 0x4 | 1);
    }
}
