//! SDMA descriptor parsing and AHG against how the kernel builds them (sdma.h, sdma.c _sdma_txreq_ahgadd,
//! ruc.c build_ahg).

#![forbid(unsafe_code)]

use super::*;

/// sdma_build_ahg_descriptor(data, dwindex, startbit, bits).
fn ahg(data: u16, dwindex: u32, startbit: u32, bits: u32) -> u32 {
    SDMA_AHG_UPDATE_ENABLE
        | ((startbit & 0x1F) << 24)
        | ((bits & 0xF) << 20)
        | ((dwindex & 0xF) << 16)
        | u32::from(data)
}

/// The descriptors _sdma_txreq_ahgadd makes for `updates` on slot `entry` with a header of `hlen` bytes,
/// then one data descriptor with LAST.
fn apply_packet(updates: &[u32], entry: u64, hlen: u64) -> Vec<Desc> {
    let mode = match updates.len() {
        1 => SDMA_AHG_APPLY_UPDATE1,
        2..=5 => SDMA_AHG_APPLY_UPDATE2,
        _ => SDMA_AHG_APPLY_UPDATE3,
    };
    let edits = match mode {
        SDMA_AHG_APPLY_UPDATE2 => 1,
        SDMA_AHG_APPLY_UPDATE3 => 2,
        _ => 0,
    };
    let mut d = vec![Desc { qw0: SDMA_DESC0_FIRST_DESC_FLAG, qw1: 0 }];
    d.extend((0..edits).map(|_| Desc { qw0: 0, qw1: 0 }));
    d[0].qw1 |= (entry << 8) | ((hlen >> 2) << 4) | (mode << 13) | (u64::from(updates[0]) << 32);
    let (mut desc, mut shift) = (0, 0);
    for (i, u) in updates[1..].iter().enumerate() {
        if shift == 0 && i & 2 == 0 {
            desc += 1;
        }
        let q = &mut d[desc];
        if i & 2 == 0 {
            q.qw0 |= u64::from(*u) << shift;
        } else {
            q.qw1 |= u64::from(*u) << shift;
        }
        shift = (shift + 32) & 63;
    }
    d.push(Desc { qw0: SDMA_DESC0_LAST_DESC_FLAG | (64 << 48) | 0x9000, qw1: SDMA_DESC1_HEAD_TO_HOST_FLAG });
    d
}

#[test]
fn a_packet_runs_from_first_to_last_and_edit_descriptors_do_not_end_it() {
    // Nine updates: the enable bit of every update word sets bit 63 (FIRST) or 31 of the edit descriptors'
    // words, and bit 62 may be LAST's: the packet still ends at the data descriptor.
    let updates: Vec<u32> = (0..9).map(|k| ahg(0xC000 | k, 6, 16, 16)).collect();
    let p = apply_packet(&updates, 5, 28);
    assert_eq!(packet_len(&p), Ok(Some(4)));
    assert_eq!(ahg_updates(&p), updates);
    let plain = [Desc { qw0: SDMA_DESC0_FIRST_DESC_FLAG | (36 << 48), qw1: 0 }];
    assert_eq!(packet_len(&plain), Ok(None), "LAST not handed over yet");
    let both = [Desc { qw0: SDMA_DESC0_FIRST_DESC_FLAG | SDMA_DESC0_LAST_DESC_FLAG | (36 << 48), qw1: 0 }];
    assert_eq!(packet_len(&both), Ok(Some(1)));
}

#[test]
fn descriptor_errors_are_the_chips() {
    let no_first = [Desc { qw0: SDMA_DESC0_LAST_DESC_FLAG, qw1: 0 }];
    assert_eq!(packet_len(&no_first), Err(SDMA_FIRST_DESC_ERR));
    let two_firsts = [Desc { qw0: SDMA_DESC0_FIRST_DESC_FLAG, qw1: 0 }; 2];
    assert_eq!(packet_len(&two_firsts), Err(SDMA_FIRST_DESC_ERR));
    let endless = vec![Desc { qw0: 0, qw1: 0 }; MAX_DESC];
    let mut endless = endless;
    endless[0].qw0 = SDMA_DESC0_FIRST_DESC_FLAG;
    assert_eq!(packet_len(&endless), Err(SDMA_PACKET_DESC_OVERFLOW_ERR));
    let bad_mode = [Desc { qw0: SDMA_DESC0_FIRST_DESC_FLAG | SDMA_DESC0_LAST_DESC_FLAG, qw1: 5 << 13 }];
    assert_eq!(packet_len(&bad_mode), Err(SDMA_HEADER_SELECT_ERR));
}

#[test]
fn the_psn_update_of_build_ahg_lands_in_bth2() {
    // PBC (2 dwords), LRH (2), BTH (3): BTH2 is dword 6; build_ahg puts cpu_to_be16(psn & 0xffff) in bits
    // 31:16 (a 16-bit field, stored as length 0).
    let mut header = vec![0u8; 28];
    let psn: u32 = 0x0012_3456;
    let value = ((psn & 0xFFFF) as u16).swap_bytes();
    apply_updates(&mut header, &[ahg(value, 6, 16, 16)]).unwrap();
    assert_eq!(&header[26..28], &[0x34, 0x56], "the PSN's low 16 bits, big-endian, at the end of BTH2");
    // And the upper half where it changes: bits 15:0 take cpu_to_be16(psn >> 16).
    apply_updates(&mut header, &[ahg(((psn >> 16) as u16).swap_bytes(), 6, 0, 16)]).unwrap();
    assert_eq!(&header[24..28], &[0x00, 0x12, 0x34, 0x56]);
    assert_eq!(apply_updates(&mut header, &[ahg(1, 9, 0, 16)]), Err(SDMA_HEADER_SELECT_ERR), "beyond the header");
}

#[test]
fn a_walk_spans_head_to_tail_and_none_when_an_index_lies_outside_the_ring() {
    let walk = |count, head, tail| Walk { engine: 0, epoch: 0, base: 0, count, head, tail, gen: 0, gen_check: false };
    // (ring, head, tail, descriptors handed over)
    let cases: [(u64, u64, u64, Option<u64>); 8] = [
        (128, 0, 3, Some(3)),
        (128, 120, 8, Some(16)),
        (128, 5, 5, Some(0)),
        // The ring shrank under the head (issue 38): nothing between them, and no underflow.
        (64, 64, 0, None),
        (64, 100, 0, None),
        (64, 0, 64, None),
        (0, 0, 0, None),
        (u64::MAX, u64::MAX - 1, 0, Some(1)),
    ];
    for (count, head, tail, want) in cases {
        assert_eq!(ring_span(&walk(count, head, tail)), want, "ring {count}, head {head}, tail {tail}");
    }
}
