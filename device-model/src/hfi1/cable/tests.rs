//! The cable with two fake ports: training, link loss, delivery order and the faults.

#![forbid(unsafe_code)]

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::wire::{LNH_BTH, LRH_BYTES, OPCODE_TID_RDMA_WRITE_DATA_LAST};
use super::*;
use crate::clock::FakeClock;
use crate::fault::FaultSpec;

/// A port that records what the cable tells it, can refuse link events, and can hold the cable thread in
/// its `receive` (a peer that does not drain).
struct FakePort {
    id: Neighbor,
    probe: Arc<Probe>,
    refuse: Mutex<bool>,
    seen: Mutex<Vec<Seen>>,
    changed: Condvar,
    hold: Mutex<bool>,
    released: Condvar,
}

#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Link(LinkEvent),
    Packet(Vec<u8>),
}

impl FakePort {
    fn new(guid: u64) -> Arc<FakePort> {
        Arc::new(FakePort {
            id: Neighbor { guid, node_type: 0, port: 1, ..Neighbor::default() },
            probe: Probe::new("hfi1-wfr"),
            refuse: Mutex::new(false),
            seen: Mutex::new(Vec::new()),
            changed: Condvar::new(),
            hold: Mutex::new(false),
            released: Condvar::new(),
        })
    }

    fn hold(&self, on: bool) {
        *self.hold.lock().unwrap() = on;
        self.released.notify_all();
    }

    /// Waits (bounded) until `n` events arrived; returns them.
    fn wait(&self, n: usize) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap();
        let (seen, _) = self.changed.wait_timeout_while(seen, Duration::from_secs(5), |s| s.len() < n).unwrap();
        seen.clone()
    }

    fn packets(&self) -> Vec<Vec<u8>> {
        let seen = self.seen.lock().unwrap();
        seen.iter().filter_map(|s| if let Seen::Packet(p) = s { Some(p.clone()) } else { None }).collect()
    }
}

impl Port for FakePort {
    fn identity(&self) -> Neighbor {
        self.id
    }
    fn probe(&self) -> Arc<Probe> {
        Arc::clone(&self.probe)
    }
    fn link(&self, event: LinkEvent) -> bool {
        if *self.refuse.lock().unwrap() {
            return false;
        }
        self.seen.lock().unwrap().push(Seen::Link(event));
        self.changed.notify_all();
        true
    }
    fn receive(&self, packet: WirePacket) {
        self.seen.lock().unwrap().push(Seen::Packet(packet.bytes));
        self.changed.notify_all();
        let held = self.hold.lock().unwrap();
        let _unheld = self.released.wait_timeout_while(held, Duration::from_secs(30), |h| *h).unwrap();
    }
}

/// Two fake ports on a cable whose time moves only when the test moves `clock`.
struct Rig {
    a: Arc<FakePort>,
    b: Arc<FakePort>,
    ea: CableEnd,
    eb: CableEnd,
    clock: Arc<FakeClock>,
}

fn rig() -> Rig {
    rig_training(Duration::ZERO)
}

fn rig_training(training: Duration) -> Rig {
    let clock = Arc::new(FakeClock::default());
    let cable = Cable::with_clock(training, Arc::clone(&clock) as Arc<dyn Clock>).unwrap();
    let (a, b) = (FakePort::new(0x11), FakePort::new(0x22));
    let wa: Weak<dyn Port> = Arc::downgrade(&(Arc::clone(&a) as Arc<dyn Port>));
    let wb: Weak<dyn Port> = Arc::downgrade(&(Arc::clone(&b) as Arc<dyn Port>));
    let ea = cable.end(End::A, wa);
    let eb = cable.end(End::B, wb);
    Rig { a, b, ea, eb, clock }
}

fn up(r: &Rig) {
    r.ea.phy(Phy::Polling);
    r.eb.phy(Phy::Polling);
    r.a.wait(1);
    r.b.wait(1);
}

/// A small RC SEND_ONLY whose first payload byte is `tag`.
fn packet(tag: u8) -> WirePacket {
    let mut b = vec![0u8; LRH_BYTES + 12 + 4];
    b[1] = LNH_BTH;
    let dwords = ((b.len() + 4) / 4) as u16;
    b[4..6].copy_from_slice(&dwords.to_be_bytes());
    b[8] = 0x04;
    b[LRH_BYTES + 12] = tag;
    WirePacket::seal(b, false, false).unwrap()
}

fn tag(p: &[u8]) -> u8 {
    p[LRH_BYTES + 12]
}

#[test]
fn the_link_trains_when_both_ends_poll_and_each_learns_the_other() {
    let r = rig();
    r.ea.phy(Phy::Polling);
    assert!(!r.ea.link_up());
    r.eb.phy(Phy::Polling);
    let id = |guid| Seen::Link(LinkEvent::Up(Neighbor { guid, node_type: 0, port: 1, ..Neighbor::default() }));
    assert_eq!(r.a.wait(1), vec![id(0x22)]);
    assert_eq!(r.b.wait(1), vec![id(0x11)]);
    assert!(r.ea.link_up() && r.eb.link_up());
}

#[test]
fn the_link_comes_up_only_once_it_has_trained_for_the_training_time() {
    const TRAINING: Duration = Duration::from_millis(200);
    let r = rig_training(TRAINING);
    r.ea.phy(Phy::Polling);
    r.eb.phy(Phy::Polling);
    settled(&r.ea);
    assert_eq!(r.eb.status()["training_ms_left"], 200);
    r.clock.advance(TRAINING - Duration::from_millis(1));
    settled(&r.ea);
    assert!(!r.eb.link_up() && r.a.wait(0).is_empty(), "up before the training time");
    assert_eq!(r.eb.status()["training_ms_left"], 1);
    r.clock.advance(Duration::from_millis(1));
    assert!(matches!(r.a.wait(1)[0], Seen::Link(LinkEvent::Up(_))));
    assert!(r.eb.link_up());
    assert_eq!(r.eb.status()["training_ms_left"], serde_json::Value::Null);
}

/// Waits until the cable thread has taken every message and every piece of news `end` sent before: it
/// answers a capture request in its turn, and applies news at the next message it takes.
fn settled(end: &CableEnd) {
    end.capture(None, 0).expect("the cable answers");
}

#[test]
fn an_end_that_stops_polling_while_the_link_trains_ends_the_training() {
    // Long enough that only a bug would bring the link up while the test runs.
    let r = rig_training(TRAINING_MAX);
    let max_ms = TRAINING_MAX.as_millis() as u64;
    r.ea.phy(Phy::Polling);
    r.eb.phy(Phy::Polling);
    settled(&r.ea);
    assert_eq!(r.ea.status()["training_ms_left"], max_ms, "training");
    r.ea.phy(Phy::Down { reason: None });
    settled(&r.ea);
    assert_eq!(r.ea.status()["training_ms_left"], serde_json::Value::Null, "the training ended");
    r.ea.phy(Phy::Polling);
    settled(&r.ea);
    assert_eq!(r.ea.status()["training_ms_left"], max_ms, "both poll: training again");
    assert!(!r.ea.link_up() && r.a.wait(0).is_empty() && r.b.wait(0).is_empty(), "no end heard of a link");
}

#[test]
fn an_end_going_down_tells_the_other_with_its_reason_and_polling_again_retrains() {
    let r = rig();
    up(&r);
    r.ea.phy(Phy::Down { reason: Some(9) });
    assert_eq!(r.b.wait(2)[1], Seen::Link(LinkEvent::Down { reason: Some(9) }));
    assert!(!r.eb.link_up());
    // A's own Down is no news to A; both poll again and the link comes back.
    r.eb.phy(Phy::Down { reason: Some(0) });
    r.ea.phy(Phy::Polling);
    r.eb.phy(Phy::Polling);
    assert!(matches!(r.a.wait(2)[1], Seen::Link(LinkEvent::Up(_))));
    assert!(matches!(r.b.wait(3)[2], Seen::Link(LinkEvent::Up(_))));
}

#[test]
fn dropping_an_end_takes_the_link_down_for_the_other() {
    let r = rig();
    up(&r);
    drop(r.ea);
    assert_eq!(r.b.wait(2)[1], Seen::Link(LinkEvent::Down { reason: None }));
}

#[test]
fn packets_cross_in_order_only_while_the_link_is_up() {
    let r = rig();
    r.ea.transmit(packet(1));
    up(&r);
    for t in 2..=5 {
        r.ea.transmit(packet(t));
    }
    r.b.wait(5);
    assert_eq!(r.b.packets().iter().map(|p| tag(p)).collect::<Vec<_>>(), vec![2, 3, 4, 5]);
    let s = r.ea.status();
    assert_eq!((s["to_b"]["packets"].as_u64(), s["to_b"]["dropped_link_down"].as_u64()), (Some(4), Some(1)));
}

/// One cable fault case: armed on the receiver, the tags it receives in order before time moves, how far
/// time then moves, the tags it has received then, the tags whose ICRC no longer checks.
struct FaultCase {
    spec: &'static str,
    first: Vec<u8>,
    wait: Duration,
    want: Vec<u8>,
    broken: Vec<u8>,
}

#[test]
fn cable_faults_drop_corrupt_delay_and_reorder_the_nth_packet() {
    let case = |spec, first: &[u8], wait, want: &[u8], broken: &[u8]| FaultCase {
        spec,
        first: first.to_vec(),
        wait,
        want: want.to_vec(),
        broken: broken.to_vec(),
    };
    let none = Duration::ZERO;
    let table = [
        case("cable-drop,nth=2", &[1, 3, 4], none, &[1, 3, 4], &[]),
        case("cable-reorder,nth=2", &[1, 3, 2, 4], none, &[1, 3, 2, 4], &[]),
        case("cable-delay,nth=2,ms=50", &[1, 3, 4], Duration::from_millis(50), &[1, 3, 4, 2], &[]),
        // Byte 20 is the tag: the corrupted packet arrives as tag 0x82.
        case("cable-corrupt,nth=2,byte=20,xor=0x80", &[1, 0x82, 3, 4], none, &[1, 0x82, 3, 4], &[0x82]),
    ];
    for FaultCase { spec, first, wait, want, broken } in table {
        let r = rig();
        r.b.probe.faults.arm(FaultSpec::parse(spec).unwrap());
        up(&r);
        for t in 1..=4 {
            r.ea.transmit(packet(t));
        }
        settled(&r.ea);
        assert_eq!(r.b.packets().iter().map(|p| tag(p)).collect::<Vec<_>>(), first, "{spec}");
        r.clock.advance(wait);
        r.b.wait(1 + want.len());
        let got = r.b.packets();
        assert_eq!(got.iter().map(|p| tag(p)).collect::<Vec<_>>(), want, "{spec}");
        let bad: Vec<u8> = got
            .iter()
            .filter(|p| !WirePacket { bytes: p.to_vec(), sc4: false, test_ebp: false }.icrc_ok())
            .map(|p| tag(p))
            .collect();
        assert_eq!(bad, broken, "{spec}");
    }
}

#[test]
fn a_cable_fault_with_an_opcode_counts_only_the_packets_of_that_opcode() {
    // Tags 1..=6, the even ones TID RDMA WRITE DATA LAST (0xE3), the odd ones SEND ONLY (0x04): the second 0xE3
    // packet is tag 4. (fault, tags received in order)
    let table = [
        ("cable-drop,opcode=0xe3,nth=2", vec![1, 2, 3, 5, 6]),
        ("cable-drop,opcode=0x04,nth=2", vec![1, 2, 4, 5, 6]),
        ("cable-reorder,opcode=0xe3,nth=1", vec![1, 3, 2, 4, 5, 6]),
    ];
    for (spec, want) in table {
        let r = rig();
        r.b.probe.faults.arm(FaultSpec::parse(spec).unwrap());
        up(&r);
        for t in 1..=6u8 {
            let mut p = packet(t);
            if t % 2 == 0 {
                p.bytes[LRH_BYTES] = OPCODE_TID_RDMA_WRITE_DATA_LAST;
                p = WirePacket::seal(p.bytes[..p.bytes.len() - 4].to_vec(), false, false).unwrap();
            }
            r.ea.transmit(p);
        }
        r.b.wait(1 + want.len());
        assert_eq!(r.b.packets().iter().map(|p| tag(p)).collect::<Vec<_>>(), want, "{spec}");
    }
}

#[test]
fn a_reordered_packet_with_nothing_behind_it_still_arrives() {
    let r = rig();
    r.b.probe.faults.arm(FaultSpec::parse("cable-reorder,nth=1").unwrap());
    up(&r);
    r.ea.transmit(packet(7));
    settled(&r.ea);
    assert!(r.b.packets().is_empty(), "held for the packet that is to overtake it");
    r.clock.advance(REORDER_WAIT);
    r.b.wait(2);
    assert_eq!(r.b.packets().iter().map(|p| tag(p)).collect::<Vec<_>>(), vec![7]);
}

#[test]
fn an_end_that_left_polling_refuses_link_up_and_its_down_takes_the_peer_down() {
    let r = rig();
    *r.a.refuse.lock().unwrap() = true;
    r.ea.phy(Phy::Polling);
    r.eb.phy(Phy::Polling);
    r.b.wait(1);
    r.ea.phy(Phy::Down { reason: Some(0) });
    assert_eq!(r.b.wait(2)[1], Seen::Link(LinkEvent::Down { reason: Some(0) }));
}

#[test]
fn the_capture_records_both_directions_and_stops_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wire.pcap");
    let r = rig();
    up(&r);
    r.ea.capture(Some(path.clone()), 1 << 20).unwrap();
    r.ea.transmit(packet(1));
    r.eb.transmit(packet(2));
    r.b.wait(2);
    r.a.wait(2);
    r.ea.capture(None, 0).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    // pcap record header, ERF header, LRH + BTH + 4 bytes of payload + ICRC.
    let rec = 16 + 16 + 28;
    assert_eq!(bytes.len(), 24 + 2 * rec);
    // ERF flags: interface 0 for A to B, then 1 for B to A.
    assert_eq!((bytes[24 + 16 + 9], bytes[24 + rec + 16 + 9]), (0x4, 0x5));
}

#[test]
fn after_a_loss_the_link_trains_only_once_both_ends_poll_again() {
    let r = rig();
    up(&r);
    r.ea.phy(Phy::Down { reason: Some(0) });
    r.b.wait(2);
    // A polls again while B, taken down by the loss, has not: no training yet.
    r.ea.phy(Phy::Polling);
    r.eb.transmit(packet(1)); // a message behind A's, so the cable has handled it
    assert!(!r.ea.link_up());
    r.eb.phy(Phy::Polling);
    assert!(matches!(r.b.wait(3)[2], Seen::Link(LinkEvent::Up(_))));
}

#[test]
fn idle_messages_cross_only_while_the_link_is_up() {
    let r = rig();
    r.ea.phy(Phy::Idle(0x103));
    settled(&r.ea);
    up(&r);
    r.ea.phy(Phy::Idle(0x203));
    // B heard the link come up, then the message sent while it was up; the earlier one went nowhere.
    let seen = r.b.wait(2);
    assert_eq!(seen.len(), 2);
    assert!(matches!(seen[0], Seen::Link(LinkEvent::Up(_))));
    assert_eq!(seen[1], Seen::Link(LinkEvent::Idle(0x203)));
    assert!(r.a.wait(1).iter().all(|s| !matches!(s, Seen::Link(LinkEvent::Idle(_)))), "no echo to the sender");
}

#[test]
fn a_link_state_change_waits_for_no_room_in_a_full_packet_queue_and_is_not_lost() {
    let r = rig();
    up(&r);
    // B stops draining: the cable thread stays in B's receive of packet 1, and A's packets fill the queue.
    r.b.hold(true);
    r.ea.transmit(packet(1));
    assert_eq!(r.b.wait(2)[1], Seen::Packet(packet(1).bytes));
    let full = |e: &CableEnd| e.status()["to_b"]["dropped_queue_full"].as_u64().unwrap_or(0);
    for _ in 0..=QUEUE {
        r.ea.transmit(packet(2));
    }
    assert_eq!(full(&r.ea), 1, "the queue is full");
    // A goes down. Had the news waited for room in the queue, it would still be waiting: the thread is held.
    r.ea.phy(Phy::Down { reason: Some(7) });
    r.ea.transmit(packet(3));
    assert_eq!(full(&r.ea), 2, "the queue is still full: nothing was taken from it meanwhile");
    // B drains again: the news reaches it right behind the packets A sent before it, and the link is down.
    r.b.hold(false);
    let seen = r.b.wait(QUEUE + 3);
    assert_eq!(seen.len(), QUEUE + 3);
    assert_eq!(seen[QUEUE + 1], Seen::Packet(packet(2).bytes), "the last packet queued");
    assert_eq!(seen[QUEUE + 2], Seen::Link(LinkEvent::Down { reason: Some(7) }));
    assert!(!r.ea.link_up());
}

#[test]
fn states_coalesce_to_their_net_effect_and_idle_messages_keep_their_order_up_to_their_bound() {
    let polling = Phy::Polling;
    let down = |r| Phy::Down { reason: Some(r) };
    // (what an end says, what its mailbox holds for the cable thread)
    let cases: Vec<(Vec<Phy>, Vec<Phy>)> = vec![
        (vec![polling, polling], vec![polling]),
        (vec![down(1), down(2)], vec![down(2)]),
        (vec![polling, down(1)], vec![down(1)]),
        // A bounce: down, then polling again.
        (vec![down(1), polling, polling], vec![down(1), polling]),
        (vec![down(1), polling, down(2), polling], vec![down(2), polling]),
        // An idle message keeps its place between the states around it.
        (
            vec![polling, Phy::Idle(1), down(1), Phy::Idle(2), polling],
            vec![polling, Phy::Idle(1), down(1), Phy::Idle(2), polling],
        ),
    ];
    for (said, want) in cases {
        let mut mail = PhyMail::default();
        assert!(said.iter().all(|&p| mail.push(0, p)));
        assert_eq!(mail.take(Some(0)), want, "{said:?}");
    }
    // A packet between two states keeps both: each is applied at its place among the packets.
    let mut mail = PhyMail::default();
    assert!(mail.push(0, polling) && mail.push(1, down(1)) && mail.push(1, polling));
    assert_eq!(mail.take(Some(0)), vec![polling], "packet 0 is taken after the Polling, before the Down");
    assert_eq!(mail.take(Some(1)), vec![down(1), polling]);
    let mut mail = PhyMail::default();
    assert!((0..MAX_IDLE_PENDING as u64).all(|m| mail.push(0, Phy::Idle(m))));
    assert!(!mail.push(0, Phy::Idle(99)), "past the bound");
    assert!(mail.push(0, down(0)), "a state always fits");
    assert_eq!(mail.take(None).len(), MAX_IDLE_PENDING + 1);
    assert!(mail.push(0, Phy::Idle(100)), "taken: room again");
}
