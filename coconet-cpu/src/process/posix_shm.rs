//! Memory shared by processes on one Linux host without MPI: each process creates a
//! POSIX shared-memory object of its part (`shm_open`, in `/dev/shm`), every process
//! maps every part, and each creator removes its object's name once all have mapped
//! it (the memory lives on until the last mapping goes). The processes agree through
//! the transport on a name no other job uses and on every step's outcome, so all of
//! them share, or none does.

use super::transport::all_gather_u64;
use super::transport::link::{Link, PAGE, Shared};
use coconet_plan::RuntimeError;
use std::ffi::CString;

/// One part mapped in this process.
struct Part {
    at: *mut u8,
    len: usize,
}

impl Drop for Part {
    fn drop(&mut self) {
        // SAFETY: `at..at + len` is a mapping this part made and nothing else unmaps.
        unsafe { libc::munmap(self.at.cast(), self.len) };
    }
}

/// Every process's part, mapped here.
struct Mapping(Vec<Part>);

// SAFETY: the mappings are valid in every thread of the process.
unsafe impl Send for Mapping {}

impl Shared for Mapping {
    fn base(&self, rank: usize) -> *mut u8 {
        self.0[rank].at
    }
}

/// The object's name for rank `r` of the job `token` names.
fn name(token: &[u64], r: usize) -> CString {
    CString::new(format!("/coconet-{:x}-{:x}-{r}", token[0], token[1]))
        .expect("no NUL in a formatted name")
}

/// Maps `len` bytes of the object `name`, creating it first if `create`.
fn map(name: &CString, len: usize, create: bool) -> Option<Part> {
    let flags = match create {
        true => libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
        false => libc::O_RDWR,
    };
    // SAFETY: a valid C string; the descriptor is closed below (the mapping keeps the
    // object).
    let fd = unsafe { libc::shm_open(name.as_ptr(), flags, 0o600) };
    if fd < 0 {
        return None;
    }
    let size = libc::off_t::try_from(len).ok();
    // The creator reserves the memory now (`posix_fallocate`: a full /dev/shm is then
    // an error here, not a SIGBUS when a page is first touched).
    // SAFETY: `fd` is the object just opened; a mapping of `len` bytes of it, shared.
    let at = unsafe {
        match size {
            Some(size)
                if !create
                    || (libc::ftruncate(fd, size) == 0
                        && libc::posix_fallocate(fd, 0, size) == 0) =>
            {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            }
            _ => libc::MAP_FAILED,
        }
    };
    // SAFETY: the descriptor is ours.
    unsafe { libc::close(fd) };
    (at != libc::MAP_FAILED).then(|| Part { at: at.cast(), len })
}

/// Memory shared by every process of the job, `bytes` of it this process's part, or
/// `None` (on every process alike) where some process could not create or map a part.
/// Every process calls it.
pub(super) fn share(
    link: &dyn Link,
    bytes: usize,
) -> Result<Option<Box<dyn Shared>>, RuntimeError> {
    let (rank, size) = (link.rank(), link.size());
    let bytes = bytes.max(1).next_multiple_of(PAGE);
    // Rank 0's process id and clock name this job's objects.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let token = all_gather_u64(link, &[u64::from(std::process::id()), nanos])?;
    let mine_name = name(&token, rank);
    let mine = map(&mine_name, bytes, true);
    let created = mine.is_some();
    let made = all_gather_u64(link, &[u64::from(mine.is_some()), bytes as u64]);
    let opened = made.as_ref().ok().map(|made| {
        let all_made = made.chunks(2).all(|m| m[0] == 1);
        let mut parts = Vec::with_capacity(size);
        let mut mine = mine;
        for (r, m) in made.chunks(2).enumerate() {
            match r == rank {
                true => parts.push(mine.take()),
                false => parts.push(
                    all_made
                        .then(|| map(&name(&token, r), m[1] as usize, false))
                        .flatten(),
                ),
            }
        }
        parts
    });
    // Every process has opened every part it will (or given up): the names can go.
    let done = opened
        .as_ref()
        .map(|parts| all_gather_u64(link, &[u64::from(parts.iter().all(Option::is_some))]));
    if created {
        // SAFETY: a valid C string; removing the name this process created.
        unsafe { libc::shm_unlink(mine_name.as_ptr()) };
    }
    let (Some(parts), Some(done)) = (opened, done) else {
        return made.map(|_| None);
    };
    if done?.contains(&0) {
        return Ok(None);
    }
    Ok(Some(Box::new(Mapping(
        parts.into_iter().flatten().collect(),
    ))))
}
