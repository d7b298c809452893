//! Scheduling policy of our own threads (the one `unsafe` block calls sched_setscheduler, which neither std
//! nor rustix wraps).

/// Puts the calling thread in `SCHED_IDLE` (no privilege needed: it only lowers the thread's claim).
pub fn set_idle_policy() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads one `sched_param` through the pointer, which points to a live local
    // for the whole call; pid 0 is the calling thread.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_policy_is_sched_idle_for_the_calling_thread_only() {
        fn policy() -> i32 {
            // Field 41 of stat, counted from after the command's closing parenthesis (field 2).
            let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
            stat.rsplit_once(')').unwrap().1.split_whitespace().nth(41 - 3).unwrap().parse().unwrap()
        }
        let before = policy();
        let in_thread = std::thread::spawn(|| {
            set_idle_policy().unwrap();
            policy()
        })
        .join()
        .unwrap();
        assert_eq!(in_thread, libc::SCHED_IDLE);
        assert_eq!(policy(), before, "the caller's policy is untouched");
    }
}
