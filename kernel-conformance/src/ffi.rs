//! The one module with `unsafe`: the C API of `shim/src/kc_irdma.c` (calls into the kernel's code), the
//! shim's runtime functions the C code calls back (`shim/include/shim/runtime.h`), and the reserved BAR
//! window the kernel's register pointers point into.
//!
//! Callbacks find their device through a thread-local pointer that [`enter`] sets for exactly the
//! duration of one call into C: the kernel's control path runs synchronously on the caller's thread (no
//! timers, tasklets or interrupts here), so every callback it makes happens inside that call.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::NonNull;

use crate::env::ShimEnv;

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
struct KcIrdma {
    _opaque: [u8; 0],
}

extern "C" {
    fn kc_irdma_abi(out: *mut KcAbi);
    fn kc_irdma_new(bar0: *mut c_void, dma_ctx: *mut c_void) -> *mut KcIrdma;
    fn kc_irdma_free(k: *mut KcIrdma);
    fn kc_irdma_dev_init(k: *mut KcIrdma, max_pe_ready_count: u32, max_done_count: u32, max_sleep: u32) -> c_int;
    fn kc_irdma_cfg_ceq(k: *mut KcIrdma, ceq_id: u32, idx: u32, enable: bool);
    fn kc_irdma_cqp_init(k: *mut KcIrdma, p: *const KcCqpParams) -> c_int;
    fn kc_irdma_cqp_create(k: *mut KcIrdma, maj: *mut u16, min: *mut u16) -> c_int;
    fn kc_irdma_cqp_destroy(k: *mut KcIrdma) -> c_int;
    fn kc_irdma_ccq_init(k: *mut KcIrdma, p: *const KcCcqParams) -> c_int;
    fn kc_irdma_ccq_create(k: *mut KcIrdma, scratch: u64, check_overflow: bool, post_sq: bool) -> c_int;
    fn kc_irdma_ccq_destroy(k: *mut KcIrdma, scratch: u64, post_sq: bool) -> c_int;
    fn kc_irdma_ccq_arm(k: *mut KcIrdma);
    fn kc_irdma_ccq_get_cqe_info(k: *mut KcIrdma, out: *mut KcCqeInfo) -> c_int;
    fn kc_irdma_poll_for_cqp_op_done(k: *mut KcIrdma, op_code: u8, out: *mut KcCqeInfo) -> c_int;
    fn kc_irdma_manage_qhash_table_entry(k: *mut KcIrdma, q: *const KcQhash, scratch: u64, post_sq: bool) -> c_int;
    fn kc_irdma_process_qhash(k: *mut KcIrdma, q: *const KcQhash, scratch: u64) -> c_int;
    fn kc_irdma_process_bh(k: *mut KcIrdma) -> c_int;
    fn kc_irdma_post_sq(k: *mut KcIrdma);
    fn kc_irdma_state(k: *const KcIrdma, out: *mut KcState);
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

thread_local! {
    static CURRENT: Cell<*const ShimEnv> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f` (a call into the kernel's C code) with `env` as the device every callback reaches.
/// Nested calls keep the outer device once they return.
pub fn enter<R>(env: &ShimEnv, f: impl FnOnce() -> R) -> R {
    struct Restore(*const ShimEnv);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(env)));
    f()
}

fn with_env<R>(what: &str, fallback: R, f: impl FnOnce(&ShimEnv) -> R) -> R {
    let p = CURRENT.with(Cell::get);
    if p.is_null() {
        tracing::error!("kernel code called {what} outside any harness call");
        return fallback;
    }
    // SAFETY: CURRENT is non-null only inside `enter`, which borrows the ShimEnv for the whole call, and
    // only on this thread; the callback runs inside that call.
    f(unsafe { &*p })
}

/// The kernel's `struct irdma_sc_dev` and friends for one device (`struct kc_irdma`).
pub struct RawIrdma {
    k: NonNull<KcIrdma>,
}

// SAFETY: the C object has no thread affinity; `&mut self` on every call keeps calls serialised.
unsafe impl Send for RawIrdma {}

impl RawIrdma {
    /// The env's address is the `struct device` DMA context; the DMA callbacks check it against the
    /// current device. An `Arc` keeps that address stable.
    pub fn new(env: &std::sync::Arc<ShimEnv>) -> Option<Self> {
        let bar0 = env.bar_base() as *mut c_void;
        let ctx = std::sync::Arc::as_ptr(env) as *mut c_void;
        // SAFETY: kc_irdma_new only stores the two pointers; bar0 is never dereferenced by the shim.
        let k = enter(env, || unsafe { kc_irdma_new(bar0, ctx) });
        NonNull::new(k).map(|k| Self { k })
    }

    fn p(&mut self) -> *mut KcIrdma {
        self.k.as_ptr()
    }

    pub fn dev_init(&mut self, pe_ready: u32, done: u32, sleep_us: u32) -> i32 {
        // SAFETY: `k` is a live object from kc_irdma_new (freed only in Drop).
        unsafe { kc_irdma_dev_init(self.p(), pe_ready, done, sleep_us) }
    }
    pub fn cfg_ceq(&mut self, ceq_id: u32, idx: u32, enable: bool) {
        // SAFETY: as above; the glue checks that dev init installed irq_ops.
        unsafe { kc_irdma_cfg_ceq(self.p(), ceq_id, idx, enable) }
    }
    pub fn cqp_init(&mut self, p: &KcCqpParams) -> i32 {
        // SAFETY: live object; `p` is a valid struct kc_cqp_params (ABI checked by abi_matches).
        unsafe { kc_irdma_cqp_init(self.p(), p) }
    }
    pub fn cqp_create(&mut self, maj: &mut u16, min: &mut u16) -> i32 {
        // SAFETY: live object; both out-pointers are valid u16s.
        unsafe { kc_irdma_cqp_create(self.p(), maj, min) }
    }
    pub fn cqp_destroy(&mut self) -> i32 {
        // SAFETY: live object.
        unsafe { kc_irdma_cqp_destroy(self.p()) }
    }
    pub fn ccq_init(&mut self, p: &KcCcqParams) -> i32 {
        // SAFETY: live object; valid params struct.
        unsafe { kc_irdma_ccq_init(self.p(), p) }
    }
    pub fn ccq_create(&mut self, scratch: u64, check_overflow: bool, post_sq: bool) -> i32 {
        // SAFETY: live object.
        unsafe { kc_irdma_ccq_create(self.p(), scratch, check_overflow, post_sq) }
    }
    pub fn ccq_destroy(&mut self, scratch: u64, post_sq: bool) -> i32 {
        // SAFETY: live object.
        unsafe { kc_irdma_ccq_destroy(self.p(), scratch, post_sq) }
    }
    pub fn ccq_arm(&mut self) {
        // SAFETY: live object.
        unsafe { kc_irdma_ccq_arm(self.p()) }
    }
    pub fn ccq_get_cqe_info(&mut self, out: &mut KcCqeInfo) -> i32 {
        // SAFETY: live object; valid out struct.
        unsafe { kc_irdma_ccq_get_cqe_info(self.p(), out) }
    }
    pub fn poll_for_cqp_op_done(&mut self, op_code: u8, out: &mut KcCqeInfo) -> i32 {
        // SAFETY: live object; valid out struct.
        unsafe { kc_irdma_poll_for_cqp_op_done(self.p(), op_code, out) }
    }
    pub fn manage_qhash_table_entry(&mut self, q: &KcQhash, scratch: u64, post_sq: bool) -> i32 {
        // SAFETY: live object; valid qhash struct (user_pri is range-checked by the glue).
        unsafe { kc_irdma_manage_qhash_table_entry(self.p(), q, scratch, post_sq) }
    }
    pub fn process_qhash(&mut self, q: &KcQhash, scratch: u64) -> i32 {
        // SAFETY: live object; the glue copies `q` into command memory it owns.
        unsafe { kc_irdma_process_qhash(self.p(), q, scratch) }
    }
    pub fn process_bh(&mut self) -> i32 {
        // SAFETY: live object.
        unsafe { kc_irdma_process_bh(self.p()) }
    }
    pub fn post_sq(&mut self) {
        // SAFETY: live object.
        unsafe { kc_irdma_post_sq(self.p()) }
    }
    pub fn state(&self) -> KcState {
        let mut s = KcState::default();
        // SAFETY: live object; kc_irdma_state only reads it and fills `s`.
        unsafe { kc_irdma_state(self.k.as_ptr(), &mut s) };
        s
    }
    /// Frees the C object; its DMA memory goes back through `shim_dma_free`, so call it inside `enter`.
    pub fn free(self) {
        let k = self.k.as_ptr();
        std::mem::forget(self);
        // SAFETY: `k` came from kc_irdma_new and is freed exactly once (Drop is skipped above).
        unsafe { kc_irdma_free(k) }
    }
}

impl Drop for RawIrdma {
    fn drop(&mut self) {
        // Reached only if `free` was not called: the DMA memory then stays with the pool's own mappings,
        // but the C object itself is released.
        // SAFETY: `k` came from kc_irdma_new and Drop runs once.
        unsafe { kc_irdma_free(self.k.as_ptr()) }
    }
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

// ---- callbacks (shim/include/shim/runtime.h) -------------------------------------------------------------

#[no_mangle]
extern "C" fn shim_mmio_read32(addr: *const c_void) -> u32 {
    with_env("readl", u32::MAX, |e| e.mmio_read32(addr as usize))
}

#[no_mangle]
extern "C" fn shim_mmio_write32(addr: *const c_void, val: u32) {
    with_env("writel", (), |e| e.mmio_write32(addr as usize, val))
}

#[no_mangle]
extern "C" fn shim_mmio_read64(addr: *const c_void) -> u64 {
    with_env("readq", u64::MAX, |e| e.mmio_read64(addr as usize))
}

#[no_mangle]
extern "C" fn shim_mmio_write64(addr: *const c_void, val: u64) {
    with_env("writeq", (), |e| e.mmio_write64(addr as usize, val))
}

#[no_mangle]
extern "C" fn shim_dma_alloc(ctx: *mut c_void, size: usize, pa: *mut u64) -> *mut c_void {
    if pa.is_null() {
        return std::ptr::null_mut();
    }
    let got = with_env("dma_alloc_coherent", None, |e| {
        if !std::ptr::eq(ctx as *const ShimEnv, e) {
            e.bug("dma_alloc_coherent with another device's struct device".into());
            return None;
        }
        e.dma_alloc(size)
    });
    match got {
        Some((va, iova)) => {
            // SAFETY: `pa` is the kernel's dma_addr_t out-parameter, checked non-null above.
            unsafe { pa.write(iova) };
            va as *mut c_void
        }
        None => std::ptr::null_mut(),
    }
}

#[no_mangle]
extern "C" fn shim_dma_free(_ctx: *mut c_void, size: usize, va: *mut c_void, pa: u64) {
    with_env("dma_free_coherent", (), |e| e.dma_free(va as usize, size, pa))
}

#[no_mangle]
extern "C" fn shim_dma_wmb() {
    std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
    with_env("dma_wmb", (), ShimEnv::on_wmb)
}

#[no_mangle]
extern "C" fn shim_dma_rmb() {
    std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
    with_env("dma_rmb", (), ShimEnv::on_rmb)
}

#[no_mangle]
extern "C" fn shim_udelay(usecs: std::ffi::c_ulong) {
    with_env("udelay", (), |e| e.udelay(usecs))
}

#[no_mangle]
extern "C" fn shim_cpu_relax() {
    std::thread::yield_now();
}

#[no_mangle]
extern "C" fn shim_log_enabled(level: c_int) -> bool {
    match level {
        0 => tracing::enabled!(target: "kernel", tracing::Level::ERROR),
        1 => tracing::enabled!(target: "kernel", tracing::Level::WARN),
        2 => tracing::enabled!(target: "kernel", tracing::Level::INFO),
        _ => tracing::enabled!(target: "kernel", tracing::Level::DEBUG),
    }
}

#[no_mangle]
extern "C" fn shim_log(level: c_int, msg: *const c_char, len: usize) {
    if msg.is_null() {
        return;
    }
    // SAFETY: print.c passes a buffer of at least `len` formatted bytes.
    let bytes = unsafe { std::slice::from_raw_parts(msg.cast::<u8>(), len) };
    let m = String::from_utf8_lossy(bytes);
    match level {
        0 => tracing::error!(target: "kernel", "{m}"),
        1 => tracing::warn!(target: "kernel", "{m}"),
        2 => tracing::info!(target: "kernel", "{m}"),
        _ => tracing::debug!(target: "kernel", "{m}"),
    }
}

fn c_str(p: *const c_char) -> String {
    if p.is_null() {
        return "?".into();
    }
    // SAFETY: the shim passes string literals (`#cond`, `__FILE__`): NUL-terminated and static.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

#[no_mangle]
extern "C" fn shim_bug(what: *const c_char, file: *const c_char, line: c_int) {
    let msg = format!("{} at {}:{line}", c_str(what), c_str(file));
    with_env("shim_bug", (), |e| e.bug(msg.clone()));
}

#[no_mangle]
extern "C" fn shim_fatal(what: *const c_char, file: *const c_char, line: c_int) -> ! {
    eprintln!("kernel-conformance: fatal in kernel code: {} at {}:{line}", c_str(what), c_str(file));
    std::process::abort()
}

#[no_mangle]
extern "C" fn shim_zalloc(size: usize) -> *mut c_void {
    // SAFETY: calloc with a size the kernel code computed; NULL is the kernel's failure value too.
    unsafe { libc::calloc(1, size.max(1)) }
}

#[no_mangle]
extern "C" fn shim_free(p: *mut c_void) {
    // SAFETY: `p` came from shim_zalloc (calloc) or is NULL, as kfree's contract requires.
    unsafe { libc::free(p) }
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

    #[test]
    fn a_callback_outside_any_call_gets_the_fallback() {
        assert_eq!(shim_mmio_read32(std::ptr::null()), u32::MAX);
    }
}
