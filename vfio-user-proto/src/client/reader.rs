//! The client's reading thread: routes replies to waiting callers by message id and answers the
//! server's DMA_READ/DMA_WRITE from the memory registered with `dma_map_backed`.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crossbeam_channel::Sender;

use crate::client::{ClientDmaBacking, DmaProt};
use crate::device::Errno;
use crate::sock::{recv_message, send_message, Message, RecvLimits};
use crate::wire::{command, DmaRw, Header};

/// A fd-less mapping the client serves itself.
pub(crate) struct Backed {
    pub iova: u64,
    pub size: u64,
    pub prot: DmaProt,
    pub backing: Arc<dyn ClientDmaBacking>,
    /// For fd maps: the file's (st_dev, st_ino) and the shared handle, so one file is held once.
    pub file: Option<((u64, u64), Arc<File>)>,
}

/// Answers DMA_READ/WRITE for an fd map with pread/pwrite: used when the server did not mmap the
/// file (it is not sealed against shrinking). A file that shrank gives EFAULT, never a fault.
pub(crate) struct FdBacking {
    pub file: Arc<File>,
    pub base: u64,
}

impl ClientDmaBacking for FdBacking {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let at = self.base.checked_add(offset).ok_or(libc::EFAULT)?;
        self.file.read_exact_at(buf, at).map_err(|_| libc::EFAULT)
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let at = self.base.checked_add(offset).ok_or(libc::EFAULT)?;
        self.file.write_all_at(data, at).map_err(|_| libc::EFAULT)
    }
}

pub(crate) struct Shared {
    pub stream: UnixStream,
    pub write_lock: Mutex<()>,
    pub pending: Mutex<HashMap<u16, Sender<Message>>>,
    pub backed: RwLock<Vec<Backed>>,
    pub closed: AtomicBool,
}

impl Shared {
    pub(crate) fn send(
        &self,
        header: &Header,
        parts: &[&[u8]],
        fds: &[std::os::fd::BorrowedFd],
    ) -> std::io::Result<()> {
        let _g = self.write_lock.lock().unwrap_or_else(|e| e.into_inner());
        send_message(&self.stream, header, parts, fds)
    }

    pub(crate) fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<u16, Sender<Message>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn backed(&self) -> std::sync::RwLockReadGuard<'_, Vec<Backed>> {
        self.backed.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Finds the backing holding all of `[addr, addr+count)` with permission `need`.
    fn serve_dma(
        &self,
        addr: u64,
        count: u64,
        need: DmaProt,
        op: impl FnOnce(&dyn ClientDmaBacking, u64) -> Result<(), Errno>,
    ) -> Result<(), Errno> {
        let backed = self.backed();
        let end = addr.checked_add(count).ok_or(libc::EFAULT)?;
        let b = backed.iter().find(|b| addr >= b.iova && end <= b.iova.saturating_add(b.size)).ok_or(libc::EFAULT)?;
        if !b.prot.contains(need) {
            return Err(libc::EPERM);
        }
        op(&*b.backing, addr - b.iova)
    }

    fn answer_dma(&self, msg: &Message, max_xfer: u32) -> Result<Vec<u8>, Errno> {
        let (rw, data) = DmaRw::decode(&msg.payload).map_err(|_| libc::EINVAL)?;
        if rw.count == 0 || rw.count > u64::from(max_xfer) {
            return Err(libc::EINVAL);
        }
        match msg.header.command {
            command::DMA_READ => {
                if !data.is_empty() {
                    return Err(libc::EINVAL);
                }
                let mut out = rw.encode();
                out.resize(out.len() + rw.count as usize, 0);
                let dst = out.get_mut(crate::wire::DMA_RW_SIZE..).ok_or(libc::EINVAL)?;
                self.serve_dma(rw.address, rw.count, DmaProt::READ, |b, off| b.read(off, dst))?;
                Ok(out)
            }
            command::DMA_WRITE => {
                if data.len() as u64 != rw.count {
                    return Err(libc::EINVAL);
                }
                self.serve_dma(rw.address, rw.count, DmaProt::WRITE, |b, off| b.write(off, data))?;
                Ok(rw.encode())
            }
            _ => Err(libc::ENOSYS),
        }
    }
}

/// Runs until the socket closes. Ends by waking every caller still waiting.
pub(crate) fn run(shared: Arc<Shared>, max_msg_size: u32, max_fds: u32, max_xfer: u32, stall: std::time::Duration) {
    let limits = RecvLimits { max_msg_size, max_fds, stall_timeout: stall, stop: None };
    loop {
        let msg = match recv_message(&shared.stream, &limits) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!("client reader stops: {e}");
                break;
            }
        };
        let h = msg.header;
        if h.is_reply() {
            if let Some(tx) = shared.pending().remove(&h.msg_id) {
                let _ = tx.try_send(msg);
            }
            continue;
        }
        if h.no_reply() {
            continue;
        }
        let reply = if msg.fds.is_empty() { shared.answer_dma(&msg, max_xfer) } else { Err(libc::EINVAL) };
        let sent = match reply {
            Ok(p) => shared.send(&Header::reply(&h, p.len()), &[&p], &[]),
            Err(e) => shared.send(&Header::error_reply(&h, e), &[], &[]),
        };
        if sent.is_err() {
            break;
        }
    }
    shared.closed.store(true, Ordering::Release);
    shared.pending().clear();
}
