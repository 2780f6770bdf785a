/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Implicit ODP: odpd's side of odpd-registrar (registrar-proto.h).
 *
 * A private PD that asks for an implicit ODP MR gets a registrar: a fresh
 * process (posix_spawn of odpd-registrar, never a fork of odpd) that maps
 * its client's segments at the client's addresses, imports the PD and
 * registers ibv_reg_mr(pd, NULL, SIZE_MAX, ...|ON_DEMAND) there. The MR
 * lives in the PD's context, so odpd imports it by handle and treats it
 * like its other MRs; only registration and deregistration go through the
 * registrar.
 *
 * Threads: maps are the event loop's (asynchronous, answered in order);
 * init, reg and dereg are the workers' (synchronous, one at a time).
 */

#include <stdbool.h>
#include <stdint.h>
#include <pthread.h>
#include <sys/types.h>
#include <event2/event.h>

#include "error.h"
#include "pool.h"

struct odpd_registrar;

/* The binary: $ODPD_REGISTRAR, else the installed one. */
const char *odpd_registrar_path(void);

/* Loop: start a registrar that runs as @uid/@gid (the client's: an implicit
 * MR reaches the registrar's own memory too, so it must hold nothing the
 * client could not). 0 or -errno with @err. One reference, the caller's. */
int odpd_registrar_spawn(struct event_base *base, const char *label, uid_t uid, gid_t gid,
			 struct odpd_registrar **ret, struct odpd_err *err);
/* References: the domain's, and one per implicit MR it registered. The
 * last put frees the struct (the process is reaped apart: reap, discard). */
void odpd_registrar_get(struct odpd_registrar *g);
void odpd_registrar_put(struct odpd_registrar *g);

/* Loop: map @fd's [offset, offset + length) at the client's address @addr in
 * the registrar, as @id (a dup of @fd waits in odpd's queue until the
 * socket takes it). @cb(arg, 0 or -errno, err) runs on the loop when it
 * answers, never inside this call (-EPIPE if it died, hung for 10 s, or was
 * stopped first). Returns 0 (cb will run) or -errno (it will not; -EPIPE:
 * the registrar is dead). */
typedef void (*odpd_registrar_cb)(void *arg, int rc, const struct odpd_err *err);
int odpd_registrar_map(struct odpd_registrar *g, uint64_t id, int fd, uint64_t addr, uint64_t length,
		       uint64_t offset, bool writable, odpd_registrar_cb cb, void *arg);
/* Loop: unmap @id (in order after earlier maps; the answer is only logged). */
void odpd_registrar_unmap(struct odpd_registrar *g, uint64_t id);

/* Workers, one call at a time per registrar: import the PD (once; @cmd_fd
 * is sent, not taken), register an implicit ODP MR with @access
 * (enum ibv_access_flags), deregister one. 0 or -errno with @err. */
int odpd_registrar_init(struct odpd_registrar *g, int cmd_fd, uint32_t pd_handle, struct odpd_err *err);
bool odpd_registrar_ready(struct odpd_registrar *g);
int odpd_registrar_reg(struct odpd_registrar *g, uint32_t access, uint32_t *ret_handle, struct odpd_err *err);
int odpd_registrar_dereg(struct odpd_registrar *g, uint32_t handle, struct odpd_err *err);

/* Loop: stop talking to it: pending maps get -EPIPE, and the maps socket is
 * closed (the registrar exits on EOF). Then, on a worker, reap it: wait
 * for its exit (SIGKILL after a few seconds) and drop the domain's
 * reference. */
void odpd_registrar_stop(struct odpd_registrar *g);
void odpd_registrar_reap(struct odpd_registrar *g);
/* Loop: stop, then reap on a worker of @pool (a registrar that no domain keeps). */
void odpd_registrar_discard(struct odpd_registrar *g, struct odpd_pool *pool);
pid_t odpd_registrar_pid(const struct odpd_registrar *g);
/* Has it exited (or stopped answering)? Then its implicit MRs reach nothing:
 * a new registrar takes its place at the next implicit request. */
bool odpd_registrar_dead(struct odpd_registrar *g);
