//! Command serialisation (`irdma_process_cqp_cmd`, hw.c/utils.c): commands go to the SQ under the CQP lock,
//! or to a FIFO backlog while the SQ is full; completions drained from the CCQ free slots and the backlog
//! moves on. Waiting is by CCQ polling or by interrupt, always bounded (reference 3.6, 3.9).

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::ccq::{irdma_sc_ccq_arm, irdma_sc_ccq_get_cqe_info, IrdmaCcqCqeInfo};
use super::cqp::{irdma_sc_cqp_nop, sleep, IrdmaScCqp};
use super::defs::*;
use super::qhash::{irdma_sc_manage_qhash_table_entry, IrdmaQhashTableInfo};
use super::types::{Done, IrdmaDev};
pub use super::types::{IrdmaCqpCmd, IrdmaCqpCmdInfo, IrdmaCqpState, IrdmaCqpWaitMode};
use super::{IrdmaError, Result};

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
            Err(IrdmaError::SqFull) => {}
            other => return other,
        }
    }
    st.cqp_cmd_head.push_back(pcmdinfo);
    st.backlogged_ops += 1;
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
/// -EIO (`CqeError`), a garbage CQE -EIO (`BadCqe`), no completion -ETIMEDOUT. On any failure other than its
/// own completion the command is given up: withdrawn if still in the backlog, else its late completion is
/// dropped; only after a timeout may its slot be reused before that completion comes.
pub fn irdma_wait_cqp_op(dev: &IrdmaDev, scratch: u64) -> Result<IrdmaCcqCqeInfo> {
    let deadline = Instant::now() + dev.config.cqp_timeout;
    match wait_for(dev, scratch, deadline) {
        Ok(Done::Cqe(info)) => Ok(info),
        Ok(Done::Failed(e)) => Err(e),
        Err(e) => {
            // Only a timeout says the completion may never come; after another error it may still.
            abandon(&mut dev.lock(), scratch, matches!(e, IrdmaError::Timeout(_)));
            Err(e)
        }
    }
}

fn wait_for(dev: &IrdmaDev, scratch: u64, deadline: Instant) -> Result<Done> {
    loop {
        {
            let mut st = dev.lock();
            let drained = irdma_cqp_ce_handler(&mut st);
            if let Some(done) = st.done.remove(&scratch) {
                return Ok(done);
            }
            drained?;
            if Instant::now() >= deadline {
                return Err(IrdmaError::Timeout("CQP command completion"));
            }
            if let IrdmaCqpWaitMode::Event { .. } = dev.config.wait_mode {
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
            // Until a deadline, not a count: with no sleep between looks it yields, as the device may answer
            // from another thread.
            IrdmaCqpWaitMode::Poll => match dev.config.hw_attrs.max_sleep.min(remaining) {
                d if d.is_zero() => std::thread::yield_now(),
                d => sleep(d),
            },
            IrdmaCqpWaitMode::Event { vector } => {
                dev.hw.device().wait_irq(vector, remaining.min(dev.config.irq_slice))?;
            }
        }
    }
}

/// Gives up on `scratch`: out of the backlog if queued; if posted and not yet completed, its completion
/// will be dropped, and with `timed_out` its slot may be reused before it comes.
fn abandon(st: &mut IrdmaCqpState, scratch: u64, timed_out: bool) {
    let queued = st.cqp_cmd_head.len();
    st.cqp_cmd_head.retain(|c| c.scratch != scratch);
    if st.cqp_cmd_head.len() == queued && st.cqp.is_outstanding(scratch) {
        st.abandoned.insert(scratch);
        if timed_out {
            st.cqp.give_up(scratch);
        }
    }
    st.done.remove(&scratch);
    // A command whose slot was since reused as lost can never complete: forget it, or the set would grow by
    // one entry per lost completion for the life of the device.
    let live: std::collections::HashSet<u64> = st.cqp.outstanding().collect();
    st.abandoned.retain(|s| live.contains(s));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dma::DmaPool;
    use crate::irdma::cqp::irdma_sc_cqp_nop;
    use crate::irdma::dev::IrdmaDevConfig;
    use crate::irdma::regs::IrdmaRegisters::{IRDMA_CQARM, IRDMA_GLINT_CEQCTL};
    use crate::irdma::testdev::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn up(sq_size: u32, ccq_size: u32, wait_mode: IrdmaCqpWaitMode) -> (Arc<FakeIrdma>, IrdmaDev) {
        up_with(sq_size, ccq_size, wait_mode, Duration::from_millis(200))
    }

    fn up_with(
        sq_size: u32,
        ccq_size: u32,
        wait_mode: IrdmaCqpWaitMode,
        cqp_timeout: Duration,
    ) -> (Arc<FakeIrdma>, IrdmaDev) {
        let dev = FakeIrdma::executing();
        let pool = Arc::new(DmaPool::new(dev.clone(), false));
        let cfg = IrdmaDevConfig {
            hw_attrs: fast_attrs(),
            sq_size,
            ccq_size,
            wait_mode,
            cqp_timeout,
            irq_slice: Duration::from_millis(5),
            ..Default::default()
        };
        let irdma = IrdmaDev::new(pool, cfg).unwrap();
        (dev, irdma)
    }

    /// G9's SYN listener on `port`.
    fn listener(port: u16) -> IrdmaQhashTableInfo {
        IrdmaQhashTableInfo { dest_port: port, ..g9_syn_listener() }
    }

    fn errno<T>(r: Result<T>) -> i32 {
        r.err().map_or(0, |e| e.to_errno())
    }

    #[test]
    fn a_qhash_add_reaches_the_device_and_completes() {
        let (dev, irdma) = up(2048, 2050, IrdmaCqpWaitMode::Poll);
        let info = irdma_manage_qhash(&irdma, &listener(4791)).unwrap();
        assert_eq!((info.op_code, info.wqe_idx, info.error), (IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY, 1, false));
        let exec = dev.executed();
        assert_eq!(exec[1][1], 0x0000_0005_0000_12B7);
        assert_eq!(exec[1][3], 0xB000_0825_0000_0000);
    }

    #[test]
    fn both_rings_wrap_and_every_command_completes() {
        let (dev, irdma) = up(4, 4, IrdmaCqpWaitMode::Poll);
        for i in 0..21u16 {
            let cmd = if i % 2 == 0 { IrdmaCqpCmd::Nop } else { IrdmaCqpCmd::ManageQhashTableEntry(listener(i)) };
            let info = irdma_handle_cqp_op(&irdma, cmd).unwrap();
            assert_eq!(info.op_code, cmd.op_code(), "command {i}");
            // CREATE_CQ took SQ slot 0, so command i sits in slot (i + 1) % 4.
            assert_eq!(info.wqe_idx, u32::from(i + 1) % 4, "command {i}");
        }
        // 22 WQEs: the valid bit of each follows its pass over the 4-entry SQ (1, 0, 1, ...).
        let exec = dev.executed();
        assert_eq!(exec.len(), 22);
        for (n, w) in exec.iter().enumerate() {
            assert_eq!(IRDMA_CQPSQ_WQEVALID.get(w[3]), 1 - (n as u64 / 4) % 2, "WQE {n}");
        }
        let st = irdma.lock();
        // 22 CQEs on a 4-entry CCQ: 5 wraps, so polarity 1 ^ 1 (odd) = 0 and head 2.
        assert_eq!((st.ccq.cq_ring().head(), st.ccq.polarity), (2, 0));
        assert_eq!(st.cqp.sq_ring().used_quanta(), 0);
    }

    /// G11 on the full-size rings, end to end: WQE 2047 rings the doorbell with 0 and the next pass writes
    /// valid bits of 0.
    #[test]
    fn the_2048_entry_sq_and_2050_entry_ccq_wrap_end_to_end() {
        let (dev, irdma) = up(2048, 2050, IrdmaCqpWaitMode::Poll);
        for i in 0..2100u32 {
            let info = irdma_handle_cqp_op(&irdma, IrdmaCqpCmd::Nop).unwrap();
            assert_eq!(info.wqe_idx, (i + 1) % 2048, "command {i}");
        }
        let db = dev.writes_to(crate::irdma::regs::IrdmaRegisters::IRDMA_CQPDB);
        // init's 0, CREATE_CQ's 1, then one per command: command i rings (i + 2) % 2048.
        assert_eq!(db[..3], [0, 1, 2]);
        assert_eq!(db[2047 + 1], 0, "WQE 2047 rings 0");
        let exec = dev.executed();
        assert_eq!(IRDMA_CQPSQ_WQEVALID.get(exec[2047][3]), 1);
        assert_eq!(IRDMA_CQPSQ_WQEVALID.get(exec[2048][3]), 0, "second pass starts with valid bit 0");
        let st = irdma.lock();
        // 2101 CQEs on 2050 entries: one wrap, polarity 0, head 51.
        assert_eq!((st.ccq.cq_ring().head(), st.ccq.polarity), (51, 0));
    }

    #[test]
    fn a_full_sq_queues_commands_in_a_backlog_that_drains_as_completions_free_slots() {
        let (dev, irdma) = up(4, 4, IrdmaCqpWaitMode::Poll);
        dev.hold(true);
        let scratches: Vec<u64> = (0..5).map(|_| irdma_post_cqp_op(&irdma, IrdmaCqpCmd::Nop).unwrap()).collect();
        {
            let mut st = irdma.lock();
            assert_eq!(st.cqp_cmd_head.len(), 2, "3 usable SQ slots, 2 commands wait");
            assert_eq!(st.backlogged_ops, 2);
            assert!(st.cqp.sq_ring().is_full());
            assert_eq!(errno(irdma_sc_cqp_nop(&mut st.cqp, 0, false)), -libc::ENOMEM);
        }
        assert_eq!(dev.executed().len(), 4);
        dev.release();
        irdma_wait_cqp_op(&irdma, scratches[0]).unwrap();
        assert!(irdma.lock().cqp_cmd_head.is_empty(), "completions moved the backlog to the SQ");
        assert_eq!(dev.executed().len(), 6);
        dev.release();
        for s in &scratches[1..] {
            irdma_wait_cqp_op(&irdma, *s).unwrap();
        }
    }

    #[test]
    fn backlogged_commands_keep_their_submission_order() {
        let (dev, irdma) = up(4, 4, IrdmaCqpWaitMode::Poll);
        dev.hold(true);
        let ports = [10u16, 11, 12, 13, 14, 15];
        let scratches: Vec<u64> = ports
            .iter()
            .map(|p| irdma_post_cqp_op(&irdma, IrdmaCqpCmd::ManageQhashTableEntry(listener(*p))).unwrap())
            .collect();
        dev.hold(false);
        dev.release();
        for s in scratches {
            irdma_wait_cqp_op(&irdma, s).unwrap();
        }
        let seen: Vec<u64> = dev.executed()[1..].iter().map(|w| w[1] & 0xFFFF).collect();
        assert_eq!(seen, ports.map(u64::from));
    }

    #[test]
    fn waiting_by_interrupt_arms_the_ccq_and_wakes_on_msix() {
        let (dev, irdma) = up(8, 8, IrdmaCqpWaitMode::Event { vector: 0 });
        dev.hold(true);
        let s = irdma_post_cqp_op(&irdma, IrdmaCqpCmd::Nop).unwrap();
        let dev2 = dev.clone();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            dev2.release();
        });
        let info = irdma_wait_cqp_op(&irdma, s).unwrap();
        releaser.join().unwrap();
        assert_eq!(info.op_code, IRDMA_CQP_OP_NOP);
        assert!(dev.irqs_raised() >= 1);
        assert!(!dev.writes_to(IRDMA_CQARM).is_empty());
        assert_eq!(dev.writes_to(IRDMA_CQARM).iter().max(), Some(&0), "the CCQ is CQ 0");
        // icrdma_cfg_ceq(dev, 0, 0, true): CAUSE_ENA 1<<30 | ITR_INDX 3<<11 | MSIX_INDX 0.
        assert_eq!(dev.writes_to(IRDMA_GLINT_CEQCTL), [0x4000_1800]);
    }

    #[test]
    fn a_device_that_never_completes_times_out_in_both_wait_modes() {
        for mode in [IrdmaCqpWaitMode::Poll, IrdmaCqpWaitMode::Event { vector: 0 }] {
            let (dev, irdma) = up(4, 4, mode);
            dev.hold(true);
            let r = irdma_handle_cqp_op(&irdma, IrdmaCqpCmd::Nop);
            assert!(matches!(r, Err(IrdmaError::Timeout(_))), "{mode:?}");
            assert_eq!(errno(r), -libc::ETIMEDOUT, "{mode:?}");
        }
    }

    #[test]
    fn a_late_completion_after_a_timeout_is_dropped_and_the_cqp_keeps_working() {
        let (dev, irdma) = up(4, 4, IrdmaCqpWaitMode::Poll);
        dev.hold(true);
        assert_eq!(errno(irdma_handle_cqp_op(&irdma, IrdmaCqpCmd::Nop)), -libc::ETIMEDOUT);
        dev.hold(false);
        dev.release();
        irdma_handle_cqp_op(&irdma, IrdmaCqpCmd::Nop).unwrap();
        let st = irdma.lock();
        assert!(st.done.is_empty() && st.abandoned.is_empty());
    }

    #[test]
    fn commands_whose_completions_were_lost_are_forgotten_once_their_slots_are_reused() {
        let (dev, irdma) = up_with(4, 8, IrdmaCqpWaitMode::Poll, Duration::from_millis(5));
        for round in 0..12 {
            dev.hold(true);
            assert_eq!(errno(irdma_handle_cqp_op(&irdma, IrdmaCqpCmd::Nop)), -libc::ETIMEDOUT, "round {round}");
            dev.lose_held();
            dev.hold(false);
            irdma_handle_cqp_op(&irdma, IrdmaCqpCmd::Nop).unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        // Twelve lost completions; only a command still outstanding can be waited for, and the SQ holds 4.
        let st = irdma.lock();
        assert!(st.abandoned.len() <= 4, "{} abandoned commands kept for a 4-slot SQ", st.abandoned.len());
        assert!(st.abandoned.iter().all(|s| st.cqp.is_outstanding(*s)));
    }

    #[test]
    fn a_command_that_times_out_in_the_backlog_is_withdrawn() {
        let (dev, irdma) = up(4, 4, IrdmaCqpWaitMode::Poll);
        dev.hold(true);
        for _ in 0..3 {
            irdma_post_cqp_op(&irdma, IrdmaCqpCmd::Nop).unwrap();
        }
        let queued = irdma_post_cqp_op(&irdma, IrdmaCqpCmd::Nop).unwrap();
        assert_eq!(errno(irdma_wait_cqp_op(&irdma, queued)), -libc::ETIMEDOUT);
        assert!(irdma.lock().cqp_cmd_head.is_empty());
        dev.release();
        assert_eq!(dev.executed().len(), 4, "the withdrawn command never reaches the SQ");
    }

    #[test]
    fn an_error_completion_gives_eio_with_the_major_and_minor_codes() {
        let (dev, irdma) = up(4, 4, IrdmaCqpWaitMode::Poll);
        dev.fail_op(IRDMA_CQP_OP_MANAGE_QUAD_HASH_TABLE_ENTRY, IRDMA_CQPSQ_MAJ_CNTXTCACHE_ERROR, 1);
        let r = irdma_manage_qhash(&irdma, &listener(1));
        assert!(matches!(r, Err(IrdmaError::CqeError { op: 0x25, maj: 0xF001, min: 1 })));
        assert_eq!(errno(r), -libc::EIO);
        irdma_handle_cqp_op(&irdma, IrdmaCqpCmd::Nop).unwrap();
    }

    #[test]
    fn a_garbage_cqe_gives_eio_instead_of_a_completion() {
        let (dev, irdma) = up(4, 4, IrdmaCqpWaitMode::Poll);
        dev.hold(true);
        let s = irdma_post_cqp_op(&irdma, IrdmaCqpCmd::Nop).unwrap();
        dev.post_cqe(0xBAD_C0DE, 0, IRDMA_CQ_WQEIDX.prep(1));
        let r = irdma_wait_cqp_op(&irdma, s);
        assert!(matches!(r, Err(IrdmaError::BadCqe(_))));
        assert_eq!(errno(r), -libc::EIO);
        // No timeout: its own completion may still come, so its slot is not handed out before it does.
        assert!(!irdma.lock().cqp.is_given_up(s));
        // The real completion arrives later, is dropped, and the CQP carries on.
        dev.hold(false);
        dev.release();
        irdma_handle_cqp_op(&irdma, IrdmaCqpCmd::Nop).unwrap();
        let st = irdma.lock();
        assert!(st.done.is_empty() && st.abandoned.is_empty() && st.cqp.sq_ring().used_quanta() == 0);
    }

    #[test]
    fn several_threads_share_the_cqp_through_the_lock() {
        let (_dev, irdma) = up_with(4, 4, IrdmaCqpWaitMode::Poll, Duration::from_secs(10));
        let irdma = Arc::new(irdma);
        let workers: Vec<_> = (0..4u16)
            .map(|t| {
                let irdma = irdma.clone();
                std::thread::spawn(move || {
                    (0..25u16).all(|i| irdma_manage_qhash(&irdma, &listener(t * 100 + i)).is_ok())
                })
            })
            .collect();
        for w in workers {
            assert!(w.join().unwrap());
        }
        let st = irdma.lock();
        assert_eq!(st.cqp.completed_ops, 101, "CREATE_CQ plus 100 qhash entries");
        assert!(st.cqp_cmd_head.is_empty() && st.done.is_empty());
    }
}
