/* SPDX-License-Identifier: MIT */
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
#include "lookup.h"
#include "mrlife.h"
#include "pds.h"
#include "relaxed.h"
#include "internal.h"

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
	}
	return "?";
}

/* Issue 11: odpd's own memory per cached MR <= 256 bytes, of which
 * libibverbs' MR object takes 64 (bench/run-mem measures the whole). */
_Static_assert(sizeof(struct odpd_mr) <= 184, "struct odpd_mr grew past 184 bytes");
_Static_assert(ODPD__ACCESS__ACCESS_REMOTE_ATOMIC < 16, "Odpd__Access needs more than mr->access's 4 bits");

/* Invalidate: out of the cache and the queue, a new generation, into @list. */
void mr_invalidate(struct odpd_registry *r, struct odpd_mr *mr, struct odpd_mr **list)
{
	if (mr->state == ODPD_MR_RELAXED)
		relaxed_remove(r, mr);
	mr_unindex(mr);
	mr->state = ODPD_MR_INVALIDATING;
	mr->invalidated = true;
	/* A verify reads through it on a worker (its reference was revoked
	 * or released meanwhile): deregistered, and freed, once that is done. */
	if (mr->busy) {
		mr_defer(r, mr);
		return;
	}
	mr->batch_next = *list;
	*list = mr;
}

/* The MR is gone from the kernel: release its charges, pins and PD, on the
 * loop. A dead MR's holders keep the struct until they let go (mr_free). */
void mr_strip(struct odpd_registry *r, struct odpd_mr *mr)
{
	struct odpd_domain *d = mr->dom;

	if (mr->stripped)
		return;
	mr->stripped = true;
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

void mr_free(struct odpd_registry *r, struct odpd_mr *mr)
{
	mr_strip(r, mr);
	r->n_mrs--;
	if (mr->map)
		odpd_mapping_put(r->segs, mr->map);
	if (mr->implicit)
		odpd_registrar_put(mr->registrar);
	odpd_slab_free(&r->mr_slab, mr);
}
