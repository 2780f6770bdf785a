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
#include "holder.h"
#include "lookup.h"
#include "relaxed.h"
#include "internal.h"

/* ---------------------------------------------------------------- hit tables */

void hits_arm(struct odpd_registry *r);

/*
 * A slot in the holder's hit table for a reference its library may serve
 * again by itself: a daemon-PD MR over a segment that the cache would serve
 * (not no-cache, not implicit, not client-PD).
 */
void ref_hit_slot(struct odpd_registry *r, struct odpd_holder *h, struct odpd_ref *ref,
			 const struct odpd_reg_req *q)
{
	if (!h->hits || q->no_cache || q->implicit || q->cmd_fd >= 0 || !ref->mr->dom)
		return;
	ref->ticket = ++r->generation;
	ref->slot = odpd_hittab_take(h->hits, ref->ticket);
	if (!ref->slot)
		return;
	ref->last_use = odpd_hittab_use(h->hits, ref->slot);
	if (ref->mr->pinned && r->n_hit_pinned++ == 0)
		holes_arm(r);
}

/* @ref leaves its slot: given back (@put) or quarantined by a revocation. */
void ref_slot_end(struct odpd_registry *r, struct odpd_ref *ref, bool put)
{
	if (!ref->slot)
		return;
	if (put)
		odpd_hittab_put(ref->holder->hits, ref->slot);
	ref->slot = 0;
	if (ref->mr->pinned)
		r->n_hit_pinned--;
}

/* @mr was invalidated while held: its holders' libraries never serve it again. */
void mr_hits_invalidate(struct odpd_mr *mr)
{
	struct odpd_ref *ref;

	LIST_FOREACH(ref, &mr->holders, mlink)
		if (ref->slot)
			odpd_hittab_invalidate(ref->holder->hits, ref->slot, ref->ticket);
}


/*
 * Take back @ref if its library keeps it unused: @idle, only if its use word
 * has not moved since the last look (the timer); else if it is not in use
 * now (a flush). The reference is dropped as a relaxed release would.
 */
static bool ref_revoke(struct odpd_registry *r, struct odpd_ref *ref, bool idle, struct odpd_mr **list)
{
	struct odpd_hittab *t = ref->holder->hits;
	uint64_t use = odpd_hittab_use(t, ref->slot);

	if (use == ref->ticket) {
		ref->claimed = true;
		ref->last_use = use;
		return false;
	}
	if (use != ref->last_use) {
		/* moved: used, or released again, since the last look */
		ref->claimed = true;
		ref->last_use = use;
		if (idle)
			return false;
	}
	/* never touched by the client since it got it: it is still taking it */
	if (!ref->claimed || !odpd_hittab_revoke(t, ref->slot, ref->ticket))
		return false;
	ref_slot_end(r, ref, false);         /* quarantined until the client has seen it */
	r->stats.revoked++;
	ref_drop(r, ref, true, list);
	return true;
}

/* Revoke the unused references of @h's hit table; @idle: only those unused
 * for a whole look. Returns how many. */
unsigned holder_revoke(struct odpd_registry *r, struct odpd_holder *h, bool idle,
			      struct odpd_mr **list)
{
	struct odpd_ref *ref, *next;
	unsigned n = 0;

	if (!h->hits)
		return 0;
	/* what it released through its ring goes first (not counted here) */
	odpd_registry_take_releases(r, h);
	for (ref = LIST_FIRST(&h->refs); ref; ref = next) {
		next = LIST_NEXT(ref, hlink);
		if (ref->slot && ref_revoke(r, ref, idle, list))
			n++;
	}
	return n;
}

/* The next @h to look at from *@cursor, and the cursor past it. */
struct odpd_holder *look_next(struct odpd_registry *r, struct odpd_holder **cursor)
{
	struct odpd_holder *h = *cursor ? *cursor : LIST_FIRST(&r->holders);

	*cursor = h ? LIST_NEXT(h, rlink) : NULL;
	return h;
}

void on_hit_timer(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_registry *r = arg;
	struct odpd_mr *list = NULL;
	struct odpd_holder *h;

	(void)fd;
	(void)what;
	for (unsigned i = 0; i < ODPD_LOOK_HOLDERS && (h = look_next(r, &r->hit_cursor)); i++) {
		holder_revoke(r, h, true, &list);
		if (!r->hit_cursor)
			break;                   /* the end of the list: a look is complete */
	}
	if (list)
		start_batch(r, list, false, NULL);
	relaxed_arm(r);
	hits_arm(r);
}

/* Keep @ev firing every @ms while @on; stop it otherwise. */
void timer_every(struct event *ev, bool on, uint64_t ms)
{
	struct timeval tv = { .tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000 * 1000) };

	if (!on)
		evtimer_del(ev);
	else if (!evtimer_pending(ev, NULL))
		evtimer_add(ev, &tv);
}

/* Every relaxed window while any client has a hit table. */
void hits_arm(struct odpd_registry *r)
{
	uint64_t ms = r->conf->relaxed_window_ms;

	timer_every(r->hit_timer, r->n_hit_tables > 0, ms ? ms : 1);
}

int odpd_registry_open_hits(struct odpd_registry *r, struct odpd_holder *h, uint32_t slots, uint32_t ring,
			    int use_fd, int *ret_gen_fd, struct odpd_err *err)
{
	uint64_t charge;
	int rc;

	if (h->hits)
		return err_set(err, EALREADY, "this connection has a hit table already");
	/* its two mappings are odpd address space the user pays for */
	charge = odpd_hittab_mapped(slots, ring);
	rc = odpd_account_may(h->acct, &h->limit, ODPD_UL_MAPPED, charge, err);
	if (rc == 0)
		rc = odpd_account_may(h->acct, &h->limit, ODPD_UL_MAPPINGS, ODPD_HIT_MAPPINGS, err);
	if (rc < 0)
		return rc;
	rc = odpd_hittab_open(slots, ring, use_fd, &h->hits, ret_gen_fd, err);
	if (rc < 0)
		return rc;
	if (odpd_hittab_ring(h->hits))
		LIST_INSERT_HEAD(&h->acct->ring_holders, h, ring_link);
	odpd_hittab_events(h->hits, h->events);    /* any sent before the table */
	odpd_account_hold(h->acct, ODPD_UL_MAPPED, (int64_t)charge);
	odpd_account_hold(h->acct, ODPD_UL_MAPPINGS, ODPD_HIT_MAPPINGS);
	r->n_hit_tables++;
	hits_arm(r);
	return 0;
}

/* ---------------------------------------------------------------- release rings */

unsigned odpd_registry_take_releases(struct odpd_registry *r, struct odpd_holder *h)
{
	uint64_t handles[ODPD_HIT_RING_MAX];
	unsigned n, done = 0;
	bool bad;

	if (!h->hits || !odpd_hittab_ring(h->hits))
		return 0;
	n = odpd_hittab_ring_take(h->hits, handles, &bad);
	if (bad) {
		r->stats.ring_errors++;
		log_debug("holder %" PRIu64 " (pid %d): its release ring's count went wrong; entries skipped",
			  h->id, (int)h->pid);
	}
	for (unsigned i = 0; i < n; i++) {
		struct odpd_ref *ref = odpd_holder_find_ref(h, handles[i]);

		if (!ref) {
			/* a handle it does not hold (or one whose device went
			 * away): as a DeregMr.no_reply of it would be, counted */
			r->stats.ring_errors++;
			log_debug("holder %" PRIu64 " (pid %d): release ring names MR handle %" PRIu64
				  ", which it does not hold", h->id, (int)h->pid, handles[i]);
			continue;
		}
		odpd_registry_release(r, ref, false, NULL, NULL);
		done++;
	}
	r->stats.ring_releases += done;
	return done;
}

/* @more fits below @max beside @held */
static bool room_for(uint64_t held, uint64_t more, uint64_t max)
{
	return held <= max && max - held >= more;
}

unsigned odpd_registry_take_releases_later(struct odpd_registry *r, struct odpd_holder *h)
{
	const struct odpd_conf *conf = r->conf;
	unsigned n;

	/* a ring's worth of small MRs more in the daemon's counts (and should
	 * the registration come near a limit anyway, settle deregisters them
	 * first) */
	r->take_later = room_for(r->n_mrs, ODPD_HIT_RING_MAX, conf->max_mrs) &&
			room_for(r->pinned, (uint64_t)ODPD_HIT_RING_MAX * ODPD_LOOP_REG_MAX, conf->max_pinned);
	n = odpd_registry_take_releases(r, h);
	r->take_later = false;
	return n;
}

static void take_account(struct odpd_registry *r, struct odpd_account *a)
{
	struct odpd_holder *h;

	LIST_FOREACH(h, &a->ring_holders, ring_link)
		odpd_registry_take_releases(r, h);
}

void odpd_registry_take_all_releases(struct odpd_registry *r)
{
	struct odpd_account *a;

	LIST_FOREACH(a, &r->quota.accounts, link)
		take_account(r, a);
}

/*
 * Would @more pass @max after @held, where releases could make room for
 * it? (UINT64_MAX: no limit.) Not if @more alone passes it: nothing given
 * back helps, and a request that asks for more than a limit allows, which
 * any client can send, would have odpd take every ring for nothing.
 */
static bool would_pass(uint64_t held, uint64_t more, uint64_t max)
{
	return more <= max && held > max - more;
}

void odpd_registry_settle(struct odpd_registry *r, struct odpd_holder *h, uint64_t addr, uint64_t length,
			  bool pinned)
{
	const struct odpd_conf *conf = r->conf;
	struct odpd_account *a = h->acct;
	uint64_t max_mrs = h->limit.max[ODPD_UL_MRS];

	/* what quota_check charges: the pages [addr, addr + length) spans
	 * (a few bytes across a page boundary are two pages) */
	if (length > UINT64_MAX - 2 * PAGE)
		length = UINT64_MAX;
	else if (length)
		length = (addr % PAGE + length + PAGE - 1) / PAGE * PAGE;

	/* the daemon's limits: every user's releases count, and the MRs of
	 * this request's own ring must be gone, not only uncharged */
	if (r->n_mrs >= conf->max_mrs || (pinned && would_pass(r->pinned, length, conf->max_pinned))) {
		odpd_registry_run_later(r);
		odpd_registry_take_all_releases(r);
		return;
	}
	/* the user's: MR references, pinned bytes */
	if ((max_mrs != ODPD_UNLIMITED && would_pass(a->held[ODPD_UL_MRS], 1, max_mrs)) ||
	    (pinned && would_pass(a->pinned, length, h->limit.max_pinned)))
		take_account(r, a);
}

void odpd_registry_event_sent(struct odpd_holder *h)
{
	h->events++;
	if (h->hits)
		odpd_hittab_events(h->hits, h->events);
}

bool odpd_registry_mr_kept(const struct odpd_mr *mr)
{
	const struct odpd_ref *ref;

	if (mr->state != ODPD_MR_LIVE || mr->refs == 0)
		return false;
	LIST_FOREACH(ref, &mr->holders, mlink)
		if (!ref->slot || odpd_hittab_use(ref->holder->hits, ref->slot) == ref->ticket)
			return false;
	return true;
}

void odpd_registry_hits_report(struct odpd_registry *r, struct odpd_holder *h, bool has_hits,
			       uint64_t local_hits, bool has_seen, uint64_t seen)
{
	if (!h->hits)
		return;
	if (has_hits && local_hits > h->local_hits) {
		r->stats.local_hits += local_hits - h->local_hits;
		r->stats.gets += local_hits - h->local_hits;   /* answered in-process */
		h->local_hits = local_hits;
	}
	if (has_seen)
		odpd_hittab_seen(h->hits, seen);
}
