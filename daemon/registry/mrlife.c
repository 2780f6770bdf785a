/* SPDX-License-Identifier: MIT */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "odpd.pb-c.h"
#include "implicit.h"
#include "verify.h"
#include "batch.h"
#include "charge.h"
#include "hits.h"
#include "lookup.h"
#include "mrlife.h"
#include "keep.h"
#include "pds.h"
#include "relaxed.h"
#include "internal.h"

const struct odpd_keep *odpd_keep;

/* MRs and references come from slabs, whose objects are 8-byte aligned. */
_Static_assert(_Alignof(struct odpd_mr) <= 8 && _Alignof(struct odpd_ref) <= 8,
	       "struct odpd_mr and struct odpd_ref must fit the slab's 8-byte alignment");

const char *odpd_mr_state_name(enum odpd_mr_state s)
{
	switch (s) {
	case ODPD_MR_REGISTERING: return "registering";
	case ODPD_MR_LIVE: return "live";
	case ODPD_MR_RELAXED: return "relaxed";
	case ODPD_MR_INVALIDATING: return "invalidating";
	case ODPD_MR_DEAD: return "dead";
	case ODPD_MR_DEFERRED: return "invalidating (a verify reads through it)";
	case ODPD_MR_DEAD_DEFERRED: return "dead (a verify reads through it)";
	case ODPD_MR_DEAD_BATCHED: return "dead (being deregistered)";
	}
	return "?";
}

unsigned odpd_mr_wire_state(const struct odpd_mr *mr)
{
	switch ((enum odpd_mr_state)mr->state) {
	case ODPD_MR_DEFERRED:
		return ODPD_MR_INVALIDATING;
	case ODPD_MR_DEAD_DEFERRED:
	case ODPD_MR_DEAD_BATCHED:
		return ODPD_MR_DEAD;
	default:
		return mr->state;
	}
}

/* The transitions of registry.h's table: legal[from] has bit @to set. */
#define TO(s) (1u << (s))
static const unsigned legal[ODPD_MR_N_STATES] = {
	[ODPD_MR_REGISTERING] = TO(ODPD_MR_LIVE) | TO(ODPD_MR_INVALIDATING) | TO(ODPD_MR_DEAD),
	[ODPD_MR_LIVE] = TO(ODPD_MR_RELAXED) | TO(ODPD_MR_INVALIDATING) | TO(ODPD_MR_DEFERRED) |
			 TO(ODPD_MR_DEAD_BATCHED) | TO(ODPD_MR_DEAD_DEFERRED),
	[ODPD_MR_RELAXED] = TO(ODPD_MR_LIVE) | TO(ODPD_MR_INVALIDATING) | TO(ODPD_MR_DEFERRED),
	[ODPD_MR_INVALIDATING] = TO(ODPD_MR_DEAD),
	[ODPD_MR_DEAD] = 0,
	[ODPD_MR_DEFERRED] = TO(ODPD_MR_INVALIDATING),
	[ODPD_MR_DEAD_DEFERRED] = TO(ODPD_MR_DEAD_BATCHED),
	[ODPD_MR_DEAD_BATCHED] = TO(ODPD_MR_DEAD),
};
#undef TO

bool odpd_mr_transition_legal(enum odpd_mr_state from, enum odpd_mr_state to)
{
	return (unsigned)from < ODPD_MR_N_STATES && (unsigned)to < ODPD_MR_N_STATES &&
	       (legal[from] >> to & 1);
}

void mr_set_state(struct odpd_mr *mr, enum odpd_mr_state to)
{
	if (!odpd_mr_transition_legal(mr->state, to)) {
		log_error("MR %" PRIu64 ": no transition from %s to %s", mr->node.seq,
			  odpd_mr_state_name(mr->state), odpd_mr_state_name(to));
		assert(!"an MR state transition that registry.h does not list");
	}
	mr->state = to;
	keep_mr(mr);
}

bool odpd_mr_may_free(const struct odpd_mr *mr)
{
	return mr->state == ODPD_MR_DEAD && mr->refs == 0 && mr->busy == 0;
}

/* Issue 11: odpd's own memory per cached MR <= 256 bytes, of which
 * libibverbs' MR object takes 64 (bench/run-mem measures the whole). */
_Static_assert(sizeof(struct odpd_mr) <= 192, "struct odpd_mr grew past 192 bytes");
_Static_assert(ODPD__ACCESS__ACCESS_REMOTE_ATOMIC < 16, "Odpd__Access needs more than mr->access's 4 bits");

/*
 * Invalidate: out of the cache and the queue, a new generation, into @list
 * (INVALIDATING), or, while a verify reads through it on a worker (its
 * reference was revoked or released meanwhile), DEFERRED: batched when the
 * last verify ends. From REGISTERING, LIVE or RELAXED.
 */
void mr_invalidate(struct odpd_registry *r, struct odpd_mr *mr, struct odpd_mr **list)
{
	if (mr->state == ODPD_MR_RELAXED)
		relaxed_remove(r, mr);
	mr_unindex(mr);
	mr->invalidated = true;
	if (mr->busy) {
		mr_set_state(mr, ODPD_MR_DEFERRED);
		mr_defer(r, mr);
		return;
	}
	mr_set_state(mr, ODPD_MR_INVALIDATING);
	mr->batch_next = *list;
	*list = mr;
}

/*
 * Live @mr's device went away: out of the cache and its holders' hit
 * tables, into @list (DEAD_BATCHED) or, while a verify reads through it,
 * DEAD_DEFERRED. Its holders keep their references until they release them.
 */
void mr_kill(struct odpd_registry *r, struct odpd_mr *mr, struct odpd_mr **list)
{
	mr_unindex(mr);
	mr->invalidated = true;
	mr_hits_invalidate(mr);
	if (mr->busy) {
		mr_set_state(mr, ODPD_MR_DEAD_DEFERRED);
		mr_defer(r, mr);                  /* verify_done batches it */
		return;
	}
	mr_set_state(mr, ODPD_MR_DEAD_BATCHED);
	mr->batch_next = *list;
	*list = mr;
}

/* The last verify through deferred @mr ended: into a batch of its own,
 * under the number reserved for it. */
void mr_undefer_batch(struct odpd_registry *r, struct odpd_mr *mr)
{
	mr_set_state(mr, mr->state == ODPD_MR_DEFERRED ? ODPD_MR_INVALIDATING : ODPD_MR_DEAD_BATCHED);
	mr->batch_next = NULL;
	start_batch_seq(r, mr, false, NULL, mr_undefer(r, mr));
}

/* The MR is gone from the kernel (or never was): release its charges, pins
 * and PD, on the loop. What is left is the struct, which mr_gc frees. */
static void mr_strip(struct odpd_registry *r, struct odpd_mr *mr)
{
	struct odpd_domain *d = mr->dom;

	mr->cached = false;
	while (odpd_mr_first_charge(mr))
		charge_drop(r, mr, odpd_mr_first_charge(mr));
	global_uncharge(r, mr);
	map_remove(mr);
	if (mr->implicit) {
		r->odp.mrs--;
		r->odp.implicit_mrs--;
	} else if (!mr->pinned) {
		r->odp.mrs--;
		r->odp.bytes -= odpd_mr_length(mr);
	}
	if (d) {
		mr->dom = NULL;
		d->n_mrs--;
		domain_maybe_close(r, d, false);
	}
}

static void mr_free(struct odpd_registry *r, struct odpd_mr *mr)
{
	assert(odpd_mr_may_free(mr));
	r->n_mrs--;
	keep_mr_free(mr);
	keep_limbo_leave(mr->limbo);         /* (a deregistration that failed, a device gone) */
	if (mr->map)
		odpd_mapping_put(r->segs, mr->map);
	if (mr->implicit)
		odpd_registrar_put(mr->registrar);
	odpd_slab_free(&r->mr_slab, mr);
}

void mr_gc(struct odpd_registry *r, struct odpd_mr *mr)
{
	if (odpd_mr_may_free(mr))
		mr_free(r, mr);
}

void mr_dead(struct odpd_registry *r, struct odpd_mr *mr)
{
	mr_set_state(mr, ODPD_MR_DEAD);
	mr_strip(r, mr);
	mr_gc(r, mr);
}
