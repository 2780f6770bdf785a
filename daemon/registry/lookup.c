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
#include "hits.h"
#include "lookup.h"
#include "mrlife.h"
#include "relaxed.h"
#include "witness.h"
#include "internal.h"
#include "keep.h"

/* Into / out of its mapping's tree (loop; workers walk it under tree_lock).
 * Inserted right after mr_new: its id (node.seq) must be the largest in the
 * tree (odpd_itree_insert aborts otherwise: the order would break). */
void map_insert(struct odpd_mr *mr)
{
	pthread_mutex_lock(&mr->map->tree_lock);
	odpd_itree_insert(&mr->map->mrs, &mr->node);
	pthread_mutex_unlock(&mr->map->tree_lock);
	mr->in_map = true;
}

void map_remove(struct odpd_mr *mr)
{
	if (!mr->in_map)
		return;
	/* its witness is over before it is stripped (batch_run, reg_run) */
	if (mr->witnessed) {
		log_error("MR %" PRIu64 " leaves its segment's tree still witnessed", mr->node.seq);
		pthread_mutex_lock(&mr->map->witness_lock);
		mr->witnessed = false;
		pthread_mutex_unlock(&mr->map->witness_lock);
	}
	pthread_mutex_lock(&mr->map->tree_lock);
	odpd_itree_remove(&mr->map->mrs, &mr->node);
	pthread_mutex_unlock(&mr->map->tree_lock);
	mr->in_map = false;
}

/* Take @mr out of the cache: it is never a hit again. It stays in its
 * mapping's tree, where its pins count, until it is stripped. */
void mr_unindex(struct odpd_mr *mr)
{
	mr->cached = false;
}

/* ---------------------------------------------------------------- lookup */


/*
 * Does pinned @mr still pin the segment's pages? Fast: the segment's ctime
 * has not moved since it was last proven. Else its witness pages decide,
 * and a proof moves the baseline to the ctime read before it.
 */
static bool pinned_current(struct odpd_mr *mr, struct lookup *l)
{
	if (!l->ctime_read) {
		l->have_ctime = odpd_mapping_ctime(l->map, &l->ctime) == 0;
		l->ctime_read = true;
	}
	if (!l->have_ctime)
		return false;
	if (mr->ctime_ok && mr->ctime_ns == ts_ns(&l->ctime))
		return true;
	if (!witness_present(l->r, mr))
		return false;
	mr->ctime_ns = ts_ns(&l->ctime);
	mr->ctime_ok = ctime_settled(&l->ctime);
	return true;
}

static bool hit_ok(struct odpd_inode *n, void *arg)
{
	struct odpd_mr *mr = (struct odpd_mr *)n;
	struct lookup *l = arg;

	if (!mr->cached || mr->dom != l->dom || mr->iova - mr->node.start != l->base)
		return false;                   /* another PD's, or mapped elsewhere in the client */
	if (mr->state != ODPD_MR_LIVE && mr->state != ODPD_MR_RELAXED && mr->state != ODPD_MR_REGISTERING)
		return false;
	if (mr->pinned == l->odp)               /* the kind asked for only */
		return false;
	if ((mr->access & l->access) != l->access)
		return false;
	/* A remote key is served again only to its owner, for the same range:
	 * nobody else may extend its life or its reach. */
	if ((mr->access & ACCESS_REMOTE) &&
	    (mr->owner_id != l->h->id || mr->node.start != l->s || mr->node.end != l->e))
		return false;
	if (mr->state == ODPD_MR_REGISTERING) {
		/* on a worker now: wait for it, unless a registered one serves */
		if (!l->registering)
			l->registering = mr;
		return false;
	}
	if (mr->pinned && !pinned_current(mr, l)) {
		/* The segment's pages were replaced (hole punched): this MR
		 * pins orphans. Never serve it again; replace it. */
		mr->batch_next = l->stale;
		l->stale = mr;
		return false;
	}
	return true;
}

/* Out of the cache; deregistered now if nobody holds it. */
static void retire_stale(struct odpd_registry *r, struct odpd_mr *stale)
{
	struct odpd_mr *list = NULL, *next;

	for (struct odpd_mr *mr = stale; mr; mr = next) {
		next = mr->batch_next;
		r->stats.replaced++;
		if (mr->state == ODPD_MR_RELAXED) {
			mr_invalidate(r, mr, &list);
		} else {
			mr_unindex(mr);
			mr->invalidated = true;
			mr_hits_invalidate(mr);
			keep_mr(mr);             /* (not cached, invalidated: the journal too) */
		}
	}
	if (list) {
		start_batch(r, list, true, NULL);
		relaxed_arm(r);
	}
}

/*
 * Holes under what client libraries serve by themselves (hit tables): a
 * pinned MR of @h's table whose pages a punched hole replaced is retired as
 * a lookup would (its slots marked invalid), so that no local hit serves it
 * again. The daemon's own lookups find such MRs when they reach them; a
 * library answering in-process never asks, so the daemon looks: every
 * hole-check-ms while any slot covers a pinned MR, and at every flush of
 * the holders it selects. A pass starts with ++r->hole_pass.
 */
void holes_check(struct odpd_registry *r, struct odpd_holder *h)
{
	struct lookup l = { .r = r };
	struct odpd_ref *ref;
	unsigned n = 0;

	LIST_FOREACH(ref, &h->refs, hlink) {
		struct odpd_mr *mr = ref->mr;
		struct odpd_mapping *map = mr->map;

		/* not in the cache (retired already): its slots are invalid */
		if (!ref->slot || !mr->pinned || !mr->cached || mr->state != ODPD_MR_LIVE)
			continue;
		if (map->hole_pass != r->hole_pass) {    /* one fstat per segment and pass */
			map->hole_pass = r->hole_pass;
			map->hole_have_ctime = odpd_mapping_ctime(map, &map->hole_ctime) == 0;
		}
		l.ctime_read = true;
		l.have_ctime = map->hole_have_ctime;
		l.ctime = map->hole_ctime;
		if (pinned_current(mr, &l))
			continue;
		mr->batch_next = NULL;
		retire_stale(r, mr);
		n++;
	}
	if (n)
		log_debug("registry: %u pinned MR(s) over punched holes retired for client %" PRIu64 "'s cache",
			  n, h->id);
}

void on_hole_timer(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_registry *r = arg;
	struct odpd_holder *h;

	(void)fd;
	(void)what;
	r->hole_pass++;
	for (unsigned i = 0; i < ODPD_LOOK_HOLDERS && (h = look_next(r, &r->hole_cursor)); i++) {
		if (h->hits)
			holes_check(r, h);
		if (!r->hole_cursor)
			break;
	}
	holes_arm(r);
}

/* Every hole-check-ms while any slot covers a pinned MR. */
void holes_arm(struct odpd_registry *r)
{
	uint64_t ms = r->conf->hole_check_ms;

	timer_every(r->hole_timer, r->n_hit_pinned > 0 && ms > 0, ms);
}

struct odpd_mr *cache_lookup(struct odpd_registry *r, struct odpd_domain *d, const struct odpd_reg_req *q,
				    struct lookup *l)
{
	struct odpd_inode *n;

	l->dom = d;
	l->base = q->iova - q->offset;
	l->map = q->map;
	n = odpd_itree_find_covering(&q->map->mrs, l->s, l->e, hit_ok, l);
	/* retired after the walk: @fn must not change the tree */
	if (l->stale) {
		struct odpd_mr *stale = l->stale;
		l->stale = NULL;
		retire_stale(r, stale);
	}
	return (struct odpd_mr *)n;
}
