//! Differential property test: random cases (ring sizes and states, CQP and CCQ parameters, quad-hash
//! infos, completions with and without errors) run on the kernel's ctrl.c and on udriver; any difference
//! in results, WQE or context bytes, register traces or store order fails the case. 10,000 cases a run
//! (KERNEL_DIFF_CASES changes it, KERNEL_DIFF_SEED replays one).

// Nothing to run without the kernel source (build.rs says so and how to get it).
#![cfg(kernel_source)]

use std::sync::Mutex;

use arbitrary::{Arbitrary, Unstructured};
use kernel_conformance::diff::case::xorshift_bytes;
use kernel_conformance::diff::{run_case, Case, Coverage};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use vfio_user_proto::sync::Unpoison;

/// Summed over the run, for the closing line (a proptest body cannot return anything).
static TOTAL: Mutex<(u64, Coverage)> = Mutex::new((0, Coverage::ZERO));

fn seed() -> RngSeed {
    match std::env::var("KERNEL_DIFF_SEED").ok().and_then(|v| v.parse().ok()) {
        Some(s) => RngSeed::Fixed(s),
        None => RngSeed::Random,
    }
}

fn cases() -> u32 {
    std::env::var("KERNEL_DIFF_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 2000,
        failure_persistence: None,
        rng_seed: seed(),
        ..ProptestConfig::default()
    })]
    #[test]
    fn the_kernel_and_udriver_build_the_same_wqes_and_decode_the_same_cqes(
        bytes in proptest::collection::vec(any::<u8>(), 16..6000)
    ) {
        let case = Case::arbitrary(&mut Unstructured::new(&bytes)).unwrap();
        match run_case(&case) {
            Ok(c) => {
                let mut t = TOTAL.lock().unpoison();
                t.0 += 1;
                t.1.add(&c);
                if t.0 == u64::from(cases()) {
                    let k = kernel_conformance::KERNEL_SOURCE_VERSION;
                    eprintln!("{} differential cases against {k}, no difference: {:?}", t.0, t.1);
                }
            }
            Err(e) => prop_assert!(false, "{e}\ncase: {case:#?}"),
        }
    }
}

/// Cases from a fixed byte stream reach every kind of step the comparison covers.
#[test]
fn the_cases_reach_wqes_full_rings_cqes_and_error_cqes() {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut total = Coverage::default();
    for _ in 0..300 {
        let bytes = xorshift_bytes(&mut x, 3000);
        let case = Case::arbitrary(&mut Unstructured::new(&bytes)).unwrap();
        total.add(&run_case(&case).unwrap_or_else(|e| panic!("{e}\n{case:#?}")));
    }
    assert!(total.cqps_created > 200, "{total:?}");
    for (what, n) in
        [("WQEs", total.wqes), ("CQEs", total.cqes), ("error CQEs", total.error_cqes), ("SQ full", total.sq_full)]
    {
        assert!(n > 0, "no {what}: {total:?}");
    }
}
