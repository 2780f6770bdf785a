/* SPDX-License-Identifier: MIT */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <sys/queue.h>
#include <infiniband/verbs.h>

#include "device.h"
#include "error.h"

struct odpd_verifier;
struct odpd_shared_pd;
struct odpd_bucket;

/* Client-PD mode: the client's context and PD, imported from its cmd_fd. */
struct odpd_import {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
};

/*
 * A protection domain on one device, in a device context of its own
 * (ibv_open_device), so that the context holds nothing but the objects of
 * that PD's clients (DESIGN.md §4): a client's private PD, or a named shared
 * one. The struct is made on the event loop; the context and PD are opened
 * on a worker by the first registration and closed on a worker once no
 * member and no MR is left.
 */
struct odpd_domain {
	struct odpd_device *dev;
	unsigned dev_index;
	struct odpd_shared_pd *spd;         /* NULL: private (or closing) */
	uint64_t owner_id;                  /* private: the client's id */
	/* Workers: opening, and the verifier's QPs, one job at a time. */
	pthread_mutex_t lock;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct odpd_verifier *verifier;     /* created on first verify */
	bool exported;                      /* its cmd_fd went to a client (ImportPd) */
	/* Event loop. */
	LIST_ENTRY(odpd_domain) link;
	unsigned members;
	unsigned n_mrs;
	LIST_HEAD(, odpd_bucket) buckets;
};

/* On the loop: the struct only. NULL on ENOMEM. */
struct odpd_domain *odpd_domain_new(struct odpd_device *dev, unsigned dev_index);
/* Worker, under d->lock: open the context and PD if not yet open. */
int odpd_domain_open_locked(struct odpd_domain *d, struct odpd_err *err);
/* Worker: destroy the verifier, the PD and the context, and free. MRs must be gone. */
void odpd_domain_close(struct odpd_domain *d);
