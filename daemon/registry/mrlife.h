/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The MR's life: the one transition function (mr_set_state, which asserts
 * every change is in registry.h's table), invalidation (out of the cache for
 * good, a new generation, into a batch or deferred to its verifies), a
 * device's death, and the one place an MR is freed (mr_gc).
 *
 * Owns: mr->state, and the MR's memory (its mr_slab object): who may hold
 * a pointer to an MR is its holders' references (mr->refs, with an admin
 * verify's own), the verifies reading through it (mr->busy), a batch or
 * the deferred list while it is in one, the relaxed queue while RELAXED,
 * and a registration job while REGISTERING.
 * Invariants: an MR is freed only by mr_gc, once DEAD with no reference and
 * no verify; DEAD means stripped (charges, pins, PD released).
 * Callers: every part that ends an MR's use; the transition table is also
 * open to tests (odpd_mr_transition_legal).
 */

#include "internal.h"

/* Is @from -> @to one of registry.h's transitions? */
bool odpd_mr_transition_legal(enum odpd_mr_state from, enum odpd_mr_state to);
/* The one way an MR changes state; asserts the transition is legal (and
 * logs it, where asserts are compiled out). */
void mr_set_state(struct odpd_mr *mr, enum odpd_mr_state to);
/* Nothing may reach @mr any more: DEAD, no reference, no verify. */
bool odpd_mr_may_free(const struct odpd_mr *mr);

void mr_invalidate(struct odpd_registry *r, struct odpd_mr *mr, struct odpd_mr **list);
void mr_kill(struct odpd_registry *r, struct odpd_mr *mr, struct odpd_mr **list);
void mr_undefer_batch(struct odpd_registry *r, struct odpd_mr *mr);
/* Deregistered (a batch is done) or never registered: DEAD, stripped, and
 * freed unless references are left (mr_gc). */
void mr_dead(struct odpd_registry *r, struct odpd_mr *mr);
/* Free @mr if nothing may reach it any more (odpd_mr_may_free). */
void mr_gc(struct odpd_registry *r, struct odpd_mr *mr);
