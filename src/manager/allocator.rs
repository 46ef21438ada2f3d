//! glibc's malloc held to one arena in the manager (decision 0023).
//!
//! glibc gives a thread that finds the heap locked an arena of its own, up to eight per core, and
//! keeps what is freed in each for the thread that freed it. The manager's work moves between
//! tokio's worker threads, so every arena ends up holding the free room of the biggest burst it
//! saw: with 5,000 Nodes and NodeImages and 10,000 pods watched that was 5 to 8 MiB of its
//! ~70 MiB (`cargo bench --bench manager_memory`, `MALLOC_ARENA_MAX=1` against the default).
//! The manager's threads are few and mostly wait on the API server, so they share one arena.
//!
//! Only glibc builds do anything here: the image's static musl build has an allocator without
//! arenas. A `MALLOC_ARENA_MAX` in the environment is glibc's own setting and is left to win.

/// Limits glibc's malloc to one arena unless `MALLOC_ARENA_MAX` says otherwise. Call before
/// any other thread starts: a thread keeps the arena its first allocation got. Returns whether
/// the limit was set.
pub fn one_arena() -> bool {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return false;
    }
    set_arena_max(1)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_arena_max(arenas: std::ffi::c_int) -> bool {
    use std::ffi::c_int;

    /// `M_ARENA_MAX` in glibc's `<malloc.h>`.
    const M_ARENA_MAX: c_int = -8;
    unsafe extern "C" {
        /// glibc: sets a malloc parameter; 1 on success, 0 on error.
        fn mallopt(param: c_int, value: c_int) -> c_int;
    }
    // SAFETY: `mallopt` takes two integers and touches only malloc's own state, under its lock;
    // any value is defined behaviour (a bad one returns 0).
    unsafe { mallopt(M_ARENA_MAX, arenas) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_arena_max(_arenas: i32) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_takes_the_limit() {
        // The test harness has threads already; the call is still accepted (it governs arenas
        // made from now on), which is what this checks.
        assert!(set_arena_max(1));
    }
}
