//! Command serialisation (`irdma_process_cqp_cmd`, hw.c/utils.c): commands go to the SQ under the CQP lock,
//! or to a FIFO backlog while the SQ is full; completions drained from the CCQ free slots and the backlog
//! moves on. Waiting is by CCQ polling or by interrupt, always bounded (reference 3.6, 3.9).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::ccq::{irdma_sc_ccq_arm, irdma_sc_ccq_get_cqe_info, IrdmaCcqCqeInfo, IrdmaScCq};
use super::cqp::{irdma_sc_cqp_nop, sleep, IrdmaScCqp};
use super::defs::*;
use super::dev::IrdmaDev;
use super::qhash::{irdma_sc_manage_qhash_table_entry, IrdmaQhashTableInfo};
use super::{IrdmaError, Result};

/// The commands this driver issues through `irdma_process_cqp_cmd` (`pcmdinfo->cqp_cmd`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IrdmaCqpCmd {
    ManageQhashTableEntry(IrdmaQhashTableInfo),
    Nop,
}

impl IrdmaCqpCmd {
    pub fn op_code(&self) -> u8 {
        match self {
            IrdmaCqpCmd::ManageQhashTableEntry(_) => IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY,
            IrdmaCqpCmd::Nop => IRDMA_CQP_OP_NOP,
        }
    }
}

/// `struct cqp_cmds_info`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IrdmaCqpCmdInfo {
    pub cqp_cmd: IrdmaCqpCmd,
    pub post_sq: bool,
    pub scratch: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IrdmaCqpWaitMode {
    /// Poll the CCQ every max_sleep (`irdma_sc_poll_for_cqp_op_done`'s way).
    Poll,
    /// Arm the CCQ and wait for MSI-X `vector` (the kernel's CEQ-driven `irdma_cqp_ce_handler`).
    Event { vector: u32 },
}

/// The outcome of one command, kept until its waiter collects it.
#[derive(Debug)]
enum Done {
    Cqe(IrdmaCcqCqeInfo),
    Failed(IrdmaError),
}

/// Everything `dev->cqp_lock` protects.
pub struct IrdmaCqpState {
    pub cqp: IrdmaScCqp,
    pub ccq: IrdmaScCq,
    /// `dev->cqp_cmd_head`: commands waiting for SQ space, oldest first.
    pub cqp_cmd_head: VecDeque<IrdmaCqpCmdInfo>,
    done: HashMap<u64, Done>,
    /// Commands whose waiter gave up; their late completions are dropped.
    abandoned: HashSet<u64>,
}

impl IrdmaCqpState {
    pub(crate) fn new(cqp: IrdmaScCqp, ccq: IrdmaScCq) -> Self {
        Self { cqp, ccq, cqp_cmd_head: VecDeque::new(), done: HashMap::new(), abandoned: HashSet::new() }
    }

    fn finish(&mut self, scratch: u64, done: Done) {
        if !self.abandoned.remove(&scratch) {
            self.done.insert(scratch, done);
        }
    }
}

/// `irdma_exec_cqp_cmd`: builds the command's WQE and rings the doorbell if asked.
pub fn irdma_exec_cqp_cmd(cqp: &mut IrdmaScCqp, pcmdinfo: &IrdmaCqpCmdInfo) -> Result<()> {
    match &pcmdinfo.cqp_cmd {
        IrdmaCqpCmd::ManageQhashTableEntry(info) => {
            irdma_sc_manage_qhash_table_entry(cqp, info, pcmdinfo.scratch, pcmdinfo.post_sq)
        }
        IrdmaCqpCmd::Nop => irdma_sc_cqp_nop(cqp, pcmdinfo.scratch, pcmdinfo.post_sq),
    }
}

/// `irdma_process_cqp_cmd(dev, pcmdinfo)`: executes at once when nothing is queued and the SQ has room,
/// else queues behind the backlog (FIFO, so commands never overtake each other).
pub fn irdma_process_cqp_cmd(dev: &IrdmaDev, pcmdinfo: IrdmaCqpCmdInfo) -> Result<()> {
    let mut st = dev.lock();
    process_locked(&mut st, pcmdinfo)
}

fn process_locked(st: &mut IrdmaCqpState, pcmdinfo: IrdmaCqpCmdInfo) -> Result<()> {
    if st.cqp_cmd_head.is_empty() && !st.cqp.sq_ring().is_full() {
        match irdma_exec_cqp_cmd(&mut st.cqp, &pcmdinfo) {
            Err(IrdmaError::SqFull) => st.cqp_cmd_head.push_back(pcmdinfo),
            other => return other,
        }
    } else {
        st.cqp_cmd_head.push_back(pcmdinfo);
    }
    Ok(())
}

/// `irdma_process_bh`: moves backlogged commands to the SQ while it has room. A command that fails to build
/// completes with that error.
pub fn irdma_process_bh(st: &mut IrdmaCqpState) {
    while !st.cqp.sq_ring().is_full() {
        let Some(cmd) = st.cqp_cmd_head.pop_front() else { break };
        match irdma_exec_cqp_cmd(&mut st.cqp, &cmd) {
            Ok(()) => {}
            Err(IrdmaError::SqFull) => {
                st.cqp_cmd_head.push_front(cmd);
                break;
            }
            Err(e) => st.finish(cmd.scratch, Done::Failed(e)),
        }
    }
}

/// `irdma_cqp_ce_handler`'s CCQ drain, under the lock: every new CQE completes its command, then the
/// backlog moves. Returns how many CQEs were consumed, or the first bad CQE's error.
pub fn irdma_cqp_ce_handler(st: &mut IrdmaCqpState) -> Result<u32> {
    let mut n = 0;
    let result = loop {
        let mut info = IrdmaCcqCqeInfo::default();
        match irdma_sc_ccq_get_cqe_info(&mut st.ccq, &mut st.cqp, &mut info) {
            Ok(()) => {
                n += 1;
                let done = if info.error && info.op_code != IRDMA_CQP_OP_QUERY_STAG {
                    Done::Failed(IrdmaError::CqeError {
                        op: info.op_code,
                        maj: info.maj_err_code,
                        min: info.min_err_code,
                    })
                } else {
                    Done::Cqe(info)
                };
                st.finish(info.scratch, done);
            }
            Err(IrdmaError::NoCqe) => break Ok(n),
            Err(e) => break Err(e),
        }
    };
    irdma_process_bh(st);
    result
}

/// Submits `cmd` without waiting; returns its scratch for `irdma_wait_cqp_op`.
pub fn irdma_post_cqp_op(dev: &IrdmaDev, cmd: IrdmaCqpCmd) -> Result<u64> {
    let scratch = dev.next_scratch.fetch_add(1, Ordering::Relaxed);
    irdma_process_cqp_cmd(dev, IrdmaCqpCmdInfo { cqp_cmd: cmd, post_sq: true, scratch })?;
    Ok(scratch)
}

/// Waits for the command `scratch` to complete, at most `cqp_timeout`. A completion with the error bit gives
/// -EIO (`CqeError`), a garbage CQE -EIO (`BadCqe`), no completion -ETIMEDOUT; a command that timed out
/// while still in the backlog is withdrawn.
pub fn irdma_wait_cqp_op(dev: &IrdmaDev, scratch: u64) -> Result<IrdmaCcqCqeInfo> {
    let deadline = Instant::now() + dev.config.cqp_timeout;
    loop {
        {
            let mut st = dev.lock();
            let drained = irdma_cqp_ce_handler(&mut st);
            if let Some(done) = st.done.remove(&scratch) {
                return match done {
                    Done::Cqe(info) => Ok(info),
                    Done::Failed(e) => Err(e),
                };
            }
            if let Err(e) = drained {
                abandon(&mut st, scratch);
                return Err(e);
            }
            if Instant::now() >= deadline {
                abandon(&mut st, scratch);
                return Err(IrdmaError::Timeout("CQP command completion"));
            }
            if let super::IrdmaCqpWaitMode::Event { .. } = dev.config.wait_mode {
                // Arm before sleeping, then look once more: a CQE that landed before the arm raises no
                // interrupt.
                irdma_sc_ccq_arm(&st.ccq)?;
                if st.ccq.has_new_cqe()? {
                    continue;
                }
            }
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        match dev.config.wait_mode {
            IrdmaCqpWaitMode::Poll => sleep(dev.config.hw_attrs.max_sleep.min(remaining)),
            IrdmaCqpWaitMode::Event { vector } => {
                dev.hw.device().wait_irq(vector, remaining.min(dev.config.irq_slice))?;
            }
        }
    }
}

fn abandon(st: &mut IrdmaCqpState, scratch: u64) {
    let queued = st.cqp_cmd_head.len();
    st.cqp_cmd_head.retain(|c| c.scratch != scratch);
    if st.cqp_cmd_head.len() == queued {
        st.abandoned.insert(scratch);
    }
}

/// `irdma_handle_cqp_op`: submit and wait.
pub fn irdma_handle_cqp_op(dev: &IrdmaDev, cmd: IrdmaCqpCmd) -> Result<IrdmaCcqCqeInfo> {
    let scratch = irdma_post_cqp_op(dev, cmd)?;
    irdma_wait_cqp_op(dev, scratch)
}

/// `irdma_manage_qhash`'s CQP part: one quad-hash add, modify or delete, waited for.
pub fn irdma_manage_qhash(dev: &IrdmaDev, info: &IrdmaQhashTableInfo) -> Result<IrdmaCcqCqeInfo> {
    irdma_handle_cqp_op(dev, IrdmaCqpCmd::ManageQhashTableEntry(*info))
}
