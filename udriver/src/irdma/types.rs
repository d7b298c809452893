//! The control path's shared structs (the kernel's type.h): the device, its configuration, the state behind
//! the CQP lock and the commands it serialises. Only types live here; `dev` brings the device up and
//! `process` runs the commands, and neither imports the other through these types.

#![forbid(unsafe_code)]

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration;

use super::ccq::{IrdmaCcqCqeInfo, IrdmaScCq};
use super::cqp::{IrdmaHwAttrs, IrdmaProtocolUsed, IrdmaScCqp};
use super::defs::*;
use super::qhash::IrdmaQhashTableInfo;
use super::regs::IrdmaHw;
use super::IrdmaError;

/// How `IrdmaDev` brings up its control path. The defaults are what `irdma_create_cqp` / `irdma_create_ccq`
/// use on GEN2.
#[derive(Clone, Copy, Debug)]
pub struct IrdmaDevConfig {
    pub hw_attrs: IrdmaHwAttrs,
    pub sq_size: u32,
    pub ccq_size: u32,
    pub hmc_profile: u8,
    pub protocol_used: IrdmaProtocolUsed,
    pub hw_maj_ver: u16,
    pub hw_min_ver: u16,
    pub wait_mode: IrdmaCqpWaitMode,
    /// How long a command may take from submission to completion.
    pub cqp_timeout: Duration,
    /// Longest single interrupt wait; waiters re-check their completion at least this often, because
    /// another waiter may have taken the interrupt and drained their CQE.
    pub irq_slice: Duration,
}

/// IRDMA_HMC_PROFILE_DEFAULT.
pub const IRDMA_HMC_PROFILE_DEFAULT: u8 = 1;
/// HW_MAJVER of a GEN2 device.
pub const IRDMA_GEN2_HW_MAJ_VER: u16 = 1;

impl Default for IrdmaDevConfig {
    fn default() -> Self {
        Self {
            hw_attrs: IrdmaHwAttrs::default(),
            sq_size: IRDMA_CQP_SW_SQSIZE_2048,
            ccq_size: IW_CCQ_SIZE,
            hmc_profile: IRDMA_HMC_PROFILE_DEFAULT,
            protocol_used: IrdmaProtocolUsed::IrdmaRoceProtocolOnly,
            hw_maj_ver: IRDMA_GEN2_HW_MAJ_VER,
            hw_min_ver: 0,
            wait_mode: IrdmaCqpWaitMode::Poll,
            cqp_timeout: Duration::from_secs(5),
            irq_slice: Duration::from_millis(10),
        }
    }
}

/// One irdma function's control path: the CQP and CCQ, created, behind the CQP lock.
pub struct IrdmaDev {
    pub(crate) hw: IrdmaHw,
    pub(crate) config: IrdmaDevConfig,
    /// GLPCI_LBARCTRL.PE_DB_SIZE found at init.
    pub db_size: u32,
    /// `dev->cqp_lock`: the CQP, the CCQ and the backlog.
    pub(crate) cqp_lock: Mutex<IrdmaCqpState>,
    pub(crate) next_scratch: AtomicU64,
}

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
pub(super) enum Done {
    Cqe(IrdmaCcqCqeInfo),
    Failed(IrdmaError),
}

/// Everything `dev->cqp_lock` protects.
pub struct IrdmaCqpState {
    pub cqp: IrdmaScCqp,
    pub ccq: IrdmaScCq,
    /// `dev->cqp_cmd_head`: commands waiting for SQ space, oldest first.
    pub cqp_cmd_head: VecDeque<IrdmaCqpCmdInfo>,
    /// Commands that had to wait in the backlog since bring-up.
    pub backlogged_ops: u64,
    pub(super) done: HashMap<u64, Done>,
    /// Commands whose waiter gave up; their late completions are dropped.
    pub(super) abandoned: HashSet<u64>,
}

impl IrdmaCqpState {
    pub(crate) fn new(cqp: IrdmaScCqp, ccq: IrdmaScCq) -> Self {
        Self {
            cqp,
            ccq,
            cqp_cmd_head: VecDeque::new(),
            backlogged_ops: 0,
            done: HashMap::new(),
            abandoned: HashSet::new(),
        }
    }

    pub(super) fn finish(&mut self, scratch: u64, done: Done) {
        if !self.abandoned.remove(&scratch) {
            self.done.insert(scratch, done);
        }
    }
}
