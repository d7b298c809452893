//! The host <-> guest protocol: one JSON object per line, tagged by `"type"`, over the guest's second
//! serial port. Defined once here for both sides.
//!
//! ```text
//! guest                                          host
//! hello (context, flow, generation, seed, MTU) ->
//!                                              <- welcome (pre-checks)
//! per round:
//! registered (buffers: length, tidlist, PFNs) ->
//!                         host checks the RcvArray and DMA maps, injects data and negative packets
//!                                              <- injected (placement results, check errors)
//! verified (byte-for-byte result)             ->
//! freed (TID_FREE results)                    ->
//!                                              <- round_verdict (no entry left valid)
//! done                                        ->
//!                                              <- verdict
//! bye                                         ->
//! ```
//! The host closes only after `bye`: QEMU's serial port takes bytes from the socket as the guest's UART
//! drains them, and a host that closed right after its last line could lose the line's tail.
//! Either side may send `abort` instead of its next message; the other then stops waiting.

use serde::{Deserialize, Serialize};

use crate::abi::Hfi1CtxtInfo;

pub const PROTO_VERSION: u32 = 1;

/// How a buffer's memory was obtained: what "contiguous" and "fragmented" can mean from user space, which
/// cannot choose physical pages. TID_UPDATE takes one virtually contiguous range; the kernel splits it at
/// every physical discontinuity (find_phys_blocks), so the physical layout decides the TIDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferKind {
    /// Its own anonymous mmap, faulted in page order: physically whatever the allocator handed out in
    /// sequence, often runs of adjacent pages.
    Separate,
    /// One of several buffers cut from one large mmap, separated by guard pages: neighbouring virtual
    /// ranges of one VMA registered by separate calls.
    Carved,
    /// Physically fragmented on purpose: pages faulted in one order, then moved (mremap) into the buffer
    /// interleaved (0, 2, 4, …, 1, 3, …), so no two virtually adjacent pages were allocated one after the
    /// other. Likely one TID per page; the kernel, not the program, has the last word.
    Scattered,
    /// A 2 MiB-aligned range with MADV_HUGEPAGE: one transparent huge page when the kernel grants it, i.e.
    /// one physically contiguous 2 MiB entry (MAX_EXPECTED_BUFFER, BUF_SIZE code 10).
    Huge,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub proto: u32,
    pub info: Hfi1CtxtInfo,
    /// uctxt->expected_count, from CTXT_INFO.
    pub expected_count: u32,
    /// USER_INFO hw_version / sw_version.
    pub hw_version: u32,
    pub sw_version: u32,
    pub flow: u32,
    pub generation: u32,
    /// What the guest wrote into the flow's UREGS slot, and read back from it.
    pub flow_value: u64,
    pub flow_readback: u64,
    pub seed: u64,
    pub mtu: u32,
    /// TID_UPDATE of expected_count + 1 pages, one more than a call may pin: the errno it gave.
    pub over_limit_pages: u32,
    pub over_limit_errno: Option<String>,
    pub rounds: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferReport {
    pub id: u32,
    pub kind: BufferKind,
    pub pages: u32,
    /// Bytes passed to TID_UPDATE.
    pub len: u64,
    /// Bytes the kernel says it programmed (tinfo.length, whole pages).
    pub length: u64,
    pub vaddr: u64,
    pub tidlist: Vec<u32>,
    /// Page frame numbers of the buffer's pages after TID_UPDATE pinned them (/proc/self/pagemap); empty
    /// when the guest could not read them.
    pub pfns: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mismatch {
    pub buffer: u32,
    pub offset: u64,
    pub expected: u8,
    pub found: u8,
    /// The byte should have kept the guard value (nothing was to be placed there).
    pub guard: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verified {
    pub round: u32,
    pub ok: bool,
    pub bytes_checked: u64,
    pub data_bytes: u64,
    pub mismatch_count: u64,
    /// The first few mismatches.
    pub mismatches: Vec<Mismatch>,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeReport {
    pub id: u32,
    /// tinfo.tidcnt after TID_FREE: how many TIDs the kernel released.
    pub tidcnt: u32,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NegativeReport {
    /// `wrong_tid_invalid_entry`, `wrong_tid_out_of_range`, `wrong_context_absent`,
    /// `wrong_context_disabled`, `wrong_generation`.
    pub kind: String,
    pub expected: String,
    pub result: String,
    pub ok: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Injected {
    pub round: u32,
    pub packets: u32,
    pub placed: u32,
    pub payload_bytes: u64,
    pub negatives: Vec<NegativeReport>,
    /// Every host check of this round that failed so far (RcvArray, DMA maps, placement, counters).
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum GuestMsg {
    Hello(Hello),
    Registered {
        round: u32,
        buffers: Vec<BufferReport>,
    },
    Verified(Verified),
    Freed {
        round: u32,
        buffers: Vec<FreeReport>,
    },
    Done {
        ok: bool,
        error: Option<String>,
    },
    /// The verdict arrived; the host may close.
    Bye,
    Abort {
        error: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HostMsg {
    Welcome { proto: u32, device: String, errors: Vec<String> },
    Injected(Injected),
    RoundVerdict { round: u32, ok: bool, errors: Vec<String> },
    Verdict { ok: bool, errors: Vec<String> },
    Abort { error: String },
}

impl GuestMsg {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Hello(_) => "hello",
            Self::Registered { .. } => "registered",
            Self::Verified(_) => "verified",
            Self::Freed { .. } => "freed",
            Self::Done { .. } => "done",
            Self::Bye => "bye",
            Self::Abort { .. } => "abort",
        }
    }
}

impl HostMsg {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Welcome { .. } => "welcome",
            Self::Injected(_) => "injected",
            Self::RoundVerdict { .. } => "round_verdict",
            Self::Verdict { .. } => "verdict",
            Self::Abort { .. } => "abort",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_are_tagged_by_type_in_snake_case() {
        let m = GuestMsg::Freed { round: 2, buffers: vec![FreeReport { id: 1, tidcnt: 3, error: None }] };
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v, json!({"type":"freed","round":2,"buffers":[{"id":1,"tidcnt":3,"error":null}]}));
        let back: HostMsg =
            serde_json::from_value(json!({"type":"round_verdict","round":1,"ok":true,"errors":[]})).unwrap();
        assert_eq!(back, HostMsg::RoundVerdict { round: 1, ok: true, errors: vec![] });
        assert_eq!(serde_json::to_value(BufferKind::Scattered).unwrap(), json!("scattered"));
    }

    #[test]
    fn a_message_of_the_other_direction_does_not_parse() {
        assert!(serde_json::from_value::<HostMsg>(json!({"type":"freed","round":2,"buffers":[]})).is_err());
        assert!(serde_json::from_value::<GuestMsg>(json!({"type":"verdict","ok":true,"errors":[]})).is_err());
    }
}
