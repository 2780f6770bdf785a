/* SPDX-License-Identifier: MIT */
/*
 * The registry as a whole: its set-up and end (odpd_registry_init/finish,
 * which arm every part's timer), and a device's removal, which touches
 * every part at once: its MRs die (mrlife.c, batch.c), its PDs retire
 * (pds.c), client contexts on it go (cctx.c). The parts are listed in
 * registry.h.
 */
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
#include "hits.h"
#include "lookup.h"
#include "mrlife.h"
#include "pds.h"
#include "relaxed.h"
#include "verifyjob.h"
#include "internal.h"

/* ---------------------------------------------------------------- device removal */

static bool cctx_on(struct odpd_client_ctx *c, const struct odpd_device *dev)
{
	bool on;

	if (!c)
		return false;
	pthread_mutex_lock(&c->lock);         /* a worker may be importing it */
	on = c->ctx && strcmp(ibv_get_device_name(c->ctx->device), dev->name) == 0;
	pthread_mutex_unlock(&c->lock);
	return on;
}

/* Is live, relaxed or registering @mr on @dev? MRs out of the cache (in a
 * batch, deferred, dead) are not looked at: a worker may be dropping their
 * import now. */
static bool mr_on(const struct odpd_mr *mr, const struct odpd_device *dev)
{
	if (mr->state != ODPD_MR_LIVE && mr->state != ODPD_MR_RELAXED && mr->state != ODPD_MR_REGISTERING)
		return false;
	if (mr->state == ODPD_MR_REGISTERING)
		return mr->dom && mr->dom->dev == dev;
	return mr->dom ? mr->dom->dev == dev : mr_cctx(mr) && cctx_on(mr_cctx(mr), dev);
}

void odpd_registry_device_removed(struct odpd_registry *r, struct odpd_device *dev,
				  void (*notify)(struct odpd_holder *h, unsigned mrs, void *arg), void *arg)
{
	struct odpd_mr *list = NULL, *mr, *next;
	struct odpd_domain *d, *dn;
	struct odpd_holder *h;
	unsigned i = (unsigned)(dev - r->devices->dev), killed = 0;

	r->stats.device_removals++;
	LIST_FOREACH(h, &r->holders, rlink) {
		struct odpd_client_ctx *c;
		const struct odpd_ref *ref;
		unsigned mrs = 0;
		bool uses = h->domains[i] || (h->spd && h->spd->doms[i]);

		LIST_FOREACH(ref, &h->refs, hlink)
			mrs += mr_on(ref->mr, dev);
		LIST_FOREACH(c, &h->cctxs, link)
			uses |= cctx_on(c, dev);
		if (uses || mrs)
			notify(h, mrs, arg);
	}
	/* Its MRs: registrations in flight fail when they complete (reg_done). */
	for (mr = odpd_registry_next_mr(r, NULL); mr; mr = next) {
		next = odpd_registry_next_mr(r, mr);
		if (!mr_on(mr, dev))
			continue;
		if (mr->state == ODPD_MR_RELAXED) {
			mr_invalidate(r, mr, &list);
			killed++;
		} else if (mr->state == ODPD_MR_LIVE) {
			mr_kill(r, mr, &list);
			killed++;
		}
	}
	r->stats.killed += killed;
	if (list)
		start_batch(r, list, false, NULL);
	/* Its PDs: detached, so that nothing new goes in; closed (on a worker)
	 * once their MRs are deregistered and their jobs done. */
	for (d = LIST_FIRST(&r->domains); d; d = dn) {
		dn = LIST_NEXT(d, link);
		if (d->dev != dev || d->retired)
			continue;
		d->retired = true;
		if (d->spd) {
			d->spd->doms[i] = NULL;
			d->spd = NULL;
		}
		LIST_FOREACH(h, &r->holders, rlink)
			if (h->domains[i] == d)
				h->domains[i] = NULL;
		d->members = 0;
		domain_maybe_close(r, d, true);
	}
	/* Client-PD mode: odpd's copies of the clients' contexts on it; MRs and
	 * registrations in flight drop their references when they are done. */
	LIST_FOREACH(h, &r->holders, rlink) {
		struct odpd_client_ctx *c, *cn;

		for (c = LIST_FIRST(&h->cctxs); c; c = cn) {
			cn = LIST_NEXT(c, link);
			if (cctx_on(c, dev))
				holder_unlink_client_ctx(r, h, c);
		}
	}
	relaxed_arm(r);
	log_notice("device %s removed: %u MR(s) went with it", dev->name, killed);
}

/* ---------------------------------------------------------------- life */

int odpd_registry_init(struct odpd_registry *r, struct event_base *base, struct odpd_pool *pool,
		       struct odpd_segtable *segs, const struct odpd_conf *conf,
		       struct odpd_devices *devices)
{
	memset(r, 0, sizeof(*r));
	r->base = base;
	r->pool = pool;
	r->segs = segs;
	r->conf = conf;
	r->devices = devices;
	odpd_slab_init(&r->mr_slab, sizeof(struct odpd_mr));
	odpd_slab_init(&r->ref_slab, sizeof(struct odpd_ref));
	LIST_INIT(&r->quota.accounts);
	TAILQ_INIT(&r->relaxed);
	LIST_INIT(&r->domains);
	LIST_INIT(&r->holders);
	LIST_INIT(&r->shared);
	LIST_INIT(&r->batches);
	LIST_INIT(&r->waiters);
	r->pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	r->pagemap_scan = true;
	if (r->pagemap_fd < 0)
		log_errno(LOG_WARNING, errno, "/proc/self/pagemap: pinned MRs are not served from the "
			  "cache once their segment's ctime changed");
	r->relaxed_timer = evtimer_new(base, on_relaxed_timer, r);
	r->hit_timer = evtimer_new(base, on_hit_timer, r);
	r->hole_timer = evtimer_new(base, on_hole_timer, r);
	TAILQ_INIT(&r->idle_verifiers);
	r->verifier_timer = evtimer_new(base, on_verifier_timer, r);
	return r->relaxed_timer && r->hit_timer && r->hole_timer && r->verifier_timer ? 0 : -ENOMEM;
}

bool odpd_registry_idle(const struct odpd_registry *r)
{
	return r->n_mrs == 0 && r->pending == 0 && LIST_EMPTY(&r->domains);
}

void odpd_registry_finish(struct odpd_registry *r)
{
	if (r->relaxed_timer)
		event_free(r->relaxed_timer);
	r->relaxed_timer = NULL;
	if (r->hit_timer)
		event_free(r->hit_timer);
	r->hit_timer = NULL;
	if (r->hole_timer)
		event_free(r->hole_timer);
	r->hole_timer = NULL;
	if (r->verifier_timer)                /* (no PD is left, so none is listed) */
		event_free(r->verifier_timer);
	r->verifier_timer = NULL;
	if (r->pagemap_fd >= 0)
		close(r->pagemap_fd);
	r->pagemap_fd = -1;
	while (r->deferred)                   /* (none: the pool drained, every verify ended) */
		mr_undefer(r, r->deferred->mr);
	odpd_slab_fini(&r->mr_slab);
	odpd_slab_fini(&r->ref_slab);
	free(r->spare_op);
	r->spare_op = NULL;
}
