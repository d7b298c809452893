//! `udriver stress` for hfi1: several threads, each driving its own QP on one receive context, set up 1-3
//! segment requests, send and verify the data, and clear, for a given time. The context is one of all the
//! chip's contexts, so its RcvArray share is small and the QPs contend for TIDs (-EAGAIN, FIFO wait
//! queue, wakeups through the port workqueue). Afterwards nothing may be left: no TID, group or flow, no
//! waiter, and no RcvArray entry valid on the device.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use serde_json::{json, Value};

use super::port::{errno, fragment_runs, pattern, Port, Transfer, SEG_BYTES, SEG_PAGES};
use crate::access::DeviceAccess;
use crate::demo::DemoReport;
use crate::hfi1::ctxt::{ExpState, Hfi1Ctxtdata, Hfi1Devdata, Hfi1Params};
use crate::hfi1::exp_rcv::{hfi1_kern_exp_rcv_alloc_flows, hfi1_kern_exp_rcv_free_flows};
use crate::hfi1::qp::HFI1_S_WAIT_TID_SPACE;
use crate::hfi1::sge::{RvtSge, RvtSgeState};

/// Segments per request at most (each iteration takes 1, 2 or 3).
const STRESS_SEGS: u32 = 3;
pub const MAX_STRESS_THREADS: usize = 64;
const WAIT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a QP that got -EAGAIN waits for its wakeup before trying again.
const WAKE_WAIT: Duration = Duration::from_millis(20);

#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    iterations: u64,
    segments: u64,
    packets: u64,
    bytes: u64,
    eagain: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.iterations += o.iterations;
        self.segments += o.segments;
        self.packets += o.packets;
        self.bytes += o.bytes;
        self.eagain += o.eagain;
    }
}

/// The three group sets agree with every group's `used`/`map` and with their counts.
fn groups_consistent(exp: &ExpState) -> Result<(u32, u32, u32), String> {
    let sets = [("free", &exp.tid_group_list), ("used", &exp.tid_used_list), ("full", &exp.tid_full_list)];
    for (name, set) in sets {
        if set.count as usize != set.list.len() {
            return Err(format!("{name} set counts {} but lists {}", set.count, set.list.len()));
        }
        for &g in &set.list {
            let grp = exp.groups.get(g).ok_or(format!("group {g} does not exist"))?;
            let fits = match name {
                "free" => grp.used == 0,
                "used" => grp.used > 0 && grp.used < grp.size,
                _ => grp.used == grp.size,
            };
            if !fits || grp.map.count_ones() != u32::from(grp.used) {
                return Err(format!("group {g} (used {}, map {:#x}) on the {name} set", grp.used, grp.map));
            }
        }
    }
    let total = exp.tid_group_list.count + exp.tid_used_list.count + exp.tid_full_list.count;
    if total as usize != exp.groups.len() {
        return Err(format!("sets hold {total} groups of {}", exp.groups.len()));
    }
    Ok((exp.tid_group_list.count, exp.tid_used_list.count, exp.tid_full_list.count))
}

impl Transfer {
    /// A fresh request ring and SGE state over the whole buffer, for the next iteration.
    fn restart(&mut self) -> Result<(), String> {
        hfi1_kern_exp_rcv_alloc_flows(&mut self.req).map_err(errno)?;
        self.req.isge = 0;
        let len = u32::try_from(self.buf.len()).map_err(|_| "buffer too large".to_string())?;
        self.ss = RvtSgeState::new(vec![RvtSge::new(self.buf.clone(), 0, len).map_err(errno)?]).map_err(errno)?;
        Ok(())
    }
}

/// One QP's loop until `deadline`.
fn qp_loop(port: &Port, t: &mut Transfer, wake: &Receiver<()>, deadline: Instant, seed: u32) -> Result<Stats, String> {
    let mut st = Stats::default();
    let mut iter = 0u32;
    while Instant::now() < deadline {
        let want = 1 + iter % STRESS_SEGS;
        t.restart()?;
        let mut slots = Vec::new();
        let mut res = Ok(());
        for _ in 0..want {
            let slot = t.req.setup_head;
            res = t.setup_segment();
            if res.is_err() {
                break;
            }
            slots.push(slot);
        }
        match res {
            Ok(()) => {
                for (k, slot) in slots.iter().enumerate() {
                    let payload = pattern(SEG_BYTES, seed ^ (iter << 4) ^ k as u32);
                    let out = t.send_and_verify(port, *slot, k * SEG_BYTES, &payload, WAIT_TIMEOUT)?;
                    st.packets += out.descriptors;
                    st.bytes += SEG_BYTES as u64;
                    st.segments += 1;
                }
                st.iterations += 1;
            }
            Err(e) if e == -libc::EAGAIN => st.eagain += 1,
            Err(e) => return Err(format!("QP {}: {}", t.qp.qp_num, errno(e))),
        }
        // Release everything, staying queued after -EAGAIN: the turn comes with the wakeup.
        t.release(false)?;
        hfi1_kern_exp_rcv_free_flows(&mut t.req).map_err(errno)?;
        if res.is_err() {
            let _ = wake.recv_timeout(WAKE_WAIT);
        }
        iter = iter.wrapping_add(1);
    }
    t.release(true)?;
    Ok(st)
}

/// Runs the hfi1 stress mode: `threads` QPs on receive context 0 for `duration`, then the leak checks.
pub fn hfi1_stress(dev: Arc<dyn DeviceAccess>, duration: Duration, threads: usize) -> DemoReport {
    let mut rep = DemoReport::new("hfi1-stress");
    let mut port = None;
    let ok = rep.step("probe and enable the receive context", || {
        if !(1..=MAX_STRESS_THREADS).contains(&threads) {
            return Err(format!("threads {threads} not in 1..={MAX_STRESS_THREADS}"));
        }
        // Partition for every context the chip has: context 0 then owns a small share.
        dev.pci_enable_device().map_err(|e| format!("pci_enable_device: {e}"))?;
        let chip = Hfi1Devdata::probe(dev.clone(), Hfi1Params::default()).map_err(|e| format!("probe: {e}"))?;
        let (p, detail) = Port::bring_up(dev, 0, chip.chip_rcv_contexts)?;
        port = Some(p);
        Ok(detail)
    });
    let Some(port) = port.filter(|_| ok) else { return rep };
    let mut xfers = Vec::new();
    let mut wakes = Vec::new();
    let ok = rep.step("prepare QPs", || {
        let pages = u64::from(STRESS_SEGS) * SEG_PAGES as u64;
        for t in 0..threads {
            let (tx, rx) = crossbeam_channel::bounded::<()>(1);
            // Single pages (a TID entry each) for half of the QPs, so TIDs run short.
            let runs = if t % 2 == 0 { vec![1; pages as usize] } else { fragment_runs(pages, t) };
            let buf = port.pool.alloc_fragmented(&runs).map_err(|e| e.to_string())?;
            let pmtu = if t % 4 < 2 { 4096 } else { 8192 };
            let do_send = Box::new(move |_: &Arc<crate::hfi1::qp::Hfi1Qp>| {
                let _ = tx.try_send(());
            });
            xfers.push(Transfer::new(&port, "fragmented", t as u32 + 1, pmtu, STRESS_SEGS, buf, do_send)?);
            wakes.push(rx);
        }
        Ok(json!({"threads": threads, "pages_per_qp": pages, "expected_entries": port.rcd.expected_count}))
    });
    if ok {
        rep.step("run", || run(&port, &mut xfers, &wakes, duration));
        rep.step("leak check", || leak_check(&port, &xfers));
    }
    for t in xfers {
        if let Ok(buf) = Arc::try_unwrap(t.buf) {
            buf.release(&port.pool);
        }
    }
    port.release();
    rep
}

fn run(port: &Port, xfers: &mut [Transfer], wakes: &[Receiver<()>], duration: Duration) -> Result<Value, String> {
    let start = Instant::now();
    let deadline = start + duration;
    let stop = AtomicBool::new(false);
    let broken = Mutex::new(None::<String>);
    let results: Vec<Result<Stats, String>> = std::thread::scope(|s| {
        // The port workqueue's runner, which also checks the group sets while everything runs.
        let runner = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                port.dd.wq.run_one(Duration::from_millis(5));
                if let Err(e) = groups_consistent(&port.rcd.lock_exp()) {
                    broken.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                }
            }
        });
        let handles: Vec<_> = xfers
            .iter_mut()
            .zip(wakes)
            .enumerate()
            .map(|(i, (t, w))| {
                s.spawn(move || qp_loop(port, t, w, deadline, 0x9E37_79B9u32.wrapping_mul(i as u32 + 1)))
            })
            .collect();
        let results =
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("QP thread panicked".into()))).collect();
        stop.store(true, Ordering::Relaxed);
        let _ = runner.join();
        results
    });
    port.dd.wq.run_pending(100_000);
    if let Some(e) = broken.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(format!("group sets inconsistent during the run: {e}"));
    }
    let mut total = Stats::default();
    for r in results {
        total.add(&r?);
    }
    if total.iterations == 0 {
        return Err("no request completed".into());
    }
    Ok(json!({"seconds": start.elapsed().as_secs_f64(), "iterations": total.iterations, "segments": total.segments,
              "packets": total.packets, "bytes_verified": total.bytes, "eagain": total.eagain,
              "n_tidwait": port.dd.n_tidwait.load(Ordering::Relaxed)}))
}

fn leak_check(port: &Port, xfers: &[Transfer]) -> Result<Value, String> {
    let rcd: &Hfi1Ctxtdata = &port.rcd;
    for t in xfers {
        let g = t.qp.lock();
        if g.s_flags & HFI1_S_WAIT_TID_SPACE != 0 || g.tid_wait.is_some() || g.flow_state.index < 32 {
            return Err(format!("QP {} still waits or holds flow {}", t.qp.qp_num, g.flow_state.index));
        }
    }
    let exp = rcd.lock_exp();
    let (free, used, full) = groups_consistent(&exp)?;
    let idle = exp.groups.iter().all(|g| g.used == 0 && g.map == 0);
    let queues = [&exp.flow_queue, &exp.rarr_queue];
    let queued: usize = queues.iter().map(|q| q.queue_head.len()).sum();
    // dequeue_tid_waiter counts on the queue passed, not the one left (tid_rdma.c:549): only the sums balance.
    let balanced = queues.iter().map(|q| q.enqueue).fold(0u32, u32::wrapping_add)
        == queues.iter().map(|q| q.dequeue).fold(0u32, u32::wrapping_add);
    let flow_mask = exp.flow_mask;
    drop(exp);
    let valid = port.valid_rcv_entries(WAIT_TIMEOUT)?;
    if used != 0 || full != 0 || !idle || flow_mask != 0 || queued != 0 || !balanced || valid != 0 {
        return Err(format!(
            "leak: groups used {used} full {full} idle {idle}, flow_mask {flow_mask:#x}, {queued} queued \
             (balanced {balanced}), {valid} RcvArray entries valid on the device"
        ));
    }
    Ok(json!({"free_groups": free, "used_groups": used, "full_groups": full, "flow_mask": flow_mask,
              "waiters": queued, "valid_rcv_entries_on_device": valid, "workqueue_pending": port.dd.wq.len()}))
}
