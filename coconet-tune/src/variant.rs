//! One setting of a backend's knobs, as the tuner times it.

/// One setting of a backend's knobs: the backend configured with it, and a label
/// naming it in the table and the cache.
#[derive(Debug, Clone)]
pub struct Variant<B> {
    /// What it sets, e.g. `chunk 4096`.
    pub label: String,
    /// The backend configured with it.
    pub backend: B,
}

impl Variant<coconet_cpu::Cpu> {
    /// The CPU backend with each kernel chunk length of `chunks` (elements; see
    /// [`RunOptions::chunk`](coconet_cpu::RunOptions::chunk)).
    pub fn cpu_chunks(chunks: &[usize]) -> Vec<Variant<coconet_cpu::Cpu>> {
        chunks
            .iter()
            .map(|&chunk| Variant {
                label: format!("chunk {chunk}"),
                backend: coconet_cpu::Cpu {
                    options: coconet_cpu::RunOptions::default().with_chunk(chunk),
                },
            })
            .collect()
    }
}

impl<'a, B: coconet_cuda::AccessChoice> Variant<coconet_cuda::WithAccess<'a, B>> {
    /// A multi-rank CUDA backend with each peer access of `accesses` (mapped memory, or
    /// exchanges cut into chunks of some size): the knob that decides how far
    /// communication overlaps the kernels.
    /// [`access_choices`](coconet_cuda::AccessChoice::access_choices) lists the settings
    /// worth timing on a backend.
    pub fn cuda_access(
        backend: &'a B,
        accesses: &[coconet_cuda::PeerAccess],
    ) -> Vec<Variant<coconet_cuda::WithAccess<'a, B>>> {
        accesses
            .iter()
            .map(|&access| Variant {
                label: coconet_cuda::access_label(access),
                backend: coconet_cuda::WithAccess { backend, access },
            })
            .collect()
    }
}
