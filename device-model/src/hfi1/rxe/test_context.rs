//! The receive context the RXE tests program, as hfi1_rcvctrl and hfi1_setup_eagerbufs enable a kernel
//! context with the project's module parameters: rcvhdrcnt 64 entries of hdrq_entsize 32 dwords at HDRQ, 8
//! eager buffers of 16 KiB at EAGER (hfi1_put_tid PT_EAGER into RcvArray entries 0..8).

#![forbid(unsafe_code)]

use super::rhq::HDRQ_SIZE_SHIFT;
use super::state::Rxe;
use crate::hfi1::counters::Counters;
use crate::hfi1::regs::*;
use crate::hfi1::shm::SharedWords;

pub const HDRQ: u64 = 0x10_0000;
pub const EAGER: u64 = 0x40_0000;
pub const ENTRIES: u64 = 64;
pub const ENTSIZE: u64 = 32;
pub const EGR_BUFS: u64 = 8;
pub const EGR_SIZE: u64 = 16 * 1024;

/// An RXE of 4 contexts (its RcvArray file named `name`) with context `ctxt` enabled: the header queue and
/// eager buffers above, whatever `setup` programs on top, then RCV_CTXT_CTRL with ENABLE, INTR_AVAIL, the
/// 16 KiB eager size and `ctrl_extra`.
pub fn enabled(name: &str, ctxt: usize, ctrl_extra: u64, setup: impl FnOnce(&mut Rxe, &Counters)) -> (Rxe, Counters) {
    let n = Counters::default();
    let mut c = Rxe::new(4, SharedWords::new(name, RCV_ARRAY, 4096).unwrap(), false);
    let k = |reg| kctxt_csr(reg, ctxt as u64);
    c.write(k(RCV_HDR_ADDR), HDRQ, &n);
    c.write(k(RCV_HDR_CNT), ENTRIES >> HDRQ_SIZE_SHIFT, &n);
    c.write(k(RCV_HDR_ENT_SIZE), 4, &n);
    c.write(k(RCV_EGR_CTRL), (EGR_BUFS >> RCV_SHIFT) << RCV_EGR_CTRL_EGR_CNT_SHIFT, &n);
    for i in 0..EGR_BUFS {
        // hfi1_put_tid(PT_EAGER): WRITE_ENABLE, size code log2(16K / 4K) + 1 = 3, address in 4 KiB units.
        let addr = (EAGER + i * EGR_SIZE) >> 12;
        c.write(RCV_ARRAY + 8 * i, (1 << 63) | (3 << 36) | addr, &n);
    }
    setup(&mut c, &n);
    let ctrl = RCV_CTXT_CTRL_ENABLE_SMASK | RCV_CTXT_CTRL_INTR_AVAIL_SMASK | (3 << RCV_CTXT_CTRL_EGR_BUF_SIZE_SHIFT);
    c.write(k(RCV_CTXT_CTRL), ctrl | ctrl_extra, &n);
    (c, n)
}
