//! hfi1 receive side for TID RDMA: RcvArray, TID flows, expected-receive setup, waiting for resources and
//! WQE setup, with the kernel's names. Lock order: a QP's `s_lock` ([`qp::QpLocked`]) outside, the
//! context's `exp_lock` ([`ctxt::ExpLocked`]) inside. See docs/udriver-hfi1.md.

#![forbid(unsafe_code)]

pub mod ctxt;
pub mod exp_rcv;
pub mod flow;
pub mod hfi;
pub mod loopback;
pub mod pageset;
pub mod qp;
pub mod regs;
pub mod sge;
pub mod tid;
pub mod tid_rdma;
pub mod tid_read;
pub mod wait;
pub mod wqe;

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_exp;
#[cfg(test)]
mod tests_read;
#[cfg(test)]
mod tests_wait;

use thiserror::Error;

use crate::access::AccessError;

/// Errors of probe and context creation; the kernel-named calls return negative errno values instead.
#[derive(Debug, Error)]
pub enum Hfi1Error {
    #[error("device reports {what} = {value:#x}, which is not a valid value")]
    BadChipValue { what: &'static str, value: u64 },
    #[error("invalid driver parameter {what} = {value}")]
    BadParam { what: &'static str, value: u64 },
    #[error(transparent)]
    Access(#[from] AccessError),
}

impl Hfi1Error {
    pub fn to_errno(&self) -> i32 {
        match self {
            Hfi1Error::BadChipValue { .. } => -libc::ENODEV,
            Hfi1Error::BadParam { .. } => -libc::EINVAL,
            Hfi1Error::Access(e) => e.to_errno(),
        }
    }
}
