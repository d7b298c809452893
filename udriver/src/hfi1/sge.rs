//! An SGE state over DMA buffers (`struct rvt_sge_state`), walked page by page by `kern_find_pages`.

#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::dma::{DmaBuffer, PAGE_SIZE};

/// `struct rvt_sge`: `length` bytes of `buf` from byte `offset`.
#[derive(Clone)]
pub struct RvtSge {
    pub buf: Arc<DmaBuffer>,
    /// Current byte offset in `buf` (the kernel's `vaddr`).
    pub offset: usize,
    /// Bytes left in this SGE (the kernel's `sge_length`).
    pub sge_length: u32,
}

impl RvtSge {
    /// An SGE; fails unless `[offset, offset + length)` lies inside `buf`.
    pub fn new(buf: Arc<DmaBuffer>, offset: usize, length: u32) -> Result<Self, i32> {
        match offset.checked_add(length as usize) {
            Some(end) if end <= buf.len() => Ok(Self { buf, offset, sge_length: length }),
            _ => Err(-libc::EINVAL),
        }
    }

    /// IOVA of the page holding the current offset.
    pub fn page_iova(&self) -> Option<u64> {
        self.buf.iova(self.offset).map(|a| a & !(PAGE_SIZE - 1))
    }

    /// True when the SGE starts on a page and spans whole pages (`hfi1_check_sge_align`).
    pub fn page_aligned(&self) -> bool {
        self.buf.iova(self.offset).is_some_and(|a| a % PAGE_SIZE == 0) && u64::from(self.sge_length) % PAGE_SIZE == 0
    }
}

impl std::fmt::Debug for RvtSge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RvtSge")
            .field("iova", &self.buf.iova(self.offset))
            .field("sge_length", &self.sge_length)
            .finish()
    }
}

/// `struct rvt_sge_state`: the current SGE plus the list. Unlike rdmavt, `sg_list` holds every SGE
/// (the first too), so SGE `isge` is `sg_list[isge]`.
#[derive(Clone, Debug, Default)]
pub struct RvtSgeState {
    pub sge: Option<RvtSge>,
    pub sg_list: Vec<RvtSge>,
    pub num_sge: u8,
    pub total_len: u32,
}

impl RvtSgeState {
    /// At most 255 SGEs (`num_sge` is a u8 as in rdmavt).
    pub fn new(sg_list: Vec<RvtSge>) -> Result<Self, i32> {
        let num_sge = u8::try_from(sg_list.len()).map_err(|_| -libc::EINVAL)?;
        let total = sg_list.iter().try_fold(0u32, |acc, s| acc.checked_add(s.sge_length)).ok_or(-libc::EINVAL)?;
        Ok(Self { sge: sg_list.first().cloned(), sg_list, num_sge, total_len: total })
    }

    /// Moves the state to SGE `isge` (or to none past the end).
    pub fn select(&mut self, isge: u8) {
        self.sge = self.sg_list.get(usize::from(isge)).cloned();
    }

    /// `rvt_restart_sge(ss, wqe, len)`: the state over the WQE's `sg_list` again, `len` bytes in
    /// (`rvt_skip_sge`). Returns the index of the SGE it stopped in, which is where the kernel's advanced
    /// `sg_list` stands; -EINVAL when `len` passes the end.
    pub fn restart(&mut self, sg_list: &[RvtSge], len: u32) -> Result<u8, i32> {
        let mut st = RvtSgeState::new(sg_list.to_vec())?;
        let (mut left, mut isge) = (len, 0u8);
        while left > 0 {
            let Some(sge) = st.sge.as_mut() else { return Err(-libc::EINVAL) };
            let step = left.min(sge.sge_length);
            sge.offset += step as usize;
            sge.sge_length -= step;
            left -= step;
            if sge.sge_length == 0 {
                isge += 1;
                st.select(isge);
            }
        }
        *self = st;
        Ok(isge)
    }
}
