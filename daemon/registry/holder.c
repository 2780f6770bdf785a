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
#include "cctx.h"
#include "charge.h"
#include "hits.h"
#include "holder.h"
#include "mrlife.h"
#include "pds.h"
#include "relaxed.h"
#include "internal.h"
#include "keep.h"

/* ---------------------------------------------------------------- references */

/* Handles are a client's sequence numbers: their low bits spread them. */
static void ref_index_put(struct odpd_ref **index, uint32_t size, struct odpd_ref *ref)
{
	struct odpd_ref **b = &index[ref->handle & (size - 1)];

	ref->index_next = *b;
	*b = ref;
}

/* Rebuild the index with twice the slots (at least 64) when the references
 * outnumber them: true, and every reference is in it. False: unchanged
 * (out of memory: its chains get longer; no index: lookups scan refs). */
static bool ref_index_grow(struct odpd_holder *h)
{
	uint32_t size = h->ref_index_size ? h->ref_index_size * 2 : 64;
	struct odpd_ref **index, *ref;

	if (h->n_refs <= h->ref_index_size || size > (1u << 30) || !(index = calloc(size, sizeof(*index))))
		return false;
	LIST_FOREACH(ref, &h->refs, hlink)
		ref_index_put(index, size, ref);
	free(h->ref_index);
	h->ref_index = index;
	h->ref_index_size = size;
	return true;
}

static void ref_index_del(struct odpd_holder *h, struct odpd_ref *ref)
{
	struct odpd_ref **pp;

	if (!h->ref_index)
		return;
	for (pp = &h->ref_index[ref->handle & (h->ref_index_size - 1)]; *pp; pp = &(*pp)->index_next)
		if (*pp == ref) {
			*pp = ref->index_next;
			return;
		}
}

struct odpd_ref *ref_new(struct odpd_registry *r, struct odpd_holder *h, struct odpd_mr *mr,
				const struct odpd_reg_req *q)
{
	struct odpd_ref *ref = odpd_slab_zalloc(&r->ref_slab);

	if (!ref)
		return NULL;
	ref->holder = h;
	ref->mr = mr;
	ref->handle = q->handle;
	ref->iova = q->iova;
	ref->length = q->length;
	ref->cookie = q->cookie;
	LIST_INSERT_HEAD(&h->refs, ref, hlink);
	h->n_refs++;
	if (!(h->n_refs > h->ref_index_size && ref_index_grow(h)) && h->ref_index)
		ref_index_put(h->ref_index, h->ref_index_size, ref);
	odpd_account_hold(h->acct, ODPD_UL_MRS, 1);
	LIST_INSERT_HEAD(&mr->holders, ref, mlink);
	mr->refs++;
	h->n_odp_refs += mr->implicit || !mr->pinned;
	ref_hit_slot(r, h, ref, q);
	keep_ref(h->id, ref, false);
	keep_mr(mr);
	return ref;
}

struct odpd_ref *odpd_holder_find_ref(struct odpd_holder *h, uint64_t handle)
{
	struct odpd_ref *ref;

	if (h->ref_index) {
		for (ref = h->ref_index[handle & (h->ref_index_size - 1)]; ref; ref = ref->index_next)
			if (ref->handle == handle)
				return ref;
		return NULL;
	}
	LIST_FOREACH(ref, &h->refs, hlink)
		if (ref->handle == handle)
			return ref;
	return NULL;
}

/* Drop @ref. A last, non-relaxed reference puts the MR on *@dereg. */
void ref_drop(struct odpd_registry *r, struct odpd_ref *ref, bool relaxed, struct odpd_mr **dereg)
{
	struct odpd_holder *h = ref->holder;
	struct odpd_mr *mr = ref->mr;
	struct odpd_charge *c = charge_find(mr, h->acct);

	keep_ref(h->id, ref, true);
	keep_mr(mr);
	h->n_odp_refs -= mr->implicit || !mr->pinned;
	LIST_REMOVE(ref, hlink);
	ref_index_del(h, ref);
	h->n_refs--;
	odpd_account_hold(h->acct, ODPD_UL_MRS, -1);
	LIST_REMOVE(ref, mlink);
	mr->refs--;
	ref_slot_end(r, ref, true);
	odpd_slab_free(&r->ref_slab, ref);
	if (c && --c->refs == 0 && (mr->refs > 0 || !relaxed || !mr->cached))
		charge_drop(r, mr, c);
	if (mr->refs > 0)
		return;
	if (mr->state != ODPD_MR_LIVE) {
		/* its device went away: deregistered already (DEAD): freed
		 * now; in a batch or waiting for a verify: that frees it */
		mr_gc(r, mr);
		return;
	}
	if (relaxed && mr->cached) {
		/* c (refs 0) stays: the relaxed MR is still charged to its last holder */
		mr_set_state(mr, ODPD_MR_RELAXED);
		mr->relaxed_ms = (uint32_t)((now_ns() + 999999) / 1000000);  /* never early */
		mr->relaxed_pid = h->pid;
		mr->relaxed_by = h->id;
		TAILQ_INSERT_TAIL(&r->relaxed, mr, rlink);
		r->n_relaxed++;
		r->relaxed_bytes += odpd_mr_length(mr);
		if (r->n_relaxed > r->conf->relaxed_max_mrs || r->relaxed_bytes > r->conf->relaxed_max_bytes)
			r->stats.inv_eviction += flush_queue(r, "relaxed-max-mrs or relaxed-max-bytes passed");
		else if (r->n_relaxed == 1)
			relaxed_arm(r);
		return;
	}
	mr_invalidate(r, mr, dereg);
}

int odpd_registry_release(struct odpd_registry *r, struct odpd_ref *ref, bool relaxed,
			  odpd_done_cb cb, void *arg)
{
	struct odpd_mr *mr = ref->mr, *list = NULL;
	/* the last reference of an MR a verify reads through: deferred (mr_defer) */
	bool deferred = !relaxed && mr->refs == 1 && mr->busy && mr->state == ODPD_MR_LIVE;
	struct odpd_waiter *w;
	uint64_t seq = 0;

	ref_drop(r, ref, relaxed, &list);
	if (list && !deferred && !cb && r->take_later && batch_loop_kind(list)) {
		list->batch_next = r->later;     /* after the answer (odpd_registry_run_later) */
		r->later = list;
		return 0;
	}
	if (list && !deferred && batch_on_loop(r, list))
		return 0;
	if (deferred)
		for (const struct odpd_deferred *d = r->deferred; d && !seq; d = d->next)
			seq = d->mr == mr ? d->seq : 0;
	if (!list && !seq)
		return 0;
	w = cb ? calloc(1, sizeof(*w)) : NULL;  /* no @cb: nobody waits (DeregMr.no_reply) */
	if (w) {
		w->cb = cb;
		w->arg = arg;
	}
	if (list) {
		start_batch(r, list, false, w);
	} else if (w) {
		/* its batch gets the number reserved for it (verify_done) */
		w->seq = w->own = seq;
		w->only = true;
		LIST_INSERT_HEAD(&r->waiters, w, link);
	}
	return w ? 1 : 0;
}

void odpd_registry_run_later(struct odpd_registry *r)
{
	struct odpd_mr *mr;

	while ((mr = r->later)) {
		r->later = mr->batch_next;
		mr->batch_next = NULL;
		if (!batch_on_loop(r, mr))       /* a worker pins in its segment */
			start_batch(r, mr, false, NULL);
	}
}

/* ---------------------------------------------------------------- holders and PDs */

int odpd_holder_init(struct odpd_registry *r, struct odpd_holder *h, uint64_t id, pid_t pid, uid_t uid,
		     const struct odpd_limit *limit)
{
	memset(h, 0, sizeof(*h));
	h->id = id;
	h->pid = pid;
	h->uid = uid;
	h->limit = *limit;
	LIST_INIT(&h->refs);
	LIST_INIT(&h->cctxs);
	h->domains = calloc(ODPD_MAX_DEVICES, sizeof(*h->domains));
	h->acct = odpd_account_get(&r->quota, uid);
	if (!h->domains || !h->acct) {
		free(h->domains);
		odpd_account_put(&r->quota, h->acct);
		return -ENOMEM;
	}
	LIST_INSERT_HEAD(&r->holders, h, rlink);
	return 0;
}

static bool match_remote_owned(const struct odpd_mr *mr, const void *arg)
{
	return (mr->access & ACCESS_REMOTE) && mr->owner_id == *(const uint64_t *)arg;
}

void odpd_holder_release(struct odpd_registry *r, struct odpd_holder *h)
{
	struct odpd_mr *list = NULL;

	while (!LIST_EMPTY(&h->refs))
		ref_drop(r, LIST_FIRST(&h->refs), false, &list);
	if (h->hits) {
		odpd_account_hold(h->acct, ODPD_UL_MAPPED, -(int64_t)odpd_hittab_mapped(odpd_hittab_slots(h->hits),
											 odpd_hittab_ring(h->hits)));
		if (odpd_hittab_ring(h->hits))
			LIST_REMOVE(h, ring_link);
		odpd_account_hold(h->acct, ODPD_UL_MAPPINGS, -ODPD_HIT_MAPPINGS);
		odpd_hittab_close(h->hits);
		h->hits = NULL;
		r->n_hit_tables--;
		hits_arm(r);
	}
	/* Remote keys it released relaxed die with it (doc/design.md §8.3). */
	collect_relaxed(r, match_remote_owned, &h->id, &list);
	for (unsigned i = 0; i < r->devices->n; i++)
		if (h->domains[i])
			domain_leave(r, h->domains[i], &list);
	if (h->spd) {
		struct odpd_shared_pd *spd = h->spd;
		spd->members--;
		for (unsigned i = 0; i < r->devices->n; i++)
			if (spd->doms[i])
				domain_leave(r, spd->doms[i], &list);
		shared_maybe_free(r, spd);
	}
	if (list)
		start_batch(r, list, false, NULL);
	holder_drop_client_ctxs(r, h);
	relaxed_arm(r);
	free(h->ref_index);
	h->ref_index = NULL;
	h->ref_index_size = 0;
	free(h->domains);
	h->domains = NULL;
	odpd_account_put(&r->quota, h->acct);
	h->acct = NULL;
	if (r->hit_cursor == h)
		r->hit_cursor = LIST_NEXT(h, rlink);
	if (r->hole_cursor == h)
		r->hole_cursor = LIST_NEXT(h, rlink);
	LIST_REMOVE(h, rlink);
}
