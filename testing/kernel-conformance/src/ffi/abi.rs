//! The C API of `shim/src/kc_irdma.c` as Rust sees it: the `#[repr(C)]` mirrors of its structs, its
//! functions, the check that both sides agree on the structs' sizes, and the reserved BAR window the
//! kernel's register pointers point into. Nothing here reaches the harness; the callbacks (`super`) do.

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;

/// `struct kc_cqp_params` (shim/include/shim/kc_irdma.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KcCqpParams {
    pub sq_size: u32,
    pub dcqcn_b: u32,
    pub rreduce_mperiod: u32,
    pub hw_maj_ver: u16,
    pub hw_min_ver: u16,
    pub rai_factor: u16,
    pub hai_factor: u16,
    pub dcqcn_t: u16,
    pub struct_ver: u8,
    pub hmc_profile: u8,
    pub ena_vf_count: u8,
    pub ceqs_per_vf: u8,
    pub disable_packed: u8,
    pub rocev2_rto_policy: u8,
    pub protocol_used: u8,
    pub en_datacenter_tcp: u8,
    pub cc_cfg_valid: u8,
    pub min_dec_factor: u8,
    pub min_rate: u8,
    pub dcqcn_f: u8,
}

/// `struct kc_ccq_params`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KcCcqParams {
    pub num_elem: u32,
    pub ceq_id: u32,
    pub shadow_read_threshold: u32,
    pub vsi_idx: u16,
    pub ceqe_mask: u8,
    pub ceq_id_valid: u8,
    pub avoid_mem_cflct: u8,
    pub tph_en: u8,
    pub tph_val: u8,
    pub pad: u8,
}

/// `struct kc_qhash`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KcQhash {
    pub manage: u32,
    pub entry_type: u32,
    pub qp_num: u32,
    pub dest_ip: [u32; 4],
    pub src_ip: [u32; 4],
    pub qs_handle: [u16; 8],
    pub vlan_id: u16,
    pub dest_port: u16,
    pub src_port: u16,
    pub mac_addr: [u8; 6],
    pub vlan_valid: u8,
    pub ipv4_valid: u8,
    pub user_pri: u8,
    pub pad: [u8; 3],
}

/// `struct kc_cqe_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KcCqeInfo {
    pub scratch: u64,
    pub op_ret_val: u32,
    pub maj_err_code: u16,
    pub min_err_code: u16,
    pub op_code: u8,
    pub error: u8,
    pub cqp_is_ours: u8,
    pub pad: [u8; 5],
}

/// `struct kc_state`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KcState {
    pub cqp_addr: u64,
    pub ccq_addr: u64,
    pub sq_va: u64,
    pub sq_pa: u64,
    pub host_ctx_va: u64,
    pub host_ctx_pa: u64,
    pub sdbuf_pa: u64,
    pub ccq_va: u64,
    pub ccq_pa: u64,
    pub shadow_va: u64,
    pub shadow_pa: u64,
    pub requested_ops: u64,
    pub completed_ops: u64,
    pub sq_size: u32,
    pub sq_head: u32,
    pub sq_tail: u32,
    pub ccq_size: u32,
    pub ccq_head: u32,
    pub ccq_tail: u32,
    pub backlog_len: u32,
    pub polarity: u8,
    pub ccq_polarity: u8,
    pub pad: [u8; 2],
}

#[repr(C)]
#[derive(Default)]
struct KcAbi {
    cqp_params: u32,
    ccq_params: u32,
    qhash: u32,
    cqe_info: u32,
    state: u32,
}

#[repr(C)]
pub(super) struct KcIrdma {
    _opaque: [u8; 0],
}

extern "C" {
    fn kc_irdma_abi(out: *mut KcAbi);
    pub(super) fn kc_irdma_new(bar0: *mut c_void, dma_ctx: *mut c_void) -> *mut KcIrdma;
    pub(super) fn kc_irdma_free(k: *mut KcIrdma);
    pub(super) fn kc_irdma_dev_init(
        k: *mut KcIrdma,
        max_pe_ready_count: u32,
        max_done_count: u32,
        max_sleep: u32,
    ) -> c_int;
    pub(super) fn kc_irdma_cfg_ceq(k: *mut KcIrdma, ceq_id: u32, idx: u32, enable: bool);
    pub(super) fn kc_irdma_cqp_init(k: *mut KcIrdma, p: *const KcCqpParams) -> c_int;
    pub(super) fn kc_irdma_cqp_create(k: *mut KcIrdma, maj: *mut u16, min: *mut u16) -> c_int;
    pub(super) fn kc_irdma_cqp_destroy(k: *mut KcIrdma) -> c_int;
    pub(super) fn kc_irdma_ccq_init(k: *mut KcIrdma, p: *const KcCcqParams) -> c_int;
    pub(super) fn kc_irdma_ccq_create(k: *mut KcIrdma, scratch: u64, check_overflow: bool, post_sq: bool) -> c_int;
    pub(super) fn kc_irdma_ccq_destroy(k: *mut KcIrdma, scratch: u64, post_sq: bool) -> c_int;
    pub(super) fn kc_irdma_ccq_arm(k: *mut KcIrdma);
    pub(super) fn kc_irdma_ccq_get_cqe_info(k: *mut KcIrdma, out: *mut KcCqeInfo) -> c_int;
    pub(super) fn kc_irdma_poll_for_cqp_op_done(k: *mut KcIrdma, op_code: u8, out: *mut KcCqeInfo) -> c_int;
    pub(super) fn kc_irdma_manage_qhash_table_entry(
        k: *mut KcIrdma,
        q: *const KcQhash,
        scratch: u64,
        post_sq: bool,
    ) -> c_int;
    pub(super) fn kc_irdma_process_qhash(k: *mut KcIrdma, q: *const KcQhash, scratch: u64) -> c_int;
    pub(super) fn kc_irdma_process_bh(k: *mut KcIrdma) -> c_int;
    pub(super) fn kc_irdma_post_sq(k: *mut KcIrdma);
    pub(super) fn kc_irdma_state(k: *const KcIrdma, out: *mut KcState);
}

/// Whether the C side's structure sizes are the ones mirrored here (a mismatch would corrupt memory).
pub fn abi_matches() -> bool {
    let mut a = KcAbi::default();
    // SAFETY: kc_irdma_abi only writes the five u32 fields of the struct it is given.
    unsafe { kc_irdma_abi(&mut a) };
    [a.cqp_params, a.ccq_params, a.qhash, a.cqe_info, a.state]
        == [
            size_of::<KcCqpParams>(),
            size_of::<KcCcqParams>(),
            size_of::<KcQhash>(),
            size_of::<KcCqeInfo>(),
            size_of::<KcState>(),
        ]
        .map(|s| s as u32)
}

/// An address range reserved with no access, standing for a BAR: the kernel computes register pointers
/// inside it (`hw_addr + offset`) and hands them to readl/writel, which only subtract the base. A direct
/// dereference by kernel code faults instead of touching memory.
pub struct BarWindow {
    base: NonNull<c_void>,
    len: usize,
}

// SAFETY: the window is never accessed, only its address is used.
unsafe impl Send for BarWindow {}
// SAFETY: as above.
unsafe impl Sync for BarWindow {}

impl BarWindow {
    pub fn new(len: usize) -> std::io::Result<Self> {
        use rustix::mm::{mmap_anonymous, MapFlags, ProtFlags};
        // SAFETY: a fresh private anonymous mapping with no access rights; nothing aliases it.
        let p = unsafe {
            mmap_anonymous(std::ptr::null_mut(), len, ProtFlags::empty(), MapFlags::PRIVATE | MapFlags::NORESERVE)
        }
        .map_err(std::io::Error::from)?;
        let base = NonNull::new(p).ok_or_else(|| std::io::Error::other("mmap returned NULL"))?;
        Ok(Self { base, len })
    }
    pub fn base(&self) -> usize {
        self.base.as_ptr() as usize
    }
    /// The BAR offset of a register pointer, if it lies inside the window with room for `width` bytes.
    pub fn offset_of(&self, addr: usize, width: usize) -> Option<u64> {
        let off = addr.checked_sub(self.base())?;
        (off.checked_add(width)? <= self.len).then_some(off as u64)
    }
}

impl Drop for BarWindow {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, once.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rust_mirrors_have_the_c_structs_sizes() {
        assert!(abi_matches());
    }

    #[test]
    fn the_bar_window_names_only_offsets_inside_it() {
        let w = BarWindow::new(0x1000).unwrap();
        let b = w.base();
        let cases = [
            (b, 4, Some(0)),
            (b + 0xFFC, 4, Some(0xFFC)),
            (b + 0xFFD, 4, None),
            (b - 4, 4, None),
            (usize::MAX, 4, None),
        ];
        for (addr, width, want) in cases {
            assert_eq!(w.offset_of(addr, width), want, "{addr:#x}+{width}");
        }
    }
}
