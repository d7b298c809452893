use std::sync::Arc;

use proptest::prelude::*;

use super::seed::{seeds_from_records, Seed, SeedDevice, SeedFds, SeedItem};
use super::*;
use crate::dma::{DmaAccess, HeapMemory};
use crate::wire::{command, Header};

fn every_kind() -> Vec<Record> {
    let h = Header { msg_id: 7, command: command::REGION_READ, msg_size: 32, flags: 0, error: 0 };
    vec![
        Record::Message { header: h, payload: vec![1, 2, 3], fds: 0 },
        Record::Reply { header: Header { flags: 1, ..h }, payload: vec![9; 20], fds: 1 },
        Record::DmaRead { iova: 0x1000, data: vec![0xab; 64] },
        Record::DmaWrite { iova: 0x2000, len: 32, hash: content_hash(&[7; 32]) },
        Record::DmaFailed { iova: 0x3000, len: 8, write: true },
        Record::SharedRead { region: 0, offset: 0x120_0000, data: 0x8000_0010_0001_2345u64.to_le_bytes().to_vec() },
        Record::DeviceStep,
        Record::DeviceAccess,
        Record::ControlRequest { id: 1, text: r#"{"device":"hfi1","cmd":"dump"}"#.into() },
        Record::ControlReply { id: 1, text: r#"{"ok":true}"#.into() },
    ]
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("vfurec-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn every_record_kind_survives_encoding() {
    let header = serde_json::json!({"device": "irdma"});
    let file = encode_recording(&header, &every_kind());
    let (h, records, truncated) = RecordingReader::new(&file[..]).unwrap().records().unwrap();
    assert_eq!(h, header);
    assert_eq!(records, every_kind());
    assert!(!truncated);
}

#[test]
fn fnv1a_hash_matches_the_published_test_vectors() {
    // FNV-1a 64-bit test vectors (Fowler/Noll/Vo reference, "" and "a").
    assert_eq!(content_hash(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(content_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
    let mut h = ContentHash::new();
    h.update(b"fo");
    h.update(b"obar");
    assert_eq!(h.finish(), content_hash(b"foobar"));
    assert_eq!(content_hash(b"foobar"), 0x8594_4171_f739_67e8);
}

#[test]
fn a_truncated_last_record_ends_the_reading_cleanly() {
    let file = encode_recording(&serde_json::json!({}), &every_kind());
    for cut in 1..12 {
        let short = &file[..file.len() - cut];
        let (_, records, truncated) = RecordingReader::new(short).unwrap().records().unwrap();
        assert_eq!(records.len(), every_kind().len() - 1, "cut {cut}");
        assert!(truncated);
    }
}

#[test]
fn bad_magic_oversized_records_and_unknown_tags_are_errors() {
    assert!(matches!(RecordingReader::new(&b"NOTAREC!...."[..]), Err(RecordError::Magic)));
    let mut file = encode_recording(&serde_json::json!({}), &[]);
    file.push(3);
    file.extend_from_slice(&(MAX_RECORD as u32 + 1).to_le_bytes());
    let mut r = RecordingReader::new(&file[..]).unwrap();
    assert!(matches!(r.next_record(), Err(RecordError::Malformed { index: 0, .. })));
    let mut file = encode_recording(&serde_json::json!({}), &[]);
    file.extend_from_slice(&[99, 0, 0, 0, 0]);
    assert!(matches!(RecordingReader::new(&file[..]).unwrap().next_record(), Err(RecordError::Malformed { .. })));
    let mut huge = MAGIC.to_vec();
    huge.extend_from_slice(&(MAX_HEADER as u32 + 1).to_le_bytes());
    assert!(matches!(RecordingReader::new(&huge[..]), Err(RecordError::Header(_))));
}

#[test]
fn a_recorder_writes_one_numbered_file_per_session_with_its_header() {
    let dir = temp_dir("sessions");
    let rec = Recorder::new(&dir, "irdma", serde_json::json!({"device": "irdma"})).unwrap();
    let s1 = rec.begin().unwrap().unwrap();
    s1.dma_read(0x1000, &[1, 2]);
    let id = s1.control_request("{}");
    s1.control_reply(id, "{\"ok\":true}");
    let s2 = rec.begin().unwrap().unwrap(); // finishes s1
    assert!(rec.current().is_some_and(|c| Arc::ptr_eq(&c, &s2)));
    rec.end();
    assert!(rec.current().is_none());
    s2.dma_read(0, &[0]); // after end: dropped
    let read = |n: u32| {
        let f = std::fs::File::open(dir.join(format!("irdma-{n}.vfurec"))).unwrap();
        RecordingReader::new(std::io::BufReader::new(f)).unwrap().records().unwrap()
    };
    let (h1, r1, _) = read(1);
    assert_eq!(
        (h1["device"].as_str(), h1["session"].as_u64(), h1["format"].as_u64()),
        (Some("irdma"), Some(1), Some(1))
    );
    assert_eq!(r1.len(), 3);
    assert_eq!(r1[0], Record::DmaRead { iova: 0x1000, data: vec![1, 2] });
    assert_eq!(r1[2], Record::ControlReply { id: 1, text: "{\"ok\":true}".into() });
    let (h2, r2, _) = read(2);
    assert_eq!(h2["session"], 2);
    assert!(r2.is_empty());
    rec.set_dir(None).unwrap();
    assert!(rec.begin().unwrap().is_none(), "an idle recorder records nothing");
    // A second run into the same directory keeps the first run's files and numbers on after them.
    let again = Recorder::new(&dir, "irdma", serde_json::json!({"device": "irdma"})).unwrap();
    let s3 = again.begin().unwrap().unwrap();
    s3.dma_read(0x2000, &[3]);
    again.end();
    assert_eq!(read(1).1.len(), 3, "session 1 is untouched");
    assert!(read(2).1.is_empty());
    let (h3, r3, _) = read(3);
    assert_eq!((h3["session"].as_u64(), r3), (Some(3), vec![Record::DmaRead { iova: 0x2000, data: vec![3] }]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_recorder_is_recording_only_between_a_begun_session_and_its_end() {
    let dir = temp_dir("recording");
    let rec = Recorder::idle("hfi1", serde_json::json!({}));
    type Step<'a> = (&'a str, &'a dyn Fn(&Recorder), bool);
    let steps: [Step; 6] = [
        ("idle", &|_| {}, false),
        ("begin with no directory", &|r| assert!(r.begin().unwrap().is_none()), false),
        ("a directory, no session yet", &|r| r.set_dir(Some(&dir)).unwrap(), false),
        ("a session begun", &|r| assert!(r.begin().unwrap().is_some()), true),
        ("the session ended", &|r| r.end(), false),
        (
            "begun again, then the directory cleared",
            &|r| {
                assert!(r.begin().unwrap().is_some());
                r.set_dir(None).unwrap();
            },
            false,
        ),
    ];
    for (what, step, recording) in steps {
        step(&rec);
        assert_eq!(rec.is_recording(), recording, "{what}");
        assert_eq!(rec.current().is_some(), recording, "{what}: current agrees");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_record_over_max_record_ends_the_session_and_leaves_what_came_before_readable() {
    let dir = temp_dir("oversized");
    let rec = Recorder::new(&dir, "hfi1", serde_json::json!({})).unwrap();
    let s = rec.begin().unwrap().unwrap();
    s.dma_read(0x1000, &[7]);
    // An iova (8 bytes) and the data: one byte over what a reader accepts.
    s.dma_read(0x2000, &vec![0; MAX_RECORD - 8 + 1]);
    s.dma_read(0x3000, &[8]);
    assert!(s.failed(), "the session says its recording stopped");
    rec.end();
    let f = std::fs::File::open(dir.join("hfi1-1.vfurec")).unwrap();
    let (_, records, truncated) = RecordingReader::new(std::io::BufReader::new(f)).unwrap().records().unwrap();
    assert_eq!((records, truncated), (vec![Record::DmaRead { iova: 0x1000, data: vec![7] }], false));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_header_over_max_header_is_refused_before_any_file_is_made() {
    let dir = temp_dir("header");
    let rec = Recorder::new(&dir, "hfi1", serde_json::json!({ "faults": "x".repeat(MAX_HEADER) })).unwrap();
    let e = rec.begin().err().expect("a header no reader accepts is refused");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert!(!rec.is_recording());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no file left behind");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_session_stops_at_its_byte_limit_and_what_fit_stays_readable() {
    // A DMA read record is a tag and a length (5 bytes), the iova (8) and its data: 21 bytes with 8 of data.
    let dir = temp_dir("limit");
    let rec = Recorder::new(&dir, "hfi1", serde_json::json!({})).unwrap();
    assert_eq!(rec.max_session_bytes(), DEFAULT_MAX_SESSION_BYTES);
    rec.set_max_session_bytes(42);
    let s = rec.begin().unwrap().unwrap();
    for iova in [0x1000, 0x2000] {
        s.dma_read(iova, &[1; 8]);
    }
    assert!(!s.failed(), "two records are exactly the limit");
    s.dma_read(0x3000, &[1; 8]);
    s.device_step();
    assert!(s.failed(), "the third would pass it: the recording stopped");
    assert_eq!((s.records(), s.bytes()), (2, 42));
    rec.end();
    let f = std::fs::File::open(dir.join("hfi1-1.vfurec")).unwrap();
    let (_, records, truncated) = RecordingReader::new(std::io::BufReader::new(f)).unwrap().records().unwrap();
    let want: Vec<Record> = [0x1000, 0x2000].map(|iova| Record::DmaRead { iova, data: vec![1; 8] }).into();
    assert_eq!((records, truncated), (want, false));
    assert_eq!(rec.records_over_cap(), 2, "the two records left out are counted");
    // The limit is each session's: the next one starts from nothing.
    let s2 = rec.begin().unwrap().unwrap();
    s2.dma_read(0x4000, &[1; 8]);
    assert!(!s2.failed());
    rec.end();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_devices_recordings_stop_at_their_total_and_later_sessions_make_no_file_but_are_counted() {
    // Each session file: MAGIC (8), the header's length (4) and "{}" with the format and session fields, then
    // 21-byte DMA read records (5 + 8 of iova + 8 of data).
    let dir = temp_dir("total");
    let rec = Recorder::new(&dir, "hfi1", serde_json::json!({})).unwrap();
    assert_eq!(rec.max_total_bytes(), DEFAULT_MAX_TOTAL_BYTES);
    let file = |n: u32| dir.join(format!("hfi1-{n}.vfurec"));
    let size = |n: u32| std::fs::metadata(file(n)).unwrap().len();
    // Measure one session's header, then allow two such sessions of three records and two more records.
    rec.begin().unwrap().unwrap();
    rec.end();
    let head = size(1);
    rec.set_dir(Some(&dir)).unwrap();
    assert_eq!(rec.total_bytes(), 0, "a new directory counts from nothing");
    rec.set_max_total_bytes(2 * head + 5 * 21);
    let mut records = Vec::new();
    for _ in 0..4 {
        match rec.begin().unwrap() {
            Some(s) => {
                (0..3).for_each(|i| s.dma_read(0x1000 * i, &[1; 8]));
                records.push(s.records());
            }
            None => records.push(0),
        }
        rec.end();
    }
    assert_eq!(records, [3, 2, 0, 0], "the second session stops at the total, the later ones record nothing");
    assert_eq!((size(2), size(3)), (head + 3 * 21, head + 2 * 21), "what fit stays");
    assert!(!file(4).exists() && !file(5).exists(), "no file once the total is reached");
    assert_eq!(rec.total_bytes(), 2 * head + 5 * 21);
    assert_eq!((rec.records_over_cap(), rec.sessions_over_cap()), (1, 2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn recording_dma_logs_reads_with_data_writes_by_hash_copies_as_both_and_failures() {
    let dir = temp_dir("dma");
    let rec = Recorder::new(&dir, "d", serde_json::json!({})).unwrap();
    let session = rec.begin().unwrap().unwrap();
    let mem = Arc::new(HeapMemory::new());
    assert!(mem.map(0x1000, 0x2000));
    mem.write(0x1000, &[5; 16]).unwrap();
    let dma = RecordingDma::new(mem.clone(), session);
    let mut buf = [0u8; 16];
    dma.read(0x1000, &mut buf).unwrap();
    dma.write(0x1800, &[6; 8]).unwrap();
    dma.copy(0x1000, 0x2000, 16).unwrap();
    assert!(dma.read(0x9000, &mut buf).is_err());
    assert_eq!(mem.read_u64(0x2000), Ok(0x0505_0505_0505_0505));
    rec.end();
    let f = std::fs::File::open(dir.join("d-1.vfurec")).unwrap();
    let (_, r, _) = RecordingReader::new(f).unwrap().records().unwrap();
    assert_eq!(
        r,
        vec![
            Record::DmaRead { iova: 0x1000, data: vec![5; 16] },
            Record::DmaWrite { iova: 0x1800, len: 8, hash: content_hash(&[6; 8]) },
            Record::DmaRead { iova: 0x1000, data: vec![5; 16] },
            Record::DmaWrite { iova: 0x2000, len: 16, hash: content_hash(&[5; 16]) },
            Record::DmaFailed { iova: 0x9000, len: 16, write: false },
        ]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn msg(cmd: u16, payload: Vec<u8>, fds: u8) -> Record {
    Record::Message { header: Header::command(1, cmd, payload.len()), payload, fds }
}

#[test]
fn seeds_are_windows_after_version_and_the_last_command_write_with_fds_made_fresh() {
    let mut map = vec![0u8; 32];
    map[0..4].copy_from_slice(&32u32.to_le_bytes());
    map[8..16].copy_from_slice(&0x7000_0000u64.to_le_bytes()); // file offset in the guest's RAM
    map[24..32].copy_from_slice(&(64 * 4096u64).to_le_bytes());
    let mut enable = vec![0u8; 16];
    enable[0..8].copy_from_slice(&4u64.to_le_bytes());
    enable[8..12].copy_from_slice(&crate::device::region::CONFIG.to_le_bytes());
    enable[12..16].copy_from_slice(&2u32.to_le_bytes());
    enable.extend_from_slice(&6u16.to_le_bytes());
    let records = vec![
        msg(command::VERSION, vec![0, 0, 1, 0], 0),
        msg(command::REGION_WRITE, enable.clone(), 0),
        msg(command::DMA_MAP, map, 1),
        Record::DmaRead { iova: 0, data: vec![1; 4] },
        msg(command::DEVICE_SET_IRQS, vec![0; 20], 4),
        msg(command::REGION_READ, vec![0; 16], 0),
    ];
    let seeds = seeds_from_records(&records, SeedDevice::Irdma, 2, 8);
    assert_eq!(seeds.len(), 3);
    let SeedItem::Message { command: c, fds, payload, .. } = &seeds[1].items[2] else { panic!() };
    assert_eq!((*c, *fds), (command::DMA_MAP, SeedFds::Memfd(15)));
    assert_eq!(u64::from_le_bytes(payload[8..16].try_into().unwrap()), 0, "no file offset for the harness's memfd");
    assert_eq!(u64::from_le_bytes(payload[24..32].try_into().unwrap()), 15 * 4096);
    // The second window starts at the DMA_MAP: VERSION, the Command write before it, then map, data, SET_IRQS.
    let kinds: Vec<_> = seeds[1]
        .items
        .iter()
        .map(|i| match i {
            SeedItem::Message { command, fds, .. } => (Some(*command), *fds),
            SeedItem::DmaData(_) => (None, SeedFds::None),
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            (Some(command::VERSION), SeedFds::None),
            (Some(command::REGION_WRITE), SeedFds::None),
            (Some(command::DMA_MAP), SeedFds::Memfd(15)),
            (None, SeedFds::None),
            (Some(command::DEVICE_SET_IRQS), SeedFds::Eventfds(4)),
        ]
    );
    for s in &seeds {
        assert_eq!(Seed::decode(&s.encode()).as_ref(), Some(s));
    }
    assert_eq!(seeds_from_records(&records, SeedDevice::Irdma, 1, 2).len(), 2, "at most max seeds");
}

#[test]
fn non_seed_inputs_are_not_seeds() {
    assert_eq!(Seed::decode(b"arbitrary fuzzer bytes"), None);
    assert_eq!(Seed::decode(b"VFUSEED"), None);
}

proptest! {
    #[test]
    fn the_reader_never_panics_on_any_bytes(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut file = encode_recording(&serde_json::json!({}), &[]);
        file.extend_from_slice(&tail);
        if let Ok(mut r) = RecordingReader::new(&file[..]) {
            while let Ok(Some(_)) = r.next_record() {}
        }
    }

    #[test]
    fn seed_decoding_never_panics(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut data = seed::SEED_MAGIC.to_vec();
        data.extend_from_slice(&tail);
        let _ = Seed::decode(&data);
    }
}
