/* SPDX-License-Identifier: MIT */
/*
 * restore: the registry's side of a restart (doc/design.md §12). The next
 * odpd rebuilds what the stopping one described: shared PDs, domains whose
 * context and PD it imported, MRs it imported by handle, and each holder's
 * references. Loop only, at start, before any client is served; and the
 * other side, what a stopping odpd may keep (odpd_registry_keepable).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "batch.h"
#include "charge.h"
#include "hits.h"
#include "holder.h"
#include "lookup.h"
#include "mrlife.h"
#include "pds.h"
#include "relaxed.h"
#include "witness.h"
#include "internal.h"

struct odpd_shared_pd *odpd_registry_restore_shared(struct odpd_registry *r, const char *name, uid_t creator)
{
	struct odpd_shared_pd *spd = calloc(1, sizeof(*spd));

	if (spd)
		spd->doms = calloc(ODPD_MAX_DEVICES, sizeof(*spd->doms));
	if (!spd || !spd->doms) {
		free(spd);
		return NULL;
	}
	snprintf(spd->name, sizeof(spd->name), "%s", name);
	spd->creator_uid = creator;
	LIST_INSERT_HEAD(&r->shared, spd, link);
	r->n_shared++;
	return spd;
}

struct odpd_domain *odpd_registry_restore_domain(struct odpd_registry *r, unsigned dev_index,
						 struct odpd_shared_pd *spd, struct odpd_holder *owner,
						 struct ibv_context *ctx, struct ibv_pd *pd, bool exported)
{
	struct odpd_domain *d = odpd_domain_new(&r->devices->dev[dev_index], dev_index);

	if (!d)
		return NULL;
	d->dev->n_domains++;
	d->ctx = ctx;
	d->pd = pd;
	d->exported = exported;
	d->spd = spd;
	if (spd) {
		spd->doms[dev_index] = d;
		d->members = spd->members;
	} else {
		owner->domains[dev_index] = d;
		d->owner_id = owner->id;
		d->members = 1;
	}
	LIST_INSERT_HEAD(&r->domains, d, link);
	return d;
}

void odpd_registry_restore_join(struct odpd_holder *h, struct odpd_shared_pd *spd, bool registered)
{
	h->spd = spd;
	h->registered = registered;
	spd->members++;
	for (unsigned i = 0; i < ODPD_MAX_DEVICES; i++)
		if (spd->doms[i])
			spd->doms[i]->members++;
}

struct odpd_mr *odpd_registry_restore_mr(struct odpd_registry *r, const struct odpd_mr_restore *q)
{
	struct odpd_mr *mr;

	/* ids only grow in a mapping's tree (map_insert): the caller sorts */
	if (q->id <= r->next_mr_id && r->n_mrs > 0)
		return NULL;
	mr = odpd_slab_zalloc(&r->mr_slab);
	if (!mr)
		return NULL;
	mr->node.seq = q->id;
	if (q->id > r->next_mr_id)
		r->next_mr_id = q->id;
	mr->dom = q->dom;
	mr->map = q->map;
	mr->node.start = q->start;
	mr->node.end = q->end;
	mr->iova = q->iova;
	mr->mr = q->mr;
	mr->access = q->access & 15;
	mr->pinned = 1;
	mr->owner_id = q->owner;
	mr->ctime_ns = q->ctime_ns;
	mr->ctime_ok = q->ctime_ok;
	mr->witness_epoch = atomic_load(&q->map->witness_epoch);
	LIST_INIT(&mr->holders);
	mr->state = ODPD_MR_LIVE;           /* (the state it had; RELAXED below) */
	map_insert(mr);
	mr->cached = q->cached;
	mr->invalidated = q->invalidated;
	global_charge(r, mr);
	odpd_mapping_ref(mr->map);
	r->n_mrs++;
	q->dom->n_mrs++;
	if (q->relaxed) {
		mr_set_state(mr, ODPD_MR_RELAXED);
		mr->relaxed_ms = q->relaxed_ms;
		mr->relaxed_pid = q->relaxed_pid;
		mr->relaxed_by = q->relaxed_by;
		TAILQ_INSERT_TAIL(&r->relaxed, mr, rlink);
		r->n_relaxed++;
		r->relaxed_bytes += odpd_mr_length(mr);
		if (r->n_relaxed == 1)
			relaxed_arm(r);
	}
	return mr;
}

int odpd_registry_restore_charge(struct odpd_registry *r, struct odpd_mr *mr, uid_t uid)
{
	struct odpd_account *a = odpd_account_get(&r->quota, uid);
	struct odpd_charge *c;
	int rc;

	if (!a)
		return -ENOMEM;
	/* refs 0: the references restored count themselves (restore_ref);
	 * those of connections not taken back must not hold it */
	rc = charge_find(mr, a) ? 0 : charge_add(r, mr, a, &c);
	odpd_account_put(&r->quota, a);      /* the charge holds it */
	return rc;
}

struct odpd_ref *odpd_registry_restore_ref(struct odpd_registry *r, struct odpd_holder *h, struct odpd_mr *mr,
					   uint64_t handle, uint64_t iova, uint64_t length, void *cookie)
{
	struct odpd_reg_req q = { .handle = handle, .iova = iova, .length = length, .cookie = cookie,
				  .cmd_fd = -1 };
	struct odpd_hittab *hits = h->hits;
	struct odpd_charge *c = charge_find(mr, h->acct);
	struct odpd_ref *ref;

	if (!c && charge_add(r, mr, h->acct, &c) < 0)
		return NULL;
	h->hits = NULL;                      /* no slot: the old table is gone (odpd-state.proto) */
	ref = ref_new(r, h, mr, &q);
	h->hits = hits;
	if (!ref) {
		if (c->refs == 0)
			charge_drop(r, mr, c);
		return NULL;
	}
	c->refs++;                           /* as a hit counts it (reg.c) */
	h->registered = true;
	return ref;
}

/* What a restart cannot keep of an MR (doc/design.md §12). */
static const char *mr_unkeepable(const struct odpd_mr *mr)
{
	if (mr->implicit || !mr->pinned)
		return "an ODP MR";
	if (!mr->dom)
		return "an MR in a client's own PD";
	if (mr->state != ODPD_MR_LIVE && mr->state != ODPD_MR_RELAXED)
		return "an MR on its way out";
	if (mr->busy)
		return "an MR a verify reads through";
	/* (a full fd store refused it: daemon/fdstore.h) */
	if (!mr->dom->jstored)
		return "its PD's context is not in systemd's fd store";
	if (mr->map && !mr->map->save_id)
		return "its segment is not in systemd's fd store";
	return NULL;
}

const char *odpd_registry_holder_lost(const struct odpd_holder *h)
{
	if (h->n_cctxs)
		return "it registered into its own PD";
	if (h->n_odp_refs)
		return "it holds an ODP MR";
	for (unsigned i = 0; i < ODPD_MAX_DEVICES; i++) {
		const struct odpd_domain *d = h->spd ? h->spd->doms[i] : h->domains ? h->domains[i] : NULL;

		if (d && d->registrar)
			return "it has implicit ODP MRs";
		if (d && d->dev->removed)
			return "a device of its went away";
	}
	return NULL;
}

const char *odpd_registry_holder_unkeepable(const struct odpd_registry *r, const struct odpd_holder *h)
{
	const char *lost = odpd_registry_holder_lost(h);
	const struct odpd_ref *ref;

	(void)r;
	if (lost)
		return lost;
	LIST_FOREACH(ref, &h->refs, hlink) {
		const char *why = mr_unkeepable(ref->mr);

		if (why)
			return why;
	}
	return NULL;
}

bool odpd_registry_mr_keepable(const struct odpd_mr *mr)
{
	return mr_unkeepable(mr) == NULL;
}

static bool match_unkeepable(const struct odpd_mr *mr, const void *arg)
{
	(void)arg;
	return mr_unkeepable(mr) != NULL;
}

unsigned odpd_registry_drop_unkeepable(struct odpd_registry *r)
{
	struct odpd_mr *list = NULL;
	unsigned n = collect_relaxed(r, match_unkeepable, NULL, &list);

	if (n)
		start_batch(r, list, true, NULL);
	return n;
}

void odpd_registry_hits_freeze(struct odpd_holder *h)
{
	if (!h->hits)
		return;
	/* Its slots are not in the state: no slot may say valid any more, and
	 * the events word says the table is retired: the library then opens a
	 * new one with the next odpd (doc/design.md §12). After a crash the
	 * next odpd does the same through the stored fd (restart.c). */
	odpd_hittab_retire(h->hits);
}

void odpd_registry_restore_orphan(struct odpd_registry *r, struct odpd_mr *mr)
{
	struct odpd_mr *list = NULL;

	if (mr->state != ODPD_MR_LIVE)
		return;
	if (mr->refs) {
		/* A charge no reference came back for (its connections were
		 * not taken back) would hold its account's pinned bytes for as
		 * long as the others hold the MR. */
		for (struct odpd_charge *c = odpd_mr_first_charge(mr), *next; c; c = next) {
			next = c->next;
			if (c->refs == 0)
				charge_drop(r, mr, c);
		}
		return;
	}
	mr_invalidate(r, mr, &list);
	start_batch(r, list, false, NULL);
}

bool odpd_registry_mr_current(struct odpd_registry *r, const struct odpd_mr *mr, uint64_t ctime_ns)
{
	if (mr->ctime_ok && mr->ctime_ns == ctime_ns)
		return true;
	return witness_present(r, mr);
}

void odpd_registry_revoke_unused(struct odpd_registry *r, struct odpd_holder *h)
{
	struct odpd_mr *list = NULL;

	if (holder_revoke(r, h, false, &list) && list)
		start_batch(r, list, false, NULL);
}

static bool match_remote_owned(const struct odpd_mr *mr, const void *arg)
{
	return (mr->access & ACCESS_REMOTE) && mr->owner_id == *(const uint64_t *)arg;
}

static bool match_domain(const struct odpd_mr *mr, const void *arg)
{
	return mr->dom == arg;
}

void odpd_registry_restore_gone(struct odpd_registry *r, uint64_t id)
{
	struct odpd_mr *list = NULL;

	/* as when it disconnects (odpd_holder_release, doc/design.md §8.3) */
	if (collect_relaxed(r, match_remote_owned, &id, &list))
		start_batch(r, list, false, NULL);
}

void odpd_registry_restore_settle(struct odpd_registry *r)
{
	struct odpd_domain *d, *dnext;
	struct odpd_shared_pd *spd, *snext;
	struct odpd_mr *list = NULL;

	/* A domain nobody came back to: as after its last member left
	 * (domain_leave): its relaxed MRs go, and it closes once empty. */
	for (d = LIST_FIRST(&r->domains); d; d = dnext) {
		dnext = LIST_NEXT(d, link);
		if (d->members)
			continue;
		collect_relaxed(r, match_domain, d, &list);
		domain_maybe_close(r, d, true);
	}
	/* A shared PD with no member and no domain left. */
	for (spd = LIST_FIRST(&r->shared); spd; spd = snext) {
		snext = LIST_NEXT(spd, link);
		shared_maybe_free(r, spd);
	}
	if (list)
		start_batch(r, list, false, NULL);
}
