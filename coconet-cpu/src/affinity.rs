//! Binding rank threads to CPUs, as MPI binds its ranks to cores by default.
//!
//! Left to itself, Linux may wake two computing rank threads on one core and leave them
//! there for milliseconds (measured on 2 cores: a pipeline step took 4.8 ms or 9 ms at
//! random, depending on where its two computing ranks woke up). A job binds its worker
//! threads to the CPUs the process may use, one each in turn, and the caller's thread
//! (rank 0) to its CPU for the length of each run. Successive jobs start
//! where the previous one ended, so jobs running side by side spread over the CPUs
//! instead of piling onto the first ones.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where the next job's CPU assignment starts.
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// The CPUs the process may use, as first read.
static PROCESS: OnceLock<Option<Vec<usize>>> = OnceLock::new();

/// The CPUs of the ranks of a new `ranks`-rank job: `cpus[r]` for rank r, or `None`
/// where binding is unavailable (one CPU, not Linux, or the process's CPU set cannot be
/// read).
pub(crate) fn assign(ranks: usize) -> Option<Vec<usize>> {
    let allowed = PROCESS.get_or_init(allowed).as_ref()?;
    if allowed.len() < 2 {
        return None;
    }
    let start = NEXT.fetch_add(ranks, Ordering::Relaxed) % allowed.len();
    Some(
        (0..ranks)
            .map(|r| allowed[(start + r) % allowed.len()])
            .collect(),
    )
}

/// Binds the calling thread to `cpu`. Best effort: a refusal (a CPU set changed since
/// [`assign`] read it) leaves the thread unbound, which is only slower.
pub(crate) fn bind(cpu: usize) {
    set(&[cpu]);
}

/// Runs `f` with the calling thread bound to `cpu`, then gives the thread back the
/// CPUs it had (also if `f` panics): rank 0 runs on the caller's thread, which belongs
/// to the user, so it is bound only for the run — and not at all where its CPUs cannot
/// be read or do not include `cpu` (the user placed it).
pub(crate) fn bound_while<R>(cpu: usize, f: impl FnOnce() -> R) -> R {
    struct Restore(Vec<usize>);
    impl Drop for Restore {
        fn drop(&mut self) {
            set(&self.0);
        }
    }
    let _restore = match allowed() {
        Some(cpus) if cpus.contains(&cpu) => {
            bind(cpu);
            Some(Restore(cpus))
        }
        _ => None,
    };
    f()
}

/// Restricts the calling thread to `cpus` (those beyond the mask's size are skipped).
fn set(cpus: &[usize]) {
    #[cfg(target_os = "linux")]
    // SAFETY: `set` is a plain bit mask owned by this frame; `CPU_SET` is given only
    // CPUs below the mask's size (it indexes the mask's words), and
    // `sched_setaffinity` only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let size = 8 * std::mem::size_of::<libc::cpu_set_t>();
        for &cpu in cpus.iter().filter(|&&c| c < size) {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cpus;
}

/// The CPUs the calling thread may run on.
fn allowed() -> Option<Vec<usize>> {
    #[cfg(target_os = "linux")]
    // SAFETY: `set` is written by `sched_getaffinity` (size given) and only read after
    // it succeeded.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        let cpus = 8 * std::mem::size_of::<libc::cpu_set_t>();
        Some((0..cpus).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
    }
    #[cfg(not(target_os = "linux"))]
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranks of one job get distinct CPUs while there are enough, every CPU is one the
    /// process may use, and a bound thread runs only there.
    #[test]
    fn ranks_get_distinct_allowed_cpus() {
        let Some(allowed) = allowed() else { return };
        let Some(cpus) = assign(allowed.len()) else {
            assert!(allowed.len() < 2);
            return;
        };
        let mut distinct = cpus.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), allowed.len());
        assert!(cpus.iter().all(|c| allowed.contains(c)));
        let cpu = cpus[1];
        let bound = std::thread::spawn(move || {
            bind(cpu);
            allowed_now()
        })
        .join()
        .unwrap();
        assert_eq!(bound, vec![cpu]);
    }

    /// The caller's thread runs only on rank 0's CPU during a run and gets its own CPUs
    /// back after it, also when the run panics; a thread placed off that CPU is left
    /// alone.
    #[test]
    fn the_caller_is_bound_only_while_it_runs_rank_0() {
        let Some(before) = allowed().filter(|a| a.len() >= 2) else {
            return;
        };
        let cpu = before[1];
        std::thread::spawn(move || {
            let during = bound_while(cpu, allowed_now);
            assert_eq!(during, vec![cpu]);
            assert_eq!(allowed_now(), before);
            let panicked = std::panic::catch_unwind(|| bound_while(cpu, || panic!("rank 0")));
            assert!(panicked.is_err());
            assert_eq!(allowed_now(), before);
            // A thread the user placed elsewhere stays where it was placed.
            bind(before[0]);
            assert_eq!(bound_while(cpu, allowed_now), vec![before[0]]);
            assert_eq!(allowed_now(), vec![before[0]]);
        })
        .join()
        .unwrap();
    }

    fn allowed_now() -> Vec<usize> {
        allowed().unwrap_or_default()
    }
}
