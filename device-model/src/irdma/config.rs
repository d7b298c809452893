//! How an irdma function is built.

#![forbid(unsafe_code)]

use std::time::Duration;

use crate::worker::WorkerMode;

/// Construction parameters of an irdma function.
#[derive(Debug, Clone)]
pub struct IrdmaConfig {
    /// Quad-hash table capacity (entries). Default 4096; at most `IRDMA_EMU_MAX_QHASH_CAPACITY` (larger values
    /// are clamped). Storage is reserved up front.
    pub qhash_capacity: usize,
    /// MSI-X vectors of the function. Default 4. Also the number of GLINT_CEQCTL registers.
    pub msix_vectors: u16,
    /// How long the worker waits for the driver to consume a CCQ entry when the CCQ is full. Default 10 ms.
    pub ccq_full_wait: Duration,
    /// Largest CCQ the device accepts in CREATE_CQ (entries). Default 1 << 20 (CQEIDX is 20 bits).
    pub max_ccq_size: u64,
    /// Where the CQP worker's jobs run. Default a thread that sleeps between jobs ([`WorkerMode::default`]).
    pub worker: WorkerMode,
}

impl Default for IrdmaConfig {
    fn default() -> Self {
        Self {
            qhash_capacity: 4096,
            msix_vectors: 4,
            ccq_full_wait: Duration::from_millis(10),
            max_ccq_size: 1 << 20,
            worker: WorkerMode::default(),
        }
    }
}

/// Largest quad-hash table the device builds.
pub const IRDMA_EMU_MAX_QHASH_CAPACITY: usize = 1 << 20;
