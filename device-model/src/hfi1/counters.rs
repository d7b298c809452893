//! Device error and event counters: atomics, so a driver or the control socket reads them while work runs.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// Event and error counts since the last reset.
        #[derive(Debug, Default)]
        pub struct Counters {
            $($(#[doc = $doc])* pub $name: AtomicU64,)*
        }

        impl Counters {
            /// Every counter by name, in declaration order.
            pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.load(Ordering::Relaxed)),)*]
            }

            pub fn reset(&self) {
                $(self.$name.store(0, Ordering::Relaxed);)*
            }
        }
    };
}

counters! {
    /// RcvArray values (trapped, or taken from shared memory and non-zero) without WRITE_ENABLE: ignored.
    rcv_array_no_write_enable,
    /// RcvArray values with WRITE_ENABLE and a reserved BUF_SIZE code (0xB..=0xF): entry invalidated.
    rcv_array_bad_buf_size,
    /// Trapped RcvArray writes at an index at or beyond RCV_ARRAY_CNT.
    rcv_array_bad_index,
    /// RcvArray values adopted (programmed or invalidated) from a trapped write or from shared memory.
    rcv_array_adopted,
    /// RcvArray entries programmed with a buffer inside a context's expected (TID) range of RCV_TID_CTRL:
    /// the TIDs a driver set up for expected receive (eager buffers lie outside that range).
    rcv_array_expected_programmed,
    /// Of those, entries inside the expected range of a user context (its receive job key on with a user's key,
    /// jkey.rs): the TIDs the kernel programs for a process's HFI1_IOCTL_TID_UPDATE.
    rcv_array_user_programmed,
    /// RCV_TID_FLOW_TABLE writes that make a flow valid on a generation other than the kernel's reserved
    /// 0xFFFFF: a flow set up for a TID RDMA segment (kern_set_hw_flow from hfi1_kern_setup_hw_flow).
    flows_programmed,
    /// RCV_TID_FLOW_TABLE writes that park a flow on the reserved generation 0xFFFFF (kern_clear_hw_flow,
    /// hfi1_kern_init_ctxt_generations).
    flows_parked,
    /// RCV_TID_FLOW_TABLE writes to a user context's flows (jkey.rs), all of which come through its user
    /// register page: PSM2 parks and programs its flows itself.
    tidflow_user_writes,
    /// Packets offered to the receive engine.
    rx_packets,
    /// Packets whose payload was placed.
    rx_placed,
    /// Packets for a context number at or beyond RCV_CONTEXTS.
    rx_bad_context,
    /// Packets for a context without RCV_CTXT_CTRL.ENABLE.
    rx_context_disabled,
    /// Packets with KDETH TIDCTRL 0 or 3.
    rx_bad_tidctrl,
    /// Packets for a flow without FLOW_VALID.
    rx_flow_invalid,
    /// Packets whose generation differs from the flow's (GEN_MISMATCH).
    rx_gen_mismatch,
    /// Packets whose sequence differs from the flow's expected one (SEQ_MISMATCH).
    rx_seq_mismatch,
    /// Packets whose TID names an entry outside the context's RCV_TID_CTRL range.
    rx_tid_out_of_range,
    /// Packets whose RcvArray entry is invalid.
    rx_tid_invalid_entry,
    /// Packets whose offset + length exceeds the entry's buffer.
    rx_buffer_overrun,
    /// Payload DMA writes that failed (unmapped or refused memory).
    rx_dma_errors,
    /// Loopback descriptors that could not be read or were malformed.
    lb_bad_descriptors,
    /// Loopback doorbells dropped because the worker queue was full.
    lb_doorbell_overruns,
    /// Packets the cable brought to the port.
    wire_rx_packets,
    /// Packets written to a receive header queue.
    wire_rx_written,
    /// Packets dropped because RCV_CTRL.RcvPortEnable was clear.
    wire_rx_port_disabled,
    /// Packets whose DLID the port's filter (DCC_CFG_PORT_CONFIG1) refused.
    wire_rx_dlid_filtered,
    /// Packets the sender marked with a bad end (PBC TestEBP): dropped.
    wire_rx_test_ebp,
    /// Packets routed to a context at or beyond RCV_CONTEXTS.
    wire_rx_bad_context,
    /// KDETH eager packets (TIDCTRL 0: TID RDMA requests, responses, ACKs, RESYNCs) written to a header
    /// queue.
    wire_rx_kdeth_eager,
    /// KDETH expected packets placed through a TID.
    wire_rx_kdeth_expected,
    /// Of those, packets placed for a user context (jkey.rs).
    wire_rx_kdeth_user_expected,
    /// Of those, placed without a header queue entry (header suppression).
    wire_rx_kdeth_suppressed,
    /// Of those, placed in sequence on a flow that had a sequence error since the driver last wrote it, so
    /// their entries report FLOW_SEQ_ERR all the same (the kernel's software PSN check).
    wire_rx_kdeth_placed_after_seq_err,
    /// Payload bytes placed through TIDs.
    wire_rx_kdeth_bytes,
    /// Of those, the bytes of TID RDMA READ responses (opcode 0xE5): READ data landing at the requester.
    wire_rx_kdeth_read_resp_bytes,
    /// Of those, the bytes of TID RDMA WRITE DATA and WRITE DATA LAST (0xE2, 0xE3): WRITE data landing at the
    /// responder.
    wire_rx_kdeth_write_data_bytes,
    /// KDETH packets with KDETH.INTR whose header queue entry was written: each raises the context's RcvUrgent
    /// source (IS_RCVURGENT_START + context), which interrupts where CCE_INT_MASK lets it through.
    wire_rx_kdeth_urgent,
    /// KDETH packets delivered as error entries (flow sequence or generation, TID, eager space, KDETH header).
    wire_rx_kdeth_errors,
    /// KDETH packets shorter than their header (RHF KHdrMinLenErr).
    rx_khdr_min_len,
    /// KDETH packets of a version other than 1 (RHF KHdrKVerErr).
    rx_khdr_kver,
    /// Packets that did not fit the port's ingress queue.
    wire_rx_ingress_overflow,
    /// Times a packet waited for room in a full header queue or eager buffer set.
    wire_rx_held,
    /// Header queue, eager or tail DMA writes that failed.
    wire_rx_dma_errors,
    /// Packets for a context whose header queue size or entry size is not valid.
    rx_rhq_unconfigured,
    /// Packets whose header queue entry, tail or eager slot would lie beyond 2^64 (RCV_HDR_ADDR,
    /// RCV_HDR_TAIL_ADDR near the top of the address space): dropped.
    rx_rhq_bad_address,
    /// Packets whose headers do not fit a header queue entry.
    rx_header_too_long,
    /// Packets dropped for a full header queue (no DONT_DROP_RHQ_FULL).
    rx_rhq_full,
    /// Packets dropped for full eager buffers (no DONT_DROP_EGR_FULL).
    rx_eager_full,
    /// Packets with payload for a context without eager buffers.
    rx_no_eager,
    /// Packets whose payload is larger than an eager buffer.
    rx_eager_too_small,
    /// Packets whose eager buffer's RcvArray entry is not valid.
    rx_eager_invalid,
    /// Packets that left for the cable.
    wire_tx_packets,
    /// PIO packets launched from a user send context (its job-key check on with a user's key, jkey.rs).
    pio_user_launches,
    /// Packets the SDMA engines sent whose BTH opcode is a user's KDETH one (0xC0..=0xDF: user_sdma.c takes
    /// only opcode & 0xC0 == 0xC0, and the kernel's TID RDMA uses 0xE0..=0xEF).
    sdma_user_packets,
    /// Their payload bytes: what follows the LRH, the BTH and the 36-byte KDETH header of the user ABI's
    /// struct hfi1_pkt_header, without the pad.
    sdma_user_bytes,
    /// Packets launched while the link was down: dropped.
    wire_tx_link_down,
    /// Launched bytes that are not a 9B packet: dropped.
    wire_tx_malformed,
    /// 16B (bypass) packets: not modelled on the wire, dropped.
    wire_tx_bypass_unmodelled,
    /// SDMA head write-backs that failed.
    sdma_head_dma_errors,
    /// SDMA engines halted by an error the device found in their descriptors.
    sdma_halts,
    /// Credit-return DMA writes that failed.
    pio_credit_dma_errors,
    /// BAR writes that were not 8 bytes at an 8-byte-aligned offset.
    mmio_bad_width,
    /// BAR writes to read-only or unimplemented offsets.
    mmio_ignored_writes,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names_every_counter_and_reset_zeroes_them() {
        let c = Counters::default();
        c.rx_gen_mismatch.fetch_add(2, Ordering::Relaxed);
        let snap = c.snapshot();
        assert_eq!(snap.len(), 64);
        assert!(snap.contains(&("rx_gen_mismatch", 2)));
        c.reset();
        assert!(c.snapshot().iter().all(|(_, v)| *v == 0));
    }
}
