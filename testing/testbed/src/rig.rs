//! The functions the harnesses build, and the error every part of the rig returns.

#![forbid(unsafe_code)]

use std::sync::Arc;

use device_model::engine::Engine;
use device_model::hfi1::{Hfi1, Hfi1Config, Hfi1Error};
use device_model::irdma::{Irdma, IrdmaConfig};
use device_model::pci::{Function, PciError, PciIds};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RigError {
    #[error("hfi1 engine: {0}")]
    Hfi1(#[from] Hfi1Error),
    #[error("PCI function: {0}")]
    Pci(#[from] PciError),
    #[error("{op}: {source}")]
    Io { op: &'static str, source: std::io::Error },
    /// rust-vmm's server (the benchmarks' peer) failed.
    #[error("peer server: {0}")]
    Peer(String),
}

/// Which of the project's functions to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Hfi1,
    Irdma,
}

/// The function for `kind` with its default configuration and the device model's default IDs.
pub fn function(kind: Kind) -> Result<Arc<Function>, RigError> {
    let (engine, ids): (Arc<dyn Engine>, _) = match kind {
        Kind::Hfi1 => (Arc::new(Hfi1::new(Hfi1Config::default())?), PciIds::hfi1_default()),
        Kind::Irdma => (Arc::new(Irdma::new(IrdmaConfig::default())), PciIds::irdma_default()),
    };
    Ok(Function::try_new(engine, ids)?)
}
