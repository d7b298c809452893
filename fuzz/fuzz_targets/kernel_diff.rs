//! The Linux kernel's irdma control path (ctrl.c, unmodified, built by kernel-conformance) against
//! udriver, on identical fake devices.
//!
//! The input becomes a differential case (`kernel_conformance::diff::Case`): CQP and CCQ parameters, ring
//! sizes, and a sequence of quad-hash WQEs, device completions (with error codes, consumed by
//! get_cqe_info or poll_for_cqp_op_done), arms and doorbells, then the register-polled CCQ destroy and
//! the CQP destroy. Oracle: after every step both drivers returned the same, decoded the same CQE info,
//! hold the same ring state, and left the same device-visible trace (register accesses, and queue memory
//! at every barrier and register write); every WQE is zeroed, filled, fenced, then made valid, then rung.
//! Any difference panics with the step and both values.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use kernel_conformance::diff::{run_case, Case};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(case) = Case::arbitrary(&mut Unstructured::new(data)) else { return };
    if let Err(e) = run_case(&case) {
        panic!("kernel and udriver differ: {e}\ncase: {case:#?}");
    }
});
