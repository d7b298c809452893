//! The cable's wire capture: a classic pcap file of link type ERF, one ERF record of type OPA_9B per packet,
//! which Wireshark decodes as Omni-Path (its erf dissector hands type 29 to the OPA 9B dissector, which hands
//! management datagrams to its OPA MAD dissector). The ERF record's interface number is the direction.

#![forbid(unsafe_code)]

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::wire::WirePacket;
use crate::output_file::{self, Existing, OutputError};

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

/// A capture file, bounded in size: opened by whoever asks for the capture ([`Capture::open`]), started (the
/// file truncated, the pcap header written) by the cable thread once it took it ([`Capture::start`]).
pub struct Capture {
    path: PathBuf,
    out: BufWriter<File>,
    written: u64,
    max_bytes: u64,
    /// Records left out because the file reached `max_bytes`.
    pub skipped: u64,
}

impl Capture {
    /// Opens `path` for a capture of at most `max_bytes`, creating it (0600) if missing, without changing what
    /// it holds: a symbolic link, a FIFO or anything else but a regular file is refused at once, never waited
    /// on ([`crate::output_file`]).
    pub fn open(path: &Path, max_bytes: u64) -> Result<Capture, OutputError> {
        let file = output_file::open(path, Existing::Keep)?;
        Ok(Capture { path: path.to_path_buf(), out: BufWriter::new(file), written: 0, max_bytes, skipped: 0 })
    }

    /// Empties the file and writes the pcap header: only once the capture is certain to run.
    pub fn start(mut self) -> std::io::Result<Capture> {
        self.out.get_ref().set_len(0)?;
        let mut h = Vec::with_capacity(PCAP_FILE_HEADER);
        h.extend_from_slice(&PCAP_MAGIC_US.to_le_bytes());
        h.extend_from_slice(&PCAP_VERSION_MAJOR.to_le_bytes());
        h.extend_from_slice(&PCAP_VERSION_MINOR.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes()); // thiszone
        h.extend_from_slice(&0u32.to_le_bytes()); // sigfigs
        h.extend_from_slice(&PCAP_SNAPLEN.to_le_bytes());
        h.extend_from_slice(&LINKTYPE_ERF.to_le_bytes());
        self.out.write_all(&h)?;
        self.written = h.len() as u64;
        Ok(self)
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
    use super::super::{Cable, End, LinkEvent, Neighbor, Phy, Port, QUEUE};
    use super::*;
    use crate::probe::Probe;
    use std::sync::{Arc, Condvar, Mutex, Weak};
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

    /// A port whose first received packet holds the cable thread until the gate opens (dropping the gate
    /// opens it, so a failing test does not leave the cable thread stuck).
    struct GatePort {
        probe: Arc<Probe>,
        /// (packets received, the gate open)
        state: Mutex<(usize, bool)>,
        changed: Condvar,
    }

    impl Port for GatePort {
        fn identity(&self) -> Neighbor {
            Neighbor::default()
        }
        fn probe(&self) -> Arc<Probe> {
            Arc::clone(&self.probe)
        }
        fn link(&self, _: LinkEvent) -> bool {
            true
        }
        fn receive(&self, _: WirePacket) {
            let mut s = self.state.lock().unwrap();
            s.0 += 1;
            self.changed.notify_all();
            while !s.1 {
                s = self.changed.wait(s).unwrap();
            }
        }
    }

    impl GatePort {
        /// Waits until `n` packets arrived.
        fn wait_received(&self, n: usize) -> bool {
            let s = self.state.lock().unwrap();
            let (s, _) = self.changed.wait_timeout_while(s, Duration::from_secs(10), |s| s.0 < n).unwrap();
            s.0 >= n
        }
        fn open(&self) {
            self.state.lock().unwrap().1 = true;
            self.changed.notify_all();
        }
    }

    struct Opener(Arc<GatePort>);
    impl Drop for Opener {
        fn drop(&mut self) {
            self.0.open();
        }
    }

    #[test]
    fn a_capture_the_busy_cable_refuses_leaves_the_file_as_it_was_and_one_it_takes_empties_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keep.pcap");
        std::fs::write(&path, b"precious").unwrap();
        let cable = Cable::new(Duration::ZERO).unwrap();
        let port = |probe| Arc::new(GatePort { probe, state: Mutex::new((0, false)), changed: Condvar::new() });
        let (a, b) = (port(Probe::new("hfi1-wfr")), port(Probe::new("hfi1-wfr1")));
        let weak = |p: &Arc<GatePort>| Arc::downgrade(&(Arc::clone(p) as Arc<dyn Port>));
        let (ea, eb) = (cable.end(End::A, weak(&a)), cable.end(End::B, weak(&b)));
        let _opener = Opener(Arc::clone(&b));
        ea.phy(Phy::Polling);
        eb.phy(Phy::Polling);
        // The cable thread delivers to B and is held there; what is sent meanwhile fills its queue.
        ea.transmit(packet());
        assert!(b.wait_received(1), "the cable delivered the first packet");
        (0..QUEUE).for_each(|_| ea.transmit(packet()));

        assert_eq!(ea.capture(Some(path.clone()), 1 << 20), Err("the cable is busy".to_string()));
        assert_eq!(std::fs::read(&path).unwrap(), b"precious", "untouched by a capture that did not start");

        b.open();
        assert!(b.wait_received(1 + QUEUE), "the cable's queue drained");
        ea.capture(Some(path.clone()), 1 << 20).expect("the cable takes the capture");
        ea.capture(None, 0).expect("stopped (and flushed)");
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), PCAP_FILE_HEADER, "emptied, then only the pcap header");
        assert_eq!(u32::from_le_bytes(bytes[0..4].try_into().unwrap()), PCAP_MAGIC_US);
        drop((ea, eb));
    }

    #[test]
    fn a_capture_into_a_fifo_or_through_a_symlink_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR).unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"precious").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let cable = Cable::new(Duration::ZERO).unwrap();
        let ea = Arc::new(cable.end(End::A, Weak::<GatePort>::new()));
        let _eb = cable.end(End::B, Weak::<GatePort>::new());
        for path in [fifo, link] {
            // Asked from a thread: the old open of a FIFO without a reader blocked for ever.
            let (tx, rx) = crossbeam_channel::bounded(1);
            let (end, p) = (Arc::clone(&ea), path.clone());
            std::thread::spawn(move || tx.send(end.capture(Some(p), 1 << 20)));
            let r = rx.recv_timeout(Duration::from_secs(10)).expect("the capture answers instead of blocking");
            assert!(r.is_err(), "{}: {r:?}", path.display());
        }
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    }

    #[test]
    fn a_capture_file_starts_with_an_erf_pcap_header_and_stops_at_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.pcap");
        let mut c = Capture::open(&path, 24 + 2 * (16 + 16 + 288)).unwrap().start().unwrap();
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
