//! How the harness reaches a device model: the rig's in-process backend, or a real vfio-user socket served in
//! this process (`testbed::Served`). Kept in one module so the rest of the harness does not care which.

#![forbid(unsafe_code)]

use std::sync::Arc;

use device_model::irdma::{Irdma, IrdmaConfig};
use device_model::pci::{Function, PciIds};
use testbed::{InProcess, Served};
use udriver::access::DeviceAccess;
use udriver::backend::vfio_user::VfioUserBackend;
use udriver::dma::DmaPool;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    InProcess,
    VfioUser,
}

/// An irdma device model with a driver-side view of it (register access and a DMA pool).
pub struct IrdmaModel {
    pub engine: Arc<Irdma>,
    pub function: Arc<Function>,
    pub access: Arc<dyn DeviceAccess>,
    pub pool: Arc<DmaPool>,
    /// Declared last: the client goes before the server stops.
    _served: Option<Served>,
}

impl IrdmaModel {
    /// Memory decoding and bus mastering are enabled, as a probe does before touching BARs or DMA.
    pub fn new(cfg: IrdmaConfig, transport: Transport) -> Result<Self, String> {
        let engine = Arc::new(Irdma::new(cfg));
        let function = Function::new(engine.clone(), PciIds::irdma_default());
        let (access, served): (Arc<dyn DeviceAccess>, _) = match transport {
            Transport::InProcess => (Arc::new(InProcess::new(function.clone())), None),
            Transport::VfioUser => {
                let s = Served::function(function.clone()).map_err(|e| format!("serve: {e}"))?;
                let c = VfioUserBackend::connect(s.path(), true).map_err(|e| format!("connect: {e}"))?;
                (Arc::new(c), Some(s))
            }
        };
        access.pci_enable_device().map_err(|e| format!("pci_enable_device: {e}"))?;
        let pool = Arc::new(DmaPool::new(access.clone(), false));
        Ok(Self { engine, function, access, pool, _served: served })
    }
}
