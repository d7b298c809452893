//! The stock kernel's own detectors as the fuzzer's oracles: their reports, read off the guest's serial console.
//!
//! The fuzz row boots with `panic_on_warn=1 oops=panic kfence.sample_interval=1 slub_debug=FZPU
//! softlockup_panic=1 hung_task_panic=1` and `loglevel=5` (so the WARNING lines, `pr_warn`, reach the console).
//! Every detector prints a first line of a known shape and most then panic; [`Scanner`] finds those first lines
//! in the console's bytes as they arrive and keeps the report that follows them.

use serde::Serialize;

/// What kind of detector spoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// `WARN()` (kernel/panic.c `__warn`: "WARNING: CPU: %d PID: %d at ...").
    Warn,
    /// KFENCE (mm/kfence/report.c: "BUG: KFENCE: ...").
    Kfence,
    /// A SLUB consistency check (mm/slub.c `slab_bug`: "BUG <cache> (<taint>): ...").
    Slab,
    /// `BUG()` and list corruption under BUG_ON_DATA_CORRUPTION (lib/bug.c: "kernel BUG at ...";
    /// lib/list_debug.c: "list_add corruption", "list_del corruption").
    Bug,
    /// A fault in kernel mode (arch/x86/mm/fault.c, arch/x86/kernel/traps.c and dumpstack.c: "BUG: unable to
    /// handle page fault", "BUG: kernel NULL pointer dereference", "Oops: ...", "general protection fault").
    Oops,
    /// The soft-lockup detector (kernel/watchdog.c: "watchdog: BUG: soft lockup - CPU#...").
    SoftLockup,
    /// The hung-task detector (kernel/hung_task.c: "INFO: task ...:... blocked for more than ... seconds.").
    HungTask,
    /// An RCU stall (kernel/rcu/tree_stall.h: "rcu: INFO: rcu_... detected stalls" / "self-detected stall").
    RcuStall,
    /// Any other "BUG: " line (scheduling while atomic, sleeping in atomic context, workqueue lockup...).
    OtherBug,
    /// "Kernel panic - not syncing" with no report before it.
    Panic,
    /// Not a kernel detector: the driver never took a batch (the device model's deadline), and nothing spoke.
    Stall,
}

/// A detector's report: its first line and what followed, up to the panic or a bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub kind: Kind,
    /// The first line, without the printk time stamp.
    pub title: String,
    /// The report's lines (the first included), at most [`REPORT_LINES`].
    pub text: Vec<String>,
}

/// Lines kept of a report (a stack trace with the module list fits).
pub const REPORT_LINES: usize = 120;
/// Longest console line kept whole; the rest of a longer one is dropped.
const MAX_LINE: usize = 1024;

impl Report {
    /// What findings are de-duplicated on: the kind and the title with its numbers (CPU, PID, addresses,
    /// offsets) taken out, so the same defect hit twice is one finding.
    pub fn signature(&self) -> String {
        let mut s = String::with_capacity(self.title.len());
        let mut word = String::new();
        let flush = |word: &mut String, s: &mut String| {
            // A number: decimal or 0x-hex, or a bare hex address ("ffffc90000a3f000"); "hfi1_cov" is a word.
            let hex = word.strip_prefix("0x").unwrap_or(word);
            let number = !word.is_empty()
                && ((word.starts_with(|c: char| c.is_ascii_digit()) && hex.bytes().all(|b| b.is_ascii_hexdigit()))
                    || (word.len() >= 8 && word.bytes().all(|b| b.is_ascii_hexdigit())));
            s.push_str(if number { "#" } else { word });
            word.clear();
        };
        for c in self.title.chars() {
            if c.is_ascii_alphanumeric() || c == '_' {
                word.push(c);
            } else {
                flush(&mut word, &mut s);
                s.push(c);
            }
        }
        flush(&mut word, &mut s);
        match self.rip_function() {
            Some(f) => format!("{:?}: {} @ {}", self.kind, s, f),
            None => format!("{:?}: {}", self.kind, s),
        }
    }

    /// The function of the report's first "RIP: " line ("RIP: 0010:hfi1_ud_rcv+0x779/0xd20 [hfi1]" gives
    /// "hfi1_ud_rcv"): where a fault happened, which the title of a page fault or NULL dereference does not say.
    pub fn rip_function(&self) -> Option<&str> {
        let rip = self.text.iter().find_map(|l| l.trim_start().strip_prefix("RIP: "))?;
        let sym = rip.split_once(':').map_or(rip, |(_, s)| s);
        let f = sym.split(['+', ' ']).next()?;
        (!f.is_empty()).then_some(f)
    }

    /// Whether the kernel stops after this report under the fuzz row's parameters (panic_on_warn, oops=panic,
    /// softlockup_panic, hung_task_panic, KFENCE and BUG reports via oops).
    pub fn is_fatal(&self) -> bool {
        !matches!(self.kind, Kind::RcuStall | Kind::OtherBug | Kind::Slab)
    }
}

/// The shape of a detector's first line: its kind, if `line` (time stamp removed) is one.
pub fn classify(line: &str) -> Option<Kind> {
    let l = line.trim_start();
    // Order matters: the specific "BUG: ..." forms before the catch-all.
    let starts = |p: &str| l.starts_with(p);
    Some(if starts("WARNING: CPU: ") {
        Kind::Warn
    } else if starts("BUG: KFENCE: ") {
        Kind::Kfence
    } else if starts("watchdog: BUG: soft lockup") {
        Kind::SoftLockup
    } else if starts("INFO: task ") && l.contains(" blocked for more than ") {
        Kind::HungTask
    } else if starts("rcu: INFO: rcu_") && l.contains("stall") {
        Kind::RcuStall
    } else if starts("kernel BUG at ") || starts("list_add corruption") || starts("list_del corruption") {
        Kind::Bug
    } else if starts("BUG: unable to handle page fault")
        || starts("BUG: kernel NULL pointer dereference")
        || starts("Oops: ")
        || starts("general protection fault")
    {
        Kind::Oops
    } else if starts("BUG: ") {
        Kind::OtherBug
    } else if starts("BUG ") && (l.contains("(Tainted") || l.contains("(Not tainted)")) {
        Kind::Slab
    } else if starts("Kernel panic - not syncing") {
        Kind::Panic
    } else {
        return None;
    })
}

/// The line without printk's time stamp ("[   12.345678] ").
fn strip_stamp(line: &str) -> &str {
    let t = line.trim_end_matches(['\r', '\n']);
    match t.strip_prefix('[').and_then(|r| r.split_once("] ")) {
        Some((stamp, rest)) if stamp.trim().bytes().all(|b| b.is_ascii_digit() || b == b'.') => rest,
        _ => t,
    }
}

/// Finds reports in console output fed to it in pieces of any size.
#[derive(Debug, Default)]
pub struct Scanner {
    partial: Vec<u8>,
    open: Option<Report>,
    done: Vec<Report>,
    /// A report has been seen on this console (a later panic is its consequence).
    seen: bool,
}

impl Scanner {
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                let line = String::from_utf8_lossy(&self.partial).into_owned();
                self.partial.clear();
                self.line(strip_stamp(&line));
            } else if self.partial.len() < MAX_LINE {
                self.partial.push(b);
            }
        }
    }

    fn line(&mut self, line: &str) {
        let kind = classify(line);
        match (kind, &mut self.open) {
            // The die header ("Oops: 0000 [#1] ...") follows the fault's or BUG's own first line: one report.
            (Some(Kind::Oops), Some(open)) if line.trim_start().starts_with("Oops: ") => {
                push_bounded(&mut open.text, line);
            }
            // A panic is the consequence of the report before it, not a defect of its own.
            (Some(Kind::Panic), Some(open)) => {
                push_bounded(&mut open.text, line);
                self.close();
            }
            (Some(Kind::Panic), None) if self.seen => {}
            (Some(kind), _) => {
                self.close();
                self.seen = true;
                self.open = Some(Report { kind, title: line.trim().to_string(), text: vec![line.to_string()] });
                if kind == Kind::Panic {
                    self.close();
                }
            }
            (None, Some(open)) => {
                push_bounded(&mut open.text, line);
                // "---[ end trace ... ]---" ends a WARN's or an oops' report (lib/bug.c, print_oops_end_marker).
                if line.starts_with("---[ end trace") {
                    self.close();
                }
            }
            (None, None) => {}
        }
    }

    fn close(&mut self) {
        if let Some(r) = self.open.take() {
            self.done.push(r);
        }
    }

    /// The reports completed so far, taken; [`Scanner::flush`] first closes an open one (the console ended).
    pub fn take(&mut self) -> Vec<Report> {
        std::mem::take(&mut self.done)
    }

    /// Ends the open report, if any (the guest is gone, so nothing more comes).
    pub fn flush(&mut self) {
        if !self.partial.is_empty() {
            let line = String::from_utf8_lossy(&self.partial).into_owned();
            self.partial.clear();
            self.line(strip_stamp(&line));
        }
        self.close();
    }

    /// Whether a report has started and not ended yet.
    pub fn reporting(&self) -> bool {
        self.open.is_some()
    }
}

fn push_bounded(text: &mut Vec<String>, line: &str) {
    if text.len() < REPORT_LINES {
        text.push(line.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// First lines as the kernel prints them (the format strings cited in [`Kind`]).
    #[test]
    fn each_detector_first_line_is_classified() {
        let table: &[(&str, Option<Kind>)] = &[
            ("WARNING: CPU: 1 PID: 0 at drivers/infiniband/hw/hfi1/verbs.c:123 hfi1_cov_plant+0x2a/0x40 [hfi1]", Some(Kind::Warn)),
            ("BUG: KFENCE: out-of-bounds read in hfi1_rc_rcv+0x1c/0x900 [hfi1]", Some(Kind::Kfence)),
            ("BUG: KFENCE: use-after-free read in rvt_qp_release+0x10/0x80 [rdmavt]", Some(Kind::Kfence)),
            ("watchdog: BUG: soft lockup - CPU#0 stuck for 26s! [kworker/0:1:45]", Some(Kind::SoftLockup)),
            ("INFO: task kworker/1:2:77 blocked for more than 120 seconds.", Some(Kind::HungTask)),
            ("rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:", Some(Kind::RcuStall)),
            ("kernel BUG at lib/list_debug.c:59!", Some(Kind::Bug)),
            ("list_del corruption, ffff888003a0b000->next is LIST_POISON1 (dead000000000100)", Some(Kind::Bug)),
            ("BUG: unable to handle page fault for address: ffffc90000a3f000", Some(Kind::Oops)),
            ("BUG: kernel NULL pointer dereference, address: 0000000000000008", Some(Kind::Oops)),
            ("Oops: general protection fault, probably for non-canonical address 0xdead000000000100: 0000 [#1] PREEMPT SMP NOPTI", Some(Kind::Oops)),
            ("BUG: scheduling while atomic: swapper/0/0/0x00000100", Some(Kind::OtherBug)),
            ("BUG kmalloc-64 (Tainted: G           OE     ): Right Redzone overwritten", Some(Kind::Slab)),
            ("Kernel panic - not syncing: kernel: panic_on_warn set ...", Some(Kind::Panic)),
            ("hfi1 0000:00:03.0: hfi1_0: 8051 firmware version 1.27", None),
            ("BUGS are everywhere", None),
        ];
        for (line, want) in table {
            assert_eq!(classify(line), *want, "{line}");
        }
    }

    #[test]
    fn a_warn_report_runs_to_its_end_marker_and_the_panic_after_it_is_not_a_finding() {
        let console = "[   40.100000] hfi1_cov: planted defect hit\r\n\
            [   40.100100] ------------[ cut here ]------------\r\n\
            [   40.100200] WARNING: CPU: 0 PID: 12 at /build/hfi1/hfi1_cov.c:210 hfi1_cov_plant+0x55/0x60 [hfi1]\r\n\
            [   40.100300] Modules linked in: hfi1(OE) rdmavt ib_core\r\n\
            [   40.100400] Call Trace:\r\n\
            [   40.100500]  hfi1_ib_rcv+0x20/0x90 [hfi1]\r\n\
            [   40.100600] ---[ end trace 0000000000000000 ]---\r\n\
            [   40.100700] Kernel panic - not syncing: kernel: panic_on_warn set ...\r\n";
        let mut s = Scanner::default();
        // Fed in awkward pieces: a report may arrive split anywhere.
        for chunk in console.as_bytes().chunks(7) {
            s.feed(chunk);
        }
        s.flush();
        let reports = s.take();
        assert_eq!(reports.len(), 1, "{reports:#?}");
        assert_eq!(reports[0].kind, Kind::Warn);
        assert!(reports[0].title.contains("hfi1_cov_plant"));
        assert_eq!(reports[0].text.len(), 5);
    }

    /// As arch/x86/mm/fault.c and dumpstack.c print a fault in kernel mode: the fault's line, the die header
    /// ("Oops: ..."), the registers, the trace, the end marker, and the panic after it.
    #[test]
    fn an_oops_with_its_die_header_trace_and_panic_is_one_report() {
        let console = "BUG: kernel NULL pointer dereference, address: 0000000000000001\n\
            #PF: supervisor read access in kernel mode\n\
            Oops: Oops: 0000 [#1] PREEMPT SMP NOPTI\n\
            RIP: 0010:hfi1_ud_rcv+0x779/0xd20 [hfi1]\n\
            Call Trace:\n\
            ---[ end trace 0000000000000000 ]---\n\
            Kernel panic - not syncing: Fatal exception in interrupt\n";
        let mut s = Scanner::default();
        s.feed(console.as_bytes());
        s.flush();
        let reports = s.take();
        assert_eq!(reports.len(), 1, "{reports:#?}");
        assert_eq!(reports[0].kind, Kind::Oops);
        assert_eq!(reports[0].text.len(), 6);
        assert_eq!(reports[0].rip_function(), Some("hfi1_ud_rcv"));
        assert!(reports[0].signature().ends_with("@ hfi1_ud_rcv"), "{}", reports[0].signature());
        assert!(!s.reporting());
    }

    #[test]
    fn a_panic_alone_is_a_finding() {
        let mut s = Scanner::default();
        s.feed(b"Kernel panic - not syncing: hung_task: blocked tasks\n");
        assert_eq!(s.take().iter().map(|r| r.kind).collect::<Vec<_>>(), [Kind::Panic]);
    }

    #[test]
    fn the_same_defect_twice_has_one_signature() {
        let a = Report {
            kind: Kind::Warn,
            title: "WARNING: CPU: 1 PID: 402 at drivers/x.c:12 f+0x2a/0x40 [hfi1]".into(),
            text: vec![],
        };
        let b = Report { title: "WARNING: CPU: 0 PID: 7 at drivers/x.c:12 f+0x2a/0x40 [hfi1]".into(), ..a.clone() };
        let c = Report { title: "WARNING: CPU: 0 PID: 7 at drivers/y.c:12 g+0x2a/0x40 [hfi1]".into(), ..a.clone() };
        assert_eq!(a.signature(), b.signature());
        assert_ne!(a.signature(), c.signature());
        let oops = |addr: &str| Report {
            kind: Kind::Oops,
            title: format!("BUG: unable to handle page fault for address: {addr}"),
            text: vec![],
        };
        assert_eq!(oops("ffffc90000a3f000").signature(), oops("ffffc90000b41000").signature());
        assert!(a.signature().contains("hfi1"), "{}", a.signature());
    }

    #[test]
    fn a_console_line_longer_than_the_bound_is_cut_not_kept_whole() {
        let mut s = Scanner::default();
        let long = format!("WARNING: CPU: 0 PID: 1 at {}\n", "a".repeat(10 * MAX_LINE));
        s.feed(long.as_bytes());
        s.flush();
        let r = s.take();
        assert_eq!(r.len(), 1);
        assert!(r[0].title.len() <= MAX_LINE);
    }
}
