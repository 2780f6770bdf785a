/* SPDX-License-Identifier: MIT */
/* admin.c - admin requests: status and the MR list (root or the admin group). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "fdstore.h"
#include "handler.h"

/* Largest number of MrInfo in one MrsReply: well inside ODPD_MAX_PACKET. */
#define MRS_PER_PAGE 200

static bool admin_only(const struct odpd_caller *k, struct odpd_out *o, const char *what)
{
	char msg[128];

	if (k->admin)
		return true;
	snprintf(msg, sizeof(msg), "%s is an admin request: root or the admin group only", what);
	odpd_out_error(o, k, EPERM, msg);
	return false;
}

/* Relaxed MRs a client released last, still queued. */
static unsigned relaxed_of(const struct odpd_registry *r, uint64_t client_id)
{
	const struct odpd_mr *mr;
	unsigned n = 0;

	TAILQ_FOREACH(mr, &r->relaxed, rlink)
		n += mr->relaxed_by == client_id;
	return n;
}

static void client_info(const struct odpd_registry *r, const struct odpd_conn_view *c, Odpd__ClientInfo *o)
{
	uint64_t seg_bytes = 0, mr_bytes = 0;
	const struct odpd_cseg *s;
	const struct odpd_ref *ref;

	LIST_FOREACH(s, &c->segs->list, link)
		seg_bytes += s->length;
	/* PINNED: the bytes of its pinned MRs; ODP MRs pin nothing (odpctl(8)) */
	LIST_FOREACH(ref, &c->holder->refs, hlink)
		if (ref->mr && ref->mr->pinned)
			mr_bytes += ref->length;
	o->has_id = o->has_pid = o->has_uid = o->has_gid = 1;
	o->id = c->id;
	o->pid = c->pid;
	o->uid = c->uid;
	o->gid = c->gid;
	o->name = (char *)c->name;
	o->has_segments = o->has_mrs = o->has_pinned_bytes = o->has_segment_bytes = 1;
	o->segments = c->segs->n;
	o->mrs = c->holder->n_refs;
	o->pinned_bytes = mr_bytes;
	o->segment_bytes = seg_bytes;
	o->pd = (char *)(c->holder->spd ? c->holder->spd->name : "");
	o->has_relaxed = 1;
	o->relaxed = relaxed_of(r, c->id);
	o->has_local_hits = o->has_hit_slots = 1;
	o->local_hits = c->holder->local_hits;
	o->hit_slots = c->holder->hits ? odpd_hittab_used(c->holder->hits) : 0;
}

static void odp_stats(const struct odpd_registry *r, Odpd__OdpStats *o)
{
	const struct odpd_odp_stats *s = &r->odp;

	o->has_mrs = o->has_bytes = o->has_registrations = o->has_prefetches = 1;
	o->has_prefetch_bytes = o->has_prefetch_errors = 1;
	o->mrs = s->mrs;
	o->bytes = s->bytes;
	o->registrations = s->registrations;
	o->prefetches = s->prefetches;
	o->prefetch_bytes = s->prefetch_bytes;
	o->prefetch_errors = s->prefetch_errors;
	o->has_implicit_mrs = o->has_registrars = 1;
	o->implicit_mrs = s->implicit_mrs;
	o->registrars = s->registrars;
}

static void cache_stats(const struct odpd_registry *r, Odpd__CacheStats *o)
{
	const struct odpd_cache_stats *s = &r->stats;

	o->has_lookups = o->has_hits = o->has_misses = o->has_evictions = 1;
	o->has_registrations = o->has_deregistrations = o->has_relaxed_pending = 1;
	o->has_relaxed_bytes = o->has_flushes = o->has_invalidated = o->has_replaced = 1;
	o->lookups = s->lookups;
	o->hits = s->hits;
	o->misses = s->misses;
	o->evictions = s->evictions;
	o->registrations = s->registrations;
	o->deregistrations = s->deregistrations;
	o->relaxed_pending = r->n_relaxed;
	o->relaxed_bytes = r->relaxed_bytes;
	o->flushes = s->flushes;
	o->invalidated = s->invalidated;
	o->replaced = s->replaced;
	o->has_local_hits = o->has_revoked = 1;
	o->local_hits = s->local_hits;
	o->revoked = s->revoked;
	o->has_gets = o->has_invalidated_flush = o->has_invalidated_eviction = 1;
	o->has_invalidated_expired = o->has_invalidated_device = o->has_registered_bytes = 1;
	o->gets = s->gets;
	o->invalidated_flush = s->inv_flush;
	o->invalidated_eviction = s->inv_eviction;
	o->invalidated_expired = s->inv_expired;
	o->invalidated_device = s->killed;
	o->registered_bytes = s->registered_bytes;
	o->has_registrations_on_loop = o->has_deregistrations_on_loop = 1;
	o->registrations_on_loop = s->loop_registrations;
	o->deregistrations_on_loop = s->loop_deregistrations;
	o->has_ring_releases = 1;
	o->ring_releases = s->ring_releases;
	o->n_registration_sizes = ODPD_REG_SIZE_BUCKETS;
	o->registration_sizes = (uint64_t *)s->reg_sizes;   /* (the reply is packed at once) */
}

static void quota_info(const struct odpd_account *a, Odpd__QuotaInfo *o)
{
	o->has_uid = o->has_pinned_bytes = o->has_limit = o->has_mrs = 1;
	o->uid = a->uid;
	o->pinned_bytes = a->pinned;
	o->limit = a->limit;
	o->rule = (char *)a->rule;
	o->mrs = a->mrs;
	o->has_connections = o->has_segments = o->has_mappings = 1;
	o->connections = (uint32_t)a->held[ODPD_UL_CONNECTIONS];
	o->segments = (uint32_t)a->held[ODPD_UL_SEGMENTS];
	o->mappings = a->held[ODPD_UL_MAPPINGS];
}

/* A shared PD's row per device it has a domain on (or one without). */
static unsigned pd_infos(const struct odpd_registry *r, Odpd__PdInfo *infos, Odpd__PdInfo **ptrs,
			 unsigned cap)
{
	const struct odpd_shared_pd *spd;
	unsigned n = 0;

	LIST_FOREACH(spd, &r->shared, link) {
		bool any = false;
		for (unsigned i = 0; i <= r->devices->n && n < cap; i++) {
			const struct odpd_domain *d = i < r->devices->n ? spd->doms[i] : NULL;
			if (i == r->devices->n && any)
				break;
			if (i < r->devices->n && !d)
				continue;
			any = true;
			odpd__pd_info__init(&infos[n]);
			infos[n].name = (char *)spd->name;
			infos[n].device = (char *)(d ? d->dev->name : "");
			infos[n].has_members = infos[n].has_mrs = infos[n].has_creator_uid = 1;
			infos[n].members = spd->members;
			infos[n].mrs = d ? d->n_mrs : 0;
			infos[n].creator_uid = spd->creator_uid;
			ptrs[n] = &infos[n];
			n++;
		}
	}
	return n;
}

static int status_reply(const struct odpd_caller *k, struct odpd_out *o);

int odpd_admin_status(const struct odpd_caller *k, struct odpd_out *o)
{
	/* what clients released through their rings counts as released
	 * (doc/design.md §11); only for an admin: a Status that is refused
	 * must not have odpd read every ring */
	if (k->admin)
		odpd_registry_take_all_releases(&k->m->registry);
	return status_reply(k, o);
}

static int status_reply(const struct odpd_caller *k, struct odpd_out *o)
{
	struct odpd_manager *m = k->m;
	struct odpd_registry *r = &m->registry;
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__StatusReply sr = ODPD__STATUS_REPLY__INIT;
	Odpd__RestartInfo ri = ODPD__RESTART_INFO__INIT;
	Odpd__FdStoreInfo fi = ODPD__FD_STORE_INFO__INIT;
	Odpd__CacheStats cs = ODPD__CACHE_STATS__INIT;
	Odpd__OdpStats os = ODPD__ODP_STATS__INIT;
	unsigned n_pd_rows = r->n_shared * (r->devices->n + 1) + 1;
	Odpd__ClientInfo *infos = calloc(m->n_clients + 1, sizeof(*infos));
	Odpd__ClientInfo **ptrs = calloc(m->n_clients + 1, sizeof(*ptrs));
	struct odpd_conn_view *views = calloc(m->n_clients + 1, sizeof(*views));
	Odpd__QuotaInfo *qi = calloc(r->quota.n_accounts + 1, sizeof(*qi));
	Odpd__QuotaInfo **qp = calloc(r->quota.n_accounts + 1, sizeof(*qp));
	Odpd__PdInfo *pi = calloc(n_pd_rows, sizeof(*pi));
	Odpd__PdInfo **pp = calloc(n_pd_rows, sizeof(*pp));
	Odpd__Device **devs = NULL;
	const struct odpd_account *a;
	unsigned n = 0, n_views;

	if (!admin_only(k, o, "status"))
		goto out;
	if (!infos || !ptrs || !views || !qi || !qp || !pi || !pp ||
	    odpd_devices_to_proto(&m->devices, &devs) < 0) {
		odpd_out_error(o, k, ENOMEM, "out of memory");
		goto out;
	}
	n_views = m->notify.clients(m->notify.ctx, views, m->n_clients + 1, &sr.monitors);
	for (; n < n_views; n++) {
		odpd__client_info__init(&infos[n]);
		client_info(r, &views[n], &infos[n]);
		ptrs[n] = &infos[n];
	}
	sr.has_monitors = 1;
	sr.devices = devs;
	sr.n_devices = m->devices.n_live;
	sr.clients = ptrs;
	sr.n_clients = n;
	sr.has_mrs = sr.has_pinned_bytes = 1;
	sr.mrs = r->n_mrs;
	sr.pinned_bytes = r->pinned;
	sr.has_segments = sr.has_segment_bytes = sr.has_registrations = 1;
	sr.has_deregistrations = sr.has_errors = sr.has_daemon_pid = 1;
	sr.segments = m->segs.count;
	sr.segment_bytes = m->segs.bytes;
	sr.registrations = r->stats.registrations;
	sr.deregistrations = r->stats.deregistrations;
	sr.errors = m->stats.errors + m->registry.stats.ring_errors;   /* ring entries: no reply to count them in */
	sr.daemon_version = (char *)ODPD_VERSION;
	sr.daemon_pid = (int32_t)getpid();
	/* disconnected clients, and PDs, batches and mappings still being released */
	sr.has_releasing = 1;
	sr.releasing = m->n_clients - n - sr.monitors + r->pending + m->segs.unmapping;
	cache_stats(r, &cs);
	sr.cache = &cs;
	odp_stats(r, &os);
	sr.odp = &os;
	n = 0;
	LIST_FOREACH(a, &r->quota.accounts, link) {
		odpd__quota_info__init(&qi[n]);
		quota_info(a, &qi[n]);
		qp[n] = &qi[n];
		n++;
	}
	sr.quotas = qp;
	sr.n_quotas = n;
	sr.has_max_pinned = sr.has_max_mrs = 1;
	sr.max_pinned = m->conf.max_pinned;
	sr.max_mrs = m->conf.max_mrs > UINT32_MAX ? UINT32_MAX : (uint32_t)m->conf.max_mrs;
	sr.has_fd_limit = sr.has_max_map_count = 1;
	sr.fd_limit = m->budget.nofile;
	sr.max_map_count = m->budget.max_map_count;
	if (m->restart_from[0]) {
		ri.from_version = m->restart_from;
		ri.has_kept_clients = ri.has_kept_mrs = ri.has_dropped_clients = ri.has_dropped_mrs = 1;
		ri.kept_clients = m->restart_kept_clients;
		ri.kept_mrs = m->restart_kept_mrs;
		ri.dropped_clients = m->restart_dropped_clients;
		ri.dropped_mrs = m->restart_dropped_mrs;
		ri.has_crashed = ri.has_swept_mrs = 1;
		ri.crashed = m->restart_crashed;
		ri.swept_mrs = m->restart_swept_mrs;
		sr.restart = &ri;
	}
	if (odpd_fdstore_available()) {
		struct odpd_fdstore_usage u;

		odpd_fdstore_usage(&u);
		fi.has_stored = fi.has_refused = 1;
		fi.stored = u.stored;
		fi.has_max = u.known;
		fi.max = u.max;
		fi.refused = u.refused;
		sr.fd_store = &fi;
	}
	sr.n_pds = pd_infos(r, pi, pp, n_pd_rows);
	sr.pds = pp;
	reply.has_id = reply.has_status = 1;
	reply.id = k->id;
	reply.body_case = ODPD__REPLY__BODY_STATUS_REPLY;
	reply.status_reply = &sr;
	odpd_out_reply(o, &reply, -1);
out:
	free(views);
	free(devs);
	free(ptrs);
	free(infos);
	free(qp);
	free(qi);
	free(pp);
	free(pi);
	return ODPD_DONE;
}

/* ---------------------------------------------------------------- reload */

int odpd_admin_reload(const struct odpd_caller *k, struct odpd_out *o)
{
	const struct odpd_control *ctl = &k->m->control;
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__ReloadReply rr = ODPD__RELOAD_REPLY__INIT;
	char msg[640];
	int r;

	if (!admin_only(k, o, "reload"))
		return ODPD_DONE;
	r = ctl->reload(ctl->ctx, msg, sizeof(msg));
	if (r < 0) {
		odpd_out_error(o, k, -r, msg);
		return ODPD_DONE;
	}
	rr.summary = msg;
	reply.has_id = reply.has_status = 1;
	reply.id = k->id;
	reply.body_case = ODPD__REPLY__BODY_RELOAD;
	reply.reload = &rr;
	odpd_out_reply(o, &reply, -1);
	return ODPD_DONE;
}

/* ---------------------------------------------------------------- list_mrs */

static bool mr_selected(const struct odpd_mr *mr, const Odpd__ListMrs *req)
{
	const struct odpd_ref *ref;

	if (req->pd && *req->pd && (!mr->dom || !mr->dom->spd || strcmp(mr->dom->spd->name, req->pd) != 0))
		return false;
	if (!req->has_pid)
		return true;
	if (mr->state == ODPD_MR_RELAXED && mr->relaxed_pid == req->pid)
		return true;
	LIST_FOREACH(ref, &mr->holders, mlink)
		if (ref->holder->pid == req->pid)
			return true;
	return false;
}

static void mr_info(const struct odpd_mr *mr, Odpd__MrInfo *o, int32_t *pids, uint64_t now)
{
	const struct odpd_ref *ref;
	size_t n = 0;

	o->has_id = o->has_client_id = o->has_iova = o->has_length = o->has_access = o->has_kind = 1;
	o->has_lkey = o->has_rkey = o->has_holders = o->has_state = o->has_generation = 1;
	o->has_segment_dev = o->has_segment_ino = o->has_offset = o->has_uid = o->has_age_ms = 1;
	o->id = mr->node.seq;
	o->pd = (char *)(mr->dom && mr->dom->spd ? mr->dom->spd->name : "");
	o->client_id = mr->owner_id;
	o->device = (char *)(mr->dom ? mr->dom->dev->name : "");
	o->iova = mr->iova;
	o->length = odpd_mr_length(mr);
	o->access = mr->access;
	o->kind = mr->implicit ? ODPD__MR_KIND__MR_IMPLICIT_ODP :
		  mr->pinned ? ODPD__MR_KIND__MR_PINNED : ODPD__MR_KIND__MR_ODP;
	/* Only while no worker registers or deregisters it (mr->mr changes there). */
	if (mr->state == ODPD_MR_LIVE || mr->state == ODPD_MR_RELAXED) {
		o->lkey = mr->mr ? mr->mr->lkey : 0;
		o->rkey = mr->mr ? mr->mr->rkey : 0;
	}
	o->holders = mr->refs;
	o->state = odpd_registry_mr_kept(mr) ? ODPD__MR_STATE__MR_STATE_KEPT : (Odpd__MrState)odpd_mr_wire_state(mr);
	o->generation = odpd_mr_generation(mr);
	o->segment_dev = mr->map ? mr->map->dev : 0;     /* implicit: no segment */
	o->segment_ino = mr->map ? mr->map->ino : 0;
	o->offset = mr->node.start;
	o->uid = odpd_mr_first_charge(mr) ? odpd_mr_first_charge(mr)->acct->uid : 0;
	if (mr->state == ODPD_MR_RELAXED) {
		uint64_t since = odpd_mr_relaxed_ns(mr, now);

		o->age_ms = now > since ? (now - since) / 1000000 : 0;
	}
	LIST_FOREACH(ref, &mr->holders, mlink)
		pids[n++] = ref->holder->pid;
	o->holder_pids = pids;
	o->n_holder_pids = n;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Restore the max-heap (by id) of @h[0..n) below @i. */
static void heap_sift_down(const struct odpd_mr **h, unsigned n, unsigned i)
{
	for (;;) {
		unsigned l = 2 * i + 1, r = l + 1, m = i;
		const struct odpd_mr *t;

		if (l < n && h[l]->node.seq > h[m]->node.seq)
			m = l;
		if (r < n && h[r]->node.seq > h[m]->node.seq)
			m = r;
		if (m == i)
			return;
		t = h[i];
		h[i] = h[m];
		h[m] = t;
		i = m;
	}
}

/*
 * The page: of the selected MRs with an id above @after, the @k smallest
 * ids, ascending, into @page; returns how many (all of them when fewer).
 * One walk over every MR keeping a max-heap of the k smallest seen:
 * O(n log k), no index by id (an MR has no list link for one).
 */
static unsigned mrs_page(const struct odpd_registry *r, const Odpd__ListMrs *req, const struct odpd_mr **page,
			 unsigned k)
{
	const struct odpd_mr *mr;
	unsigned n = 0;

	for (mr = odpd_registry_next_mr(r, NULL); mr; mr = odpd_registry_next_mr(r, mr)) {
		if (mr->node.seq <= req->after || !mr_selected(mr, req))
			continue;
		if (n < k) {
			unsigned i = n++;

			page[i] = mr;
			while (i && page[(i - 1) / 2]->node.seq < page[i]->node.seq) {
				const struct odpd_mr *t = page[i];

				page[i] = page[(i - 1) / 2];
				page[(i - 1) / 2] = t;
				i = (i - 1) / 2;
			}
		} else if (mr->node.seq < page[0]->node.seq) {
			page[0] = mr;
			heap_sift_down(page, n, 0);
		}
	}
	for (unsigned m = n; m > 1; m--) {           /* heap sort: ascending ids */
		const struct odpd_mr *t = page[0];

		page[0] = page[m - 1];
		page[m - 1] = t;
		heap_sift_down(page, m - 1, 0);
	}
	return n;
}

int odpd_admin_list_mrs(const struct odpd_caller *k, const Odpd__ListMrs *req, struct odpd_out *o)
{
	struct odpd_registry *r = &k->m->registry;
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__MrsReply mr_reply = ODPD__MRS_REPLY__INIT;
	Odpd__MrInfo *infos = calloc(MRS_PER_PAGE, sizeof(*infos));
	Odpd__MrInfo **ptrs = calloc(MRS_PER_PAGE, sizeof(*ptrs));
	const struct odpd_mr **page = calloc(MRS_PER_PAGE + 1, sizeof(*page));
	int32_t *pids = NULL;
	size_t n_pids = 0, used = 0;
	uint64_t now = mono_ns();
	unsigned n = 0;

	if (!admin_only(k, o, "the MR list"))
		goto out;
	odpd_registry_take_all_releases(r);  /* as for Status: released is released */
	if (!page) {
		odpd_out_error(o, k, ENOMEM, "out of memory");
		goto out;
	}
	/* one more than a page: whether more follow */
	n = mrs_page(r, req, page, MRS_PER_PAGE + 1);
	if (n > MRS_PER_PAGE) {
		mr_reply.has_more = mr_reply.more = 1;
		n = MRS_PER_PAGE;
	}
	/* Holder pids of one page at most: bounded by the page's holders. */
	for (unsigned i = 0; i < n; i++)
		n_pids += page[i]->refs;
	pids = calloc(n_pids + 1, sizeof(*pids));
	if (!infos || !ptrs || !pids) {
		odpd_out_error(o, k, ENOMEM, "out of memory");
		goto out;
	}
	for (unsigned i = 0; i < n; i++) {
		odpd__mr_info__init(&infos[i]);
		mr_info(page[i], &infos[i], pids + used, now);
		used += infos[i].n_holder_pids;
		ptrs[i] = &infos[i];
	}
	mr_reply.mrs = ptrs;
	mr_reply.n_mrs = n;
	reply.has_id = reply.has_status = 1;
	reply.id = k->id;
	reply.body_case = ODPD__REPLY__BODY_MRS;
	reply.mrs = &mr_reply;
	odpd_out_reply(o, &reply, -1);
out:
	free(page);
	free(pids);
	free(ptrs);
	free(infos);
	return ODPD_DONE;
}
