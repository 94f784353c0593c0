//! The example programs (`examples/programs/`), shared by the test files that run all of
//! them: `#[path = "support/examples.rs"] mod examples; use examples::*;`.

#[allow(dead_code)]
#[path = "../../examples/programs/adam.rs"]
pub mod adam_program;
#[allow(dead_code)]
#[path = "../../examples/programs/data.rs"]
pub mod data;
#[allow(dead_code)]
#[path = "../../examples/programs/lamb.rs"]
pub mod lamb_program;
#[allow(dead_code)]
#[path = "../../examples/programs/megatron.rs"]
pub mod megatron_program;
#[allow(dead_code)]
#[path = "../../examples/programs/pipeline.rs"]
pub mod pipeline_program;
#[allow(dead_code)]
#[path = "../../examples/programs/sgd.rs"]
pub mod sgd_program;
