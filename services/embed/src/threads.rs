//! The thread count candle's CPU matrix products use, fixed once per process.
//!
//! candle sizes every matrix product's rayon split by calling its `get_num_threads()`, which
//! reads `RAYON_NUM_THREADS` and, when that is unset, counts physical cores with
//! `num_cpus::get_physical()`: that opens and parses `/proc/cpuinfo` on every call, dozens
//! of times per query embedding. Setting the variable once at start-up to the same count
//! keeps candle's choice and skips the file. Measured (`make bench-search` setup, 3,199
//! chunks, 300 fused queries, two interleaved A/B rounds on 2 cores): gRPC Search p50
//! 29.1 / 25.6 ms without it, 20.4 / 21.9 ms with it.

/// The variable candle (and rayon's global pool) read for their thread count.
const MATMUL_THREADS_VAR: &str = "RAYON_NUM_THREADS";

/// candle's own CPU list, which it counts instead of physical cores.
const CPU_MASK_VAR: &str = "CANDLE_CPU_MASK";

/// Sets `RAYON_NUM_THREADS` to the physical core count (candle's own pick) unless the
/// operator set it or pinned candle to CPUs with `CANDLE_CPU_MASK` (then candle counts
/// those). Also sizes rayon's global pool (the tokenizer's batches) to physical cores. On
/// hybrid CPUs candle would count only the performance cores: set the variable there.
///
/// # Safety
///
/// It changes the process environment, so no other thread may exist yet (the contract of
/// [`std::env::set_var`]): call it first thing in `main`, before an async runtime starts.
#[allow(unsafe_code)]
pub unsafe fn pin_matmul_threads() {
    if std::env::var_os(MATMUL_THREADS_VAR).is_some() || std::env::var_os(CPU_MASK_VAR).is_some() {
        return;
    }
    let threads = num_cpus::get_physical().max(1).to_string();
    // SAFETY: the caller guarantees this process runs no other thread yet.
    unsafe { std::env::set_var(MATMUL_THREADS_VAR, threads) };
}
