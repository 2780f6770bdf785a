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
 * Threads: everything here is the event loop's. The registrar runs as the
 * client's uid, which may stop it (SIGSTOP): so no thread of odpd ever
 * waits for it. Its two sockets are on the loop; each call is queued, sent
 * as the socket takes it and answered through its callback, in order per
 * socket, or failed when the registrar's oldest call is late (a loop timer:
 * 10 s for a map, 2 s for a verb; then the registrar is killed), when it
 * exits or misbehaves, or when it is stopped. A callback never runs inside
 * the call that queued it.
 */

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <event2/event.h>

#include "error.h"

struct odpd_registrar;

/* The binary: $ODPD_REGISTRAR, else the installed one. */
const char *odpd_registrar_path(void);

/* Start a registrar that runs as @uid/@gid (the client's: an implicit MR
 * reaches the registrar's own memory too, so it must hold nothing the
 * client could not). 0 or -errno with @err. One reference, the caller's. */
int odpd_registrar_spawn(struct event_base *base, const char *label, uid_t uid, gid_t gid,
			 struct odpd_registrar **ret, struct odpd_err *err);
/* References: the domain's (given back by reaping it), each implicit MR's,
 * and each call's while it runs. The last put frees the struct. */
void odpd_registrar_get(struct odpd_registrar *g);
void odpd_registrar_put(struct odpd_registrar *g);

/* Map @fd's [offset, offset + length) at the client's address @addr in
 * the registrar, as @id (a dup of @fd waits in odpd's queue until the
 * socket takes it). @cb(arg, 0 or -errno, err) runs when it answers (-EPIPE
 * if it died, did not answer within 10 s, or was stopped first). Returns 0
 * (cb will run) or -errno (it will not; -EPIPE: the registrar is dead). */
typedef void (*odpd_registrar_cb)(void *arg, int rc, const struct odpd_err *err);
int odpd_registrar_map(struct odpd_registrar *g, uint64_t id, int fd, uint64_t addr, uint64_t length,
		       uint64_t offset, bool writable, odpd_registrar_cb cb, void *arg);
/* Unmap @id (in order after earlier maps; the answer is only logged). */
void odpd_registrar_unmap(struct odpd_registrar *g, uint64_t id);

/*
 * Verbs, answered through @cb(arg, 0 or -errno, err, mr_handle) like maps,
 * within 2 s (else -ETIMEDOUT, and the registrar is killed):
 * reg: register an implicit ODP MR with @access (enum ibv_access_flags);
 * the first one also imports the PD (@cmd_fd of its context is sent, a dup,
 * not taken; @pd_handle), and its failure is the answer. mr_handle: the
 * kernel handle of the new MR, for ibv_import_mr.
 * dereg: deregister the MR of kernel handle @mr_handle (passed back).
 * 0 (cb will run) or -errno (it will not).
 */
typedef void (*odpd_registrar_verb_cb)(void *arg, int rc, const struct odpd_err *err, uint32_t mr_handle);
int odpd_registrar_reg(struct odpd_registrar *g, int cmd_fd, uint32_t pd_handle, uint32_t access,
		       odpd_registrar_verb_cb cb, void *arg);
int odpd_registrar_dereg(struct odpd_registrar *g, uint32_t mr_handle, odpd_registrar_verb_cb cb, void *arg);

/* Stop talking to it: the calls still queued get -EPIPE (inside this call),
 * and both sockets are closed (the registrar exits on EOF). */
void odpd_registrar_stop(struct odpd_registrar *g);
/*
 * Then reap it (stopping it first if not yet): wait on the loop for its
 * exit (SIGKILL after 3 s: a stopped one never exits by itself), collect
 * it, drop the domain's reference and run @done(@arg) (may be NULL) on a
 * later turn (inside this call only when out of memory). reap_now does the
 * same at once (SIGKILL, waitpid): for where the loop cannot wait.
 */
void odpd_registrar_reap(struct odpd_registrar *g, void (*done)(void *arg), void *arg);
void odpd_registrar_reap_now(struct odpd_registrar *g);
pid_t odpd_registrar_pid(const struct odpd_registrar *g);
/* Has it exited (or stopped answering)? Then its implicit MRs reach nothing:
 * a new registrar takes its place at the next implicit request. */
bool odpd_registrar_dead(const struct odpd_registrar *g);
