//! The kernel's irdma control-path functions, called by their own names, each returning the kernel's
//! 0 / -errno as a `Result`. Every call runs the unmodified ctrl.c code with this device as the shim's
//! current device.

#![forbid(unsafe_code)]

use std::sync::Arc;

use thiserror::Error;

use crate::env::{EnvError, ShimEnv};
use crate::ffi::{enter, RawIrdma};
pub use crate::ffi::{KcCcqParams, KcCqeInfo, KcCqpParams, KcQhash, KcState};

/// A kernel function returned a negative errno.
#[derive(Debug, Clone, Copy, Error, PartialEq, Eq)]
#[error("{func} returned {errno}")]
pub struct KernelError {
    pub func: &'static str,
    pub errno: i32,
}

impl KernelError {
    pub fn to_errno(&self) -> i32 {
        self.errno
    }
}

pub type KResult<T> = Result<T, KernelError>;

fn check(func: &'static str, ret: i32) -> KResult<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(KernelError { func, errno: ret })
    }
}

/// The kernel's own retry counts and delays (irdma_sc_dev_init), which a test may shorten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelHwAttrs {
    pub max_pe_ready_count: u32,
    pub max_done_count: u32,
    /// µs, `IRDMA_SLEEP_COUNT`.
    pub max_sleep_count: u32,
}

impl Default for KernelHwAttrs {
    /// irdma_sc_dev_init: 14, IRDMA_DONE_COUNT 1000, IRDMA_SLEEP_COUNT 10.
    fn default() -> Self {
        Self { max_pe_ready_count: 14, max_done_count: 1000, max_sleep_count: 10 }
    }
}

/// One irdma function driven by the kernel's ctrl.c: `struct irdma_sc_dev` with its CQP and CCQ.
pub struct KernelIrdma {
    env: Arc<ShimEnv>,
    raw: Option<RawIrdma>,
}

impl KernelIrdma {
    pub fn new(env: Arc<ShimEnv>) -> Result<Self, EnvError> {
        let raw = RawIrdma::new(&env).ok_or(EnvError::NoMemory)?;
        Ok(Self { env, raw: Some(raw) })
    }

    pub fn env(&self) -> &Arc<ShimEnv> {
        &self.env
    }

    fn call<R>(&mut self, f: impl FnOnce(&mut RawIrdma) -> R) -> R {
        let raw = self.raw.as_mut().expect("raw is Some until drop");
        enter(&self.env, || f(raw))
    }

    /// `irdma_sc_dev_init(IRDMA_GEN_2, dev, info)` (icrdma_init_hw, PE readiness, LBARCTRL), then the
    /// delays from `attrs`, the HMC limits the CCQ needs and the default VSI.
    pub fn irdma_sc_dev_init(&mut self, attrs: KernelHwAttrs) -> KResult<()> {
        let r = self.call(|k| k.dev_init(attrs.max_pe_ready_count, attrs.max_done_count, attrs.max_sleep_count));
        check("irdma_sc_dev_init", r)
    }

    /// `dev->irq_ops->irdma_cfg_ceq` = icrdma_cfg_ceq (GLINT_CEQCTL).
    pub fn irdma_cfg_ceq(&mut self, ceq_id: u32, idx: u32, enable: bool) {
        self.call(|k| k.cfg_ceq(ceq_id, idx, enable))
    }

    /// hw.c irdma_create_cqp's allocation + `irdma_sc_cqp_init(cqp, info)`.
    pub fn irdma_sc_cqp_init(&mut self, p: &KcCqpParams) -> KResult<()> {
        let r = self.call(|k| k.cqp_init(p));
        check("irdma_sc_cqp_init", r)
    }

    pub fn irdma_sc_cqp_create(&mut self, maj_err: &mut u16, min_err: &mut u16) -> KResult<()> {
        let r = self.call(|k| k.cqp_create(maj_err, min_err));
        check("irdma_sc_cqp_create", r)
    }

    pub fn irdma_sc_cqp_destroy(&mut self) -> KResult<()> {
        let r = self.call(|k| k.cqp_destroy());
        check("irdma_sc_cqp_destroy", r)
    }

    /// hw.c irdma_create_ccq's allocation + `irdma_sc_ccq_init(ccq, info)`.
    pub fn irdma_sc_ccq_init(&mut self, p: &KcCcqParams) -> KResult<()> {
        let r = self.call(|k| k.ccq_init(p));
        check("irdma_sc_ccq_init", r)
    }

    pub fn irdma_sc_ccq_create(&mut self, scratch: u64, check_overflow: bool, post_sq: bool) -> KResult<()> {
        let r = self.call(|k| k.ccq_create(scratch, check_overflow, post_sq));
        check("irdma_sc_ccq_create", r)
    }

    pub fn irdma_sc_ccq_destroy(&mut self, scratch: u64, post_sq: bool) -> KResult<()> {
        let r = self.call(|k| k.ccq_destroy(scratch, post_sq));
        check("irdma_sc_ccq_destroy", r)
    }

    pub fn irdma_sc_ccq_arm(&mut self) {
        self.call(|k| k.ccq_arm())
    }

    /// -ENOENT when the next CQE is not valid yet; the info is filled otherwise (error CQEs too).
    pub fn irdma_sc_ccq_get_cqe_info(&mut self, info: &mut KcCqeInfo) -> KResult<()> {
        let r = self.call(|k| k.ccq_get_cqe_info(info));
        check("irdma_sc_ccq_get_cqe_info", r)
    }

    /// -EIO for an error CQE (info filled), -ETIMEDOUT after 100 x max_done_count empty polls.
    pub fn irdma_sc_poll_for_cqp_op_done(&mut self, op_code: u8, info: &mut KcCqeInfo) -> KResult<()> {
        let r = self.call(|k| k.poll_for_cqp_op_done(op_code, info));
        check("irdma_sc_poll_for_cqp_op_done", r)
    }

    /// The static `irdma_sc_manage_qhash_table_entry(cqp, info, scratch, post_sq)` itself.
    pub fn irdma_sc_manage_qhash_table_entry(&mut self, q: &KcQhash, scratch: u64, post_sq: bool) -> KResult<()> {
        let r = self.call(|k| k.manage_qhash_table_entry(q, scratch, post_sq));
        check("irdma_sc_manage_qhash_table_entry", r)
    }

    /// `irdma_process_cqp_cmd` with an IRDMA_OP_MANAGE_QHASH_TABLE_ENTRY command, as utils.c
    /// irdma_manage_qhash builds it: executed at once, or queued on `dev->cqp_cmd_head`.
    pub fn irdma_process_cqp_cmd_qhash(&mut self, q: &KcQhash, scratch: u64) -> KResult<()> {
        let r = self.call(|k| k.process_qhash(q, scratch));
        check("irdma_process_cqp_cmd", r)
    }

    pub fn irdma_process_bh(&mut self) -> KResult<()> {
        let r = self.call(|k| k.process_bh());
        check("irdma_process_bh", r)
    }

    pub fn irdma_sc_cqp_post_sq(&mut self) {
        self.call(|k| k.post_sq())
    }

    pub fn state(&self) -> KcState {
        self.raw.as_ref().map(RawIrdma::state).unwrap_or_default()
    }
}

impl Drop for KernelIrdma {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            enter(&self.env, || raw.free());
        }
    }
}
