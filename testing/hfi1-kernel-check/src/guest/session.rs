//! The guest's side of the protocol (see `proto`), over any [`UserContext`].

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::time::Duration;

use serde::Serialize;

use super::buffers::{default_maps, rounds, MapSpec};
use super::{GuestError, GuestMemory, Result, UserContext};
use crate::abi::{
    expected_count, flow_expected_readback, flow_program_value, Hfi1CtxtInfo, TidInfo, GENERATION_MASK,
    HFI1_SWMAJOR_SHIFT, HFI1_USER_SWMAJOR, KERN_GENERATION_RESERVED, MAX_TID_PAIR_ENTRIES, PAGE_SIZE,
    RXE_NUM_TID_FLOWS,
};
use crate::channel::{ChannelError, LineChannel};
use crate::pattern::{self, GUARD_BYTE};
use crate::plan::{check_mtu, placed_ranges, plan_buffer};
use crate::proto::{
    BufferKind, BufferReport, FreeReport, GuestMsg, Hello, HostMsg, Injected, Mismatch, Verified, PROTO_VERSION,
};
use crate::sys::SysError;

const PAGE: usize = PAGE_SIZE as usize;
const CHUNK: usize = 64 * 1024;
/// Mismatches listed per round (all are counted).
const MAX_MISMATCHES: usize = 16;
/// How long a farewell `abort` may take to leave.
const ABORT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct GuestOptions {
    pub flow: u32,
    pub generation: u32,
    pub seed: u64,
    pub mtu: u32,
    /// Wait for the host's welcome (the host is up before QEMU, so this is short).
    pub hello_timeout: Duration,
    /// Every later wait for the host (injection of a round takes the longest).
    pub timeout: Duration,
    /// Progress lines on stderr: an ioctl stuck in the kernel cannot be timed out from here, so the last
    /// line says where it stopped.
    pub progress: bool,
}

fn note(opts: &GuestOptions, msg: std::fmt::Arguments<'_>) {
    if opts.progress {
        eprintln!("hfi1-user: {msg}");
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct OverLimit {
    pub pages: u32,
    pub errno: Option<String>,
    pub ok: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct BufferResult {
    pub id: u32,
    pub kind: BufferKind,
    pub pages: u32,
    pub len: u64,
    pub length: u64,
    pub tids: usize,
    pub largest_tid_pages: u32,
    pub single_page_tids: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct HostVerdict {
    pub ok: bool,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RoundResult {
    pub round: u32,
    pub ok: bool,
    pub buffers: Vec<BufferResult>,
    pub injected: Option<Injected>,
    pub verified: Option<Verified>,
    pub freed: Vec<FreeReport>,
    pub host: Option<HostVerdict>,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GuestResult {
    pub program: &'static str,
    pub ok: bool,
    pub ctxt_info: Option<Hfi1CtxtInfo>,
    pub expected_count: Option<u32>,
    pub flow: u32,
    pub generation: u32,
    pub flow_readback: Option<u64>,
    pub over_limit: Option<OverLimit>,
    pub rounds: Vec<RoundResult>,
    pub host_welcome_errors: Vec<String>,
    pub host_verdict: Option<HostVerdict>,
    pub errors: Vec<String>,
    pub noise_lines: u64,
}

/// Runs the whole program over `ctx` and `chan`; never panics, always returns a result.
pub fn run<C: UserContext, S: Read + Write + AsFd>(
    ctx: &mut C,
    chan: &mut LineChannel<S>,
    opts: &GuestOptions,
) -> GuestResult {
    let mut res = GuestResult {
        program: "hfi1-user",
        ok: false,
        ctxt_info: None,
        expected_count: None,
        flow: opts.flow,
        generation: opts.generation,
        flow_readback: None,
        over_limit: None,
        rounds: Vec::new(),
        host_welcome_errors: Vec::new(),
        host_verdict: None,
        errors: Vec::new(),
        noise_lines: 0,
    };
    if let Err(e) = session(ctx, chan, opts, &mut res) {
        res.errors.push(e.to_string());
        // Tell the host why we stop, unless it stopped first or the line is gone.
        if !matches!(e, GuestError::HostAbort(_) | GuestError::Channel(ChannelError::Closed { .. })) {
            let _ = chan.send(&GuestMsg::Abort { error: e.to_string() }, ABORT_TIMEOUT);
        }
    }
    res.noise_lines = chan.noise().0;
    res.ok = res.errors.is_empty()
        && res.over_limit.as_ref().is_some_and(|o| o.ok)
        && res.rounds.iter().all(|r| r.ok)
        && res.host_verdict.as_ref().is_some_and(|v| v.ok);
    res
}

fn check_options(opts: &GuestOptions) -> Result<()> {
    check_mtu(opts.mtu).map_err(|e| GuestError::Setup(e.to_string()))?;
    if opts.flow >= RXE_NUM_TID_FLOWS {
        return Err(GuestError::Setup(format!("flow {} is not below {RXE_NUM_TID_FLOWS}", opts.flow)));
    }
    if opts.generation > GENERATION_MASK || opts.generation == KERN_GENERATION_RESERVED {
        return Err(GuestError::Setup(format!(
            "generation {:#x} is not a 20-bit generation other than the kernel's reserved {KERN_GENERATION_RESERVED:#x}",
            opts.generation
        )));
    }
    Ok(())
}

fn session<C: UserContext, S: Read + Write + AsFd>(
    ctx: &mut C,
    chan: &mut LineChannel<S>,
    opts: &GuestOptions,
    res: &mut GuestResult,
) -> Result<()> {
    check_options(opts)?;
    let facts = ctx.facts();
    res.ctxt_info = Some(facts.info);
    let e = expected_count(&facts.info).filter(|&e| e > 0 && e <= 2 * MAX_TID_PAIR_ENTRIES).ok_or_else(|| {
        GuestError::Setup(format!(
            "CTXT_INFO gives no usable expected count (rcvtids {}, egrtids {})",
            facts.info.rcvtids, facts.info.egrtids
        ))
    })?;
    res.expected_count = Some(e);
    note(opts, format_args!("context {}:{}, {e} expected entries", facts.info.ctxt, facts.info.subctxt));
    if facts.base.sw_version >> HFI1_SWMAJOR_SHIFT != HFI1_USER_SWMAJOR {
        return Err(GuestError::Setup(format!("USER_INFO sw_version {:#x} is not major 6", facts.base.sw_version)));
    }

    // Program the flow as PSM does, through the mapped UREGS page.
    let flow_value = flow_program_value(opts.generation);
    let readback = ctx.write_flow(opts.flow, flow_value)?;
    res.flow_readback = Some(readback);
    if readback != flow_expected_readback(opts.generation) {
        res.errors.push(format!(
            "flow {} read back {readback:#x} after writing {flow_value:#x} (expected {:#x})",
            opts.flow,
            flow_expected_readback(opts.generation)
        ));
    }

    note(opts, format_args!("flow {} generation {:#x} read back {readback:#x}", opts.flow, opts.generation));
    note(opts, format_args!("TID_UPDATE of {} pages, one more than a call may pin", e + 1));
    let over = over_limit(ctx, e)?;
    let plan = rounds(default_maps(e), e);
    let hello = Hello {
        proto: PROTO_VERSION,
        info: facts.info,
        expected_count: e,
        hw_version: facts.base.hw_version,
        sw_version: facts.base.sw_version,
        flow: opts.flow,
        generation: opts.generation,
        flow_value,
        flow_readback: readback,
        seed: opts.seed,
        mtu: opts.mtu,
        over_limit_pages: over.pages,
        over_limit_errno: over.errno.clone(),
        rounds: plan.len() as u32,
    };
    res.over_limit = Some(over);
    note(opts, format_args!("hello sent; {} rounds planned", plan.len()));
    chan.send(&GuestMsg::Hello(hello), opts.timeout)?;
    match chan.recv::<HostMsg>("welcome", opts.hello_timeout)? {
        HostMsg::Welcome { proto, errors, .. } if proto == PROTO_VERSION => res.host_welcome_errors = errors,
        HostMsg::Welcome { proto, .. } => {
            return Err(GuestError::Setup(format!("host speaks protocol {proto}, we speak {PROTO_VERSION}")))
        }
        HostMsg::Abort { error } => return Err(GuestError::HostAbort(error)),
        other => return Err(GuestError::Unexpected { expected: "welcome", got: other.name() }),
    }

    for (i, maps) in plan.iter().enumerate() {
        let mut rr = RoundResult {
            round: i as u32 + 1,
            ok: false,
            buffers: Vec::new(),
            injected: None,
            verified: None,
            freed: Vec::new(),
            host: None,
            errors: Vec::new(),
        };
        let out = run_round(ctx, chan, opts, maps, &mut rr);
        note(opts, format_args!("round {}: {}", rr.round, if rr.ok { "ok" } else { "FAILED" }));
        res.rounds.push(rr);
        out?;
    }

    let ok = res.errors.is_empty() && res.rounds.iter().all(|r| r.ok);
    chan.send(&GuestMsg::Done { ok, error: None }, opts.timeout)?;
    match chan.recv::<HostMsg>("verdict", opts.timeout)? {
        HostMsg::Verdict { ok, errors } => {
            res.host_verdict = Some(HostVerdict { ok, errors });
            chan.send(&GuestMsg::Bye, opts.timeout)?;
        }
        HostMsg::Abort { error } => return Err(GuestError::HostAbort(error)),
        other => return Err(GuestError::Unexpected { expected: "verdict", got: other.name() }),
    }
    Ok(())
}

/// TID_UPDATE of one page more than a call may pin (user_exp_rcv.c:167): the kernel must refuse it.
fn over_limit<C: UserContext>(ctx: &mut C, e: u32) -> Result<OverLimit> {
    let pages = e + 1;
    let mem = ctx.map(BufferKind::Separate, pages as usize + 1)?;
    let errno = match ctx.tid_update(&mem, 0, pages as usize * PAGE) {
        Err(GuestError::Sys(SysError::Ioctl { errno, .. })) => Some(errno),
        Err(other) => return Err(other),
        Ok(upd) => {
            // Accepted against the kernel's own limit: release it and report.
            let _ = ctx.tid_free(&upd.tidlist);
            None
        }
    };
    let ok = errno.as_deref() == Some("EINVAL");
    Ok(OverLimit { pages, errno, ok })
}

/// A buffer that TID_UPDATE programmed.
struct Registered {
    id: u32,
    map: usize,
    offset: usize,
    pages: u32,
    tidlist: Vec<u32>,
}

fn run_round<C: UserContext, S: Read + Write + AsFd>(
    ctx: &mut C,
    chan: &mut LineChannel<S>,
    opts: &GuestOptions,
    maps: &[MapSpec],
    rr: &mut RoundResult,
) -> Result<()> {
    let mut mems = Vec::with_capacity(maps.len());
    for m in maps {
        let mem = ctx.map(m.kind, m.pages())?;
        for off in (0..mem.size()).step_by(CHUNK) {
            mem.write(off, &[GUARD_BYTE; CHUNK][..CHUNK.min(mem.size() - off)])?;
        }
        mems.push(mem);
    }
    let mut registered = Vec::new();
    let out = register_inject_verify_free(ctx, chan, opts, maps, &mems, &mut registered, rr);
    if out.is_err() {
        // Whatever stopped the round, give back what is still programmed (closing the fd would too).
        for r in &registered {
            let _ = ctx.tid_free(&r.tidlist);
        }
    }
    out
}

fn register_inject_verify_free<C: UserContext, S: Read + Write + AsFd>(
    ctx: &mut C,
    chan: &mut LineChannel<S>,
    opts: &GuestOptions,
    maps: &[MapSpec],
    mems: &[C::Mem],
    registered: &mut Vec<Registered>,
    rr: &mut RoundResult,
) -> Result<()> {
    let n = rr.round;
    let mut reports = Vec::new();
    for (mi, m) in maps.iter().enumerate() {
        for (b, offset) in m.buffers.iter().zip(m.offsets()) {
            note(opts, format_args!("round {n}: TID_UPDATE buffer {} ({:?}, {} pages)", b.id, m.kind, b.pages));
            let upd = ctx.tid_update(&mems[mi], offset, b.len as usize)?;
            registered.push(Registered { id: b.id, map: mi, offset, pages: b.pages, tidlist: upd.tidlist.clone() });
            let pfns = ctx.pfns(&mems[mi], offset, b.pages as usize)?;
            let lens: Vec<u32> = upd.tidlist.iter().map(|&t| TidInfo::decode(t).len).collect();
            let tid_pages: u64 = lens.iter().map(|&l| u64::from(l)).sum();
            let want = u64::from(b.pages) * PAGE_SIZE;
            if upd.tidlist.is_empty() || u64::from(upd.length) != want || tid_pages * PAGE_SIZE != want {
                rr.errors.push(format!(
                    "buffer {}: TID_UPDATE of {} bytes programmed {} bytes in {} TIDs covering {tid_pages} pages \
                     (whole {} pages expected)",
                    b.id,
                    b.len,
                    upd.length,
                    upd.tidlist.len(),
                    b.pages
                ));
            }
            rr.buffers.push(BufferResult {
                id: b.id,
                kind: m.kind,
                pages: b.pages,
                len: b.len,
                length: u64::from(upd.length),
                tids: lens.len(),
                largest_tid_pages: lens.iter().copied().max().unwrap_or(0),
                single_page_tids: lens.iter().filter(|&&l| l == 1).count(),
            });
            reports.push(BufferReport {
                id: b.id,
                kind: m.kind,
                pages: b.pages,
                len: b.len,
                length: u64::from(upd.length),
                vaddr: mems[mi].vaddr() + offset as u64,
                tidlist: upd.tidlist,
                pfns,
            });
        }
    }
    note(opts, format_args!("round {n}: registered; waiting for the host's packets"));
    chan.send(&GuestMsg::Registered { round: n, buffers: reports }, opts.timeout)?;
    match chan.recv::<HostMsg>("injected", opts.timeout)? {
        HostMsg::Injected(i) if i.round == n => rr.injected = Some(i),
        HostMsg::Injected(i) => {
            return Err(GuestError::Setup(format!("host reported injection for round {}, not {n}", i.round)))
        }
        HostMsg::Abort { error } => return Err(GuestError::HostAbort(error)),
        other => return Err(GuestError::Unexpected { expected: "injected", got: other.name() }),
    }

    let verified = verify_round(mems, registered, opts, n)?;
    chan.send(&GuestMsg::Verified(verified.clone()), opts.timeout)?;
    rr.verified = Some(verified);

    note(
        opts,
        format_args!(
            "round {n}: {} bytes checked, {} wrong; TID_FREE",
            rr.verified.as_ref().map_or(0, |v| v.bytes_checked),
            rr.verified.as_ref().map_or(0, |v| v.mismatch_count)
        ),
    );
    let mut freed = Vec::new();
    for r in registered.drain(..) {
        let report = match ctx.tid_free(&r.tidlist) {
            Ok(tidcnt) => FreeReport { id: r.id, tidcnt, error: None },
            Err(e) => FreeReport { id: r.id, tidcnt: 0, error: Some(e.to_string()) },
        };
        if report.error.is_some() || report.tidcnt as usize != r.tidlist.len() {
            rr.errors.push(format!(
                "buffer {}: TID_FREE of {} TIDs released {} ({})",
                r.id,
                r.tidlist.len(),
                report.tidcnt,
                report.error.as_deref().unwrap_or("no error")
            ));
        }
        freed.push(report);
    }
    chan.send(&GuestMsg::Freed { round: n, buffers: freed.clone() }, opts.timeout)?;
    rr.freed = freed;
    match chan.recv::<HostMsg>("round_verdict", opts.timeout)? {
        HostMsg::RoundVerdict { round, ok, errors } if round == n => rr.host = Some(HostVerdict { ok, errors }),
        HostMsg::RoundVerdict { round, .. } => {
            return Err(GuestError::Setup(format!("host sent the verdict of round {round}, not {n}")))
        }
        HostMsg::Abort { error } => return Err(GuestError::HostAbort(error)),
        other => return Err(GuestError::Unexpected { expected: "round_verdict", got: other.name() }),
    }
    rr.ok = rr.errors.is_empty()
        && rr.injected.as_ref().is_some_and(|i| i.errors.is_empty())
        && rr.verified.as_ref().is_some_and(|v| v.ok)
        && rr.host.as_ref().is_some_and(|h| h.ok);
    Ok(())
}

/// Every byte of every buffer and of the guard page after it: data where the plan put packets, the guard
/// byte everywhere else.
fn verify_round<M: GuestMemory>(
    mems: &[M],
    registered: &[Registered],
    opts: &GuestOptions,
    n: u32,
) -> Result<Verified> {
    let mut v = Verified {
        round: n,
        ok: true,
        bytes_checked: 0,
        data_bytes: 0,
        mismatch_count: 0,
        mismatches: Vec::new(),
        errors: Vec::new(),
    };
    for r in registered {
        let plan = match plan_buffer(&r.tidlist, opts.mtu) {
            Ok(p) => p,
            Err(e) => {
                v.errors.push(format!("buffer {}: {e}", r.id));
                continue;
            }
        };
        let span = (r.pages as usize + 1) * PAGE;
        let mut segments = Vec::new();
        let mut at = 0u64;
        for (s, e) in placed_ranges(&plan) {
            segments.push((at, s, false));
            segments.push((s, e, true));
            at = e;
        }
        segments.push((at, span as u64, false));
        let mut found = vec![0u8; CHUNK];
        let mut want = vec![0u8; CHUNK];
        for (start, end, data) in segments {
            let mut off = start;
            while off < end {
                let len = (end - off).min(CHUNK as u64) as usize;
                mems[r.map].read(r.offset + off as usize, &mut found[..len])?;
                if data {
                    pattern::fill(opts.seed, r.id, off, &mut want[..len]);
                    v.data_bytes += len as u64;
                } else {
                    want[..len].fill(GUARD_BYTE);
                }
                for (i, (&w, &f)) in want[..len].iter().zip(&found[..len]).enumerate() {
                    if w != f {
                        v.mismatch_count += 1;
                        if v.mismatches.len() < MAX_MISMATCHES {
                            v.mismatches.push(Mismatch {
                                buffer: r.id,
                                offset: off + i as u64,
                                expected: w,
                                found: f,
                                guard: !data,
                            });
                        }
                    }
                }
                v.bytes_checked += len as u64;
                off += len as u64;
            }
        }
    }
    v.ok = v.mismatch_count == 0 && v.errors.is_empty();
    Ok(v)
}
