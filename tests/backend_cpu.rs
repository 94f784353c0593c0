//! The backend suite on the CPU backend (rank threads in this process).

coconet_test_support::backend_suite!(coconet::runtime::cpu::Cpu::default());
