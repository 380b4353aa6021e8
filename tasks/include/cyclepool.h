/*
 * cyclepool.h: the cyclepool task ABI for C and C++ (docs/TASK_ABI.md).
 *
 * A task is a WASI preview 1 command. Build one with Debian's clang, lld
 * and wasi-libc (apt-get install clang lld wasi-libc
 * libclang-rt-14-dev-wasm32):
 *
 *     clang --target=wasm32-wasi -O2 -I tasks/include -o task.wasm task.c
 *
 * It reads argv, stdin and files under /in (or its own files: docs/DATA.md),
 * writes stdout and files under /out, and uses these functions to report
 * progress and to checkpoint and restore its state. All are optional.
 */
#ifndef CYCLEPOOL_H
#define CYCLEPOOL_H

#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#define CYCLEPOOL_IMPORT(name) __attribute__((import_module("cyclepool"), import_name(#name)))

/* cyclepool_progress reports the fraction of the task done, 0 to 1. */
CYCLEPOOL_IMPORT(progress) void cyclepool_progress(double fraction);

/* cyclepool_checkpoint_due returns 1 when a checkpoint is due: call it
 * often, it is cheap. */
CYCLEPOOL_IMPORT(checkpoint_due) int32_t cyclepool_checkpoint_due(void);

/* cyclepool_checkpoint hands len bytes of state to the platform and
 * returns 0 once they are saved, non-zero when they were refused (the
 * task goes on). At most the server's frame limit less about 1 KiB. */
CYCLEPOOL_IMPORT(checkpoint) int32_t cyclepool_checkpoint(const void *state, int32_t len);

/* cyclepool_restore copies the state to resume from into buf when it
 * fits in cap bytes, and returns its length (0: start afresh). Call it
 * with cap 0 to learn the length. */
CYCLEPOOL_IMPORT(restore) int32_t cyclepool_restore(void *buf, int32_t cap);

/* cyclepool_chdir_pwd moves to the task's working directory, $PWD (the
 * workflow's "cwd"): WASI has none of its own, and wasi-libc starts at /.
 * Returns 0, or -1 when PWD is unset or cannot be entered. */
static inline int cyclepool_chdir_pwd(void) {
	const char *pwd = getenv("PWD");
	return pwd && *pwd ? chdir(pwd) : -1;
}

#endif
