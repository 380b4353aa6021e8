//! The cyclepool task ABI for Rust (docs/TASK_ABI.md).
//!
//! A task is a WASI preview 1 command (`--target wasm32-wasi`). It reads
//! argv, stdin and files under /in (or its own files: docs/DATA.md), writes
//! stdout and files under /out, and uses these functions to report progress
//! and to checkpoint and restore its state. Built for any other target, they
//! work without a platform: progress is discarded, no checkpoint is ever
//! due and nothing is restored.

#[cfg(target_os = "wasi")]
#[link(wasm_import_module = "cyclepool")]
extern "C" {
    #[link_name = "progress"]
    fn cp_progress(fraction: f64);
    #[link_name = "checkpoint_due"]
    fn cp_checkpoint_due() -> i32;
    #[link_name = "checkpoint"]
    fn cp_checkpoint(ptr: *const u8, len: i32) -> i32;
    #[link_name = "restore"]
    fn cp_restore(ptr: *mut u8, cap: i32) -> i32;
}

/// Reports the fraction of the task done, from 0 to 1.
pub fn progress(fraction: f64) {
    #[cfg(target_os = "wasi")]
    unsafe {
        cp_progress(fraction)
    }
    #[cfg(not(target_os = "wasi"))]
    let _ = fraction;
}

/// Reports whether a checkpoint is due: call it often, it is cheap.
pub fn checkpoint_due() -> bool {
    #[cfg(target_os = "wasi")]
    unsafe {
        cp_checkpoint_due() != 0
    }
    #[cfg(not(target_os = "wasi"))]
    false
}

/// Hands the state to the platform; an error means it was refused (the
/// task goes on).
pub fn checkpoint(state: &[u8]) -> Result<(), ()> {
    #[cfg(target_os = "wasi")]
    unsafe {
        if cp_checkpoint(state.as_ptr(), state.len() as i32) == 0 {
            Ok(())
        } else {
            Err(())
        }
    }
    #[cfg(not(target_os = "wasi"))]
    {
        let _ = state;
        Err(())
    }
}

/// Returns the state to resume from, if an earlier attempt saved one.
pub fn restore() -> Option<Vec<u8>> {
    #[cfg(target_os = "wasi")]
    unsafe {
        let n = cp_restore(std::ptr::null_mut(), 0);
        if n <= 0 {
            return None;
        }
        let mut buf = vec![0u8; n as usize];
        if cp_restore(buf.as_mut_ptr(), n) != n {
            return None;
        }
        Some(buf)
    }
    #[cfg(not(target_os = "wasi"))]
    None
}

/// Moves to the task's working directory, `$PWD` (the workflow's `cwd`):
/// WASI has none of its own, and the program starts at `/`.
pub fn chdir_pwd() -> std::io::Result<()> {
    match std::env::var("PWD") {
        Ok(p) if !p.is_empty() => std::env::set_current_dir(p),
        _ => Err(std::io::Error::new(std::io::ErrorKind::NotFound, "PWD is not set")),
    }
}
