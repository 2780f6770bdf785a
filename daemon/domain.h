/* SPDX-License-Identifier: MIT */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/queue.h>
#include <infiniband/verbs.h>

#include "device.h"
#include "error.h"

struct odpd_verifier;
struct odpd_shared_pd;

/*
 * Client-PD mode: a client's device context, imported from its cmd_fd once
 * per connection and shared by that connection's MRs in it (each MR imports
 * its PD by handle). Counted references: the connection's list holds one,
 * each MR and each registration in flight one; whoever drops the last
 * closes our copy of the client's fd (ibv_close_device), so a disconnected
 * client's context is never kept alive by odpd.
 */
struct odpd_client_ctx {
	LIST_ENTRY(odpd_client_ctx) link;   /* in its holder's list (the loop) */
	bool linked;
	pthread_mutex_t lock;               /* workers: import once */
	int fd;                             /* ours; owned by ctx once imported */
	struct ibv_context *ctx;            /* NULL until imported */
	atomic_uint refs;
};

/* On the loop: take @fd (closed on failure). NULL on ENOMEM. One reference. */
struct odpd_client_ctx *odpd_client_ctx_new(int fd);
/* Is @fd the same open file as @c's (kcmp)? False where kcmp is unavailable. */
bool odpd_client_ctx_is(const struct odpd_client_ctx *c, int fd);
void odpd_client_ctx_get(struct odpd_client_ctx *c);
/* Drop a reference (none for NULL); the last closes the context, which can
 * destroy a dead client's objects: prefer workers. */
void odpd_client_ctx_put(struct odpd_client_ctx *c);
/* Worker: import the context if not yet done. 0 or -errno with @err. */
int odpd_client_ctx_import(struct odpd_client_ctx *c, struct odpd_err *err);

/* What a client-PD MR holds. */
struct odpd_import {
	struct odpd_client_ctx *cctx;
	struct ibv_pd *pd;                  /* imported by handle into cctx->ctx */
};

/*
 * A protection domain on one device, in a device context of its own
 * (ibv_open_device), so that the context holds nothing but the objects of
 * that PD's clients (doc/design.md §8.1): a client's private PD, or a
 * named shared one. The struct is made on the event loop; the context and PD are opened
 * on a worker by the first registration and closed on a worker once no
 * member and no MR is left.
 */
struct odpd_domain {
	struct odpd_device *dev;
	unsigned dev_index;
	struct odpd_shared_pd *spd;         /* NULL: private (or closing) */
	uint64_t owner_id;                  /* private: the client's id */
	/* Workers: opening, and taking or putting back the verifier (a verify
	 * takes it for its run: it holds the lock only for that). */
	pthread_mutex_t lock;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct odpd_verifier *verifier;     /* an idle one, kept for verify-idle-ms; or NULL */
	bool exported;                      /* its cmd_fd went to a client (ImportPd) */
	/* Its id in the journal and the fd store ("ctx-ID"; journal.h): given
	 * by the first worker that tracks an MR of it, or the first record. */
	unsigned save_id;
	bool jstored;                       /* its context's fd is in systemd's fd store */
	/* Implicit ODP (implicit.h): the loop's only; reaped on the loop
	 * before the close job runs (by odpd_domain_close only when no job
	 * could be made). */
	struct odpd_registrar *registrar;
	/* Event loop. */
	LIST_ENTRY(odpd_domain) link;
	unsigned members;
	unsigned n_mrs;
	unsigned jobs;                      /* verify, advise, export, verifier jobs in flight */
	unsigned verifies;                  /* of them, verifies */
	bool retired;                       /* its device went away: detached, closes when idle */
	/* In the registry's list of verifiers kept idle (oldest first) until
	 * verifier_idle_at (ms, CLOCK_MONOTONIC); 0: not in it. */
	TAILQ_ENTRY(odpd_domain) idle_link;
	uint64_t verifier_idle_at;
};

/* On the loop: the struct only. NULL on ENOMEM. */
struct odpd_domain *odpd_domain_new(struct odpd_device *dev, unsigned dev_index);
/* Worker, under d->lock: open the context and PD if not yet open. */
int odpd_domain_open_locked(struct odpd_domain *d, struct odpd_err *err);
/* Worker: destroy the verifier, the PD and the context, and free. MRs must be gone. */
void odpd_domain_close(struct odpd_domain *d);
