//! The host's side of the protocol (see `proto`): accept QEMU's connection, then one state machine over the
//! guest's messages. Every wait is bounded; whatever happens, a report comes out.

use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};
use serde::Serialize;

use super::check::{check_freed, check_registration, Issue};
use super::control::ControlClient;
use super::inject::inject_round;
use super::{HostConfig, HostError};
use crate::abi::{flow_expected_readback, FlowEntry, RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK};
use crate::channel::{ChannelError, LineChannel};
use crate::errno::io_error_name;
use crate::proto::{
    BufferReport, FreeReport, GuestMsg, Hello, HostMsg, Injected, NegativeReport, Verified, PROTO_VERSION,
};

const ABORT_TIMEOUT: Duration = Duration::from_secs(2);
/// Errors of one kind listed in a message to the guest (the report keeps them all).
const MAX_LISTED: usize = 32;

#[derive(Debug, Clone, Default, Serialize)]
pub struct HostRound {
    pub round: u32,
    pub ok: bool,
    pub buffers: usize,
    pub tids: usize,
    pub entries_ok: usize,
    pub dma_maps: usize,
    pub pages_gpa_checked: u64,
    pub pages_gpa_unchecked: u64,
    pub registration: Vec<Issue>,
    /// Buffers no data was sent to, because their entries failed the check.
    pub skipped_buffers: Vec<u32>,
    pub packets: u32,
    pub placed: u32,
    pub payload_bytes: u64,
    pub negatives: Vec<NegativeReport>,
    pub injection_errors: Vec<String>,
    pub verified: Option<Verified>,
    pub freed: Vec<FreeReport>,
    pub free_errors: Vec<String>,
    pub after_free: Vec<Issue>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GuestDone {
    pub ok: bool,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct HostReport {
    pub program: &'static str,
    pub ok: bool,
    pub device: String,
    pub listen: String,
    pub hello: Option<Hello>,
    pub pre_checks: Vec<String>,
    pub rounds: Vec<HostRound>,
    pub guest_done: Option<GuestDone>,
    /// Why the run failed, all in one place.
    pub errors: Vec<String>,
    pub noise_lines: u64,
    pub seconds: f64,
}

fn capped(mut v: Vec<String>) -> Vec<String> {
    if v.len() > MAX_LISTED {
        let more = v.len() - MAX_LISTED;
        v.truncate(MAX_LISTED);
        v.push(format!("… and {more} more"));
    }
    v
}

/// Removes the listening socket when the host is done.
struct Unlink<'a>(&'a Path);
impl Drop for Unlink<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

/// Binds `path`, replacing a stale socket but nothing else.
fn bind(path: &Path) -> Result<UnixListener, HostError> {
    let shown = || path.display().to_string();
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(HostError::NotSocket { path: shown() });
        }
        let _ = std::fs::remove_file(path);
    }
    let listener =
        UnixListener::bind(path).map_err(|e| HostError::Listen { path: shown(), errno: io_error_name(&e) })?;
    listener.set_nonblocking(true).map_err(|e| HostError::Listen { path: shown(), errno: io_error_name(&e) })?;
    Ok(listener)
}

fn accept(listener: &UnixListener, path: &Path, timeout: Duration) -> Result<UnixStream, HostError> {
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((s, _)) => return Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(HostError::Accept { path: path.display().to_string(), errno: io_error_name(&e) }),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HostError::AcceptTimeout { path: path.display().to_string(), after: timeout });
        }
        let ts = rustix::event::Timespec::try_from(left).unwrap_or(rustix::event::Timespec { tv_sec: 1, tv_nsec: 0 });
        let _ = poll(&mut [PollFd::new(listener, PollFlags::IN)], Some(&ts));
    }
}

/// Runs the host side to the end and returns its report (never panics, never waits unbounded).
pub fn serve(cfg: &HostConfig) -> HostReport {
    let start = Instant::now();
    let mut rep = HostReport {
        program: "hfi1-user-host",
        ok: false,
        device: cfg.device.clone(),
        listen: cfg.listen.display().to_string(),
        hello: None,
        pre_checks: Vec::new(),
        rounds: Vec::new(),
        guest_done: None,
        errors: Vec::new(),
        noise_lines: 0,
        seconds: 0.0,
    };
    if let Err(e) = run(cfg, &mut rep) {
        rep.errors.push(e.to_string());
    }
    judge(&mut rep);
    rep.seconds = start.elapsed().as_secs_f64();
    rep
}

fn note(cfg: &HostConfig, msg: std::fmt::Arguments<'_>) {
    if cfg.progress {
        eprintln!("hfi1-user-host: {msg}");
    }
}

fn run(cfg: &HostConfig, rep: &mut HostReport) -> Result<(), HostError> {
    // Listen first, so QEMU can connect while we look at the device model.
    let listener = bind(&cfg.listen)?;
    let _unlink = Unlink(&cfg.listen);
    let mut ctl = ControlClient::connect(&cfg.control, &cfg.device, cfg.control_timeout)?;
    ctl.check_device()?;
    note(
        cfg,
        format_args!("listening on {}; device {} on {}", cfg.listen.display(), cfg.device, cfg.control.display()),
    );
    let stream = accept(&listener, &cfg.listen, cfg.accept_timeout)?;
    note(cfg, format_args!("connected; waiting up to {:?} for the guest's hello", cfg.hello_timeout));
    let mut chan = LineChannel::new(stream)?;
    let out = session(&mut ctl, &mut chan, cfg, rep);
    rep.noise_lines = chan.noise().0;
    if let Err(e) = &out {
        if !matches!(e, HostError::GuestAbort(_) | HostError::Channel(ChannelError::Closed { .. })) {
            let _ = chan.send(&HostMsg::Abort { error: e.to_string() }, ABORT_TIMEOUT);
        }
    }
    out
}

/// Every reason the run failed, besides the fatal error that may have stopped it.
fn verdict_errors(rep: &HostReport) -> Vec<String> {
    let mut errors: Vec<String> = rep.pre_checks.iter().map(|e| format!("before TID_UPDATE: {e}")).collect();
    for r in rep.rounds.iter().filter(|r| !r.ok) {
        errors.push(format!("round {} failed (see rounds[{}])", r.round, r.round.saturating_sub(1)));
    }
    let Some(h) = &rep.hello else {
        errors.push("the guest never said hello".into());
        return errors;
    };
    if rep.rounds.len() != h.rounds as usize {
        errors.push(format!("{} of the guest's {} rounds ran", rep.rounds.len(), h.rounds));
    }
    let sent = |kinds: &[&str]| rep.rounds.iter().flat_map(|r| &r.negatives).any(|n| kinds.contains(&n.kind.as_str()));
    for (what, kinds) in [
        ("wrong generation", &["wrong_generation"][..]),
        ("wrong context", &["wrong_context_absent", "wrong_context_disabled"][..]),
        ("wrong TID", &["wrong_tid_invalid_entry", "wrong_tid_out_of_range"][..]),
    ] {
        if !rep.rounds.is_empty() && !sent(kinds) {
            errors.push(format!("no {what} packet could be sent in any round"));
        }
    }
    match &rep.guest_done {
        Some(d) if !d.ok => errors
            .push(format!("the guest reports failure{}", d.error.as_ref().map_or(String::new(), |e| format!(": {e}")))),
        None => errors.push("the guest did not finish".into()),
        _ => {}
    }
    errors
}

/// The overall verdict: the fatal error (if any) first, then every other failure.
fn judge(rep: &mut HostReport) {
    let fatal = !rep.errors.is_empty();
    let mut more = verdict_errors(rep);
    // A stopped run did not finish or said no hello because of the fatal error: say it once.
    if fatal {
        more.retain(|e| e != "the guest did not finish" && e != "the guest never said hello");
    }
    rep.errors.extend(more);
    rep.ok = rep.errors.is_empty();
}

fn session(
    ctl: &mut ControlClient,
    chan: &mut LineChannel<UnixStream>,
    cfg: &HostConfig,
    rep: &mut HostReport,
) -> Result<(), HostError> {
    let hello = match chan.recv::<GuestMsg>("hello", cfg.hello_timeout)? {
        GuestMsg::Hello(h) => h,
        GuestMsg::Abort { error } => return Err(HostError::GuestAbort(error)),
        other => return Err(HostError::Unexpected { expected: "hello", got: other.name() }),
    };
    rep.hello = Some(hello.clone());
    if hello.proto != PROTO_VERSION {
        return Err(HostError::Protocol(format!(
            "the guest speaks protocol {}, we speak {PROTO_VERSION}",
            hello.proto
        )));
    }
    note(
        cfg,
        format_args!(
            "hello: context {}, {} expected entries, {} rounds",
            hello.info.ctxt, hello.expected_count, hello.rounds
        ),
    );
    rep.pre_checks = pre_checks(ctl, &hello)?;
    let welcome = HostMsg::Welcome { proto: PROTO_VERSION, device: cfg.device.clone(), errors: rep.pre_checks.clone() };
    chan.send(&welcome, cfg.step_timeout)?;
    loop {
        match chan.recv::<GuestMsg>("registered or done", cfg.step_timeout)? {
            GuestMsg::Registered { round, buffers } if round as usize == rep.rounds.len() + 1 => {
                rep.rounds.push(HostRound { round, buffers: buffers.len(), ..Default::default() });
                let hr = rep.rounds.last_mut().ok_or_else(|| HostError::Protocol("no round".into()))?;
                host_round(ctl, chan, cfg, &hello, buffers, hr)?;
            }
            GuestMsg::Registered { round, .. } => {
                return Err(HostError::Protocol(format!(
                    "the guest registered round {round}, round {} expected",
                    rep.rounds.len() + 1
                )))
            }
            GuestMsg::Done { ok, error } => {
                rep.guest_done = Some(GuestDone { ok, error });
                let errors = verdict_errors(rep);
                let verdict = HostMsg::Verdict { ok: errors.is_empty(), errors: capped(errors) };
                chan.send(&verdict, cfg.step_timeout)?;
                // Stay connected until the guest has read it (see proto).
                return match chan.recv::<GuestMsg>("bye", cfg.step_timeout)? {
                    GuestMsg::Bye => Ok(()),
                    other => Err(HostError::Unexpected { expected: "bye", got: other.name() }),
                };
            }
            GuestMsg::Abort { error } => return Err(HostError::GuestAbort(error)),
            other => return Err(HostError::Unexpected { expected: "registered or done", got: other.name() }),
        }
    }
}

/// What must hold before any TID_UPDATE: the context as the kernel set it up, the guest's flow in the
/// device's flow table, no expected entry valid (the refused over-limit call left nothing).
fn pre_checks(ctl: &mut ControlClient, hello: &Hello) -> Result<Vec<String>, HostError> {
    let dump = ctl.dump()?;
    let ours = u32::from(hello.info.ctxt);
    let mut errs = Vec::new();
    if hello.over_limit_errno.as_deref() != Some("EINVAL") {
        errs.push(format!(
            "TID_UPDATE of {} pages (expected_count + 1) gave {:?}; user_exp_rcv.c pin_rcv_pages refuses it with EINVAL",
            hello.over_limit_pages, hello.over_limit_errno
        ));
    }
    if hello.flow_readback != flow_expected_readback(hello.generation) {
        errs.push(format!("the guest read flow {} back as {:#x} through UREGS", hello.flow, hello.flow_readback));
    }
    let Some(c) = dump.context(ours) else {
        errs.push(format!("context {ours} is not in the device model's dump"));
        return Ok(errs);
    };
    if c.tid_count != u64::from(hello.expected_count) {
        errs.push(format!(
            "RCV_TID_CTRL gives context {ours} {} expected entries, CTXT_INFO {}",
            c.tid_count, hello.expected_count
        ));
    }
    let ctrl = c.rcv_ctxt_ctrl().unwrap_or(0);
    if !c.enabled() || ctrl & RCV_CTXT_CTRL_TID_FLOW_ENABLE_SMASK == 0 {
        errs.push(format!(
            "RCV_CTXT_CTRL of context {ours} is {ctrl:#x}: ENABLE and TID_FLOW_ENABLE expected (user_init sets \
             TIDFLOW_ENB with the user HDRSUPP capability; runtime_flags {:#x})",
            hello.info.runtime_flags
        ));
    }
    let raw = c.flow(hello.flow);
    let f = FlowEntry::decode(raw);
    if raw != hello.flow_readback || !f.flow_valid || f.generation != hello.generation || f.sequence != 0 {
        errs.push(format!(
            "flow {} of context {ours} is {raw:#x} in the device model; the guest wrote {:#x} through UREGS and \
             read back {:#x}",
            hello.flow, hello.flow_value, hello.flow_readback
        ));
    }
    let left = check_freed(c, &dump);
    if !left.is_empty() {
        errs.push(format!("{} expected entries valid before any TID_UPDATE, e.g. {}", left.len(), left[0]));
    }
    Ok(errs)
}

fn host_round(
    ctl: &mut ControlClient,
    chan: &mut LineChannel<UnixStream>,
    cfg: &HostConfig,
    hello: &Hello,
    buffers: Vec<BufferReport>,
    hr: &mut HostRound,
) -> Result<(), HostError> {
    let round = hr.round;
    let ours = u32::from(hello.info.ctxt);
    let dump = ctl.dump()?;
    let maps = ctl.dma_maps()?;
    let ctx = dump.context(ours).ok_or_else(|| HostError::Protocol(format!("context {ours} left the dump")))?;
    let check = check_registration(ctx, &dump, &maps, &buffers, cfg.gpa_check);
    hr.dma_maps = maps.len();
    hr.tids = check.tids;
    hr.entries_ok = check.entries_ok;
    hr.pages_gpa_checked = check.pages_gpa_checked;
    hr.pages_gpa_unchecked = check.pages_gpa_unchecked;
    hr.registration = check.errors.iter().map(Issue::from).collect();
    let injectable = check.injectable(&buffers);
    hr.skipped_buffers = buffers.iter().map(|b| b.id).filter(|id| !injectable.contains(id)).collect();
    let targets: Vec<&BufferReport> = buffers.iter().filter(|b| injectable.contains(&b.id)).collect();

    note(cfg, format_args!("round {round}: {} TIDs, {} check failures; injecting", check.tids, check.errors.len()));
    let inj = inject_round(ctl, hello, &dump, &targets)?;
    note(cfg, format_args!("round {round}: {}/{} packets placed", inj.placed, inj.packets));
    hr.packets = inj.packets;
    hr.placed = inj.placed;
    hr.payload_bytes = inj.payload_bytes;
    hr.negatives = inj.negatives.clone();
    hr.injection_errors = inj.errors.clone();
    let mut errors: Vec<String> = hr.registration.iter().map(|i| i.message.clone()).collect();
    errors = capped(errors);
    if !hr.skipped_buffers.is_empty() {
        errors.push(format!("no data sent to buffers {:?}: their entries failed the check", hr.skipped_buffers));
    }
    errors.extend(inj.errors);
    let injected = Injected {
        round,
        packets: inj.packets,
        placed: inj.placed,
        payload_bytes: inj.payload_bytes,
        negatives: inj.negatives,
        errors,
    };
    chan.send(&HostMsg::Injected(injected), cfg.step_timeout)?;

    let verified = match chan.recv::<GuestMsg>("verified", cfg.step_timeout)? {
        GuestMsg::Verified(v) if v.round == round => v,
        GuestMsg::Abort { error } => return Err(HostError::GuestAbort(error)),
        other => return Err(HostError::Unexpected { expected: "verified", got: other.name() }),
    };
    let verified_ok = verified.ok;
    hr.verified = Some(verified);
    let freed = match chan.recv::<GuestMsg>("freed", cfg.step_timeout)? {
        GuestMsg::Freed { round: r, buffers } if r == round => buffers,
        GuestMsg::Abort { error } => return Err(HostError::GuestAbort(error)),
        other => return Err(HostError::Unexpected { expected: "freed", got: other.name() }),
    };
    for b in &buffers {
        match freed.iter().find(|f| f.id == b.id) {
            Some(f) if f.error.is_none() && f.tidcnt as usize == b.tidlist.len() => {}
            Some(f) => hr.free_errors.push(format!(
                "buffer {}: TID_FREE released {} of {} TIDs ({})",
                b.id,
                f.tidcnt,
                b.tidlist.len(),
                f.error.as_deref().unwrap_or("no error")
            )),
            None => hr.free_errors.push(format!("buffer {}: the guest reported no TID_FREE", b.id)),
        }
    }
    hr.freed = freed;
    let after = ctl.dump()?;
    let ctx = after.context(ours).ok_or_else(|| HostError::Protocol(format!("context {ours} left the dump")))?;
    hr.after_free = check_freed(ctx, &after).iter().map(Issue::from).collect();

    hr.ok = hr.registration.is_empty()
        && hr.skipped_buffers.is_empty()
        && hr.injection_errors.is_empty()
        && verified_ok
        && hr.free_errors.is_empty()
        && hr.after_free.is_empty();
    let mut errors = capped(hr.after_free.iter().map(|i| i.message.clone()).collect());
    errors.extend(hr.free_errors.iter().cloned());
    if !verified_ok {
        errors.push("the guest found bytes that differ from what was placed".into());
    }
    note(cfg, format_args!("round {round}: {}", if hr.ok { "ok" } else { "FAILED" }));
    chan.send(&HostMsg::RoundVerdict { round, ok: hr.ok, errors }, cfg.step_timeout)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn cfg(dir: &Path, accept: Duration) -> HostConfig {
        HostConfig {
            listen: dir.join("serial.sock"),
            control: dir.join("dm.sock"),
            device: "hfi1-wfr".into(),
            accept_timeout: accept,
            hello_timeout: Duration::from_millis(200),
            step_timeout: Duration::from_millis(200),
            control_timeout: Duration::from_secs(1),
            gpa_check: true,
            progress: false,
        }
    }

    /// Removed when the test ends, pass or fail.
    fn tempdir(tag: &str) -> tempfile::TempDir {
        tempfile::Builder::new().prefix(&format!("hfi1-user-{tag}-")).tempdir().unwrap()
    }

    #[test]
    fn nothing_connecting_is_an_accept_timeout_and_the_socket_is_removed() {
        let dir = tempdir("accept");
        let c = cfg(dir.path(), Duration::from_millis(100));
        let listener = bind(&c.listen).unwrap();
        let start = Instant::now();
        let e = accept(&listener, &c.listen, c.accept_timeout).unwrap_err();
        assert!(matches!(e, HostError::AcceptTimeout { .. }), "{e}");
        assert!(start.elapsed() < Duration::from_secs(5));
        // serve(): no device model either, so it stops at the control socket, and cleans up.
        let rep = serve(&c);
        assert!(!rep.ok && rep.errors[0].contains("control socket"), "{:?}", rep.errors);
        assert!(!c.listen.exists());
    }

    #[test]
    fn a_file_in_the_way_is_not_replaced() {
        let dir = tempdir("notsock");
        let c = cfg(dir.path(), Duration::from_millis(100));
        std::fs::File::create(&c.listen).unwrap().write_all(b"keep").unwrap();
        assert!(matches!(bind(&c.listen), Err(HostError::NotSocket { .. })));
        assert_eq!(std::fs::read(&c.listen).unwrap(), b"keep");
    }

    #[test]
    fn early_connection_is_accepted_later() {
        let dir = tempdir("early");
        let c = cfg(dir.path(), Duration::from_secs(5));
        let listener = bind(&c.listen).unwrap();
        let _qemu = UnixStream::connect(&c.listen).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(accept(&listener, &c.listen, c.accept_timeout).is_ok());
    }
}
