//! Issue 38: the memory of a device model under a guest that writes every CSR offset and ignores every credit
//! is bounded.
//!
//! One chip-personality function in this process (its own test binary, so the process's memory is the
//! device's): a guest writes every 8-byte offset of BAR0, in passes with different values (all-ones over the
//! whole BAR, the send buffers included; the offset's complement over every CSR), then programs every send
//! context with the largest ring and fills it again and again without ever waiting for a credit. Meanwhile the
//! worker is stalled inside a DMA access that does not complete, as when a vfio-user client does not answer,
//! so nothing the guest queued is taken away. What input can grow is then held against the bounds the chip's
//! fixed sizes give (the derivation is `Bound::new`), both by the device's own accounting and by the
//! process's peak resident memory.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use device_model::hfi1::wfr::csr::{
    SEND_CTXT_CREDIT_CTRL, SEND_CTXT_CREDIT_RETURN_ADDR, SEND_CTXT_CTRL, SEND_PIO_INIT_CTXT,
};
use device_model::hfi1::wfr::pio::{
    Launch, MAX_QUEUED_PER_CONTEXT, MAX_RING_BLOCKS, PIO_ADDR_CONTEXT_SHIFT, PIO_BLOCK_SIZE,
    SEND_CTXT_CREDIT_CTRL_CREDIT_INTR_SMASK, SEND_CTXT_CTRL_CTXT_DEPTH_SHIFT, SEND_CTXT_CTRL_CTXT_ENABLE_SMASK,
    SEND_PIO_INIT_CTXT_PIO_CTXT_NUM_SHIFT, SEND_PIO_INIT_CTXT_PIO_SINGLE_CTXT_INIT_SMASK, SOP_DISTANCE,
};
use device_model::hfi1::wfr::{names, TXE_NUM_CONTEXTS, TXE_PIO_SEND, WFR_BAR0_SIZE};
use device_model::hfi1::{Hfi1, Hfi1Config};
use device_model::pci::{Function, PciIds};
use vfio_user_proto::device::{region, Device, DeviceContext};
use vfio_user_proto::dma::{DmaAccess, DmaError};
use vfio_user_proto::irq::IrqState;

/// A guard against hanging, not a measure: the worker enters its first DMA within milliseconds.
const HANG_GUARD: Duration = Duration::from_secs(60);
/// Per-context CSR spacing (write_kctxt_csr).
const KCTXT_STRIDE: u64 = 0x100;
/// Where the credit returns of the flood go (any address: the DMA never completes).
const CREDIT_RETURN: u64 = 0x10_0000;
/// Times the flood fills every ring without waiting for a credit.
const FLOOD_ROUNDS: usize = 2;

/// Guest memory that nothing is mapped in, whose accesses from any thread but the guest's wait until
/// released: a worker stalled in a DMA, as on a client that does not answer.
struct Stall {
    guest: ThreadId,
    released: Mutex<bool>,
    changed: Condvar,
    entered: AtomicBool,
}

impl Stall {
    fn wait(&self, iova: u64, len: usize) -> Result<(), DmaError> {
        if std::thread::current().id() != self.guest {
            self.entered.store(true, Ordering::Release);
            self.changed.notify_all();
            let released = self.released.lock().unwrap();
            let _released = self.changed.wait_while(released, |r| !*r).unwrap();
        }
        Err(DmaError::Unmapped { iova, len: len as u64 })
    }

    fn release(&self) {
        *self.released.lock().unwrap() = true;
        self.changed.notify_all();
    }

    /// Waits until another thread is stalled; false at the hang guard.
    fn wait_entered(&self) -> bool {
        let guard = self.released.lock().unwrap();
        let (_g, res) =
            self.changed.wait_timeout_while(guard, HANG_GUARD, |_| !self.entered.load(Ordering::Acquire)).unwrap();
        !res.timed_out()
    }
}

impl DmaAccess for Stall {
    fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        self.wait(iova, buf.len())
    }
    fn write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
        self.wait(iova, buf.len())
    }
}

/// What the device may hold at most, from the chip's fixed sizes.
#[derive(Debug)]
struct Bound {
    /// Launches waiting for the worker: every send context's ring, a block per launch, and a forced return.
    launches: u64,
    /// Packet bytes those launches carry: a ring of 64-byte blocks per context.
    launch_bytes: u64,
    /// Registers the storage keeps: those the kernel's list names below the send buffers.
    storage_entries: u64,
    /// Bytes of the process's resident memory the hostile guest may add, with the derivation's parts.
    resident: u64,
}

impl Bound {
    fn new() -> Self {
        let contexts = u64::from(TXE_NUM_CONTEXTS);
        let ring = MAX_RING_BLOCKS as u64;
        let block = PIO_BLOCK_SIZE;
        let launches = contexts * MAX_QUEUED_PER_CONTEXT as u64;
        let launch_bytes = contexts * ring * block;
        let storage_entries = (0..TXE_PIO_SEND).step_by(8).filter(|&o| names::is_named(o)).count() as u64;
        // Send buffers: every context's ring, each block 64 bytes plus a written mask and a SOP flag.
        let rings = contexts * ring * (block + 2);
        // The launch queue: a VecDeque grows to at most twice its length; each packet body is its own
        // allocation (at most a block, plus the allocator's header). The worker may hold one more queue's
        // worth, taken just before it stalled.
        let queue = 2 * (launches * 2 * std::mem::size_of::<Launch>() as u64 + launch_bytes + contexts * ring * 16);
        // The storage: a hash table at most twice the named registers, 16 bytes and a control byte each.
        let storage = (storage_entries * 8 / 7).next_power_of_two() * 17;
        // The 8051's data RAM: 4096 qwords (RAM_ACCESS_CTRL's 15-bit address) in a hash table.
        let dc_ram = 2 * 4096 * 17;
        // Headroom for what the allocator keeps after frees, and the pages code and stacks touch on the way.
        let headroom = 64 << 20;
        let resident = rings + queue + storage + dc_ram + headroom;
        eprintln!(
            "bound: rings {rings} + launch queue {queue} + storage {storage} + 8051 RAM {dc_ram} + headroom \
             {headroom} = {resident} bytes; {launches} launches of {launch_bytes} bytes; {storage_entries} registers"
        );
        Bound { launches, launch_bytes, storage_entries, resident }
    }
}

/// A line of /proc/self/status in bytes (`VmRSS`, `VmHWM`: resident now and at its peak).
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("procfs");
    let line = status.lines().find(|l| l.starts_with(field)).expect("the field");
    let kib: u64 = line[field.len() + 1..].trim().trim_end_matches(" kB").trim().parse().expect("a count of kB");
    kib * 1024
}

fn bar_w(f: &Function, offset: u64, value: u64) {
    f.region_write(region::BAR0, offset, &value.to_le_bytes()).expect("a BAR0 write is a valid access");
}

/// pio.c sc_alloc and sc_enable for hardware context `ctxt` with the largest ring: depth, credit return,
/// PIO init, enable.
fn enable_context(f: &Function, ctxt: u64) {
    let depth = (MAX_RING_BLOCKS as u64) << SEND_CTXT_CTRL_CTXT_DEPTH_SHIFT;
    bar_w(f, SEND_CTXT_CTRL + KCTXT_STRIDE * ctxt, depth);
    bar_w(f, SEND_CTXT_CREDIT_RETURN_ADDR + KCTXT_STRIDE * ctxt, CREDIT_RETURN);
    bar_w(f, SEND_CTXT_CREDIT_CTRL + KCTXT_STRIDE * ctxt, SEND_CTXT_CREDIT_CTRL_CREDIT_INTR_SMASK);
    let init = SEND_PIO_INIT_CTXT_PIO_SINGLE_CTXT_INIT_SMASK | (ctxt << SEND_PIO_INIT_CTXT_PIO_CTXT_NUM_SHIFT);
    bar_w(f, SEND_PIO_INIT_CTXT, init);
    bar_w(f, SEND_CTXT_CTRL + KCTXT_STRIDE * ctxt, depth | SEND_CTXT_CTRL_CTXT_ENABLE_SMASK);
}

/// pio_copy of a one-block packet (PBC length 16 dwords) into ring block `block` of context `ctxt`.
fn one_block_packet(f: &Function, ctxt: u64, block: u64) {
    let at = TXE_PIO_SEND + (ctxt << PIO_ADDR_CONTEXT_SHIFT) + block * PIO_BLOCK_SIZE;
    bar_w(f, at + SOP_DISTANCE, 16);
    for q in 1..8 {
        bar_w(f, at + 8 * q, 0x1111_0000 + q);
    }
}

#[test]
fn a_guest_writing_every_csr_and_ignoring_every_credit_leaves_the_device_model_within_its_bound() {
    let bound = Bound::new();
    let stall = Arc::new(Stall {
        guest: std::thread::current().id(),
        released: Mutex::new(false),
        changed: Condvar::new(),
        entered: AtomicBool::new(false),
    });
    let engine = Arc::new(Hfi1::new(Hfi1Config::wfr()).unwrap());
    let f = Function::try_new(engine.clone(), PciIds::hfi1_wfr_default()).unwrap();
    f.attach(DeviceContext { dma: stall.clone(), irq: Arc::new(IrqState::new()) });
    // Memory decoding and bus mastering on, as pci_enable_device and pci_set_master leave them.
    f.region_write(region::CONFIG, 0x04, &0x0006u16.to_le_bytes()).unwrap();
    let before = status_bytes("VmRSS:");

    // One packet, whose credit return is a DMA: the worker stalls in it and takes nothing more.
    enable_context(&f, 0);
    one_block_packet(&f, 0, 0);
    assert!(stall.wait_entered(), "the worker never reached a DMA access");

    // Every offset of BAR0 all-ones (send buffers too), then every CSR offset its complement.
    for offset in (0..WFR_BAR0_SIZE).step_by(8) {
        bar_w(&f, offset, u64::MAX);
    }
    for offset in (0..TXE_PIO_SEND).step_by(8) {
        bar_w(&f, offset, !offset);
    }
    // Every send context's ring filled with packets, again and again, no credit ever waited for.
    for ctxt in 0..u64::from(TXE_NUM_CONTEXTS) {
        enable_context(&f, ctxt);
        for n in 0..FLOOD_ROUNDS * MAX_RING_BLOCKS {
            one_block_packet(&f, ctxt, (n % MAX_RING_BLOCKS) as u64);
        }
    }

    let peak = status_bytes("VmHWM:");
    let dump = engine.dump();
    let wfr = &dump["wfr"];
    let pio = &wfr["pio"];
    let get = |v: &serde_json::Value, key: &str| v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}"));
    let (launches, launch_bytes) = (get(pio, "queued_launches"), get(pio, "queued_bytes"));
    let storage_entries = get(wfr, "storage_entries");
    let grown = peak.saturating_sub(before);
    eprintln!(
        "held: {launches} launches of {launch_bytes} bytes, {storage_entries} registers; resident memory grew \
         {grown} bytes at its peak; {} writes overflowed, {} found a halted context",
        get(pio, "writes_overflow"),
        get(pio, "writes_halted")
    );
    assert!(launches <= bound.launches, "{launches} launches wait, more than the rings allow ({})", bound.launches);
    assert!(launch_bytes <= bound.launch_bytes, "{launch_bytes} bytes of packets wait ({})", bound.launch_bytes);
    assert!(storage_entries <= bound.storage_entries, "{storage_entries} registers stored");
    assert!(grown <= bound.resident, "resident memory grew {grown} bytes, more than the bound {}", bound.resident);
    // The guest did overrun: the bound held because the chip refused, not because nothing was sent.
    assert!(get(pio, "writes_overflow") > 0 && get(pio, "writes_halted") > 0);

    // The worker goes on once its DMA fails; the function then detaches and drops with it.
    stall.release();
    f.detach();
}
