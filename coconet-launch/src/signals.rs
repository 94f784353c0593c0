//! The launcher's hold on its ranks' processes: each rank runs in a process group of its
//! own (so a rank that is a wrapper script is stopped with everything it started) and
//! dies with the launcher (Linux's parent-death signal); signals sent to the launcher
//! (SIGTERM, SIGINT, SIGHUP) are noted and forwarded; ranks are stopped with SIGTERM and
//! a grace period before SIGKILL (a rank writing a checkpoint can finish it).

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

/// The last forwarded signal received (0: none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// The signals the launcher forwards to its ranks.
const FORWARDED: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

extern "C" fn note(signal: libc::c_int) {
    // An atomic store is async-signal-safe.
    RECEIVED.store(signal, Ordering::Relaxed);
}

/// Forwarded signals are noted (not acted on) while this lives; the previous handlers
/// come back when it is dropped.
pub(crate) struct Noted {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl Noted {
    /// Notes SIGTERM, SIGINT and SIGHUP from now on.
    pub fn install() -> Noted {
        RECEIVED.store(0, Ordering::Relaxed);
        let mut previous = Vec::new();
        for signal in FORWARDED {
            // SAFETY: a zeroed sigaction with a handler that only stores an atomic, and
            // an empty mask, is a valid disposition; the old one is kept to restore it.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = note as *const () as libc::sighandler_t;
                libc::sigemptyset(&mut action.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(signal, &action, &mut old) == 0 {
                    previous.push((signal, old));
                }
            }
        }
        Noted { previous }
    }

    /// The signal received since [`Noted::install`], if any.
    pub fn received(&self) -> Option<i32> {
        match RECEIVED.load(Ordering::Relaxed) {
            0 => None,
            s => Some(s),
        }
    }
}

impl Drop for Noted {
    fn drop(&mut self) {
        for (signal, old) in &self.previous {
            // SAFETY: restores the disposition `sigaction` returned.
            unsafe {
                libc::sigaction(*signal, old, std::ptr::null_mut());
            }
        }
    }
}

/// Starts the rank in a process group of its own, killed (SIGKILL) if the launcher dies.
pub(crate) fn own_group_dying_with_parent(cmd: &mut Command) {
    cmd.process_group(0);
    // SAFETY: between fork and exec only async-signal-safe calls are made (`prctl`,
    // `getppid`); nothing allocates.
    let launcher = std::process::id() as libc::pid_t;
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The launcher died before the signal was armed.
            if libc::getppid() != launcher {
                return Err(io::Error::other("the launcher exited"));
            }
            Ok(())
        });
    }
}

/// Sends `signal` to the process group led by `pid` (a rank and whatever it started).
pub(crate) fn signal_group(pid: u32, signal: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill has no memory effects; a group that is gone is ESRCH, ignored.
        unsafe {
            libc::kill(-pid, signal);
        }
    }
}
