//! The GPU device (cargo feature `cuda`): cudarc's driver API, NVRTC and cuBLAS.
//!
//! Kernels run on a communication stream, matmuls on a compute stream; events order the
//! two (a kernel step after a matmul waits for it, and each block of an overlapped matmul
//! releases the fused all-reduce of its rows while the next block computes). A third
//! stream carries NCCL transfers between ranks with separate memories, so a pipelined
//! exchange overlaps the kernels of the previous chunk.
//! NVRTC compiles each translation unit once per (source, architecture) in a process
//! (`--fmad=false`, so results round exactly as the CPU backend's do), to a CUBIN for the
//! device's own architecture: the driver loads machine code, so an NVRTC newer than the
//! driver works (PTX from it would be refused) and nothing is JIT-compiled.
//!
//! Not yet run on a GPU: this session's machines had none (see the issue note). The
//! same executor and kernels are exercised on the host [`Emulator`](crate::Emulator).

use crate::codegen::{CudaProgram, MatMul};
use crate::devices::gpu_graph::GpuGraph;
use crate::devices::{Device, KernelCall, libraries};
use crate::lent::{Lent, Memory};
use coconet_core::DType;
use coconet_plan::RuntimeError;
use cudarc::cublas::{CudaBlas, result as blas, sys as blas_sys};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaStream, result, sys};
use cudarc::nvrtc::Ptx;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

fn cuda(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Device(format!("CUDA: {e}"))
}

/// Why no GPU can be used, or `None` when the driver, NVRTC and cuBLAS load and a device
/// is present. cudarc panics when a library is missing, so every library is probed
/// first.
pub fn unavailable() -> Option<String> {
    let (driver, nvrtc, cublas) = (libraries::driver(), libraries::nvrtc(), libraries::cublas());
    if !driver {
        return Some("no CUDA driver found (libcuda.so could not be loaded)".into());
    }
    if !nvrtc {
        return Some(
            "NVRTC not found: libnvrtc.so could not be loaded (cudarc looks for the \
             unversioned name; where only `libnvrtc.so.12` is installed, e.g. by the \
             nvidia-cuda-nvrtc-cu12 wheel, link `libnvrtc.so` to it and put its directory \
             on LD_LIBRARY_PATH)"
                .into(),
        );
    }
    if !cublas {
        return Some(
            "cuBLAS not found: libcublas.so could not be loaded (cudarc looks for the \
             unversioned name; where only `libcublas.so.12` is installed, e.g. by PyTorch's \
             nvidia-cublas-cu12 wheel, link `libcublas.so` to it and put its directory on \
             LD_LIBRARY_PATH)"
                .into(),
        );
    }
    match CudaContext::device_count() {
        Ok(0) => Some("the CUDA driver reports no device".into()),
        Ok(_) => None,
        Err(e) => Some(format!("the CUDA driver failed: {e}")),
    }
}

/// Whether NVRTC can be loaded (it compiles without a driver or GPU).
pub fn nvrtc_present() -> bool {
    libraries::nvrtc()
}

/// Whether the CUDA driver library can be loaded.
pub fn driver_present() -> bool {
    libraries::driver()
}

/// GPU `ordinal`'s primary context, kept for the rest of the process: creating it (and
/// the cuBLAS state and loaded modules that live in it) is expensive, and cudarc
/// destroys a primary context when the last reference goes — after every job, were the
/// jobs the only holders.
pub fn context(ordinal: usize) -> Result<Arc<CudaContext>, RuntimeError> {
    static CONTEXTS: OnceLock<Mutex<HashMap<usize, Arc<CudaContext>>>> = OnceLock::new();
    let mut held = CONTEXTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(ctx) = held.get(&ordinal) {
        return Ok(ctx.clone());
    }
    let ctx = CudaContext::new(ordinal).map_err(cuda)?;
    held.insert(ordinal, ctx.clone());
    Ok(ctx)
}

/// What NVRTC hands back.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Output {
    /// PTX text (for inspection; a driver older than NVRTC refuses to load it).
    Ptx,
    /// Machine code for the exact architecture: loaded as it is, no JIT.
    Cubin,
}

/// Compiled code per (source, architecture, output), for this process.
type CodeCache = Mutex<HashMap<(String, String, Output), Vec<u8>>>;

fn code_cache() -> &'static CodeCache {
    static CACHE: OnceLock<CodeCache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Compiles a translation unit for `arch` (e.g. `sm_90`) to PTX, once per process.
pub fn compile(source: &str, arch: &str) -> Result<String, RuntimeError> {
    let ptx = nvrtc(source, arch, Output::Ptx)?;
    let text = ptx.split(|&b| b == 0).next().unwrap_or_default();
    Ok(String::from_utf8_lossy(text).into_owned())
}

/// Compiles a translation unit for `arch` (a real architecture, `sm_90`) to a CUBIN,
/// once per process: what the GPU device loads, so a driver older than NVRTC (which
/// refuses newer PTX) still runs it, and nothing is JIT-compiled at load.
pub fn compile_cubin(source: &str, arch: &str) -> Result<Vec<u8>, RuntimeError> {
    nvrtc(source, arch, Output::Cubin)
}

/// NVRTC with the options every kernel is compiled with: `--fmad=false`, IEEE division
/// and square root, no flush to zero — results round exactly as the CPU backend's do.
fn nvrtc(source: &str, arch: &str, output: Output) -> Result<Vec<u8>, RuntimeError> {
    use cudarc::nvrtc::{result as rtc, sys as rtc_sys};
    let key = (source.to_string(), arch.to_string(), output);
    if let Some(code) = code_cache().lock().expect("cache").get(&key) {
        return Ok(code.clone());
    }
    let rejected = |what: &str, e: &dyn std::fmt::Display| {
        RuntimeError::Device(format!("NVRTC {what} the generated source: {e}"))
    };
    let src = std::ffi::CString::new(source)
        .map_err(|_| rejected("cannot take", &"it contains a NUL byte"))?;
    let prog = rtc::create_program(&src, None).map_err(|e| rejected("cannot take", &e))?;
    /// Destroys the program however compilation ends.
    struct Program(rtc_sys::nvrtcProgram);
    impl Drop for Program {
        fn drop(&mut self) {
            // SAFETY: created by `create_program` and destroyed only here.
            let _ = unsafe { rtc::destroy_program(self.0) };
        }
    }
    let prog = Program(prog);
    let options = [
        format!("--gpu-architecture={arch}"),
        "--fmad=false".into(),
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
        "--ftz=false".into(),
        "-default-device".into(),
    ];
    // SAFETY: `prog.0` is a live program (above) for every call below.
    unsafe {
        if let Err(e) = rtc::compile_program(prog.0, &options) {
            let log = rtc::get_program_log(prog.0).unwrap_or_default();
            let log: Vec<u8> = log
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            return Err(rejected(
                "rejected",
                &format!("{e}\n{}", String::from_utf8_lossy(&log)),
            ));
        }
        let code = match output {
            Output::Ptx => {
                let ptx = rtc::get_ptx(prog.0).map_err(|e| rejected("compiled", &e))?;
                ptx.iter().map(|&c| c as u8).collect::<Vec<u8>>()
            }
            Output::Cubin => {
                let mut size = 0usize;
                rtc_sys::nvrtcGetCUBINSize(prog.0, &mut size)
                    .result()
                    .map_err(|e| rejected("has no CUBIN for", &e))?;
                let mut cubin = vec![0u8; size];
                rtc_sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast())
                    .result()
                    .map_err(|e| rejected("has no CUBIN for", &e))?;
                cubin
            }
        };
        code_cache()
            .lock()
            .expect("cache")
            .insert(key, code.clone());
        Ok(code)
    }
}

/// One GPU running a program's kernels.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    comm: Arc<CudaStream>,
    compute: Arc<CudaStream>,
    transfers: Arc<CudaStream>,
    blas: CudaBlas,
    functions: Vec<CudaFunction>,
    block: RefCell<Option<CudaEvent>>,
    /// Lent regions already found to be this GPU's memory and inside their allocation:
    /// a training loop lends the same tensors every step, and three driver queries per
    /// piece would cost a 150-tensor model hundreds of microseconds a step.
    checked: RefCell<std::collections::HashSet<(u64, usize)>>,
}

/// A device buffer (freed on drop).
pub struct GpuBuffer {
    ptr: sys::CUdeviceptr,
    ctx: Arc<CudaContext>,
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by `malloc_sync` in this context and not freed before.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Whether GPU `ordinal` can access the memory of each of GPUs `others` (false where one
/// of them is not visible to this process). Creates no context on the others.
pub fn reaches_gpus(ordinal: usize, others: &[usize]) -> Result<bool, RuntimeError> {
    if let Some(why) = unavailable() {
        return Err(RuntimeError::Device(why));
    }
    result::init().map_err(cuda)?;
    let count = result::device::get_count().map_err(cuda)? as usize;
    let device = |o: usize| result::device::get(o as i32).map_err(cuda);
    let me = device(ordinal)?;
    for &other in others.iter().filter(|&&o| o != ordinal) {
        if other >= count {
            return Ok(false);
        }
        let mut can = 0;
        // SAFETY: two valid devices and an out-parameter.
        checked("cuDeviceCanAccessPeer", unsafe {
            sys::cuDeviceCanAccessPeer(&mut can, me, device(other)?)
        })?;
        if can == 0 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Another process's buffer mapped into this one (CUDA IPC); unmapped on drop.
pub struct IpcMapping {
    ptr: sys::CUdeviceptr,
    ctx: Arc<CudaContext>,
}

impl IpcMapping {
    /// The buffer's address in this process.
    pub fn address(&self) -> u64 {
        self.ptr
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: opened by `cuIpcOpenMemHandle` in this context, closed once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}

fn checked(what: &str, r: sys::CUresult) -> Result<(), RuntimeError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(cuda(format!("{what}: {r:?}")))
    }
}

impl Gpu {
    /// The CUDA IPC handle of `b`, for processes on this machine to map it.
    pub fn ipc_handle(&self, b: &GpuBuffer) -> Result<[u8; 64], RuntimeError> {
        self.bind()?;
        let mut handle = std::mem::MaybeUninit::<sys::CUipcMemHandle>::uninit();
        // SAFETY: `b` is a whole allocation of this context; the handle is written.
        let handle = unsafe {
            checked(
                "cuIpcGetMemHandle",
                sys::cuIpcGetMemHandle(handle.as_mut_ptr(), b.ptr),
            )?;
            handle.assume_init()
        };
        Ok(handle.reserved.map(|c| c as u8))
    }

    /// Maps another process's buffer from its IPC handle.
    pub fn open_ipc(&self, handle: &[u8; 64]) -> Result<IpcMapping, RuntimeError> {
        self.bind()?;
        let handle = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut ptr = 0;
        // SAFETY: `ptr` is written; the handle came from a live process of this job.
        checked("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                handle,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        })?;
        Ok(IpcMapping {
            ptr,
            ctx: self.ctx.clone(),
        })
    }

    /// Opens device `ordinal` and loads `program`'s kernels.
    pub fn new(ordinal: usize, program: &CudaProgram) -> Result<Gpu, RuntimeError> {
        if let Some(why) = unavailable() {
            return Err(RuntimeError::Device(why));
        }
        let ctx = context(ordinal)?;
        let (major, minor) = ctx.compute_capability().map_err(cuda)?;
        let cubin = compile_cubin(&program.source(), &format!("sm_{major}{minor}"))?;
        let module = ctx.load_module(Ptx::from_binary(cubin)).map_err(cuda)?;
        let functions = program
            .kernels
            .iter()
            .map(|k| module.load_function(&k.name).map_err(cuda))
            .collect::<Result<_, _>>()?;
        let comm = ctx.new_stream().map_err(cuda)?;
        let compute = ctx.new_stream().map_err(cuda)?;
        let transfers = ctx.new_stream().map_err(cuda)?;
        let blas = CudaBlas::new(compute.clone()).map_err(cuda)?;
        Ok(Gpu {
            ctx,
            comm,
            compute,
            transfers,
            blas,
            functions,
            block: RefCell::new(None),
            checked: RefCell::new(Default::default()),
        })
    }

    /// Makes this GPU's context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<(), RuntimeError> {
        self.ctx.bind_to_thread().map_err(cuda)
    }

    /// The stream kernels run on.
    pub(crate) fn kernel_stream(&self) -> sys::CUstream {
        self.comm.cu_stream()
    }

    /// The stream transfers between ranks run on.
    pub(crate) fn transfer_stream(&self) -> sys::CUstream {
        self.transfers.cu_stream()
    }

    fn alloc(&self, bytes: usize) -> Result<GpuBuffer, RuntimeError> {
        self.ctx.bind_to_thread().map_err(cuda)?;
        // SAFETY: a fresh allocation of at least one byte, freed by `GpuBuffer::drop`.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(cuda)?;
        Ok(GpuBuffer {
            ptr,
            ctx: self.ctx.clone(),
        })
    }

    fn upload_bytes(&self, bytes: &[u8]) -> Result<GpuBuffer, RuntimeError> {
        let b = self.alloc(bytes.len())?;
        if !bytes.is_empty() {
            // On the kernels' stream, so later kernels see it (the streams do not wait for
            // the legacy stream the synchronous copy would use). From pageable memory the
            // bytes are staged before the call returns, so `bytes` may go.
            // SAFETY: `b` holds `bytes.len()` bytes.
            unsafe { result::memcpy_htod_async(b.ptr, bytes, self.comm.cu_stream()) }
                .map_err(cuda)?;
        }
        Ok(b)
    }
}

impl Device for Gpu {
    type Buffer = GpuBuffer;

    fn upload(&self, data: &coconet_core::HostData) -> Result<GpuBuffer, RuntimeError> {
        self.upload_bytes(data.as_bytes())
    }

    fn write(&self, b: &GpuBuffer, bytes: &[u8]) -> Result<(), RuntimeError> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(cuda)?;
        // On the kernels' stream, as uploads are; pageable memory is staged before the
        // call returns. The caller gives exactly the buffer's size.
        // SAFETY: `b` holds `bytes.len()` bytes (the executor checks the size).
        unsafe { result::memcpy_htod_async(b.ptr, bytes, self.comm.cu_stream()) }.map_err(cuda)
    }

    fn zeros(&self, dtype: DType, n: usize) -> Result<GpuBuffer, RuntimeError> {
        let bytes = n * dtype.size_bytes();
        let b = self.alloc(bytes)?;
        // On the kernels' stream, as uploads are (matmuls and transfers wait for that
        // stream before touching memory).
        // SAFETY: `b` holds at least `bytes.max(1)` bytes.
        unsafe { result::memset_d8_async(b.ptr, 0, bytes.max(1), self.comm.cu_stream()) }
            .map_err(cuda)?;
        Ok(b)
    }

    fn addresses(&self, addrs: &[u64]) -> Result<GpuBuffer, RuntimeError> {
        let bytes: Vec<u8> = addrs.iter().flat_map(|a| a.to_ne_bytes()).collect();
        self.upload_bytes(&bytes)
    }

    fn address(&self, b: &GpuBuffer) -> u64 {
        b.ptr
    }

    fn download(&self, b: &GpuBuffer, dtype: DType, n: usize) -> Result<Vec<f64>, RuntimeError> {
        self.synchronize()?;
        let mut host = coconet_plan::host::memory::Buffer::zeros(dtype, n);
        if n > 0 {
            // SAFETY: `host` holds n elements, as does `b` (its allocation); the host
            // buffer is ours alone and outlives the view.
            unsafe { result::memcpy_dtoh_sync(host.raw().bytes_mut(), b.ptr) }.map_err(cuda)?;
        }
        Ok(host.to_f64())
    }

    fn launch(&self, call: &KernelCall) -> Result<(), RuntimeError> {
        self.ctx.bind_to_thread().map_err(cuda)?;
        let mut args = call.argument_pointers();
        // SAFETY: `args` matches the kernel's generated parameter list.
        unsafe {
            result::launch_kernel(
                self.functions[call.kernel].cu_function(),
                (call.grid, 1, 1),
                (call.block, 1, 1),
                0,
                self.comm.cu_stream(),
                &mut args,
            )
        }
        .map_err(cuda)
    }

    type Graph = GpuGraph;

    fn graph(&self, calls: &[KernelCall]) -> Result<GpuGraph, RuntimeError> {
        self.bind()?;
        GpuGraph::new(&self.ctx, &self.functions, calls).map_err(cuda)
    }

    fn update_graph(
        &self,
        graph: &mut GpuGraph,
        i: usize,
        call: &KernelCall,
    ) -> Result<(), RuntimeError> {
        self.bind()?;
        graph.update(&self.functions, i, call).map_err(cuda)
    }

    fn replay(&self, graph: &GpuGraph) -> Result<(), RuntimeError> {
        self.bind()?;
        graph.launch(self.comm.cu_stream()).map_err(cuda)
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
        let (m, k, n) = (rows.len() as i32, mm.k as i32, mm.n as i32);
        if m == 0 || n == 0 {
            return Ok(());
        }
        // cuBLAS works on the calling thread's current context, which is this GPU's
        // only if this thread made it current.
        self.ctx.bind_to_thread().map_err(cuda)?;
        let a = a + (rows.start * mm.k) as u64 * size;
        let out = out + (rows.start * mm.n) as u64 * size;
        use blas_sys::cudaDataType_t as T;
        let (ty, compute) = match mm.dtype {
            DType::F32 => (
                T::CUDA_R_32F,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            DType::F64 => (
                T::CUDA_R_64F,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_64F,
            ),
            DType::F16 => (
                T::CUDA_R_16F,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            DType::BF16 => (
                T::CUDA_R_16BF,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            d => return Err(RuntimeError::Device(format!("no cuBLAS matmul for {d}"))),
        };
        let (one32, zero32, one64, zero64) = (1.0f32, 0.0f32, 1.0f64, 0.0f64);
        let (alpha, beta): (*const c_void, *const c_void) = if mm.dtype == DType::F64 {
            (
                (&one64 as *const f64).cast(),
                (&zero64 as *const f64).cast(),
            )
        } else {
            (
                (&one32 as *const f32).cast(),
                (&zero32 as *const f32).cast(),
            )
        };
        // Row-major out[m, n] = a[m, k] b[k, n] is column-major outᵀ = bᵀ aᵀ.
        // SAFETY: the pointers address buffers of the shapes above on this device.
        unsafe {
            blas::gemm_ex(
                *self.blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                n,
                m,
                k,
                alpha,
                b as *const c_void,
                ty,
                n,
                a as *const c_void,
                ty,
                // A leading dimension of at least 1 even for an empty inner dim (k = 0:
                // the product is zeros, beta = 0 writes them).
                k.max(1),
                beta,
                out as *mut c_void,
                ty,
                n,
                compute,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(cuda)
    }

    fn wait_kernels(&self) -> Result<(), RuntimeError> {
        let ev = self.comm.record_event(None).map_err(cuda)?;
        self.compute.wait(&ev).map_err(cuda)
    }

    fn block_done(&self) -> Result<(), RuntimeError> {
        let ev = self.compute.record_event(None).map_err(cuda)?;
        *self.block.borrow_mut() = Some(ev);
        Ok(())
    }

    fn wait_block(&self) -> Result<(), RuntimeError> {
        if let Some(ev) = self.block.borrow().as_ref() {
            self.comm.wait(ev).map_err(cuda)?;
        }
        Ok(())
    }

    fn transfers_wait_kernels(&self) -> Result<(), RuntimeError> {
        let ev = self.comm.record_event(None).map_err(cuda)?;
        self.transfers.wait(&ev).map_err(cuda)
    }

    fn kernels_wait_transfers(&self) -> Result<(), RuntimeError> {
        let ev = self.transfers.record_event(None).map_err(cuda)?;
        self.comm.wait(&ev).map_err(cuda)
    }

    fn synchronize(&self) -> Result<(), RuntimeError> {
        // Every stream of the context, the legacy one included.
        self.ctx.synchronize().map_err(cuda)
    }

    type Event = CudaEvent;

    fn memory(&self) -> Memory {
        Memory::Gpu(self.ctx.ordinal())
    }

    fn check_lent(&self, address: u64, bytes: usize) -> Result<(), String> {
        if bytes == 0 || self.checked.borrow().contains(&(address, bytes)) {
            return Ok(());
        }
        self.bind().map_err(|e| e.to_string())?;
        let attribute = |attr: sys::CUpointer_attribute, out: *mut c_void| {
            // SAFETY: `out` points at storage of the attribute's type (an int for the
            // ordinal, a pointer-sized integer for the range); any address may be asked
            // about.
            unsafe { sys::cuPointerGetAttribute(out, attr, address) }
        };
        let mut ordinal: i32 = -1;
        if attribute(
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            (&mut ordinal as *mut i32).cast(),
        ) != sys::CUresult::CUDA_SUCCESS
        {
            return Err(format!(
                "address {address:#x} is not device memory CUDA knows of"
            ));
        }
        if ordinal as usize != self.ctx.ordinal() {
            return Err(format!(
                "address {address:#x} is memory of GPU {ordinal}, not of GPU {} (the job's)",
                self.ctx.ordinal()
            ));
        }
        let (mut start, mut size): (u64, usize) = (0, 0);
        let known = attribute(
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            (&mut start as *mut u64).cast(),
        ) == sys::CUresult::CUDA_SUCCESS
            && attribute(
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                (&mut size as *mut usize).cast(),
            ) == sys::CUresult::CUDA_SUCCESS;
        if known && address + bytes as u64 > start + size as u64 {
            return Err(format!(
                "{bytes} bytes at {address:#x} run past the end of their allocation \
                 ({size} bytes at {start:#x})"
            ));
        }
        let mut checked = self.checked.borrow_mut();
        if checked.len() >= 1 << 16 {
            checked.clear();
        }
        checked.insert((address, bytes));
        Ok(())
    }

    fn record(&self) -> Result<CudaEvent, RuntimeError> {
        for other in [&self.compute, &self.transfers] {
            let ev = other.record_event(None).map_err(cuda)?;
            self.comm.wait(&ev).map_err(cuda)?;
        }
        self.comm.record_event(None).map_err(cuda)
    }

    fn wait_event(&self, event: &CudaEvent) -> Result<(), RuntimeError> {
        for s in [&self.comm, &self.compute, &self.transfers] {
            s.wait(event).map_err(cuda)?;
        }
        Ok(())
    }

    fn wait_host(&self, event: &CudaEvent) -> Result<(), RuntimeError> {
        event.synchronize().map_err(cuda)
    }

    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<(), RuntimeError> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the executor checked both regions hold `bytes` bytes on this device.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.comm.cu_stream()) }.map_err(cuda)
    }

    fn read_bytes(&self, address: u64, out: &mut [u8]) -> Result<(), RuntimeError> {
        if out.is_empty() {
            return Ok(());
        }
        let done = self.record()?;
        self.bind()?;
        // After every stream's work (joined on the kernels' stream by `record`); into
        // pageable memory, so the copy has finished when the stream has.
        // SAFETY: the executor checked `address` holds `out.len()` bytes.
        unsafe { result::memcpy_dtoh_async(out, address, self.comm.cu_stream()) }.map_err(cuda)?;
        drop(done);
        self.comm.synchronize().map_err(cuda)
    }

    fn after_lenders(&self, lent: &Lent<'_>) -> Result<(), RuntimeError> {
        for stream in lent.streams() {
            let ev = stream.record_event(None).map_err(cuda)?;
            self.wait_event(&ev)?;
        }
        Ok(())
    }

    fn release_lenders(&self, lent: &Lent<'_>, event: &CudaEvent) -> Result<(), RuntimeError> {
        for stream in lent.streams() {
            stream.wait(event).map_err(cuda)?;
        }
        Ok(())
    }
}
