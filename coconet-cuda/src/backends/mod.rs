//! The CUDA backends users construct: one device with virtual ranks ([`one_device`]), a
//! thread per GPU ([`multi_gpu`]), a process per GPU ([`distributed`]), a thread per
//! emulated device ([`emulated_ranks`]).

#[cfg(feature = "cuda")]
pub(crate) mod distributed;
pub(crate) mod emulated_ranks;
#[cfg(feature = "cuda")]
pub(crate) mod multi_gpu;
pub(crate) mod one_device;
pub(crate) mod with_access;
#[cfg(not(feature = "cuda"))]
pub(crate) mod without_cuda;

/// The error every GPU backend returns in a build without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
pub(crate) fn built_without_cuda() -> coconet_plan::RuntimeError {
    coconet_plan::RuntimeError::Device(
        "coconet was built without the `cuda` feature (enable it: \
         `coconet = { features = [\"cuda\"] }`)"
            .into(),
    )
}
