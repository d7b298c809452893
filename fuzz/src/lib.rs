//! Shared pieces of the fuzz targets: oracles that several targets use.
//!
//! Each target lives in `fuzz_targets/`; this library holds what is worth testing on its own (the DMA
//! write recorder, the fd counter) so the oracles themselves are checked by `cargo test` in this crate.

pub mod dma_oracle;
pub mod fds;
pub mod heap;
pub mod hfi1_oracle;
pub mod hostile;
pub mod mmio_input;
pub mod reused_thread;
pub mod timing;
pub mod wire_client;

/// Held by every unit test that opens descriptors: the fd oracle's own test counts the whole process's.
#[cfg(test)]
static FD_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

// Under `--cfg fuzzing` every object carries sanitizer-coverage calls whose runtime is libFuzzer, so the
// unit tests of this library link it too, with an input function that is never called.
#[cfg(all(test, fuzzing))]
mod libfuzzer_runtime {
    extern crate libfuzzer_sys;

    #[no_mangle]
    pub extern "C" fn LLVMFuzzerTestOneInput(_data: *const u8, _size: usize) -> i32 {
        0
    }
}
