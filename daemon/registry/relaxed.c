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
#include "internal.h"

/* ---------------------------------------------------------------- the relaxed queue */

void relaxed_remove(struct odpd_registry *r, struct odpd_mr *mr)
{
	TAILQ_REMOVE(&r->relaxed, mr, rlink);
	r->n_relaxed--;
	r->relaxed_bytes -= odpd_mr_length(mr);
}

/* Does the flush @sel select holder @h (whose library may keep MRs unused
 * that the flush should see go: the same holder, process, or shared PD)? */
static bool flush_selects(const struct odpd_flush_sel *sel, const struct odpd_holder *h)
{
	if (sel->all || sel->holder == h || (sel->has_pid && h->pid == sel->pid))
		return true;
	if (sel->holder && sel->holder->spd && h->spd == sel->holder->spd)
		return true;
	return sel->pd && h->spd && strcmp(h->spd->name, sel->pd) == 0;
}

/* Does the flush @arg (a struct odpd_flush_sel) select relaxed @mr? */
static bool match_sel(const struct odpd_mr *mr, const void *arg)
{
	const struct odpd_flush_sel *sel = arg;
	const struct odpd_holder *h = sel->holder;

	if (sel->has_pid && mr->relaxed_pid != sel->pid)
		return false;
	if (sel->pd && (!mr->dom || !mr->dom->spd || strcmp(mr->dom->spd->name, sel->pd) != 0))
		return false;
	if (h) {
		if (!mr->dom)
			return false;
		if (h->spd ? mr->dom->spd != h->spd : mr->dom != h->domains[mr->dom->dev_index])
			return false;
	}
	return sel->all || sel->has_pid || sel->pd || h;
}

/* Move the relaxed MRs @match selects into one batch. */
unsigned collect_relaxed(struct odpd_registry *r, bool (*match)(const struct odpd_mr *, const void *),
				const void *arg, struct odpd_mr **list)
{
	struct odpd_mr *mr, *next;
	unsigned n = 0;

	for (mr = TAILQ_FIRST(&r->relaxed); mr; mr = next) {
		next = TAILQ_NEXT(mr, rlink);
		if (match(mr, arg)) {
			mr_invalidate(r, mr, list);
			n++;
		}
	}
	if (n)
		relaxed_arm(r);                   /* the oldest may have gone */
	return n;
}

bool match_all(const struct odpd_mr *mr, const void *arg)
{
	(void)mr;
	(void)arg;
	return true;
}

unsigned flush_queue(struct odpd_registry *r, const char *why)
{
	struct odpd_mr *list = NULL;
	unsigned n = collect_relaxed(r, match_all, NULL, &list);

	if (n) {
		log_debug("registry: invalidating %u relaxed MR(s): %s", n, why);
		start_batch(r, list, true, NULL);
	}
	relaxed_arm(r);
	return n;
}

void on_relaxed_timer(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_registry *r = arg;

	(void)fd;
	(void)what;
	r->stats.inv_expired += flush_queue(r, "relaxed window passed");
}

/* The timer fires when the oldest relaxed MR passes the relaxed window. */
void relaxed_arm(struct odpd_registry *r)
{
	struct odpd_mr *oldest = TAILQ_FIRST(&r->relaxed);
	uint64_t due, now;
	struct timeval tv;

	if (!oldest) {
		evtimer_del(r->relaxed_timer);
		return;
	}
	now = now_ns();
	due = odpd_mr_relaxed_ns(oldest, now) + r->conf->relaxed_window_ms * 1000000ull;
	due = due > now ? due - now : 0;
	tv.tv_sec = (time_t)(due / 1000000000ull);
	tv.tv_usec = (suseconds_t)(due % 1000000000ull / 1000);
	evtimer_add(r->relaxed_timer, &tv);
}

/* ---------------------------------------------------------------- flush */

int odpd_registry_flush(struct odpd_registry *r, const struct odpd_flush_sel *sel,
			odpd_done_cb cb, void *arg)
{
	struct odpd_mr *list = NULL;
	const struct odpd_deferred *d0 = r->deferred, *d;
	struct odpd_waiter *w;
	struct odpd_holder *h;
	uint64_t seq0, dbytes = 0;
	unsigned dmrs = 0;

	/* What client caches keep unused is released first (relaxed), then
	 * flushed with the rest. */
	r->hole_pass++;
	LIST_FOREACH(h, &r->holders, rlink) {
		if (!h->hits || !flush_selects(sel, h))
			continue;
		holes_check(r, h);
		holder_revoke(r, h, false, &list);
	}
	r->stats.inv_flush += collect_relaxed(r, match_sel, sel, &list);
	relaxed_arm(r);
	/* What it invalidated while a verify read through it waits for that
	 * verify (mr_defer puts it at the head of r->deferred): it counts as
	 * this flush's too, and the barrier below covers its batch. */
	for (d = r->deferred; d && d != d0; d = d->next) {
		dmrs++;
		dbytes += odpd_mr_length(d->mr);
	}
	if (!list && LIST_EMPTY(&r->batches) && !r->deferred)
		return 0;
	seq0 = r->batch_seq;
	if (list)
		start_batch(r, list, true, NULL);
	w = calloc(1, sizeof(*w));
	if (!w)
		return 0;                      /* the batch runs; nobody waits */
	w->cb = cb;
	w->arg = arg;
	w->mrs = dmrs;
	w->bytes = dbytes;
	w->seq = r->batch_seq;              /* a barrier: every batch up to the newest */
	/* it counts only what it selected (none when start_batch, out of
	 * memory, deregistered it here) */
	w->own = r->batch_seq != seq0 ? r->batch_seq : 0;
	LIST_INSERT_HEAD(&r->waiters, w, link);
	waiters_check(r, true);             /* nothing in flight after all */
	return 1;
}
