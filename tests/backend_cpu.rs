//! The backend suite on the CPU backend (rank threads in this process).

coconet_backend_suite::backend_suite!(coconet::runtime::cpu::Cpu::default());
