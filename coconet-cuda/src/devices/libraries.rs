//! Whether the CUDA libraries can be used. cudarc loads them at run time in coconet's own
//! builds (and panics at the first call into one that is missing, so each is probed
//! first); in a build that links them (feature `cuda-linked`, which candle's `cuda`
//! feature forces on every crate of the build) the program could not have started
//! without them, and cudarc has no probe.

/// Whether the driver library (`libcuda.so`) is there.
pub(crate) fn driver() -> bool {
    #[cfg(not(feature = "cuda-linked"))]
    // SAFETY: only tries to load the library.
    return unsafe { cudarc::driver::sys::is_culib_present() };
    #[cfg(feature = "cuda-linked")]
    true
}

/// Whether NVRTC (`libnvrtc.so`) is there.
pub(crate) fn nvrtc() -> bool {
    #[cfg(not(feature = "cuda-linked"))]
    // SAFETY: only tries to load the library.
    return unsafe { cudarc::nvrtc::sys::is_culib_present() };
    #[cfg(feature = "cuda-linked")]
    true
}

/// Whether cuBLAS (`libcublas.so`) is there.
pub(crate) fn cublas() -> bool {
    #[cfg(not(feature = "cuda-linked"))]
    // SAFETY: only tries to load the library.
    return unsafe { cudarc::cublas::sys::is_culib_present() };
    #[cfg(feature = "cuda-linked")]
    true
}

/// Whether NCCL (`libnccl.so`) is there.
pub(crate) fn nccl() -> bool {
    #[cfg(not(feature = "cuda-linked"))]
    // SAFETY: only tries to load the library.
    return unsafe { cudarc::nccl::sys::is_culib_present() };
    #[cfg(feature = "cuda-linked")]
    true
}
