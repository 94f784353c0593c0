//! The host emulator: generated CUDA code compiled as C++ (`COCONET_EMULATE`) into a
//! shared library and run block by block, thread by thread, on the CPU. Slow, but it
//! runs the very kernels a GPU would, with the executor a GPU would use, so every
//! generated kernel is checked against the reference interpreter on machines without a
//! GPU. Needs a C++ compiler (`$CXX`, else `c++`); compiled libraries are kept between
//! processes (`cache_dir`).

use crate::codegen::{CudaProgram, MatMul};
use crate::devices::{Device, KernelCall};
use crate::lent::Memory;
use coconet_core::DType;
use coconet_plan::RuntimeError;
use coconet_plan::host::memory::Buffer;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

type LaunchFn = unsafe extern "C" fn(*mut *mut c_void, u32, u32);

/// Generated kernels compiled for the host.
pub struct Emulator {
    _lib: Arc<libloading::Library>,
    launchers: Vec<LaunchFn>,
    /// Every buffer handed out, so addresses stay valid while the emulator lives (a
    /// buffer's elements are on the heap: moving the `Buffer` does not move them).
    owned: RefCell<Vec<Buffer>>,
    /// Kernel launches and device-to-device copies so far (what tests count).
    launches: AtomicUsize,
    copies: AtomicUsize,
    /// Graph replays so far.
    replays: AtomicUsize,
}

fn err(msg: String) -> RuntimeError {
    RuntimeError::Plan(format!("CUDA emulator: {msg}"))
}

/// The shared libraries compiled so far in this process, by hash of their source: each
/// program is compiled once per process.
fn loaded() -> &'static Mutex<HashMap<u64, Arc<libloading::Library>>> {
    static LOADED: OnceLock<Mutex<HashMap<u64, Arc<libloading::Library>>>> = OnceLock::new();
    LOADED.get_or_init(Default::default)
}

/// The compiler's flags: part of a library's cache key, like the compiler and the source.
const CXX_FLAGS: [&str; 6] = [
    "-std=c++17",
    "-O1",
    "-ffp-contract=off",
    "-shared",
    "-fPIC",
    "-w",
];

/// Where compiled libraries are kept between processes: `$COCONET_EMULATOR_CACHE`, else
/// `coconet-emulator-<uid>` in the temporary directory. Test suites run the same
/// programs in many processes (one per test binary), and compiling is most of an
/// emulated test's time. A directory another user owns or can write to is not used
/// (anyone could have put a library there): `None`, and every process compiles anew.
fn cache_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("COCONET_EMULATOR_CACHE") {
        Some(d) => PathBuf::from(d),
        // SAFETY: getuid has no preconditions and cannot fail.
        None => {
            std::env::temp_dir().join(format!("coconet-emulator-{}", unsafe { libc::getuid() }))
        }
    };
    private_dir(dir)
}

/// `dir`, created if missing, when it is a directory this user owns and only this user
/// can write to.
fn private_dir(dir: PathBuf) -> Option<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir);
    let meta = std::fs::metadata(&dir).ok()?;
    // SAFETY: as above.
    let ours = meta.uid() == unsafe { libc::getuid() };
    (meta.is_dir() && ours && meta.mode() & 0o022 == 0).then_some(dir)
}

/// `source` compiled with the host C++ compiler into a shared library and loaded: from
/// this process's libraries when it was loaded before, else from the cache directory
/// when a process compiled the very same source with the same compiler and flags.
fn library(source: &str) -> Result<Arc<libloading::Library>, RuntimeError> {
    use std::hash::{Hash, Hasher};
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (source, &cxx, CXX_FLAGS).hash(&mut h);
    let hash = h.finish();
    if let Some(l) = loaded().lock().expect("emulator cache").get(&hash) {
        return Ok(l.clone());
    }
    let l = Arc::new(load(source, &cxx, hash, cache_dir().as_deref())?);
    Ok(loaded()
        .lock()
        .expect("emulator cache")
        .entry(hash)
        .or_insert(l)
        .clone())
}

/// The library compiled from `source` (`hash` its key), loaded: the one in `cache` where
/// a process compiled the same source before, else compiled now. A cached library that
/// does not load (removed or cut short by a cleaner of temporary files) is compiled
/// again rather than failing the run.
fn load(
    source: &str,
    cxx: &str,
    hash: u64,
    cache: Option<&Path>,
) -> Result<libloading::Library, RuntimeError> {
    if let Some(dir) = cache {
        // The source beside the library is renamed into place after it: where it is
        // present and equal (no hash collision), the library is complete.
        let src = dir.join(format!("k{hash:016x}.cpp"));
        if std::fs::read(&src).is_ok_and(|s| s == source.as_bytes()) {
            // SAFETY: compiled from generated code (this source, compiler and flags) by
            // a process of this user's, in a directory only this user can write;
            // loading it runs no initialisers beyond the C++ runtime's.
            if let Ok(l) = unsafe { libloading::Library::new(dir.join(format!("k{hash:016x}.so"))) }
            {
                // Used now: what `prune` keeps.
                let _ = std::fs::File::options()
                    .append(true)
                    .open(&src)
                    .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                return Ok(l);
            }
        }
    }
    let compiled = compile(source, cxx, hash, cache)?;
    // SAFETY: as above, compiled by this process.
    let l = unsafe { libloading::Library::new(&compiled.library) }
        .map_err(|e| err(format!("loading {}: {e}", compiled.library.display())));
    if let Some(scratch) = compiled.scratch {
        // Loaded (or not): the files are no longer needed (a loaded library stays mapped).
        let _ = std::fs::remove_dir_all(scratch);
    }
    if let Some(dir) = cache {
        prune(dir, std::time::SystemTime::now());
    }
    l
}

/// How long a cached library nobody loads is kept.
const KEPT_UNUSED: std::time::Duration = std::time::Duration::from_secs(14 * 24 * 3600);

/// How long a compilation's own directory may stay behind in the cache (a process
/// killed while compiling leaves one).
const KEPT_ABANDONED: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Removes from `cache` the libraries no process has loaded for [`KEPT_UNUSED`] (their
/// source's time, renewed at each load) and compilations' directories older than
/// [`KEPT_ABANDONED`], so the cache does not grow without end. The source goes first:
/// a reader that still finds it and then misses the library compiles it again.
fn prune(cache: &Path, now: std::time::SystemTime) {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return;
    };
    let age = |path: &Path| {
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok()?;
        now.duration_since(modified).ok()
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("coconet-emu-") {
            if age(&path).is_some_and(|a| a > KEPT_ABANDONED) {
                let _ = std::fs::remove_dir_all(&path);
            }
        } else if name.starts_with('k') && age(&path).is_some_and(|a| a > KEPT_UNUSED) {
            if name.ends_with(".cpp") {
                let _ = std::fs::remove_file(&path);
                let _ = std::fs::remove_file(path.with_extension("so"));
            } else if name.ends_with(".so") && !path.with_extension("cpp").exists() {
                // A library whose source never made it into place.
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// A compiled library, and the directory to remove once it is loaded (none where it was
/// kept in the cache).
struct Compiled {
    library: PathBuf,
    scratch: Option<PathBuf>,
}

/// Compiles `source`: into `cache` when there is one (moved there once complete), else
/// (or where it cannot be moved there) in a directory of its own.
fn compile(
    source: &str,
    cxx: &str,
    hash: u64,
    cache: Option<&Path>,
) -> Result<Compiled, RuntimeError> {
    // A directory of its own per compilation (inside the cache, so the moves below stay
    // on one file system): threads and processes compiling the same source at once do
    // not write each other's files.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "coconet-emu-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let dir = cache
        .map(|c| c.join(&name))
        .unwrap_or_else(|| std::env::temp_dir().join(&name));
    std::fs::create_dir_all(&dir).map_err(|e| err(format!("{}: {e}", dir.display())))?;
    let src = dir.join(format!("k{hash:016x}.cpp"));
    let lib = dir.join(format!("k{hash:016x}.so"));
    std::fs::write(&src, source).map_err(|e| err(format!("{}: {e}", src.display())))?;
    let out = std::process::Command::new(cxx)
        .args(CXX_FLAGS)
        .arg("-o")
        .arg(&lib)
        .arg(&src)
        .output()
        .map_err(|e| err(format!("cannot run the C++ compiler `{cxx}`: {e}")))?;
    if !out.status.success() {
        // The source stays for inspection.
        return Err(err(format!(
            "`{cxx}` rejected the generated source {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let uncached = Compiled {
        library: lib.clone(),
        scratch: Some(dir.clone()),
    };
    let Some(cache) = cache else {
        return Ok(uncached);
    };
    // Library first, then its source: a reader that finds the source finds the library
    // complete. A rename replaces what a concurrent compilation put there (the same
    // bytes); a process that has it loaded keeps its mapping. Where the library cannot
    // be kept (a full disk), it is loaded from where it was compiled.
    let kept = cache.join(format!("k{hash:016x}.so"));
    if std::fs::rename(&lib, &kept).is_err() {
        return Ok(uncached);
    }
    let _ = std::fs::rename(&src, cache.join(format!("k{hash:016x}.cpp")));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Compiled {
        library: kept,
        scratch: None,
    })
}

impl Emulator {
    /// Compiles `program` with the host C++ compiler (once per process) and loads it.
    pub fn new(program: &CudaProgram) -> Result<Emulator, RuntimeError> {
        let l = library(&program.emulator_source())?;
        let launchers = program
            .kernels
            .iter()
            .map(|k| {
                let name = format!("{}_launch", k.name);
                // SAFETY: every kernel has a launch wrapper of exactly this signature.
                unsafe { l.get::<LaunchFn>(name.as_bytes()) }
                    .map(|f| *f)
                    .map_err(|e| err(format!("{name}: {e}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Emulator {
            _lib: l,
            launchers,
            owned: RefCell::new(Vec::new()),
            launches: AtomicUsize::new(0),
            replays: AtomicUsize::new(0),
            copies: AtomicUsize::new(0),
        })
    }

    /// Kernel launches so far: what a run costs in launches (a parameter list lent as
    /// pieces is stepped in as many as one contiguous tensor).
    pub fn launches(&self) -> usize {
        self.launches.load(Ordering::Relaxed)
    }

    /// Device-to-device copies so far (pieces gathered into a job's buffer, reads into
    /// device memory).
    pub fn copies(&self) -> usize {
        self.copies.load(Ordering::Relaxed)
    }

    /// Graph replays so far (each runs its launches without counting them in
    /// [`Emulator::launches`]: one call, as on a GPU).
    pub fn replays(&self) -> usize {
        self.replays.load(Ordering::Relaxed)
    }

    /// Runs `call`'s kernel on the host, block by block.
    fn run(&self, call: &KernelCall) {
        let mut args = call.argument_pointers();
        // SAFETY: the arguments match the kernel's parameters (built by the executor
        // from the same generated description) and point at live host memory.
        unsafe { (self.launchers[call.kernel])(args.as_mut_ptr(), call.grid, call.block) };
    }

    fn keep(&self, b: Buffer) -> EmuBuffer {
        let mut b = b;
        // SAFETY: `owned` keeps the buffer (its heap memory does not move with it) for
        // the emulator's life; the view is read here only.
        let raw = unsafe { b.raw() };
        let len = raw.len;
        let dtype = raw.dtype;
        let addr = raw.addr() as u64;
        self.owned.borrow_mut().push(b);
        EmuBuffer { addr, len, dtype }
    }
}

/// A buffer of the emulator (host memory).
#[derive(Debug, Clone, Copy)]
pub struct EmuBuffer {
    addr: u64,
    len: usize,
    dtype: DType,
}

impl EmuBuffer {
    fn raw(&self) -> coconet_plan::host::memory::Raw {
        // SAFETY: the emulator that made this buffer owns its memory (`keep`) until it is
        // dropped, and executors use a buffer only with its own emulator, one step at a
        // time (as a device's stream orders its kernels).
        unsafe {
            coconet_plan::host::memory::Raw::from_addr(self.addr as *mut u8, self.len, self.dtype)
        }
    }
}

impl Device for Emulator {
    type Buffer = EmuBuffer;

    fn upload(&self, data: &coconet_core::HostData) -> Result<EmuBuffer, RuntimeError> {
        let buffer = Buffer::try_from_host(data).ok_or_else(|| {
            RuntimeError::Device(format!(
                "out of host memory for a {}-byte emulated device buffer",
                data.as_bytes().len()
            ))
        })?;
        Ok(self.keep(buffer))
    }

    fn write(&self, b: &EmuBuffer, bytes: &[u8]) -> Result<(), RuntimeError> {
        if bytes.len() != b.len * b.dtype.size_bytes() {
            return Err(err(format!(
                "write of {} bytes into a {}-byte buffer",
                bytes.len(),
                b.len * b.dtype.size_bytes()
            )));
        }
        // SAFETY: the buffer is host memory of exactly `bytes.len()` bytes, kept alive by
        // the emulator; nothing runs concurrently (work is synchronous).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), b.addr as *mut u8, bytes.len()) };
        Ok(())
    }

    fn zeros(&self, dtype: DType, n: usize) -> Result<EmuBuffer, RuntimeError> {
        Ok(self.keep(Buffer::zeros(dtype, n)))
    }

    fn addresses(&self, addrs: &[u64]) -> Result<EmuBuffer, RuntimeError> {
        let mut b = Buffer::zeros(DType::I64, addrs.len());
        // SAFETY: `b` outlives the view, used by this thread only.
        let raw = unsafe { b.raw() };
        for (i, a) in addrs.iter().enumerate() {
            // SAFETY: in bounds of a buffer of `addrs.len()` 8-byte elements.
            unsafe { (raw.addr() as *mut u64).add(i).write(*a) };
        }
        Ok(self.keep(b))
    }

    fn address(&self, b: &EmuBuffer) -> u64 {
        b.addr
    }

    fn download(&self, b: &EmuBuffer, _dtype: DType, n: usize) -> Result<Vec<f64>, RuntimeError> {
        let mut out = vec![0.0; n.min(b.len)];
        b.raw().load(0, &mut out);
        Ok(out)
    }

    fn launch(&self, call: &KernelCall) -> Result<(), RuntimeError> {
        self.launches.fetch_add(1, Ordering::Relaxed);
        self.run(call);
        Ok(())
    }

    type Graph = Vec<KernelCall>;

    fn graph(&self, calls: &[KernelCall]) -> Result<Vec<KernelCall>, RuntimeError> {
        Ok(calls.to_vec())
    }

    fn update_graph(
        &self,
        graph: &mut Vec<KernelCall>,
        i: usize,
        call: &KernelCall,
    ) -> Result<(), RuntimeError> {
        match graph.get_mut(i) {
            Some(held) if held.kernel == call.kernel => {
                *held = call.clone();
                Ok(())
            }
            _ => Err(err(format!(
                "a graph of {} launches has no launch {i} of kernel {}",
                graph.len(),
                call.kernel
            ))),
        }
    }

    fn replay(&self, graph: &Vec<KernelCall>) -> Result<(), RuntimeError> {
        self.replays.fetch_add(1, Ordering::Relaxed);
        for call in graph {
            self.run(call);
        }
        Ok(())
    }

    fn gemm(
        &self,
        mm: &MatMul,
        a: u64,
        b: u64,
        out: u64,
        rows: std::ops::Range<usize>,
    ) -> Result<(), RuntimeError> {
        let size = mm.dtype.size_bytes() as u64;
        let (m, k, n) = (rows.len(), mm.k, mm.n);
        use coconet_plan::host::memory::Raw;
        // SAFETY: as cuBLAS would be, the executor is handed addresses of this emulator's
        // buffers holding these extents; the views are used within this call.
        let (ra, rb, ro) = unsafe {
            (
                Raw::from_addr(
                    (a + (rows.start * k) as u64 * size) as *mut u8,
                    m * k,
                    mm.dtype,
                ),
                Raw::from_addr(b as *mut u8, k * n, mm.dtype),
                Raw::from_addr(
                    (out + (rows.start * n) as u64 * size) as *mut u8,
                    m * n,
                    mm.dtype,
                ),
            )
        };
        let (mut av, mut bv, mut ov) = (vec![0.0; m * k], vec![0.0; k * n], vec![0.0; m * n]);
        ra.load(0, &mut av);
        rb.load(0, &mut bv);
        coconet_plan::host::matmul::MatMul::new(mm.dtype, &av, &bv, k, n).rows(0..m, &mut ov);
        ro.store(0, &ov);
        Ok(())
    }

    fn wait_kernels(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn block_done(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn wait_block(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn transfers_wait_kernels(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn kernels_wait_transfers(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn synchronize(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    type Event = EmulatedEvent;

    fn memory(&self) -> Memory {
        Memory::Host
    }

    fn check_lent(&self, _address: u64, _bytes: usize) -> Result<(), String> {
        // Host memory carries no extent to look up; the contract covers it.
        Ok(())
    }

    fn record(&self) -> Result<EmulatedEvent, RuntimeError> {
        // Work runs as it is queued: everything queued so far is done.
        static RECORDED: AtomicUsize = AtomicUsize::new(0);
        Ok(EmulatedEvent(
            RECORDED.fetch_add(1, Ordering::Relaxed) as u64 + 1,
        ))
    }

    fn wait_event(&self, _event: &EmulatedEvent) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn wait_host(&self, _event: &EmulatedEvent) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<(), RuntimeError> {
        self.copies.fetch_add(1, Ordering::Relaxed);
        // SAFETY: both are host memory the executor checked to hold `bytes` bytes (its
        // own buffers, or lent memory under the lending contract).
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }

    fn read_bytes(&self, address: u64, out: &mut [u8]) -> Result<(), RuntimeError> {
        // SAFETY: as in `copy`.
        unsafe { std::ptr::copy(address as *const u8, out.as_mut_ptr(), out.len()) };
        Ok(())
    }
}

/// A point in an emulated device's work: the emulator runs work as it is queued, so every
/// event has completed when it is handed out. Numbered in the order recorded (in this
/// process), so tests can tell runs' events apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct EmulatedEvent(pub u64);

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_cache_others_can_write_is_not_used() {
        let root = std::env::temp_dir().join(format!("coconet-emu-test-{}", std::process::id()));
        let fresh = root.join("fresh");
        assert_eq!(private_dir(fresh.clone()), Some(fresh.clone()));
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "created private: {mode:o}");
        let shared = root.join("shared");
        std::fs::create_dir_all(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(private_dir(shared), None);
        let file = root.join("file");
        std::fs::write(&file, b"").unwrap();
        assert_eq!(private_dir(file), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// A library compiled into the cache is loaded from it; one removed from under the
    /// cache (a cleaner of temporary files) is compiled again, not a failed run.
    #[test]
    fn a_cached_library_removed_from_the_cache_is_compiled_again() {
        let cache = std::env::temp_dir().join(format!("coconet-emu-cache-{}", std::process::id()));
        let cache = private_dir(cache).expect("a private directory");
        let source = "extern \"C\" int seven() { return 7; }\n";
        let hash = 0x5e7e;
        let call = |l: &libloading::Library| {
            // SAFETY: `seven` is defined above with this signature.
            unsafe { (*l.get::<unsafe extern "C" fn() -> i32>(b"seven").unwrap())() }
        };
        let so = cache.join(format!("k{hash:016x}.so"));
        let first = load(source, "c++", hash, Some(&cache)).unwrap();
        assert_eq!(call(&first), 7);
        assert!(so.exists(), "kept in the cache");
        let again = load(source, "c++", hash, Some(&cache)).unwrap();
        assert_eq!(call(&again), 7);
        // Unloaded first: the dynamic loader would hand out a loaded library by its
        // path even with the file gone.
        drop((first, again));
        std::fs::remove_file(&so).unwrap();
        let rebuilt = load(source, "c++", hash, Some(&cache)).unwrap();
        assert_eq!(call(&rebuilt), 7);
        assert!(so.exists(), "compiled into the cache again");
        std::fs::remove_dir_all(&cache).unwrap();
    }

    /// Pruning removes libraries unused for two weeks and compilations abandoned for a
    /// day, and keeps the rest.
    #[test]
    fn the_cache_is_pruned_of_old_libraries_and_abandoned_compilations() {
        let cache = std::env::temp_dir().join(format!("coconet-emu-prune-{}", std::process::id()));
        let cache = private_dir(cache).expect("a private directory");
        for file in ["k01.cpp", "k01.so", "k02.cpp", "k02.so", "k03.so"] {
            std::fs::write(cache.join(file), b"").unwrap();
        }
        std::fs::create_dir_all(cache.join("coconet-emu-1-0")).unwrap();
        let day = std::time::Duration::from_secs(24 * 3600);
        let now = std::time::SystemTime::now();
        // Seen from 15 days on, everything there is old.
        prune(&cache, now + 15 * day);
        let left = |f: &str| cache.join(f).exists();
        assert!(!left("k01.cpp") && !left("k01.so") && !left("k03.so") && !left("coconet-emu-1-0"));
        // Seen from 2 days on, a library is kept and an abandoned compilation is not.
        for file in ["k01.cpp", "k01.so"] {
            std::fs::write(cache.join(file), b"").unwrap();
        }
        std::fs::create_dir_all(cache.join("coconet-emu-1-1")).unwrap();
        prune(&cache, now + 2 * day);
        assert!(left("k01.cpp") && left("k01.so") && !left("coconet-emu-1-1"));
        std::fs::remove_dir_all(&cache).unwrap();
    }
}
