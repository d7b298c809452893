//! hfi1, Intel's Omni-Path HFI ("WFR"), in two personalities ([`Personality`]). The project's own function
//! (1b36:1100, for udriver) is the receive engine with TID placement plus a loopback send block
//! (docs/hfi1-device.md). The real chip (8086:24f0) serves the stock Linux driver: PIO and SDMA send
//! engines, receive header queues and eager buffers, TID placement, and a fake 8051. Two chips on one cable
//! make a fabric (docs/hfi1-kernel-driver.md, docs/hfi1-fabric.md).
//!
//! This module is the interface: `mod` and `pub use` only. Its layers, top down (docs/architecture.md, "The
//! hfi1 engine's layers"):
//! - the function: `device`, `control`, `names`;
//! - the worker's data path: `datapath`, and the SDMA walk in `wfr::sdma::walk`;
//! - `shared` and `observe`;
//! - the state blocks: `rxe`, `wfr`, `cable`;
//! - what every layer reads: `config`, `error`, `regs`, `counters`, `jkey`, `shm`.

pub mod cable;
mod config;
mod control;
mod counters;
mod datapath;
mod device;
mod error;
mod jkey;
mod names;
mod observe;
pub mod regs;
mod rxe;
mod shared;
mod shm;
pub mod wfr;

pub use crate::worker::WorkerMode;
pub use config::{
    Hfi1Config, Personality, HFI1_BAR, HFI1_BAR0_SIZE, HFI1_MSIX_VECTORS, MAX_RCV_ARRAY_COUNT, MAX_WFR_FUNCTIONS,
    MAX_WORKER_SPIN, RCV_INCREMENT, WFR_NAMES,
};
pub use control::{CAPTURE_DEFAULT_MIB, CAPTURE_MAX_MIB};
pub use counters::Counters;
/// Packets the port holds for its worker; a burst longer than this from the cable loses the rest (counted).
pub use datapath::ingress::INGRESS_QUEUE;
pub use datapath::loopback::{
    Descriptor, LB_BASE, LB_DB_DONE, LB_DB_DROPPED, LB_DB_SUBMITTED, LB_DESC_ADDR, LB_DESC_DONE, LB_DESC_ERR,
    LB_DESC_HDR_LEN, LB_DOORBELL, LB_LAST_RESULT, LB_MAX_CHAIN, LB_MAX_PAYLOAD, LB_MSIX_VECTOR, LB_SIZE,
};
pub use device::Hfi1;
pub use error::{Hfi1Error, Result};
pub use regs::{RXE_NUM_CONTEXTS, RXE_NUM_TID_FLOWS};
pub use rxe::flow::{FlowCheck, FlowEntry};
pub use rxe::rcv::{full_flow_psn, Packet, RxResult, TIDCTRL_EVEN, TIDCTRL_ODD, TIDCTRL_PAIR};
pub use rxe::rcvarray::{BufSize, RcvEntry};
/// What a driver reads in host memory: the RHF of each header-queue entry (common.h); RCV_HDR_CNT's unit.
pub use rxe::rhq::{
    HDRQ_SIZE_SHIFT, RCV_BUF_BLOCK_SIZE, RHF_BYTES, RHF_EGR_INDEX_MASK, RHF_EGR_INDEX_SHIFT, RHF_EGR_OFFSET_MASK,
    RHF_EGR_OFFSET_SHIFT, RHF_ERROR_SMASK, RHF_HDRQ_OFFSET_MASK, RHF_HDRQ_OFFSET_SHIFT, RHF_MAX_SEQ, RHF_PKT_LEN_MASK,
    RHF_RCV_SEQ_MASK, RHF_RCV_SEQ_SHIFT, RHF_RCV_TYPE_IB, RHF_RCV_TYPE_MASK, RHF_RCV_TYPE_SHIFT, RHF_USE_EGR_BFR,
};
/// What a driver writes in host memory: SDMA descriptors (sdma.h).
pub use wfr::sdma::walk::{
    DESC_BYTES, SDMA_DESC0_BYTE_COUNT_SHIFT, SDMA_DESC0_FIRST_DESC_FLAG, SDMA_DESC0_LAST_DESC_FLAG,
    SDMA_DESC1_GENERATION_MASK, SDMA_DESC1_GENERATION_SHIFT, SDMA_DESC1_HEAD_TO_HOST_FLAG,
};

#[cfg(test)]
#[path = "wfr_device_tests.rs"]
mod wfr_device_tests;

#[cfg(test)]
#[path = "fabric_tests.rs"]
mod fabric_tests;
