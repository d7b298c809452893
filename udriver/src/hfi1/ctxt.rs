//! Device and receive-context data: probe-time validation of RCV_ARRAY_CNT / RCV_CONTEXTS, the per-context
//! RcvArray partition (§1.4), `hfi1_rcvctrl` (§1.2) and the state guarded by `exp_lock` (§1.13).

#![forbid(unsafe_code)]

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use vfio_user_proto::sync::Unpoison;

use super::flow::hfi1_kern_init_ctxt_generations;
pub use super::hfi::{
    ExpLocked, ExpState, Hfi1Ctxtdata, Hfi1Devdata, Hfi1Params, RcvEntries, RcvHdrState, TidFlowGeneration,
    HFI1_CTRL_CTXT, HFI1_RCVCTRL_CTXT_DIS, HFI1_RCVCTRL_CTXT_ENB, HFI1_RCVCTRL_INTRAVAIL_DIS,
    HFI1_RCVCTRL_INTRAVAIL_ENB, HFI1_RCVCTRL_NO_EGR_DROP_DIS, HFI1_RCVCTRL_NO_EGR_DROP_ENB,
    HFI1_RCVCTRL_NO_RHQ_DROP_DIS, HFI1_RCVCTRL_NO_RHQ_DROP_ENB, HFI1_RCVCTRL_ONE_PKT_EGR_DIS,
    HFI1_RCVCTRL_ONE_PKT_EGR_ENB, HFI1_RCVCTRL_PKEY_DIS, HFI1_RCVCTRL_PKEY_ENB, HFI1_RCVCTRL_TAILUPD_DIS,
    HFI1_RCVCTRL_TAILUPD_ENB, HFI1_RCVCTRL_TIDFLOW_DIS, HFI1_RCVCTRL_TIDFLOW_ENB, HFI1_RCVCTRL_URGENT_DIS,
    HFI1_RCVCTRL_URGENT_ENB, MAX_EAGER_ENTRIES, MAX_RCV_ARRAY_CNT, MAX_TID_PAIR_ENTRIES, RXE_NUM_CONTEXTS,
};
use super::hfi::{ExpTidSet, TidGroup, TidQueue, TidWorkQueue};
use super::regs::*;
use super::Hfi1Error;
use crate::access::{AccessError, DeviceAccess};
use crate::dma::DmaBuffer;

impl Hfi1Devdata {
    /// Reads and validates the chip geometry (`chip_rcv_array_count`, `chip_rcv_contexts`) and partitions
    /// the RcvArray as `set_up_context_variables` does, with every context a kernel context.
    pub fn probe(dev: Arc<dyn DeviceAccess>, params: Hfi1Params) -> Result<Arc<Self>, Hfi1Error> {
        let csr = Hfi1Csr(dev.as_ref());
        let raw_cnt = csr.read_csr(RCV_ARRAY_CNT)?;
        let raw_ctxts = csr.read_csr(RCV_CONTEXTS)?;
        let chip_rcv_array_count = u32::try_from(raw_cnt)
            .ok()
            .filter(|c| *c > 0 && *c % RCV_INCREMENT == 0 && *c <= MAX_RCV_ARRAY_CNT)
            .ok_or(Hfi1Error::BadChipValue { what: "RCV_ARRAY_CNT", value: raw_cnt })?;
        let chip_rcv_contexts = u32::try_from(raw_ctxts)
            .ok()
            .filter(|c| (1..=RXE_NUM_CONTEXTS).contains(c))
            .ok_or(Hfi1Error::BadChipValue { what: "RCV_CONTEXTS", value: raw_ctxts })?;
        let n = params.num_rcv_contexts;
        if n == 0 || n > chip_rcv_contexts {
            return Err(Hfi1Error::BadParam { what: "num_rcv_contexts", value: u64::from(n) });
        }
        if params.rcvarr_split > 100 {
            return Err(Hfi1Error::BadParam { what: "rcvarr_split", value: u64::from(params.rcvarr_split) });
        }
        let total = chip_rcv_array_count / RCV_INCREMENT;
        let mut rcv_entries =
            RcvEntries { group_size: RCV_INCREMENT, ngroups: total / n, nctxt_extra: total - n * (total / n) };
        // Per-context cap: ngroups * group_size <= 2 * MAX_EAGER_ENTRIES; the cut groups stay unused.
        if rcv_entries.ngroups * RCV_INCREMENT > 2 * MAX_EAGER_ENTRIES {
            rcv_entries.ngroups = 2 * MAX_EAGER_ENTRIES / RCV_INCREMENT;
            rcv_entries.nctxt_extra = 0;
        }
        let rcvarray_wc = !dev.identity().mapped_bars.contains(&HFI1_BAR);
        Ok(Arc::new(Self {
            dev,
            rcvarray_wc,
            chip_rcv_array_count,
            chip_rcv_contexts,
            num_rcv_contexts: n,
            rcv_entries,
            params,
            wq: TidWorkQueue::new(),
            n_tidwait: AtomicU64::new(0),
        }))
    }

    pub fn csr(&self) -> Hfi1Csr<'_> {
        Hfi1Csr(self.dev.as_ref())
    }
    pub fn device(&self) -> &Arc<dyn DeviceAccess> {
        &self.dev
    }
}

impl Hfi1Ctxtdata {
    /// `hfi1_create_ctxtdata` + `hfi1_alloc_ctxt_rcv_groups`: places context `ctxt` in the RcvArray and
    /// initialises its flow generations (`hfi1_kern_init_ctxt_generations`, 32 flow-table writes).
    pub fn hfi1_create_ctxtdata(dd: &Arc<Hfi1Devdata>, ctxt: u32) -> Result<Arc<Self>, Hfi1Error> {
        if ctxt >= dd.num_rcv_contexts {
            return Err(Hfi1Error::BadParam { what: "ctxt", value: u64::from(ctxt) });
        }
        let re = dd.rcv_entries;
        // The first nctxt_extra contexts get one extra group each (kctxt_ngroups with no user contexts).
        let (base, groups) = if ctxt < re.nctxt_extra {
            (ctxt * (re.ngroups + 1), re.ngroups + 1)
        } else {
            (re.nctxt_extra + ctxt * re.ngroups, re.ngroups)
        };
        let max_entries = groups * re.group_size;
        let eager_base = base * re.group_size;
        let split = u64::from(max_entries) * u64::from(dd.params.rcvarr_split) / 100;
        let egr_count = ((split as u32) / RCV_INCREMENT * RCV_INCREMENT).min(MAX_EAGER_ENTRIES);
        let egr_top = egr_count.next_multiple_of(RCV_INCREMENT);
        let expected_count = (max_entries - egr_top).min(MAX_TID_PAIR_ENTRIES * 2);
        let expected_base = eager_base + egr_top;
        let ngroups = expected_count / re.group_size;
        let groups_vec: Vec<TidGroup> =
            (0..ngroups).map(|k| TidGroup::new(expected_base + k * re.group_size, re.group_size as u8)).collect();
        let mut tid_group_list = ExpTidSet::default();
        for k in 0..groups_vec.len() {
            tid_group_list.push_back(k);
        }
        let rcd = Arc::new(Self {
            dd: dd.clone(),
            ctxt,
            rcv_array_groups: groups,
            eager_base,
            egrbufs_alloced: egr_count,
            egrbufs_rcvtid_size: dd.params.eager_buffer_size,
            expected_base,
            expected_count,
            hdr: Mutex::new(RcvHdrState::default()),
            exp_lock: Mutex::new(ExpState {
                flow_mask: 0,
                flows: [TidFlowGeneration::default(); RXE_NUM_TID_FLOWS as usize],
                groups: groups_vec,
                tid_group_list,
                tid_used_list: ExpTidSet::default(),
                tid_full_list: ExpTidSet::default(),
                flow_queue: TidQueue::default(),
                rarr_queue: TidQueue::default(),
            }),
        });
        // Every context here is a kernel context, which the kernel gives flow generations at creation.
        hfi1_kern_init_ctxt_generations(&rcd)?;
        Ok(rcd)
    }

    /// Takes `exp_lock`. With a QP involved, take the QP's `s_lock` first (§1.13).
    pub fn lock_exp(&self) -> ExpLocked<'_> {
        ExpLocked { rcd: self, st: self.exp_lock.lock().unpoison() }
    }

    /// Gives the context its receive header queue (and optional tail shadow) before `hfi1_rcvctrl`.
    pub fn set_rcvhdrq(&self, rcvhdrq: Arc<DmaBuffer>, rcvhdrtail: Option<Arc<DmaBuffer>>) {
        let mut h = self.hdr.lock().unpoison();
        h.rcvhdrq = Some(rcvhdrq);
        h.rcvhdrtail = rcvhdrtail;
    }

    /// `RCV_TID_CTRL` value for this context.
    pub fn rcv_tid_ctrl(&self) -> u64 {
        ((u64::from(self.expected_count >> RCV_SHIFT) & RCV_TID_CTRL_TID_PAIR_CNT_MASK)
            << RCV_TID_CTRL_TID_PAIR_CNT_SHIFT)
            | ((u64::from(self.expected_base >> RCV_SHIFT) & RCV_TID_CTRL_TID_BASE_INDEX_MASK)
                << RCV_TID_CTRL_TID_BASE_INDEX_SHIFT)
    }

    /// `RCV_EGR_CTRL` value for this context.
    pub fn rcv_egr_ctrl(&self) -> u64 {
        ((u64::from(self.egrbufs_alloced >> RCV_SHIFT) & RCV_EGR_CTRL_EGR_CNT_MASK) << RCV_EGR_CTRL_EGR_CNT_SHIFT)
            | ((u64::from(self.eager_base >> RCV_SHIFT) & RCV_EGR_CTRL_EGR_BASE_INDEX_MASK)
                << RCV_EGR_CTRL_EGR_BASE_INDEX_SHIFT)
    }
}

/// `hfi1_rcvctrl(dd, op, rcd)`: context enable/disable and RCV_CTXT_CTRL flags, in the kernel's write order.
/// Interrupt-mask side effects of INTRAVAIL/URGENT are not ours (MSI-X is set up by the backend).
pub fn hfi1_rcvctrl(dd: &Hfi1Devdata, op: u32, rcd: &Hfi1Ctxtdata) -> Result<(), AccessError> {
    let csr = dd.csr();
    let ctxt = rcd.ctxt;
    let mut h = rcd.hdr.lock().unpoison();
    let mut rcvctrl = csr.read_kctxt_csr(ctxt, RCV_CTXT_CTRL)?;
    let mut did_enable = false;
    if op & HFI1_RCVCTRL_CTXT_ENB != 0 && rcvctrl & RCV_CTXT_CTRL_ENABLE_SMASK == 0 {
        let hdrq = h.rcvhdrq.clone().ok_or(AccessError::NotSetUp("the receive header queue"))?;
        let hdrq_dma = hdrq.iova(0).ok_or(AccessError::NotSetUp("the receive header queue (empty)"))?;
        csr.write_kctxt_csr(ctxt, RCV_HDR_ADDR, hdrq_dma)?;
        if let Some(tail) = h.rcvhdrtail.clone() {
            let tail_dma = tail.iova(0).ok_or(AccessError::NotSetUp("the tail shadow (empty)"))?;
            csr.write_kctxt_csr(ctxt, RCV_HDR_TAIL_ADDR, tail_dma)?;
        }
        h.seq_cnt = 1;
        h.head = 0;
        hdrq.fill(0, hdrq.len(), 0)?;
        h.rcvavail_timeout = dd.params.rcv_intr_timeout_csr;
        rcvctrl |= RCV_CTXT_CTRL_ENABLE_SMASK;
        rcvctrl &= !RCV_CTXT_CTRL_EGR_BUF_SIZE_SMASK;
        rcvctrl |= (u64::from(encoded_size(rcd.egrbufs_rcvtid_size)) & RCV_CTXT_CTRL_EGR_BUF_SIZE_MASK)
            << RCV_CTXT_CTRL_EGR_BUF_SIZE_SHIFT;
        csr.write_uctxt_csr(ctxt, RCV_HDR_HEAD, 0)?;
        did_enable = true;
        csr.write_uctxt_csr(ctxt, RCV_EGR_INDEX_HEAD, 0)?;
        csr.write_kctxt_csr(ctxt, RCV_EGR_CTRL, rcd.rcv_egr_ctrl())?;
        csr.write_kctxt_csr(ctxt, RCV_TID_CTRL, rcd.rcv_tid_ctrl())?;
        if ctxt == HFI1_CTRL_CTXT {
            csr.write_csr(RCV_VL15, u64::from(HFI1_CTRL_CTXT))?;
        }
    }
    if op & HFI1_RCVCTRL_CTXT_DIS != 0 {
        csr.write_csr(RCV_VL15, 0)?;
        if dd.params.rcvhdrtail_dummy_dma != 0 {
            csr.write_kctxt_csr(ctxt, RCV_HDR_TAIL_ADDR, dd.params.rcvhdrtail_dummy_dma)?;
            rcvctrl |= RCV_CTXT_CTRL_TAIL_UPD_SMASK;
        }
        rcvctrl &= !RCV_CTXT_CTRL_ENABLE_SMASK;
    }
    let flags: [(u32, u64, bool); 9] = [
        (HFI1_RCVCTRL_INTRAVAIL_ENB, RCV_CTXT_CTRL_INTR_AVAIL_SMASK, true),
        (HFI1_RCVCTRL_INTRAVAIL_DIS, RCV_CTXT_CTRL_INTR_AVAIL_SMASK, false),
        (HFI1_RCVCTRL_TIDFLOW_ENB, RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK, true),
        (HFI1_RCVCTRL_TIDFLOW_DIS, RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK, false),
        (HFI1_RCVCTRL_ONE_PKT_EGR_DIS, RCV_CTXT_CTRL_ONE_PACKET_PER_EGR_BUFFER_SMASK, false),
        (HFI1_RCVCTRL_NO_RHQ_DROP_ENB, RCV_CTXT_CTRL_DONT_DROP_RHQ_FULL_SMASK, true),
        (HFI1_RCVCTRL_NO_RHQ_DROP_DIS, RCV_CTXT_CTRL_DONT_DROP_RHQ_FULL_SMASK, false),
        (HFI1_RCVCTRL_NO_EGR_DROP_ENB, RCV_CTXT_CTRL_DONT_DROP_EGR_FULL_SMASK, true),
        (HFI1_RCVCTRL_NO_EGR_DROP_DIS, RCV_CTXT_CTRL_DONT_DROP_EGR_FULL_SMASK, false),
    ];
    if op & HFI1_RCVCTRL_TAILUPD_ENB != 0 && h.rcvhdrtail.is_some() {
        rcvctrl |= RCV_CTXT_CTRL_TAIL_UPD_SMASK;
    }
    // A disable keeps TAIL_UPD pointed at the dummy tail.
    if op & HFI1_RCVCTRL_TAILUPD_DIS != 0 && op & HFI1_RCVCTRL_CTXT_DIS == 0 {
        rcvctrl &= !RCV_CTXT_CTRL_TAIL_UPD_SMASK;
    }
    if op & HFI1_RCVCTRL_ONE_PKT_EGR_ENB != 0 {
        // One packet per eager buffer: the buffer size field is not used.
        rcvctrl &= !RCV_CTXT_CTRL_EGR_BUF_SIZE_SMASK;
        rcvctrl |= RCV_CTXT_CTRL_ONE_PACKET_PER_EGR_BUFFER_SMASK;
    }
    for (bit, mask, set) in flags {
        if op & bit != 0 {
            rcvctrl = if set { rcvctrl | mask } else { rcvctrl & !mask };
        }
    }
    csr.write_kctxt_csr(ctxt, RCV_CTXT_CTRL, rcvctrl)?;
    if did_enable && rcvctrl & RCV_CTXT_CTRL_DONT_DROP_RHQ_FULL_SMASK != 0 {
        // Sticky BlockedRHQFull: bump the head counter to unblock.
        if csr.read_kctxt_csr(ctxt, RCV_CTXT_STATUS)? != 0 {
            csr.read_uctxt_csr(ctxt, RCV_HDR_HEAD)?;
            csr.write_uctxt_csr(ctxt, RCV_HDR_HEAD, 0x10)?;
            csr.write_uctxt_csr(ctxt, RCV_HDR_HEAD, 0x00)?;
            csr.read_uctxt_csr(ctxt, RCV_HDR_HEAD)?;
            let st = csr.read_kctxt_csr(ctxt, RCV_CTXT_STATUS)?;
            if st != 0 {
                tracing::warn!(ctxt, status = st, "receive context still blocked after enable");
            }
        }
    }
    if did_enable {
        csr.write_kctxt_csr(
            ctxt,
            RCV_AVAIL_TIME_OUT,
            (h.rcvavail_timeout & RCV_AVAIL_TIME_OUT_TIME_OUT_RELOAD_MASK) << RCV_AVAIL_TIME_OUT_TIME_OUT_RELOAD_SHIFT,
        )?;
        csr.write_uctxt_csr(
            ctxt,
            RCV_HDR_HEAD,
            (dd.params.rcv_intr_count & RCV_HDR_HEAD_COUNTER_MASK) << RCV_HDR_HEAD_COUNTER_SHIFT,
        )?;
    }
    if op & (HFI1_RCVCTRL_TAILUPD_DIS | HFI1_RCVCTRL_CTXT_DIS) != 0 {
        csr.write_kctxt_csr(ctxt, RCV_HDR_TAIL_ADDR, dd.params.rcvhdrtail_dummy_dma)?;
    }
    Ok(())
}
