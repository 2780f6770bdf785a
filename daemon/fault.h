/* SPDX-License-Identifier: MIT */
/*
 * fault.h - failure injection for tests (meson -Dfault_injection=true only;
 * release builds have none of it).
 *
 * odpd is linked with -Wl,--wrap for the allocation calls (malloc, calloc,
 * realloc, reallocarray, strdup, strndup) and for the calls that make a file
 * descriptor or a process (socket, socketpair, accept4, memfd_create, open,
 * fopen, opendir, dup3, fcntl's F_DUPFD, inotify_init1, pidfd_open through
 * syscall(), recvmsg when it carries fds, ibv_open_device, posix_spawn), and
 * libevent's and protobuf-c's allocations go through the same malloc (a
 * request's only when it does not fit in the decoding arena, manager.h). A test
 * shares a struct odpd_fault_control with odpd through the file named by
 * $ODPD_FAULT_CONTROL and arms one kind of call with a countdown: the call
 * that brings the countdown from 1 to 0 fails (ENOMEM, EMFILE, ...), once.
 * If no call failed, the scenario ran to its end: every injection point it
 * has was tried (tests/test-inject.c). sd-bus's and libibverbs' own
 * allocations are not injected.
 */
#pragma once

#include <stdint.h>

#define ODPD_FAULT_MAGIC 0x6f646650u /* "odfP" */

enum odpd_fault_kind {
	ODPD_FAULT_ALLOC = 1u << 0,  /* memory allocations: ENOMEM */
	ODPD_FAULT_FD = 1u << 1,     /* fd- and process-creating calls: EMFILE (EAGAIN for spawn) */
};

struct odpd_fault_control {
	uint32_t magic;
	_Atomic uint32_t kind;       /* the kinds that count; 0: off */
	_Atomic int64_t countdown;   /* the call that takes it from 1 to 0 fails */
	_Atomic uint64_t calls;      /* calls counted since armed */
	_Atomic uint32_t injected;   /* 1 once a call was failed */
	uint64_t site;               /* that call's return address, less odpd's load address */
	char function[32];           /* the call that was failed */
};

/* Map $ODPD_FAULT_CONTROL if set (main() calls it first). */
void odpd_fault_init(void);
/* Should this call of @function, of @kind, fail? @ra: its return address. */
_Bool odpd_fault_now(unsigned kind, const char *function, const void *ra);
