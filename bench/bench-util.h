/* SPDX-License-Identifier: MIT */
/*
 * bench-util: what the benchmarks share: dying with a message,
 * the clock, sample series and their statistics, the in-process verbs
 * baseline, touched buffers, and the odpd calls both make the same way.
 * Every helper dies on an error (exit status 1, "PROGRAM: message").
 */
#ifndef ODPD_BENCH_UTIL_H
#define ODPD_BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#include "odpd.h"

#define KiB (1024ul)
#define MiB (1024ul * KiB)

/* Defined by each program: its name, the prefix of die()'s messages and of
 * print_command()'s line, and the name of its memfds. */
extern const char bench_name[];

__attribute__((format(printf, 1, 2), noreturn)) void die(const char *fmt, ...);

/* CLOCK_MONOTONIC in µs. */
double now_us(void);
/* A field of /proc/@pid/status ("VmRSS", no colon), in kB; -1 if there is none. */
long proc_status_kb(pid_t pid, const char *field);
/* Open fds of @pid (/proc/@pid/fd), -1 if unreadable. */
int proc_fds(pid_t pid);
/* RDMA objects of type @res (qp, cq, mr, pd) the kernel holds for a thread of
 * @pid (rdma -j resource show RES names the thread that made each), -1
 * without rdma. */
long proc_rdma_objects(pid_t pid, const char *res);

/* Result files: create @dir and its parents; open @dir/@name for writing (a
 * header line "# @header" first when @header is not NULL); close it, dying
 * if anything was not written. */
void mkdir_p(const char *dir);
FILE *csv_open(const char *dir, const char *name, const char *header);
void csv_close(FILE *f, const char *dir, const char *name);

/* A count of 1..@max, else die(). */
unsigned parse_n(const char *s, unsigned max);

/* "N,N,...": sizes in bytes (suffixes K and M: KiB, MiB), 1 .. @max_bytes,
 * at most @max of them, into @sizes; their count. Else die(). */
unsigned parse_sizes(const char *s, size_t *sizes, unsigned max, size_t max_bytes);

/* "  @what  @a/@b", and with @target > 0 whether the ratio is at most
 * (@at_most) or at least @target: "met" or "MISSED". */
void print_ratio(const char *what, double a, double b, double target, bool at_most);

/* "PROGRAM: ARGV...\nkernel RELEASE MACHINE", no newline: the caller ends the line. */
void print_command(int argc, char **argv);

/* ---------------------------------------------------------------- statistics */

struct series {
	char name[48];
	double *us;
	unsigned n, cap;
	double median, p10, p90, p99;
};

__attribute__((format(printf, 2, 3))) struct series *series_new(unsigned cap, const char *fmt, ...);

void series_free(struct series *s);

/* One sample; those beyond the capacity are dropped. */
void add(struct series *s, double us);

/* Median, p10, p90 and p99 (nearest rank) of the samples; dies without any.
 * Sorts a copy: the samples stay in the order they were taken (for the CSV). */
void summarize(struct series *s);

/* ---------------------------------------------------------------- verbs baseline */

struct verbs {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	const char *name;
};

/* Own context and PD on the first device. */
void verbs_open(struct verbs *v);
void verbs_close(struct verbs *v);

/* ibv_reg_mr + ibv_dereg_mr of @buf in-process: the times before the reg,
 * after it and after the dereg in @t[0..2]. */
void verbs_reg_dereg(const struct verbs *v, void *buf, size_t len, int access, double t[3]);

/* A MAP_SHARED memfd of @len bytes with every page written. */
void *memfd_buffer(size_t len);
/* The same, never touched: no page exists yet. */
void *memfd_buffer_fresh(size_t len);

/* ---------------------------------------------------------------- odpd */

struct odpd_conn *connect_odpd(const char *sock);

/* An odpd_alloc() segment of @len bytes with every page written. */
struct odpd_segment *segment(struct odpd_conn *c, size_t len);

/* ---------------------------------------------------------------- a bare round trip */

/* A forked child serving one end of a SOCK_SEQPACKET socketpair: it keeps
 * only that socket (as fd 3) besides 0-2, and @keep_fd as fd 4 if it is not
 * -1, so no copy of another of ours outlives our close of it, runs
 * @serve(3, @arg) and exits with its status (0: the peer closed). Returns
 * our end; the child's pid in @ret_pid. End it with child_stop(). */
int child_start(int (*serve)(int fd, void *arg), void *arg, int keep_fd, pid_t *ret_pid);
/* Close our end and wait for the child; dies if it failed. */
void child_stop(int fd, pid_t pid);

/* A child that echoes SOCK_SEQPACKET packets back: the socket to it (fork
 * before any verbs or odpd state exists); one 64-byte round trip. */
int echo_start(pid_t *ret_pid);
void echo_rtt(int fd);

#endif
