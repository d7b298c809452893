//! Hardware TID flows (§1.5, §1.6): the 32-flow bitmask allocator, generations and the flow-table register.

#![forbid(unsafe_code)]

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use super::ctxt::{ExpLocked, Hfi1Ctxtdata};
use super::qp::QpLocked;
use super::regs::*;
use super::wait::{
    dequeue_tid_waiter, first_qp, kernel_tid_waiters, queue_qp_for_tid_wait, tid_rdma_schedule_tid_wakeup,
    trigger_tid_waiter, QueueId,
};
use crate::access::AccessError;

/// `kern_flow_generation_next`: the next generation, never the reserved one.
pub fn kern_flow_generation_next(gen: u32) -> u32 {
    let next = gen.wrapping_add(1) & GENERATION_MASK;
    if next == KERN_GENERATION_RESERVED {
        (next + 1) & GENERATION_MASK
    } else {
        next
    }
}

/// `kern_reserve_flow(rcd, last)`: takes flow `last` again if it is free, else the lowest free flow.
/// `last` = RXE_NUM_TID_FLOWS means no preference. -EAGAIN when all 32 are taken.
pub fn kern_reserve_flow(rcd: &mut ExpLocked<'_>, last: u32) -> Result<u32, i32> {
    if last < RXE_NUM_TID_FLOWS && rcd.flow_mask & (1 << last) == 0 {
        rcd.flow_mask |= 1 << last;
        return Ok(last);
    }
    let nr = (!rcd.flow_mask).trailing_zeros();
    if nr >= RXE_NUM_TID_FLOWS {
        return Err(-libc::EAGAIN);
    }
    rcd.flow_mask |= 1 << nr;
    Ok(nr)
}

/// `kern_set_hw_flow(rcd, generation, flow_idx)`: writes one flow-table entry.
pub fn kern_set_hw_flow(rcd: &Hfi1Ctxtdata, generation: u32, flow_idx: u32) -> Result<(), AccessError> {
    let offset = RCV_TID_FLOW_TABLE + 8 * u64::from(flow_idx % RXE_NUM_TID_FLOWS);
    rcd.dd.csr().write_uctxt_csr(rcd.ctxt, offset, tid_flow_table_value(generation))
}

/// `kern_setup_hw_flow(rcd, flow_idx)`: arms the flow with its software generation and returns it.
pub fn kern_setup_hw_flow(rcd: &mut ExpLocked<'_>, flow_idx: u32) -> Result<u32, AccessError> {
    let idx = (flow_idx % RXE_NUM_TID_FLOWS) as usize;
    let generation = rcd.flows[idx].generation;
    kern_set_hw_flow(rcd.rcd, generation, flow_idx)?;
    Ok(generation)
}

/// `kern_clear_hw_flow(rcd, flow_idx)`: advances the generation and parks the entry on the reserved one.
pub fn kern_clear_hw_flow(rcd: &mut ExpLocked<'_>, flow_idx: u32) -> Result<(), AccessError> {
    let idx = (flow_idx % RXE_NUM_TID_FLOWS) as usize;
    rcd.flows[idx].generation = kern_flow_generation_next(rcd.flows[idx].generation);
    kern_set_hw_flow(rcd.rcd, KERN_GENERATION_RESERVED, flow_idx)
}

fn random_u32() -> u32 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64));
    h.finish() as u32
}

/// `mask_generation(get_random_u32())`: any 20-bit value, the reserved one included, as the kernel takes it.
pub fn mask_generation(a: u32) -> u32 {
    a & GENERATION_MASK
}

/// `hfi1_kern_init_ctxt_generations(rcd)`: random software generations, every hardware entry reserved.
pub fn hfi1_kern_init_ctxt_generations(rcd: &Hfi1Ctxtdata) -> Result<(), AccessError> {
    let mut exp = rcd.lock_exp();
    for i in 0..RXE_NUM_TID_FLOWS {
        exp.flows[i as usize].generation = mask_generation(random_u32());
        kern_set_hw_flow(rcd, KERN_GENERATION_RESERVED, i)?;
    }
    Ok(())
}

/// `hfi1_kern_setup_hw_flow(rcd, qp)`: gives `qp` a hardware flow. -EAGAIN queues the QP on `flow_queue`;
/// it is woken when a flow frees. -EINVAL if `rcd` is not the QP's context. A failed flow-table write
/// releases the flow, takes the QP off the queue, wakes the next waiter and returns its errno.
pub fn hfi1_kern_setup_hw_flow(rcd: &Hfi1Ctxtdata, qp: &mut QpLocked<'_>) -> Result<(), i32> {
    if !std::ptr::eq(rcd, &*qp.qp.rcd) {
        return Err(-libc::EINVAL);
    }
    if qp.flow_state.index < RXE_NUM_TID_FLOWS {
        return Ok(());
    }
    let mut exp = rcd.lock_exp();
    if kernel_tid_waiters(&mut exp, QueueId::Flow, qp) {
        queue_qp_for_tid_wait(&mut exp, QueueId::Flow, qp);
        return Err(-libc::EAGAIN);
    }
    let index = match kern_reserve_flow(&mut exp, qp.flow_state.last_index) {
        Ok(i) => i,
        Err(e) => {
            queue_qp_for_tid_wait(&mut exp, QueueId::Flow, qp);
            return Err(e);
        }
    };
    // A generation carried over a RESYNC becomes the flow's software generation.
    if qp.flow_state.generation != KERN_GENERATION_RESERVED {
        exp.flows[index as usize].generation = qp.flow_state.generation;
    }
    let generation = match kern_setup_hw_flow(&mut exp, index) {
        Ok(g) => g,
        Err(e) => {
            // The flow goes back, and the QP leaves the queue as a success would, so it cannot hold up the
            // waiters behind it.
            exp.flow_mask &= !(1 << index);
            dequeue_tid_waiter(&mut exp, QueueId::Flow, qp);
            let fqp = first_qp(&mut exp, QueueId::Flow);
            drop(exp);
            tid_rdma_schedule_tid_wakeup(fqp);
            return Err(e.to_errno());
        }
    };
    qp.flow_state.index = index;
    qp.flow_state.last_index = index;
    qp.flow_state.generation = generation;
    qp.flow_state.psn = 0;
    dequeue_tid_waiter(&mut exp, QueueId::Flow, qp);
    let fqp = first_qp(&mut exp, QueueId::Flow);
    drop(exp);
    tid_rdma_schedule_tid_wakeup(fqp);
    Ok(())
}

/// `hfi1_kern_clear_hw_flow(rcd, qp)`: releases the QP's flow and wakes the head of `flow_queue`. The
/// software state is always released; an error only reports a failed flow-table write.
pub fn hfi1_kern_clear_hw_flow(rcd: &Hfi1Ctxtdata, qp: &mut QpLocked<'_>) -> Result<(), i32> {
    if !std::ptr::eq(rcd, &*qp.qp.rcd) {
        return Err(-libc::EINVAL);
    }
    let index = qp.flow_state.index;
    if index >= RXE_NUM_TID_FLOWS {
        return Ok(());
    }
    let mut exp = rcd.lock_exp();
    let written = kern_clear_hw_flow(&mut exp, index);
    exp.flow_mask &= !(1 << index);
    qp.flow_state.index = RXE_NUM_TID_FLOWS;
    qp.flow_state.psn = 0;
    qp.flow_state.generation = KERN_GENERATION_RESERVED;
    let fqp = first_qp(&mut exp, QueueId::Flow);
    drop(exp);
    match fqp {
        Some(f) if std::sync::Arc::ptr_eq(&f, qp.qp) => trigger_tid_waiter(qp),
        other => tid_rdma_schedule_tid_wakeup(other),
    }
    written.map_err(|e| e.to_errno())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// tid_rdma.c:848-856: `mask_generation(get_random_u32())` keeps a random 0xFFFFF (the reserved
    /// generation) as it is; only kern_flow_generation_next steps over it.
    #[test]
    fn an_initial_generation_is_the_random_value_masked_reserved_value_included() {
        for (random, gen) in [(u32::MAX, 0xFFFFF), (0x1234_5678, 0x45678), (0xFFF0_0000, 0)] {
            assert_eq!(mask_generation(random), gen, "{random:#x}");
        }
    }

    #[test]
    fn generation_advances_and_wraps_past_the_reserved_value() {
        let cases = [(0x12345, 0x12346), (0xFFFFD, 0xFFFFE), (0xFFFFE, 0x00000), (0xFFFFF, 0x00000), (0, 1)];
        for (g, next) in cases {
            assert_eq!(kern_flow_generation_next(g), next, "from {g:#x}");
        }
    }
}
