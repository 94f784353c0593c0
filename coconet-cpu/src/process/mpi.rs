//! MPI as a [`Transport`] (cargo feature `mpi`): an Open MPI communicator, one rank per
//! process. Collectives are MPI's non-blocking variable-count ones on bytes.
//!
//! Every wait has a deadline, as on rank threads: a collective that does not complete
//! in time (a peer stuck, or running another plan) aborts the whole MPI job with the
//! rank, the step and the time waited — MPI cannot cancel a collective in flight, and
//! its buffers stay in use, so returning an error would not be safe.

use super::transport::Transport;
use super::transport::link::{self, Link, PAGE};
use coconet_plan::RuntimeError;
use mpi::Count;
use mpi::datatype::{
    AsDatatype, Collection, Equivalence, Partitioned, PartitionedBuffer, PartitionedBufferMut,
    Pointer, PointerMut,
};
use mpi::raw::AsRaw;
use mpi::request::{Request, StaticScope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::cell::RefCell;
use std::ffi::c_void;
use std::time::{Duration, Instant};

/// An MPI communicator as a job's transport, with the deadline of its waits.
pub struct Mpi {
    world: SimpleCommunicator,
    timeout: Duration,
    /// The step being run (for the message of a missed deadline).
    at: RefCell<String>,
    /// Whether jobs may put their buffers in a shared-memory window.
    share: bool,
}

impl From<SimpleCommunicator> for Mpi {
    /// The communicator with the rank threads' default deadline (60 s).
    fn from(world: SimpleCommunicator) -> Mpi {
        Mpi {
            world,
            timeout: super::tcp::DEFAULT_TIMEOUT,
            at: RefCell::new(String::new()),
            share: true,
        }
    }
}

impl Mpi {
    /// The communicator, for jobs that move every byte in MPI messages even where their
    /// processes could share memory (by default a job on one machine puts its buffers
    /// in an MPI-3 shared-memory window).
    pub fn without_shared_memory(mut self) -> Mpi {
        self.share = false;
        self
    }

    /// Waits for `req` until the deadline; past it, aborts the job saying why.
    fn wait(&self, mut req: Request<'static, Parts, StaticScope>) {
        let start = Instant::now();
        loop {
            match req.test() {
                Ok(_) => return,
                Err(r) => req = r,
            }
            if start.elapsed() >= self.timeout {
                eprintln!(
                    "coconet: rank {} waited {:.1} s at `{}` for its peers (stuck, gone, or \
                     running another plan); aborting the MPI job",
                    Link::rank(self),
                    self.timeout.as_secs_f64(),
                    self.at.borrow()
                );
                self.world.abort(1)
            }
            std::thread::yield_now();
        }
    }
}

impl Transport for Mpi {}

impl Link for Mpi {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn enter(&self, at: &str) {
        let mut s = self.at.borrow_mut();
        s.clear();
        s.push_str(at);
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    /// MPI counts and displacements are `i32`.
    fn max_message(&self) -> usize {
        Count::MAX as usize
    }

    unsafe fn post_all_to_all(
        &self,
        send: link::Parts,
        recv: link::Parts,
    ) -> Box<dyn link::Flight + '_> {
        let (send, recv) = (Parts::from(send), Parts::from(recv));
        let (send, recv) = (Box::into_raw(Box::new(send)), Box::into_raw(Box::new(recv)));
        // SAFETY: the descriptors live until `Flight::drop` has waited for the request
        // (the 'static lifetimes are never relied on past that point); the bytes are
        // the caller's contract.
        let req = unsafe {
            self.world
                .immediate_all_to_all_varcount_into(StaticScope, &*send, &mut *recv)
        };
        Box::new(Flight {
            mpi: self,
            req: Some(req),
            send,
            recv,
        })
    }

    unsafe fn post_all_gather(
        &self,
        send: link::Bytes,
        recv: link::Parts,
    ) -> Box<dyn link::Flight + '_> {
        let send = Bytes {
            ptr: send.ptr,
            len: send.len as Count,
        };
        let recv = Parts::from(recv);
        let (send, recv) = (Box::into_raw(Box::new(send)), Box::into_raw(Box::new(recv)));
        // SAFETY: as in `post_all_to_all`.
        let req = unsafe {
            self.world
                .immediate_all_gather_varcount_into(StaticScope, &*send, &mut *recv)
        };
        Box::new(Flight {
            mpi: self,
            req: Some(req),
            send,
            recv,
        })
    }

    fn may_share(&self) -> bool {
        self.share
    }

    /// An MPI-3 shared-memory window over the processes, when every process of the job
    /// is on this machine (a communicator split by shared memory holds them all).
    fn share(&self, bytes: usize) -> Result<Option<Box<dyn link::Shared>>, RuntimeError> {
        let node = self.world.split_shared(self.world.rank());
        if node.size() != self.world.size() {
            return Ok(None);
        }
        // Parts of whole pages: every part starts page-aligned in the (contiguous)
        // window.
        let bytes = bytes.max(1).next_multiple_of(PAGE);
        let size = mpi::ffi::MPI_Aint::try_from(bytes).map_err(|_| {
            RuntimeError::Plan(format!(
                "{bytes} bytes of shared memory is too much for MPI"
            ))
        })?;
        let mut base: *mut c_void = std::ptr::null_mut();
        // SAFETY: an uninitialised handle MPI writes, and the address of `base`, where
        // MPI writes this process's part (MPI_Win_allocate_shared's `baseptr` is a
        // pointer to a pointer). Every process of `node` makes this call.
        let mut win = unsafe { std::mem::zeroed::<mpi::ffi::MPI_Win>() };
        let code = unsafe {
            mpi::ffi::MPI_Win_allocate_shared(
                size,
                1,
                mpi::ffi::RSMPI_INFO_NULL,
                node.as_raw(),
                (&raw mut base).cast(),
                &mut win,
            )
        };
        if code != mpi::ffi::MPI_SUCCESS as i32 {
            // MPI's default error handler aborts the job first; in case it returns.
            return Err(RuntimeError::Plan(format!(
                "MPI could not allocate {bytes} bytes of shared memory (error {code})"
            )));
        }
        let bases = (0..node.size())
            .map(|r| {
                let (mut size, mut unit, mut at) = (0, 0, std::ptr::null_mut::<c_void>());
                // SAFETY: `win` is the window just allocated; MPI writes the three.
                unsafe {
                    mpi::ffi::MPI_Win_shared_query(
                        win,
                        r,
                        &mut size,
                        &mut unit,
                        (&raw mut at).cast(),
                    )
                };
                at.cast::<u8>()
            })
            .collect();
        Ok(Some(Box::new(Window {
            win,
            bases,
            _node: node,
        })))
    }

    /// MPI reports no failures: a failed peer aborts the job.
    fn failure(&self) -> Option<RuntimeError> {
        None
    }

    /// Peers wait for this rank in MPI calls that have no deadline: unwinding into
    /// `MPI_Finalize` would hang the whole job. Abort it, saying why.
    fn panicked(&self, message: &str) -> RuntimeError {
        eprintln!(
            "coconet: rank {} panicked during a run ({message}); aborting the MPI job",
            Link::rank(self)
        );
        self.world.abort(1)
    }
}

/// [`link::Parts`] with MPI's counts (in range: the executor checks every collective's
/// size against [`Link::max_message`] before posting it).
struct Parts {
    ptr: *mut u8,
    counts: Vec<Count>,
    displs: Vec<Count>,
}

impl From<link::Parts> for Parts {
    fn from(p: link::Parts) -> Parts {
        let counts = |v: Vec<usize>| v.into_iter().map(|c| c as Count).collect();
        Parts {
            ptr: p.ptr,
            counts: counts(p.counts),
            displs: counts(p.displs),
        }
    }
}

/// Contiguous bytes sent whole by a non-blocking all-gather.
struct Bytes {
    ptr: *const u8,
    len: Count,
}

// SAFETY: both describe `u8` data at `ptr`: MPI reads (or, for `Parts`, writes) there the
// byte counts they report, at their displacements; keeping those bytes valid is the
// poster's contract (see `Link::post_all_to_all`).
unsafe impl Pointer for Parts {
    fn pointer(&self) -> *const c_void {
        self.ptr.cast()
    }
}
// SAFETY: as above.
unsafe impl PointerMut for Parts {
    fn pointer_mut(&mut self) -> *mut c_void {
        self.ptr.cast()
    }
}
// SAFETY: as above.
unsafe impl AsDatatype for Parts {
    type Out = <u8 as Equivalence>::Out;
    fn as_datatype(&self) -> Self::Out {
        u8::equivalent_datatype()
    }
}
impl Partitioned for Parts {
    fn counts(&self) -> &[Count] {
        &self.counts
    }
    fn displs(&self) -> &[Count] {
        &self.displs
    }
}
impl PartitionedBuffer for Parts {}
impl PartitionedBufferMut for Parts {}
// SAFETY: as above.
unsafe impl Pointer for Bytes {
    fn pointer(&self) -> *const c_void {
        self.ptr.cast()
    }
}
// SAFETY: as above.
unsafe impl Collection for Bytes {
    fn count(&self) -> Count {
        self.len
    }
}
// SAFETY: as above.
unsafe impl AsDatatype for Bytes {
    type Out = <u8 as Equivalence>::Out;
    fn as_datatype(&self) -> Self::Out {
        u8::equivalent_datatype()
    }
}
// SAFETY: as above.
unsafe impl mpi::datatype::Buffer for Bytes {}

/// A posted non-blocking collective with its two descriptors, which stay put (boxed)
/// until it completes: dropping a flight waits for it, then frees them.
struct Flight<'a, S: 'static> {
    mpi: &'a Mpi,
    req: Option<Request<'static, Parts, StaticScope>>,
    send: *mut S,
    recv: *mut Parts,
}

impl<S> link::Flight for Flight<'_, S> {
    fn poll(&mut self) {
        if let Some(r) = self.req.take() {
            self.req = r.test().err();
        }
    }
}

impl<S> Drop for Flight<'_, S> {
    fn drop(&mut self) {
        if let Some(r) = self.req.take() {
            self.mpi.wait(r);
        }
        // SAFETY: both came from `Box::into_raw` at posting, and MPI is done with them.
        unsafe {
            drop(Box::from_raw(self.send));
            drop(Box::from_raw(self.recv));
        }
    }
}

/// An MPI-3 shared-memory window: every process's part, mapped in this process.
/// Freeing it is collective: every process of the job drops its job (and so its window)
/// in the same order, as it made them.
struct Window {
    win: mpi::ffi::MPI_Win,
    bases: Vec<*mut u8>,
    /// The processes sharing the window (freed after it).
    _node: SimpleCommunicator,
}

// SAFETY: the part addresses are valid in every thread of the process; the handle is
// used only to free the window, by whichever thread drops the job — which can move
// between threads only as far as its MPI communicator can.
unsafe impl Send for Window {}

impl link::Shared for Window {
    fn base(&self, rank: usize) -> *mut u8 {
        self.bases[rank]
    }

    fn released_together(&self) -> bool {
        true
    }

    /// `MPI_Win_free` would wait for the missing peer forever: abort the job instead,
    /// as an MPI wait past its deadline does.
    fn abandon(&self, why: &str) {
        eprintln!("coconet: {why}; aborting the MPI job");
        self._node.abort(1);
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: the window was allocated by `Mpi::share`, and every buffer placed in
        // it is dropped before it (the job drops its window last).
        unsafe { mpi::ffi::MPI_Win_free(&mut self.win) };
    }
}
