/* SPDX-License-Identifier: MIT */
/*
 * preload.h - what the parts of libodpd-preload.so share. Not installed.
 *
 * libodpd-preload.so (loaded by odpd-run through LD_PRELOAD) lets a program
 * that was never written for odpd register its memory through odpd:
 *
 *   alloc.c  places the program's large allocations (malloc and its
 *            family, anonymous private mmap) in memfd-backed chunks, the
 *            segments odpd can map (doc/design.md §2), through a jemalloc
 *            arena whose extent hooks hand out those chunks; keeps fork()
 *            private (a child gets copies).
 *   verbs.c  interposes ibv_reg_mr, ibv_reg_mr_iova, ibv_reg_mr_iova2,
 *            ibv_dereg_mr and ibv_rereg_mr, and serves a registration of
 *            chunk memory in client-PD mode (the MR lives in the program's
 *            own PD, registered by odpd, imported here); anything else goes
 *            to the real function with a one-line reason on stderr (or fails,
 *            with ODPD_PRELOAD_STRICT=1).
 *
 * Environment (odpd-run sets the first two):
 *   ODPD_SOCKET            odpd's socket (default /run/odpd/odpd.sock)
 *   ODPD_PRELOAD_STRICT=1  fail a registration odpd cannot serve
 *   ODPD_PRELOAD_MIN_SIZE  bytes (K, M, G suffixes); smaller allocations stay
 *                          in the C library's heap (default 32K)
 *   ODPD_PRELOAD_WINDOW    bytes of address space reserved for chunks (default 1T)
 *   ODPD_PRELOAD_LOG=all   log every fallback, not each reason once
 *   ODPD_PRELOAD=0         interpose nothing (every call goes to the real one)
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A chunk: one sealed memfd mapped MAP_SHARED at [base, base + length). */
struct preload_chunk {
	uintptr_t base;
	size_t length;
	int fd;
	uint64_t ino, dev;              /* of fd, to notice a program that closed or reused it */
	void *seg;                      /* struct odpd_segment * of the default connection */
	void *seg_conn;                 /* the connection @seg belongs to */
};

/* Is @k->fd still the chunk's memfd (the program may have closed it, and the
 * number may name another file now)? */
bool preload_chunk_fd_ok(const struct preload_chunk *k);

/* Is the allocator on (ODPD_PRELOAD unset or not 0, the window reserved)? */
bool preload_alloc_on(void);

/* The chunk that holds [@addr, @addr + @length), or NULL. No lock: chunks
 * are never removed, and their fields other than seg/seg_conn never change
 * (but in a child after fork, which is single-threaded then). */
struct preload_chunk *preload_chunk_find(uintptr_t addr, size_t length);

/* The threshold in bytes (ODPD_PRELOAD_MIN_SIZE). */
size_t preload_min_size(void);

/* Parse "4096", "32K", "1M", "2G", "1T". false if it is not a size. */
bool preload_parse_size(const char *s, size_t *ret);

/* Write one line "odpd-preload: ..." to stderr (no stdio, no allocation). */
void preload_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The verbs part's fork handlers (verbs.c): its table of MRs whole in the child. */
void preload_verbs_lock(void);
void preload_verbs_unlock(void);
void preload_verbs_fork_child(void);
