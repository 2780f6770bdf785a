/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Batches: MRs out of the cache, deregistered together on a worker, and the
 * waiters that a flush barrier or a deregistration hangs on them. Also the
 * deferrals: an invalidated or dead MR that verifies still read through
 * gets a batch number reserved now (mr_defer) and is batched when the last
 * verify ends (verifyjob.c), so that a flush waits for it too.
 *
 * Owns: struct odpd_batch (registry->batches), struct odpd_waiter
 * (registry->waiters), struct odpd_deferred (registry->deferred).
 * Invariants: batch numbers only grow; a waiter fires once, never from
 * inside the call that made it (waiter_fire_later); an MR is in at most
 * one batch, by batch_next; a batch that cannot be allocated deregisters on
 * the loop rather than leak a pin. A batch's end hands each MR to
 * mrlife.c (mr_strip / mr_free), which alone frees.
 * Callers: every part that invalidates (relaxed, lookup, hits, holder, reg,
 * verifyjob, core).
 */

#include "internal.h"

/* A batch of MRs deregistered together on a worker. */
struct odpd_batch {
	struct odpd_job job;
	LIST_ENTRY(odpd_batch) link;
	struct odpd_registry *r;
	uint64_t seq;
	struct odpd_mr *mrs;                /* by batch_next */
	unsigned n;
	unsigned n_dereg;                   /* of them registered in the kernel */
	uint64_t bytes;
	bool flush;                         /* a flush, not a plain deregistration */
	bool implicit_only;                 /* of implicit MRs only: no barrier waits for it */
	unsigned registrar_waits;           /* implicit MRs' registrars yet to answer:
					     * submitted once none is left */
};

/* An MR a verify reads through when it was invalidated or its device went
 * away (dead_stage 1): verify_done batches it under the number reserved here. */
struct odpd_deferred {
	struct odpd_deferred *next;
	struct odpd_mr *mr;
	uint64_t seq;                       /* 0: none reserved (no memory for this) */
};

/* Someone waiting for batches: a flush barrier (every batch up to seq) or a
 * deregistration (that one batch). */
struct odpd_waiter {
	LIST_ENTRY(odpd_waiter) link;
	uint64_t seq;
	bool only;
	uint64_t own;                       /* the batch whose MRs it counts, 0: none */
	odpd_done_cb cb;
	void *arg;
	unsigned mrs;
	uint64_t bytes;
};

void mr_defer(struct odpd_registry *r, struct odpd_mr *mr);
uint64_t mr_undefer(struct odpd_registry *r, struct odpd_mr *mr);
void implicit_dereg_answered(void *arg, int rc, const struct odpd_err *err, uint32_t handle);
void waiters_check(struct odpd_registry *r, bool later);
void start_batch_seq(struct odpd_registry *r, struct odpd_mr *list, bool flush, struct odpd_waiter *w,
			    uint64_t seq);
void start_batch(struct odpd_registry *r, struct odpd_mr *list, bool flush, struct odpd_waiter *w);
bool batch_on_loop(struct odpd_registry *r, struct odpd_mr *list);
/* @list is one MR batch_on_loop would take, but for the witness lock. */
bool batch_loop_kind(const struct odpd_mr *list);
