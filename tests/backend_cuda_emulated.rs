//! The backend suite on the CUDA backend's executor and generated kernels, run by the
//! host emulator (the kernels compiled as C++): every example × schedule × P against the
//! reference interpreter, without a GPU.

#[allow(dead_code)]
#[path = "../examples/programs/adam.rs"]
mod adam_program;
#[allow(dead_code)]
#[path = "../examples/programs/data.rs"]
mod data;
#[allow(dead_code)]
#[path = "../examples/programs/lamb.rs"]
mod lamb_program;
#[allow(dead_code)]
#[path = "../examples/programs/megatron.rs"]
mod megatron_program;
#[allow(dead_code)]
#[path = "../examples/programs/pipeline.rs"]
mod pipeline_program;
#[allow(dead_code)]
#[path = "../examples/programs/sgd.rs"]
mod sgd_program;

#[macro_use]
#[path = "support/backend_suite.rs"]
mod backend_suite;

backend_suite!(coconet::runtime::cuda::EmulatedCuda);
