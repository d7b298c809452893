//! The one module with `unsafe` (with its `abi` part): the C API of `shim/src/kc_irdma.c` (calls into the kernel's code), the
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

mod abi;

use abi::*;
pub use abi::{abi_matches, BarWindow, KcCcqParams, KcCqeInfo, KcCqpParams, KcQhash, KcState};

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
    fn a_callback_outside_any_call_gets_the_fallback() {
        assert_eq!(shim_mmio_read32(std::ptr::null()), u32::MAX);
    }
}
