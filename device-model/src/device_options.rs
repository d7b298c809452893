//! One device as the command line describes it, built into a PCI function: what `main` serves, and what a
//! replay rebuilds from a recording's header (the same options give the same device).

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cli::DeviceKind;
use crate::engine::Engine;
use crate::fault::FaultSpec;
use crate::hfi1::wfr::Icode;
use crate::hfi1::{Hfi1, Hfi1Config, Personality};
use crate::irdma::{Irdma, IrdmaConfig};
use crate::pci::{Function, PciIds};
use crate::worker::WorkerMode;

/// The options that shape one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceOptions {
    pub kind: DeviceKind,
    /// PCI vendor and device IDs when not the kind's defaults.
    pub ids: Option<(u16, u16)>,
    pub hfi1_contexts: Option<u32>,
    pub hfi1_rcvarray_entries: Option<u32>,
    pub irdma_qhash_capacity: Option<u32>,
    pub worker_spin_us: Option<u64>,
    /// Which function of its kind (a second chip-personality function is 1).
    #[serde(default)]
    pub instance: u8,
    /// The chip personality's implementation code; `None` is `WfrShape`'s default (the command line always
    /// states it).
    #[serde(default)]
    pub icode: Option<Icode>,
}

impl DeviceOptions {
    pub fn new(kind: DeviceKind) -> Self {
        DeviceOptions {
            kind,
            ids: None,
            hfi1_contexts: None,
            hfi1_rcvarray_entries: None,
            irdma_qhash_capacity: None,
            worker_spin_us: None,
            instance: 0,
            icode: None,
        }
    }

    pub fn pci_ids(&self) -> PciIds {
        let default = match self.kind {
            DeviceKind::Hfi1 => PciIds::hfi1_default(),
            DeviceKind::Hfi1Wfr => PciIds::hfi1_wfr_default(),
            DeviceKind::Irdma => PciIds::irdma_default(),
        };
        self.ids.map_or(default, |(v, d)| default.with_vendor_device(v, d))
    }

    fn engine(&self) -> Result<Arc<dyn Engine>, String> {
        let spin = self.worker_spin_us.map(Duration::from_micros);
        Ok(match self.kind {
            DeviceKind::Hfi1 | DeviceKind::Hfi1Wfr => Arc::new(self.hfi1()?),
            DeviceKind::Irdma => {
                let mut config = IrdmaConfig::default();
                if let Some(n) = self.irdma_qhash_capacity {
                    config.qhash_capacity = n as usize;
                }
                if let Some(s) = spin {
                    config.worker = WorkerMode::Thread { spin: s };
                }
                Arc::new(Irdma::new(config))
            }
        })
    }

    fn hfi1(&self) -> Result<Hfi1, String> {
        let spin = self.worker_spin_us.map(Duration::from_micros);
        Ok(match self.kind {
            DeviceKind::Irdma => return Err("not an hfi1 device".into()),
            DeviceKind::Hfi1 | DeviceKind::Hfi1Wfr => {
                let mut config = if self.kind == DeviceKind::Hfi1 {
                    Hfi1Config::default()
                } else {
                    Hfi1Config::wfr_instance(self.instance)
                };
                if let (Personality::Wfr(shape), Some(icode)) = (&mut config.personality, self.icode) {
                    shape.icode = icode;
                }
                // The size options shape the project's own function; the chip personality keeps the chip's.
                if self.kind == DeviceKind::Hfi1 {
                    if let Some(n) = self.hfi1_contexts {
                        config.rcv_contexts = n as usize;
                    }
                    if let Some(n) = self.hfi1_rcvarray_entries {
                        config.rcv_array_count = n as usize;
                    }
                }
                if let Some(s) = spin {
                    config.worker = WorkerMode::Thread { spin: s };
                }
                Hfi1::new(config).map_err(|e| format!("hfi1: {e}"))?
            }
        })
    }

    /// The device, with `faults` armed.
    pub fn build(&self, faults: &[FaultSpec]) -> Result<Arc<Function>, String> {
        self.wrap(self.engine()?, faults)
    }

    fn wrap(&self, engine: Arc<dyn Engine>, faults: &[FaultSpec]) -> Result<Arc<Function>, String> {
        let function = Function::try_new(engine, self.pci_ids()).map_err(|e| format!("{}: {e}", self.kind.name()))?;
        for spec in faults {
            function.arm_fault(spec.clone())?;
        }
        Ok(function)
    }

    /// Two chip-personality functions joined by a cable whose link trains for `training` (docs/hfi1-fabric.md):
    /// `a` is end A.
    pub fn build_cabled(
        a: (&DeviceOptions, &[FaultSpec]),
        b: (&DeviceOptions, &[FaultSpec]),
        training: Duration,
    ) -> Result<[Arc<Function>; 2], String> {
        if a.0.kind != DeviceKind::Hfi1Wfr || b.0.kind != DeviceKind::Hfi1Wfr {
            return Err("a cable joins two hfi1-wfr functions".into());
        }
        let (ea, eb) = (a.0.hfi1()?, b.0.hfi1()?);
        Hfi1::connect(&ea, &eb, training).map_err(|e| e.to_string())?;
        Ok([a.0.wrap(Arc::new(ea), a.1)?, b.0.wrap(Arc::new(eb), b.1)?])
    }

    /// What a recording's header says about the device: these options and the faults armed when its
    /// session began (kept current by the function as faults come and go).
    pub fn header(&self, faults: &[String]) -> serde_json::Value {
        let device = Hfi1Config { instance: self.instance, ..Hfi1Config::wfr() };
        let name = if self.kind == DeviceKind::Hfi1Wfr { device.name() } else { self.kind.name() };
        serde_json::json!({ "device": name, "options": self, "faults": faults })
    }

    /// The options and faults of a recording's header.
    pub fn from_header(header: &serde_json::Value) -> Result<(DeviceOptions, Vec<FaultSpec>), String> {
        let options: DeviceOptions = serde_json::from_value(header.get("options").cloned().unwrap_or_default())
            .map_err(|e| format!("recording header: options: {e}"))?;
        let faults = match header.get("faults") {
            None => Vec::new(),
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .map(|v| {
                    let text = v.as_str().ok_or("recording header: a fault is not a string")?;
                    FaultSpec::parse(text).map_err(|e| format!("recording header: {e}"))
                })
                .collect::<Result<_, String>>()?,
            Some(_) => return Err("recording header: faults is not a list".into()),
        };
        Ok((options, faults))
    }
}
