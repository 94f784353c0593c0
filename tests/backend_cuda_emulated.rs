//! The backend suite on the CUDA backend's executor and generated kernels, run by the
//! host emulator (the kernels compiled as C++): every example × schedule × P against the
//! reference interpreter, without a GPU.

coconet_backend_suite::backend_suite!(coconet::runtime::cuda::EmulatedCuda);
