//! The function's shape and the constants its blocks share: the personality, the BAR, the RcvArray's limits,
//! the chip-personality functions' names. Every child of `hfi1` reads them here, not from its parent.

use emu_abi::hfi1::{LB_BASE, LB_SIZE};

use super::error::{Hfi1Error, Result};
use super::regs::{self, RXE_NUM_CONTEXTS};
use super::wfr;
use crate::worker::WorkerMode;

/// RcvArray entries are handed out in groups of 8 (RCV_INCREMENT).
pub const RCV_INCREMENT: usize = 8;
/// The largest RcvArray an RCV_TID_CTRL base can reach: (TID_BASE_INDEX mask + 1) << RCV_SHIFT.
pub const MAX_RCV_ARRAY_COUNT: usize = ((regs::RCV_TID_CTRL_TID_BASE_INDEX_MASK as usize) + 1) << regs::RCV_SHIFT;
/// BAR0 size: covers every block used (the loopback block ends at 32 MiB); the real chip's BAR is 64 MiB.
pub const HFI1_BAR0_SIZE: u64 = 0x200_0000;
/// BAR index of the register BAR (64-bit, so it also takes index 1).
pub const HFI1_BAR: u32 = 0;
/// MSI-X vectors the function has: vector 0 signals loopback completion.
pub const HFI1_MSIX_VECTORS: u16 = 1;
// The RcvArray's mapping must end below the user CSRs in the chip's map too.
const _: () = assert!(HFI1_BAR0_SIZE <= wfr::WFR_BAR0_SIZE);

// The largest RcvArray ends below the user CSRs, and the loopback block lies inside BAR0.
const _: () =
    assert!(regs::RCV_ARRAY + regs::RCV_ARRAY_ENTRY_SIZE * MAX_RCV_ARRAY_COUNT as u64 <= regs::RXE_UCTXT_BASE);
const _: () = assert!(LB_BASE + LB_SIZE <= HFI1_BAR0_SIZE);

/// What the function presents to a driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Personality {
    /// The project's own function (1b36:1100): the RXE plus the loopback send block, for udriver.
    #[default]
    Emu,
    /// The real chip (8086:24f0, "WFR"): its whole BAR0 map, for the stock Linux hfi1 driver
    /// (docs/hfi1-kernel-driver.md). Packets arrive from the cable to another such function, or from the control
    /// socket as from the wire (docs/hfi1-fabric.md).
    Wfr(wfr::WfrShape),
}

/// Shape of the emulated chip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hfi1Config {
    pub personality: Personality,
    /// Receive contexts, 1..=160. Default 8.
    pub rcv_contexts: usize,
    /// RcvArray entries, a multiple of 512 (so the shared mapping is whole pages), at most
    /// [`MAX_RCV_ARRAY_COUNT`]. Default 4096.
    pub rcv_array_count: usize,
    /// Loopback doorbells that may wait for the worker; more are counted and dropped. Default 64.
    pub doorbell_queue: usize,
    /// Where the worker's jobs run. Default a thread that sleeps between jobs ([`WorkerMode::default`]).
    pub worker: WorkerMode,
    /// Which of the process's chip-personality functions this is, below [`MAX_WFR_FUNCTIONS`]: it names the
    /// device and, through [`Hfi1Config::wfr_instance`], its node GUID. 0 on the project's own function.
    pub instance: u8,
}

/// Chip-personality functions one process serves at most: the two ends of a cable.
pub const MAX_WFR_FUNCTIONS: u8 = 2;
/// Control-socket and trace names of the chip-personality functions, by instance.
pub const WFR_NAMES: [&str; MAX_WFR_FUNCTIONS as usize] = ["hfi1-wfr", "hfi1-wfr1"];

impl Default for Hfi1Config {
    fn default() -> Self {
        Self {
            personality: Personality::Emu,
            rcv_contexts: 8,
            rcv_array_count: 4096,
            doorbell_queue: 64,
            worker: WorkerMode::default(),
            instance: 0,
        }
    }
}

#[cfg(test)]
impl Hfi1Config {
    /// The worker inline, as hfi1 unit tests run it: a job has run when the access that queued it returns, so
    /// a test reads the result at once. Tests about the worker thread keep the threaded default.
    pub fn inline(self) -> Self {
        Hfi1Config { worker: WorkerMode::Inline, ..self }
    }
}

/// Longest idle spin of the worker: beyond this a sleeping thread is cheaper than the CPU time burnt.
pub const MAX_WORKER_SPIN: std::time::Duration = std::time::Duration::from_millis(1);

/// Entries per page of the shared RcvArray mapping.
const ENTRIES_PER_PAGE: usize = 4096 / regs::RCV_ARRAY_ENTRY_SIZE as usize;

impl Hfi1Config {
    /// The WFR personality with its default shape: 16 receive contexts, enough for the driver's default
    /// module parameters on a small guest; the RcvArray as in the default (docs/hfi1-kernel-driver.md).
    pub fn wfr() -> Self {
        Self::wfr_instance(0)
    }

    /// The chip personality's `instance`-th function: its own name and node GUID (the default GUID plus the
    /// instance, so two functions differ below bit 39 and the driver does not pair them as one ASIC:
    /// init_asic_data, chip.c).
    pub fn wfr_instance(instance: u8) -> Self {
        let base = wfr::WfrShape::default();
        let shape = wfr::WfrShape { guid: base.guid + u64::from(instance), ..base };
        Self { personality: Personality::Wfr(shape), rcv_contexts: 16, instance, ..Self::default() }
    }

    /// The device's name on the control socket and in traces.
    pub fn name(&self) -> &'static str {
        match self.personality {
            Personality::Emu => "hfi1",
            Personality::Wfr(_) => WFR_NAMES.get(usize::from(self.instance)).copied().unwrap_or(WFR_NAMES[0]),
        }
    }

    /// The kind of device, which faults and PCI defaults go by.
    pub fn kind(&self) -> &'static str {
        match self.personality {
            Personality::Emu => "hfi1",
            Personality::Wfr(_) => WFR_NAMES[0],
        }
    }

    pub fn validate(&self) -> Result<()> {
        if let Personality::Wfr(shape) = &self.personality {
            shape.validate().map_err(Hfi1Error::Config)?;
        }
        if !(1..=RXE_NUM_CONTEXTS).contains(&self.rcv_contexts) {
            return Err(Hfi1Error::Config(format!("rcv_contexts {} not in 1..={RXE_NUM_CONTEXTS}", self.rcv_contexts)));
        }
        let n = self.rcv_array_count;
        if n == 0 || !n.is_multiple_of(ENTRIES_PER_PAGE) || n > MAX_RCV_ARRAY_COUNT {
            return Err(Hfi1Error::Config(format!(
                "rcv_array_count {n} must be a non-zero multiple of {ENTRIES_PER_PAGE} up to {MAX_RCV_ARRAY_COUNT}"
            )));
        }
        if let WorkerMode::Thread { spin } = self.worker {
            if spin > MAX_WORKER_SPIN {
                return Err(Hfi1Error::Config(format!("worker spin {spin:?} above {MAX_WORKER_SPIN:?}")));
            }
        }
        if self.instance >= MAX_WFR_FUNCTIONS || (self.personality == Personality::Emu && self.instance != 0) {
            return Err(Hfi1Error::Config(format!("instance {} of {}", self.instance, self.kind())));
        }
        if !(1..=4096).contains(&self.doorbell_queue) {
            return Err(Hfi1Error::Config(format!("doorbell_queue {} not in 1..=4096", self.doorbell_queue)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        assert_eq!(Hfi1Config::default().validate().ok(), Some(()));
    }

    #[test]
    fn chip_personality_instances_have_their_own_names_and_guids_differing_below_bit_39() {
        let (a, b) = (Hfi1Config::wfr_instance(0), Hfi1Config::wfr_instance(1));
        assert_eq!((a.name(), b.name()), ("hfi1-wfr", "hfi1-wfr1"));
        assert_eq!((a.kind(), b.kind()), ("hfi1-wfr", "hfi1-wfr"));
        let guid = |c: &Hfi1Config| match c.personality {
            Personality::Wfr(s) => s.guid,
            Personality::Emu => unreachable!(),
        };
        // init_asic_data pairs two HFIs whose GUIDs are equal with bit 39 (the HFI id) masked off.
        let hfi_id_mask = !(1u64 << 39);
        assert_ne!(guid(&a) & hfi_id_mask, guid(&b) & hfi_id_mask);
        assert_eq!(guid(&a), 0x0011_7501_0100_0001);
        assert_eq!(guid(&b), 0x0011_7501_0100_0002);
        assert!(a.validate().is_ok() && b.validate().is_ok());
    }

    #[test]
    fn config_outside_the_chip_limits_is_rejected() {
        let bad = [
            Hfi1Config { rcv_contexts: 0, ..Default::default() },
            Hfi1Config { rcv_contexts: 161, ..Default::default() },
            Hfi1Config { rcv_array_count: 0, ..Default::default() },
            Hfi1Config { rcv_array_count: 1000, ..Default::default() },
            Hfi1Config { rcv_array_count: MAX_RCV_ARRAY_COUNT + 512, ..Default::default() },
            Hfi1Config { doorbell_queue: 0, ..Default::default() },
            Hfi1Config { worker: WorkerMode::Thread { spin: MAX_WORKER_SPIN * 2 }, ..Default::default() },
            Hfi1Config { instance: 1, ..Default::default() },
            Hfi1Config { instance: MAX_WFR_FUNCTIONS, ..Hfi1Config::wfr() },
        ];
        for c in bad {
            let err = c.validate().err();
            assert!(matches!(err, Some(Hfi1Error::Config(_))), "{c:?}");
            assert_eq!(err.map(|e| e.errno()), Some(-libc::EINVAL));
        }
    }
}
