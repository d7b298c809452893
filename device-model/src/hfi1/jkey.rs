//! Which contexts are a user's, as the chip sees them: by their job key (J_KEY).
//!
//! The kernel turns the job-key checks on for every context it gives a J_KEY (chip.c hfi1_set_ctxt_jkey:
//! SEND_CTXT_CHECK_JOB_KEY with SEND_CTXT_CHECK_ENABLE.CHECK_JOB_KEY on the send side,
//! RCV_KEY_CTRL.JOB_KEY_ENABLE on the receive side), and off again when a user context closes
//! (hfi1_clear_ctxt_jkey). Kernel contexts get one too, for TID RDMA (tid_rdma.c hfi1_kern_exp_rcv_init:
//! TID_RDMA_JKEY 32), so "job key on" alone does not make a context a user's. The J_KEY space is split
//! (hfi.h generate_jkey): 0..=31 administrators, 32..=63 kernel protocols (tid_rdma.c HFI1_KERNEL_MIN_JKEY,
//! HFI1_KERNEL_MAX_JKEY), 64..=65535 other users. A user context is one whose job-key check is on with a key
//! outside the kernel's range (docs/decisions.md).

#![forbid(unsafe_code)]

use std::ops::RangeInclusive;

/// J_KEYs the kernel keeps for its own KDETH protocols (tid_rdma.c HFI1_KERNEL_MIN_JKEY..=_MAX_JKEY).
pub const KERNEL_JKEYS: RangeInclusive<u16> = 32..=63;

/// RCV_KEY_CTRL fields (chip_registers.h).
pub const RCV_KEY_CTRL_JOB_KEY_ENABLE_SMASK: u64 = 0x2_0000_0000;
pub const RCV_KEY_CTRL_JOB_KEY_VALUE_MASK: u64 = 0xFFFF;
/// SEND_CTXT_CHECK_ENABLE.CHECK_JOB_KEY and SEND_CTXT_CHECK_JOB_KEY.VALUE (chip_registers.h).
pub const SEND_CTXT_CHECK_ENABLE_CHECK_JOB_KEY_SMASK: u64 = 0x4;
pub const SEND_CTXT_CHECK_JOB_KEY_VALUE_MASK: u64 = 0xFFFF;
pub const SEND_CTXT_CHECK_JOB_KEY_MASK_SMASK: u64 = 0xFFFF_0000;

fn is_user_key(key: u64) -> bool {
    !KERNEL_JKEYS.contains(&(key as u16))
}

/// Whether a receive context with this RCV_KEY_CTRL is a user's.
pub fn rcv_is_user(rcv_key_ctrl: u64) -> bool {
    rcv_key_ctrl & RCV_KEY_CTRL_JOB_KEY_ENABLE_SMASK != 0 && is_user_key(rcv_key_ctrl & RCV_KEY_CTRL_JOB_KEY_VALUE_MASK)
}

/// Whether a send context with this SEND_CTXT_CHECK_ENABLE and SEND_CTXT_CHECK_JOB_KEY is a user's.
/// A send context is a user's when its job key was set for one: the kernel turns CHECK_JOB_KEY on for every
/// context type on B0 silicon (hfi.h:2260-2262) but leaves SEND_CTXT_CHECK_JOB_KEY at 0 (chip.c:13784) unless
/// hfi1_set_ctxt_jkey writes a key with an all-ones mask (chip.c:14776-14782).
pub fn send_is_user(check_enable: u64, check_job_key: u64) -> bool {
    check_enable & SEND_CTXT_CHECK_ENABLE_CHECK_JOB_KEY_SMASK != 0
        && check_job_key & SEND_CTXT_CHECK_JOB_KEY_MASK_SMASK != 0
        && is_user_key(check_job_key & SEND_CTXT_CHECK_JOB_KEY_VALUE_MASK)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SEND_CTXT_CHECK_JOB_KEY.MASK, which hfi1_set_ctxt_jkey always sets.
    const MASK_ALL_ONES: u64 = SEND_CTXT_CHECK_JOB_KEY_MASK_SMASK;

    #[test]
    fn a_context_is_a_users_when_its_job_key_check_is_on_with_a_key_outside_the_kernels_range() {
        // (what the kernel wrote, user?): hfi1_set_ctxt_jkey for a root user (uid 0 -> 0), an unprivileged
        // user below 64 (uid 5 -> 0x8005) and above (uid 1000), TID RDMA's kernel key 32, the range's ends,
        // and hfi1_clear_ctxt_jkey (0).
        let table = [
            (Some(0u16), true),
            (Some(0x8005), true),
            (Some(1000), true),
            (Some(31), true),
            (Some(32), false),
            (Some(63), false),
            (Some(64), true),
            (None, false),
        ];
        for (key, user) in table {
            let (rcv, enable, job_key) = match key {
                Some(k) => (
                    RCV_KEY_CTRL_JOB_KEY_ENABLE_SMASK | u64::from(k),
                    SEND_CTXT_CHECK_ENABLE_CHECK_JOB_KEY_SMASK | 0x1,
                    MASK_ALL_ONES | u64::from(k),
                ),
                None => (0, 0x1, 0),
            };
            assert_eq!(rcv_is_user(rcv), user, "{key:?}");
            assert_eq!(send_is_user(enable, job_key), user, "{key:?}");
        }
    }

    #[test]
    fn a_kernel_send_context_with_the_job_key_check_on_but_no_key_set_is_no_users() {
        // The VL15 and kernel contexts after init: CHECK_JOB_KEY on (hfi.h:2260-2262), the key register 0.
        assert!(!send_is_user(SEND_CTXT_CHECK_ENABLE_CHECK_JOB_KEY_SMASK, 0));
    }

    #[test]
    fn a_key_without_its_check_enabled_is_no_users() {
        assert!(!rcv_is_user(1000));
        assert!(!send_is_user(0, MASK_ALL_ONES | 1000));
    }
}
