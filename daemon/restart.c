/* SPDX-License-Identifier: MIT */
/*
 * restart: hand odpd's MRs to the next odpd through systemd's fd store
 * (restart.h; doc/design.md §12). The event loop's only.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "client.h"
#include "config.h"
#include "handler.h"
#include "log.h"
#include "manager.h"
#include "odpd-state.pb-c.h"
#include "hittab.h"
#include "journal.h"
#include "keep.h"
#include "restart.h"
#include "verify.h"

#define QUIESCE_TICK_MS 10
#define QUIESCE_READ_MS 2000           /* a client's replies wait to be read this long at most */
#define QUIESCE_MAX_MS 30000           /* within systemd's TimeoutStopSec= (90 s) */
#define STATE_MAX (256u << 20)          /* bytes of state a new odpd reads at most */

struct odpd_restart {
	OdpdState__State *st;
	bool folded;                        /* from a journal (odpd_journal_state_free) */
	bool crashed;                       /* the journal did not end with a hand-over */
	uint64_t epoch;                     /* the journal's number; 0: a state of odpd 1.4.2 */
};

static uint64_t mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ---------------------------------------------------------------- the stop */

static void max_mapping_one(struct odpd_mapping *map, void *arg)
{
	uint32_t *max = arg;

	if (map->save_id > *max)
		*max = map->save_id;
}

struct in_use_map {
	uint32_t id;
	bool found;
};

static void in_use_map_one(struct odpd_mapping *map, void *arg)
{
	struct in_use_map *q = arg;

	q->found = q->found || map->save_id == q->id;
}

const char *odpd_restart_unavailable(const struct odpd_manager *m)
{
	if (!odpd_fdstore_available())
		return "not started by systemd (no fd store)";
	for (unsigned i = 0; i < m->devices.n; i++)
		if (!m->devices.dev[i].removed && m->devices.dev[i].import != ODPD__SUPPORT__SUPPORT_YES)
			return "a device cannot import (ibv_import_device)";
	return NULL;
}

static const char *client_unkeepable(const struct odpd_client *c)
{
	const struct odpd_cseg *s;

	if (!c->hello || c->refused)
		return "it had not said Hello";
	if (c->monitor)
		return "an admin tool";
	if (!c->has_holder)
		return "no state";
	/* what a full fd store refused (daemon/fdstore.h) */
	if (odpd_journal_on()) {
		if (!c->stored)
			return "its connection is not in systemd's fd store";
		LIST_FOREACH(s, &c->segs.list, link)
			if (!s->map->save_id)
				return "a segment of its is not in systemd's fd store";
	}
	return odpd_registry_holder_unkeepable(&c->m->registry, &c->holder);
}

static void store_try_mapping(struct odpd_mapping *map, void *arg)
{
	(void)arg;
	if (map->refs)
		(void)odpd_journal_mapping_id(map);
}

/* Store what is not stored yet, as build_state would (journal.c stores a
 * PD's context and a segment on first use, and one a full fd store refused
 * may fit now), so that what drop_unkeepable judges unkeepable is what
 * cannot be stored, not what was not tried. Once, as the stop begins. */
static void store_what_is_kept(struct odpd_manager *m)
{
	struct odpd_domain *d;

	if (!odpd_journal_on())
		return;
	LIST_FOREACH(d, &m->registry.domains, link)
		if (d->pd && !d->retired)
			(void)odpd_journal_domain_id(d);
	odpd_mapping_each(&m->segs, store_try_mapping, NULL);
}

static void drop_unkeepable(struct odpd_manager *m)
{
	struct odpd_client *c, *next;
	char why[160];

	for (c = LIST_FIRST(&m->clients); c; c = next) {
		const char *w = client_unkeepable(c);

		next = LIST_NEXT(c, link);
		if (!w)
			continue;
		snprintf(why, sizeof(why), "odpd is restarting and cannot keep this connection: %s", w);
		odpd_client_disconnect(c, why);
	}
	odpd_registry_drop_unkeepable(&m->registry);
}

/* A client that leaves its replies unread must not hold everyone's MRs
 * hostage: after QUIESCE_READ_MS it is dropped, the rest kept. */
static void drop_not_reading(struct odpd_manager *m)
{
	struct odpd_client *c, *next;

	for (c = LIST_FIRST(&m->clients); c; c = next) {
		next = LIST_NEXT(c, link);
		if (c->outq && !c->busy)
			odpd_client_disconnect(c, "odpd is restarting and this connection did not read "
					       "its replies");
	}
}

static bool quiet(const struct odpd_manager *m)
{
	const struct odpd_registry *r = &m->registry;
	const struct odpd_client *c;

	if (odpd_pool_pending(m->pool) || r->pending || !LIST_EMPTY(&r->batches) || r->deferred ||
	    m->segs.unmapping || !LIST_EMPTY(&m->reap))
		return false;
	LIST_FOREACH(c, &m->clients, link)
		if (c->busy || c->outq)
			return false;
	return true;
}

/* What the state names, as it is built. */
struct writer {
	struct odpd_manager *m;
	bool clean;
	OdpdState__State *st;
	struct odpd_mr **mrs;
	size_t n_mrs, cap_mrs;
	int err;
};

static char *fd_name(const char *kind, uint64_t id)
{
	char buf[48];

	snprintf(buf, sizeof(buf), "%s-%" PRIu64, kind, id);
	return strdup(buf);
}

static void *grow(void *p, size_t *cap, size_t n, size_t size)
{
	void *q;

	if (n < *cap)
		return p;
	*cap = *cap ? *cap * 2 : 16;
	q = realloc(p, *cap * size);
	if (!q)
		free(p);
	return q;
}

static void save_mapping(struct odpd_mapping *map, void *arg)
{
	struct writer *w = arg;
	OdpdState__Mapping *pm;
	OdpdState__Mapping **a;

	if (!map->refs || !odpd_journal_mapping_id(map))
		return;
	a = realloc(w->st->mappings, (w->st->n_mappings + 1) * sizeof(*a));
	pm = calloc(1, sizeof(*pm));
	if (!a || !pm) {
		free(pm);
		if (a)
			w->st->mappings = a;
		w->err = -ENOMEM;
		return;
	}
	w->st->mappings = a;
	odpd_state__mapping__init(pm);
	pm->id = map->save_id;
	pm->fd = fd_name("seg", pm->id);
	pm->addr = (uintptr_t)map->addr;
	pm->has_in_window = 1;
	pm->in_window = map->in_window;
	a[w->st->n_mappings++] = pm;
	if (!pm->fd)
		w->err = -ENOMEM;
}

/* A stop's proof that its pinned MRs are current (doc/design.md §12): each
 * saved mapping's ctime, read once the coarse clock has passed them all (a
 * change after the read then stamps a later ctime). */
struct ctimes {
	uint64_t *ns;                       /* by mapping save_id - 1 (0: unknown) */
	unsigned n;
};

static void ctime_one(struct odpd_mapping *map, void *arg)
{
	struct ctimes *ct = arg;
	struct timespec ts;

	if (map->save_id && map->save_id <= ct->n && odpd_mapping_ctime(map, &ts) == 0)
		ct->ns[map->save_id - 1] = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void read_ctimes(struct writer *w, struct ctimes *ct)
{
	struct timespec now;
	uint64_t newest = 0;

	for (size_t i = 0; i < w->st->n_mappings; i++)
		if (w->st->mappings[i]->id > ct->n)
			ct->n = w->st->mappings[i]->id;
	ct->ns = calloc(ct->n + 1, sizeof(*ct->ns));
	if (!ct->ns)
		return;                      /* no MR proven: all stale after the restart */
	odpd_mapping_each(&w->m->segs, ctime_one, ct);
	for (unsigned i = 0; i < ct->n; i++)
		if (ct->ns[i] > newest)
			newest = ct->ns[i];
	for (int i = 0; i < 100; i++) {       /* a tick or two of the coarse clock */
		clock_gettime(CLOCK_REALTIME_COARSE, &now);
		if ((uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec > newest)
			return;
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	}
	memset(ct->ns, 0, (ct->n + 1) * sizeof(*ct->ns));
}

static int cmp_mr(const void *a, const void *b)
{
	const struct odpd_mr *x = *(struct odpd_mr *const *)a, *y = *(struct odpd_mr *const *)b;

	return x->node.seq < y->node.seq ? -1 : x->node.seq > y->node.seq;
}

static int add_mr(struct writer *w, struct odpd_mr *mr)
{
	w->mrs = grow(w->mrs, &w->cap_mrs, w->n_mrs, sizeof(*w->mrs));
	if (!w->mrs)
		return -ENOMEM;
	w->mrs[w->n_mrs++] = mr;
	return 0;
}

static OdpdState__Client *save_client(struct writer *w, struct odpd_client *c)
{
	OdpdState__Client *pc = calloc(1, sizeof(*pc));
	struct odpd_cseg *s;
	struct odpd_ref *ref;
	const char *unkeepable = w->clean ? NULL : client_unkeepable(c);

	if (!pc)
		return NULL;
	odpd_state__client__init(pc);
	pc->id = c->id;
	pc->fd = fd_name("conn", c->id);
	pc->name = strdup(c->name);
	pc->has_registered = 1;
	pc->registered = c->holder.registered;
	pc->has_next_handle = 1;
	pc->next_handle = c->segs.next_handle;
	pc->has_local_hits = 1;
	pc->local_hits = c->holder.local_hits;
	pc->has_events = 1;
	pc->events = c->holder.events;
	pc->has_starttime = 1;
	pc->starttime = c->starttime;
	if (unkeepable)
		pc->unkeepable = strdup(unkeepable);
	if (c->holder.hits) {
		pc->has_hit_slots = 1;
		pc->hit_slots = odpd_hittab_slots(c->holder.hits);
	}
	if (!w->clean && c->jlast_id) {
		/* the journal's: its last request's answer survives a rewrite */
		pc->has_last_id = 1;
		pc->last_id = c->jlast_id;
		if (c->jlast_reply && (pc->last_reply.data = malloc(c->jlast_len ? c->jlast_len : 1))) {
			memcpy(pc->last_reply.data, c->jlast_reply, c->jlast_len);
			pc->last_reply.len = c->jlast_len;
			pc->has_last_reply = 1;
		}
	}
	if (c->holder.spd)
		pc->shared = strdup(c->holder.spd->name);
	pc->segments = calloc(c->segs.n + 1, sizeof(*pc->segments));
	pc->refs = calloc(c->holder.n_refs + 1, sizeof(*pc->refs));
	if (!pc->fd || !pc->name || !pc->segments || !pc->refs || (c->holder.spd && !pc->shared) ||
	    (unkeepable && !pc->unkeepable))
		return pc;                   /* (freed with the state; w->err set by the caller) */
	LIST_FOREACH(s, &c->segs.list, link) {
		OdpdState__Segment *ps = calloc(1, sizeof(*ps));

		if (!ps)
			return pc;
		odpd_state__segment__init(ps);
		ps->handle = s->handle;
		ps->mapping = odpd_journal_mapping_id(s->map);
		ps->has_client_addr = ps->has_file_offset = ps->has_length = 1;
		ps->has_writable = ps->has_charged = 1;
		ps->client_addr = s->client_addr;
		ps->file_offset = s->file_offset;
		ps->length = s->length;
		ps->writable = s->writable;
		ps->charged = s->charged;
		pc->segments[pc->n_segments++] = ps;
	}
	LIST_FOREACH(ref, &c->holder.refs, hlink) {
		OdpdState__Ref *pr = calloc(1, sizeof(*pr));
		const struct odpd_cseg *seg = ref->cookie;

		if (!pr)
			return pc;
		odpd_state__ref__init(pr);
		pr->mr = ref->mr->node.seq;
		pr->handle = ref->handle;
		pr->has_iova = pr->has_length = pr->has_segment = 1;
		pr->iova = ref->iova;
		pr->length = ref->length;
		pr->segment = seg ? seg->handle : 0;
		pc->refs[pc->n_refs++] = pr;
		if (ref == LIST_FIRST(&ref->mr->holders) && add_mr(w, ref->mr) < 0)
			return pc;
	}
	return pc;
}

static OdpdState__Mr *save_mr(struct writer *w, const struct ctimes *ct, struct odpd_mr *mr)
{
	OdpdState__Mr *pm = calloc(1, sizeof(*pm));
	OdpdState__Mr tmp;

	(void)w;
	if (!pm || odpd_journal_fill_mr(&tmp, mr) < 0) {
		free(pm);
		return NULL;
	}
	*pm = tmp;
	/* (odpd_journal_fill_mr's charges are one block: copied so that
	 * protobuf-c can free them one by one) */
	pm->charges = calloc(tmp.n_charges + 1, sizeof(*pm->charges));
	pm->n_charges = 0;
	for (size_t i = 0; pm->charges && i < tmp.n_charges; i++) {
		OdpdState__Charge *pc = malloc(sizeof(*pc));

		if (!pc)
			break;
		*pc = *tmp.charges[i];
		pm->charges[pm->n_charges++] = pc;
	}
	odpd_journal_mr_clear(&tmp);
	if (ct && ct->ns) {
		/* Proven current against a settled ctime read before: the next
		 * odpd serves it while the ctime stays (a punched hole moves it). */
		uint64_t ctime = mr->map->save_id <= ct->n ? ct->ns[mr->map->save_id - 1] : 0;

		pm->ctime_ns = ctime;
		pm->ctime_ok = ctime && odpd_registry_mr_current(&w->m->registry, mr, ctime);
	}
	return pm;
}

/* odpd_state_build_fn (journal.h): @m's state as it is now. */
static int build_state(struct odpd_manager *m, OdpdState__State *st, bool clean)
{
	struct odpd_registry *r = &m->registry;
	struct writer w = { .m = m, .clean = clean, .st = st };
	struct ctimes ct = { 0 };
	struct odpd_domain *d;
	struct odpd_client *c;
	struct odpd_mr *mr;

	odpd_state__state__init(st);
	st->format = ODPD_STATE_FORMAT;
	st->version = strdup(ODPD_VERSION);
	st->has_window_base = st->has_window_size = 1;
	{
		size_t size;

		st->window_base = odpd_window_base(m->segs.window, &size);
		st->window_size = size;
	}
	st->has_next_client_id = st->has_next_mr_id = st->has_generation = 1;
	st->next_client_id = m->next_client_id;
	st->next_mr_id = r->next_mr_id;
	st->generation = r->generation;
	st->devices = calloc(m->devices.n + 1, sizeof(char *));
	for (unsigned i = 0; st->devices && i < m->devices.n; i++)
		st->devices[st->n_devices++] = strdup(m->devices.dev[i].name);
	/* Shared PDs. */
	{
		struct odpd_shared_pd *spd;

		st->shared = calloc(r->n_shared + 1, sizeof(*st->shared));
		LIST_FOREACH(spd, &r->shared, link) {
			OdpdState__SharedPd *ps = st->shared ? calloc(1, sizeof(*ps)) : NULL;

			if (!ps) {
				w.err = -ENOMEM;
				break;
			}
			odpd_state__shared_pd__init(ps);
			ps->name = strdup(spd->name);
			ps->has_creator_uid = 1;
			ps->creator_uid = spd->creator_uid;
			st->shared[st->n_shared++] = ps;
		}
	}
	/* Domains: their contexts' command fds are in the store. A stop frees
	 * an idle verifier first: its QP, CQ and bounce MR would stay in the
	 * context unknown. */
	LIST_FOREACH(d, &r->domains, link) {
		OdpdState__Domain *pd, **a;

		if (!d->pd || d->retired)
			continue;
		if (clean) {
			odpd_verifier_free(d->verifier);
			d->verifier = NULL;
		}
		if (!odpd_journal_domain_id(d))
			continue;
		a = realloc(st->domains, (st->n_domains + 1) * sizeof(*a));
		pd = calloc(1, sizeof(*pd));
		if (!a || !pd) {
			free(pd);
			if (a)
				st->domains = a;
			w.err = -ENOMEM;
			break;
		}
		st->domains = a;
		odpd_state__domain__init(pd);
		pd->id = d->save_id;
		pd->dev_index = d->dev_index;
		if (d->spd)
			pd->shared = strdup(d->spd->name);
		pd->has_owner = pd->has_pd_handle = pd->has_exported = 1;
		pd->owner = d->owner_id;
		pd->pd_handle = d->pd->handle;
		pd->exported = d->exported;
		pd->fd = fd_name("ctx", pd->id);
		a[st->n_domains++] = pd;
		if (!pd->fd)
			w.err = -ENOMEM;
	}
	odpd_mapping_each(&m->segs, save_mapping, &w);
	if (clean)
		read_ctimes(&w, &ct);
	/* Connections (those stored), their segments and references. */
	st->clients = calloc(m->n_clients + 1, sizeof(*st->clients));
	LIST_FOREACH(c, &m->clients, link) {
		OdpdState__Client *pc;

		if (!c->stored)
			continue;
		if (!st->clients || (clean && client_unkeepable(c))) {
			w.err = w.err ? w.err : -EAGAIN;
			break;
		}
		pc = save_client(&w, c);
		if (!pc) {
			w.err = -ENOMEM;
			break;
		}
		st->clients[st->n_clients++] = pc;
	}
	/* MRs: those held, and the relaxed ones. */
	TAILQ_FOREACH(mr, &r->relaxed, rlink)
		if (add_mr(&w, mr) < 0)
			w.err = -ENOMEM;
	if (w.mrs) {
		qsort(w.mrs, w.n_mrs, sizeof(*w.mrs), cmp_mr);
		st->mrs = calloc(w.n_mrs + 1, sizeof(*st->mrs));
		for (size_t i = 0; st->mrs && i < w.n_mrs; i++) {
			if (i && w.mrs[i] == w.mrs[i - 1])
				continue;
			if (!(clean ? odpd_registry_mr_keepable(w.mrs[i]) : odpd_journal_mr_kept(w.mrs[i])) ||
			    !odpd_journal_domain_id(w.mrs[i]->dom) ||
			    !odpd_journal_mapping_id(w.mrs[i]->map)) {
				if (clean)
					w.err = w.err ? w.err : -EAGAIN;
				continue;
			}
			st->mrs[st->n_mrs] = save_mr(&w, clean ? &ct : NULL, w.mrs[i]);
			if (!st->mrs[st->n_mrs])
				w.err = -ENOMEM;
			else
				st->n_mrs++;
		}
	}
	free(w.mrs);
	free(ct.ns);
	return w.err;
}

/* Everything quiet: the last snapshot, marked clean, into the journal.
 * 0, or -errno (then a plain stop: the journal goes with everything). */
static int hand_over(struct odpd_manager *m)
{
	OdpdState__State st;
	struct odpd_client *c;
	uint64_t t0 = mono_us();
	int rc;

	if (!odpd_journal_on())
		return -ENOENT;
	LIST_FOREACH(c, &m->clients, link)
		odpd_registry_hits_freeze(&c->holder);
	rc = build_state(m, &st, true);
	if (rc >= 0)
		rc = odpd_journal_hand_over(&st);
	if (rc >= 0)
		log_notice("restart: handed %zu connection(s), %zu PD(s), %zu segment(s) and %zu MR(s) to "
			   "systemd's fd store for the next odpd in %" PRIu64 " us", st.n_clients, st.n_domains,
			   st.n_mappings, st.n_mrs, mono_us() - t0);
	odpd_journal_state_free_built(&st);
	return rc;
}

static void on_quiesce(evutil_socket_t fd, short what, void *arg)
{
	static const struct timeval tick = { 0, QUIESCE_TICK_MS * 1000 };
	struct odpd_manager *m = arg;
	int rc;

	(void)fd;
	(void)what;
	drop_unkeepable(m);                  /* (a registration that ended meanwhile) */
	if (!quiet(m) && m->quiesce_ticks * QUIESCE_TICK_MS >= QUIESCE_READ_MS)
		drop_not_reading(m);
	if (!quiet(m)) {
		if (++m->quiesce_ticks * QUIESCE_TICK_MS < QUIESCE_MAX_MS) {
			evtimer_add(m->ev_quiesce, &tick);
			return;
		}
		log_warning("restart: requests still ran after %d ms: stopping without keeping the MRs",
			    QUIESCE_MAX_MS);
		rc = -ETIMEDOUT;
	} else {
		rc = hand_over(m);
		if (rc == 0) {
			m->handed_over = true;
			event_base_loopbreak(m->base);
			return;
		}
		log_errno(LOG_WARNING, -rc, "restart: the state could not be stored; stopping without "
			  "keeping the MRs");
	}
	m->quiescing = false;
	m->plain_stop(m);
}

void odpd_restart_begin(struct odpd_manager *m, void (*plain_stop)(struct odpd_manager *m))
{
	struct odpd_client *c;

	m->plain_stop = plain_stop;
	m->quiescing = true;
	m->ev_quiesce = evtimer_new(m->base, on_quiesce, m);
	if (!m->ev_quiesce) {
		m->quiescing = false;
		plain_stop(m);
		return;
	}
	LIST_FOREACH(c, &m->clients, link)
		if (c->ev_read && !c->read_paused) {
			event_del(c->ev_read);
			c->read_paused = true;
		}
	store_what_is_kept(m);
	drop_unkeepable(m);
	/* The hit tables cannot be kept (odpd-state.proto): what libraries
	 * keep unused comes back to odpd's cache now, as on a flush. */
	LIST_FOREACH(c, &m->clients, link)
		odpd_registry_revoke_unused(&m->registry, &c->holder);
	if (LIST_EMPTY(&m->clients) && m->registry.n_relaxed == 0) {
		log_info("restart: no connection and no relaxed MR to keep");
		m->quiescing = false;
		plain_stop(m);
		return;
	}
	on_quiesce(-1, 0, m);
}

/* ---------------------------------------------------------------- the start */

/* A state that cannot be used: what odpctl status says (the connections
 * stored, all dropped). */
static struct odpd_restart *unusable(struct odpd_manager *m, const struct odpd_fdstore *st, const char *version)
{
	snprintf(m->restart_from, sizeof(m->restart_from), "%s", version ? version : "unknown");
	for (unsigned i = 0; i < st->n; i++)
		if (st->fds[i].name && strncmp(st->fds[i].name, "odpd-conn-", 10) == 0)
			m->restart_dropped_clients++;
	return NULL;
}

/* The newest journal among the stored fds (journal-N), taken: its fd, or -1. */
static int take_journal(struct odpd_fdstore *st, uint64_t *ret_epoch)
{
	uint64_t best = 0;
	char name[48];

	for (unsigned i = 0; i < st->n; i++) {
		unsigned long long n;

		if (st->fds[i].fd >= 0 && st->fds[i].name &&
		    sscanf(st->fds[i].name, "odpd-journal-%llu", &n) == 1 && n > best)
			best = n;
	}
	if (!best)
		return -1;
	*ret_epoch = best;
	snprintf(name, sizeof(name), "journal-%" PRIu64, best);
	return odpd_fdstore_take(st, name);
}

static struct odpd_restart *read_journal(struct odpd_manager *m, struct odpd_fdstore *st, int fd,
					 uint64_t epoch)
{
	struct odpd_restart *rs = calloc(1, sizeof(*rs));
	bool crashed;
	uint64_t e;

	rs = rs ? rs : NULL;
	if (rs)
		rs->st = odpd_journal_read(fd, &crashed, &e);
	close(fd);
	if (!rs || !rs->st) {
		free(rs);
		log_warning("restart: the stored journal cannot be read: dropping everything");
		return unusable(m, st, NULL);
	}
	rs->folded = true;
	rs->crashed = crashed;
	rs->epoch = epoch;
	if (rs->st->format < ODPD_STATE_FORMAT_MIN || rs->st->format > ODPD_STATE_FORMAT) {
		log_warning("restart: the stored journal has format %u (odpd %s); this odpd reads %u to %u: "
			    "dropping everything", rs->st->format, rs->st->version ? rs->st->version : "?",
			    ODPD_STATE_FORMAT_MIN, ODPD_STATE_FORMAT);
		unusable(m, st, rs->st->version);
		m->restart_dropped_mrs = (unsigned)rs->st->n_mrs;
		odpd_restart_free(rs);
		return NULL;
	}
	log_info("restart: journal-%" PRIu64 " of odpd %s read: %zu connection(s), %zu MR(s)%s", epoch,
		 rs->st->version ? rs->st->version : "?", rs->st->n_clients, rs->st->n_mrs,
		 crashed ? "; the odpd before did not stop, it crashed" : "");
	return rs;
}

struct odpd_restart *odpd_restart_read(struct odpd_manager *m, struct odpd_fdstore *st)
{
	struct odpd_restart *rs;
	OdpdState__State *s;
	struct stat sb;
	uint8_t *buf;
	uint64_t epoch = 0;
	int fd;

	/* The next journal's and limbo's names come after every stored one,
	 * used or not: a name stored twice would be removed twice. */
	for (unsigned i = 0; i < st->n; i++) {
		unsigned long long n;

		if (st->fds[i].name && (sscanf(st->fds[i].name, "odpd-journal-%llu", &n) == 1 ||
					sscanf(st->fds[i].name, "odpd-limbo-%llu", &n) == 1) && n > m->restart_epoch)
			m->restart_epoch = n;
	}
	fd = take_journal(st, &epoch);
	if (fd >= 0)
		return read_journal(m, st, fd, epoch);
	fd = odpd_fdstore_take(st, "state");      /* odpd 1.4.2's hand-over */
	if (fd < 0) {
		if (st->n) {
			log_warning("restart: %u fd(s) in systemd's fd store but no state: dropped", st->n);
			return unusable(m, st, NULL);
		}
		return NULL;
	}
	if (fstat(fd, &sb) < 0 || sb.st_size <= 0 || (uint64_t)sb.st_size > STATE_MAX) {
		log_warning("restart: the stored state is unreadable or too large: dropping everything");
		close(fd);
		return unusable(m, st, NULL);
	}
	buf = malloc((size_t)sb.st_size);
	if (!buf || pread(fd, buf, (size_t)sb.st_size, 0) != sb.st_size) {
		log_warning("restart: cannot read the stored state: dropping everything");
		free(buf);
		close(fd);
		return unusable(m, st, NULL);
	}
	close(fd);
	s = odpd_state__state__unpack(NULL, (size_t)sb.st_size, buf);
	free(buf);
	if (!s) {
		log_warning("restart: the stored state does not decode: dropping everything");
		return unusable(m, st, NULL);
	}
	if (s->format < ODPD_STATE_FORMAT_MIN || s->format > ODPD_STATE_FORMAT) {
		log_warning("restart: the stored state has format %u (odpd %s); this odpd reads %u to %u: "
			    "dropping everything", s->format, s->version ? s->version : "?",
			    ODPD_STATE_FORMAT_MIN, ODPD_STATE_FORMAT);
		unusable(m, st, s->version);
		m->restart_dropped_mrs = (unsigned)s->n_mrs;
		odpd_state__state__free_unpacked(s, NULL);
		return NULL;
	}
	rs = calloc(1, sizeof(*rs));
	if (!rs) {
		odpd_state__state__free_unpacked(s, NULL);
		return NULL;
	}
	rs->st = s;
	return rs;
}

uintptr_t odpd_restart_window(const struct odpd_restart *rs, size_t size)
{
	if (!rs || !rs->st->has_window_base || rs->st->window_size != size)
		return 0;
	return (uintptr_t)rs->st->window_base;
}

void odpd_restart_drop(struct odpd_manager *m, struct odpd_restart *rs)
{
	snprintf(m->restart_from, sizeof(m->restart_from), "%s", rs->st->version ? rs->st->version : "unknown");
	m->restart_dropped_clients = (unsigned)rs->st->n_clients;
	m->restart_dropped_mrs = (unsigned)rs->st->n_mrs;
	odpd_restart_free(rs);
}

void odpd_restart_free(struct odpd_restart *rs)
{
	if (!rs)
		return;
	if (rs->folded)
		odpd_journal_state_free(rs->st);
	else
		odpd_state__state__free_unpacked(rs->st, NULL);
	free(rs);
}

/* What the restore made of each thing the state numbers. */
struct restoring {
	struct odpd_manager *m;
	OdpdState__State *st;
	struct odpd_client **clients;       /* [st->n_clients], NULL: not kept */
	const char **why;                   /* [st->n_clients]: why a client is dropped */
	struct odpd_domain **domains;       /* by Domain.id - 1 */
	struct odpd_mapping **maps;         /* by Mapping.id - 1 */
	struct odpd_mr **mrs;               /* [st->n_mrs] */
	size_t n_domains, n_maps;
	unsigned kept_mrs, dropped_mrs;
	bool crashed;                       /* from a journal that did not end with a hand-over */
	uint64_t *kept;                     /* PD id << 32 | handle of each MR taken back */
	size_t n_kept;
};

/* The id an fd name gives ("ctx-7": 7), 0 if none. */
static uint32_t name_id(const char *name, const char *kind)
{
	size_t n = strlen(kind);
	unsigned long v;
	char *end;

	if (!name || strncmp(name, kind, n) != 0 || name[n] != '-')
		return 0;
	v = strtoul(name + n + 1, &end, 10);
	return *end || v > UINT32_MAX ? 0 : (uint32_t)v;
}

/* The state's index of MR @id, or st->n_mrs if it names none. */
static size_t mr_index(const struct restoring *x, uint64_t id)
{
	size_t lo = 0, hi = x->st->n_mrs;

	while (lo < hi) {                    /* the state lists MRs by id */
		size_t mid = (lo + hi) / 2;

		if (x->st->mrs[mid]->id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < x->st->n_mrs && x->st->mrs[lo]->id == id ? lo : x->st->n_mrs;
}

static struct odpd_mr *mr_by_id(struct restoring *x, uint64_t id)
{
	size_t i = mr_index(x, id);

	return i < x->st->n_mrs ? x->mrs[i] : NULL;
}

/* After a crash: was MR @id deregistered after the journal's last commit
 * (its PD came back, the MR did not import, or came back as another)?
 * Else its PD was lost: the keys its holders have reach nothing. */
static bool mr_released_at_crash(const struct restoring *x, uint64_t id)
{
	size_t i = mr_index(x, id);
	uint32_t dom;

	if (i == x->st->n_mrs)
		return true;                 /* (the journal had it gone already) */
	dom = x->st->mrs[i]->domain;
	return dom && dom <= x->n_domains && x->domains[dom - 1];
}

static void restore_domain(struct restoring *x, const OdpdState__Domain *pd)
{
	struct odpd_manager *m = x->m;
	struct odpd_holder *owner = NULL;
	struct odpd_shared_pd *spd = NULL;
	struct ibv_context *ctx;
	struct ibv_pd *ibpd;
	int fd;

	if (pd->id == 0 || pd->id > x->n_domains || pd->dev_index >= m->devices.n)
		return;
	if (pd->shared) {
		spd = odpd_registry_find_shared(&m->registry, pd->shared);
		if (!spd || spd->doms[pd->dev_index])
			return;
	} else {
		/* adopted (with its old id) and not dropped at once */
		struct odpd_client *c = odpd_client_connected(m, pd->owner);

		if (!c || c->holder.domains[pd->dev_index])
			return;
		owner = &c->holder;
	}
	fd = odpd_fdstore_take(x->m->restore_fds, pd->fd);
	if (fd < 0)
		return;
	ctx = ibv_import_device(fd);
	if (!ctx) {
		log_errno(LOG_WARNING, errno, "restart: ibv_import_device of PD %u", pd->id);
		close(fd);
		return;
	}
	ibpd = ibv_import_pd(ctx, pd->pd_handle);
	if (!ibpd) {
		log_errno(LOG_WARNING, errno, "restart: ibv_import_pd of PD %u (handle %u)", pd->id,
			  pd->pd_handle);
		ibv_close_device(ctx);
		return;
	}
	x->domains[pd->id - 1] = odpd_registry_restore_domain(&m->registry, pd->dev_index, spd, owner, ctx,
							      ibpd, pd->exported);
	if (!x->domains[pd->id - 1]) {
		ibv_unimport_pd(ibpd);
		ibv_close_device(ctx);
		return;
	}
	/* its id in the journal and the store stays */
	x->domains[pd->id - 1]->save_id = name_id(pd->fd, "ctx");
	x->domains[pd->id - 1]->jstored = x->domains[pd->id - 1]->save_id != 0;
}

static void restore_mr(struct restoring *x, size_t i)
{
	const OdpdState__Mr *pm = x->st->mrs[i];
	struct odpd_mr_restore q = { 0 };
	struct odpd_mr *mr;
	struct ibv_mr *ibmr;

	if (pm->domain == 0 || pm->domain > x->n_domains || !x->domains[pm->domain - 1])
		return;                      /* (its context's fd closed: the kernel's MR with it) */
	if (pm->mapping == 0 || pm->mapping > x->n_maps || !x->maps[pm->mapping - 1] || pm->start >= pm->end ||
	    (i && pm->id <= x->st->mrs[i - 1]->id)) {
		/* Its PD lives on (another member came back): so would the
		 * kernel's MR, pinned, its rkey valid, known to nobody. */
		ibmr = ibv_import_mr(x->domains[pm->domain - 1]->pd, pm->handle);
		if (ibmr)
			ibv_dereg_mr(ibmr);
		else
			log_errno(LOG_WARNING, errno, "restart: MR %" PRIu64 " (handle %u) cannot be "
				  "deregistered (ibv_import_mr): it stays until its PD closes", pm->id, pm->handle);
		return;
	}
	ibmr = ibv_import_mr(x->domains[pm->domain - 1]->pd, pm->handle);
	if (!ibmr) {
		log_errno(LOG_WARNING, errno, "restart: ibv_import_mr of MR %" PRIu64 " (handle %u)", pm->id,
			  pm->handle);
		return;
	}
	if (ibmr->lkey != pm->lkey || ibmr->rkey != pm->rkey) {
		log_warning("restart: MR %" PRIu64 " came back with other keys: dropped", pm->id);
		ibv_dereg_mr(ibmr);
		return;
	}
	ibmr->addr = (void *)(uintptr_t)pm->iova;    /* an imported MR has none */
	q.id = pm->id;
	q.dom = x->domains[pm->domain - 1];
	q.map = x->maps[pm->mapping - 1];
	q.start = pm->start;
	q.end = pm->end;
	q.iova = pm->iova;
	q.access = pm->access;
	q.mr = ibmr;
	q.owner = pm->owner;
	q.relaxed = pm->relaxed;
	q.relaxed_by = pm->relaxed_by;
	q.relaxed_pid = pm->relaxed_pid;
	q.relaxed_ms = pm->relaxed_ms;
	q.ctime_ns = pm->ctime_ns;
	q.ctime_ok = pm->ctime_ok;
	q.cached = pm->cached;
	q.invalidated = pm->invalidated;
	mr = odpd_registry_restore_mr(&x->m->registry, &q);
	if (!mr) {
		ibv_dereg_mr(ibmr);
		return;
	}
	for (size_t k = 0; k < pm->n_charges; k++)
		if (odpd_registry_restore_charge(&x->m->registry, mr, pm->charges[k]->uid) < 0)
			log_warning("restart: MR %" PRIu64 ": out of memory for a charge", pm->id);
	mr->limbo = odpd_limbo_enter(q.dom, pm->handle);
	if (x->kept)
		x->kept[x->n_kept++] = (uint64_t)q.dom->save_id << 32 | pm->handle;
	x->mrs[i] = mr;
	x->kept_mrs++;
}

/* Is "KIND-ID" among the fds systemd passed (not taken yet)? */
static bool stored(const struct odpd_fdstore *fds, const char *kind, uint64_t id)
{
	char name[64];

	snprintf(name, sizeof(name), "odpd-%s%" PRIu64, kind, id);
	for (unsigned i = 0; i < fds->n; i++)
		if (fds->fds[i].fd >= 0 && fds->fds[i].name && strcmp(fds->fds[i].name, name) == 0)
			return true;
	return false;
}

static void restore_client(struct restoring *x, size_t i)
{
	const OdpdState__Client *pc = x->st->clients[i];
	struct odpd_client *c = x->clients[i];

	if (!c)
		return;
	if (pc->unkeepable)
		x->why[i] = pc->unkeepable;
	else if (x->crashed && pc->hit_slots && !stored(x->m->restore_fds, "hit-", pc->id))
		x->why[i] = "its hit table could not be retired (its fd is not in systemd's store)";
	for (size_t k = 0; k < pc->n_segments && !x->why[i]; k++) {
		const OdpdState__Segment *ps = pc->segments[k];

		if (ps->mapping == 0 || ps->mapping > x->n_maps || !x->maps[ps->mapping - 1])
			x->why[i] = "a segment of its could not be mapped again";
		else if (!odpd_attach_restore(&c->segs, &c->holder, x->maps[ps->mapping - 1], ps->handle,
					      ps->client_addr, ps->file_offset, ps->length, ps->writable,
					      ps->charged))
			x->why[i] = "out of memory";
	}
	c->segs.next_handle = pc->next_handle;
	c->holder.local_hits = pc->local_hits;
	c->holder.events = pc->events;
	for (size_t k = 0; k < pc->n_refs && !x->why[i]; k++) {
		const OdpdState__Ref *pr = pc->refs[k];
		struct odpd_mr *mr = mr_by_id(x, pr->mr);
		struct odpd_cseg *seg = NULL, *s;

		LIST_FOREACH(s, &c->segs.list, link)
			if (s->handle == pr->segment)
				seg = s;
		if (!mr && x->crashed && mr_released_at_crash(x, pr->mr)) {
			/* Deregistered after the journal's last commit: the
			 * client's release of it was in flight. When it sends
			 * it again, it succeeds. */
			uint64_t *a = realloc(c->gone_handles, (c->n_gone + 1) * sizeof(*a));

			log_info("restart: client %" PRIu64 ": MR %" PRIu64 " (its handle %" PRIu64 ") is gone",
				 pc->id, pr->mr, pr->handle);
			if (a) {
				c->gone_handles = a;
				a[c->n_gone++] = pr->handle;
			}
		} else if (!mr)
			x->why[i] = "an MR of its could not be imported again";
		else if (!odpd_registry_restore_ref(&x->m->registry, &c->holder, mr, pr->handle, pr->iova,
						    pr->length, seg))
			x->why[i] = "out of memory";
		else if (seg)
			seg->n_mrs++;
	}
	c->holder.registered = c->holder.registered || pc->registered;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Deregister the MR @handle of @d's context if it is one (an import of a
 * handle of another type, or of none, fails): true if it was. */
static bool sweep_one(struct odpd_domain *d, uint32_t handle)
{
	struct ibv_mr *ibmr = ibv_import_mr(d->pd, handle);

	if (!ibmr)
		return false;                /* deregistered after all, or not an MR */
	if (ibv_dereg_mr(ibmr) == 0)
		return true;
	ibv_unimport_mr(ibmr);
	return false;
}

/*
 * A registration whose verb was running at the crash (ODPD_LIMBO_PENDING):
 * the kernel may have made the MR without its handle ever reaching odpd.
 * The kernel gives a context's objects the lowest free handle, so such an
 * MR's handle is below the number of objects the context held: every
 * handle below that bound that names no MR taken back is looked at. Not in
 * a PD a client imported (odpd_import_pd): the client may have made MRs of
 * its own in that context, which are not odpd's to deregister; such a
 * registration stays until the PD closes.
 */
static unsigned sweep_pending(struct restoring *x, struct odpd_domain *d, size_t bound)
{
	uint64_t key;
	unsigned swept = 0;

	if (d->exported) {
		log_notice("restart: a registration was in flight at the crash in PD %u, which a client imported: "
			   "not looked for (it stays until the PD closes)", d->save_id);
		return 0;
	}
	for (size_t h = 0; h < bound && h < UINT32_MAX; h++) {
		key = (uint64_t)d->save_id << 32 | h;
		if (!bsearch(&key, x->kept, x->n_kept, sizeof(*x->kept), cmp_u64))
			swept += sweep_one(d, (uint32_t)h);
	}
	return swept;
}

/*
 * After a crash: the MRs the odpd before had in the kernel but not in its
 * journal (a registration that ran on a worker, a deregistration not yet
 * run) are in its limbo. Those in PDs taken back that were not taken back
 * themselves are deregistered: else they stayed pinned, known to nobody,
 * until their PD closes.
 */
static void sweep_limbo(struct restoring *x)
{
	char name[48];
	unsigned swept = 0;
	size_t n_entries = 0;
	bool *pending = calloc(x->n_domains + 1, sizeof(*pending));

	if (!x->kept || !pending) {
		free(pending);
		return;
	}
	qsort(x->kept, x->n_kept, sizeof(*x->kept), cmp_u64);
	for (unsigned f = 0; f < x->m->restore_fds->n; f++) {
		const struct odpd_stored_fd *sf = &x->m->restore_fds->fds[f];
		unsigned long long e;
		uint64_t *ent;
		size_t n;
		int fd;

		if (!sf->name || sscanf(sf->name, "odpd-limbo-%llu", &e) != 1)
			continue;
		snprintf(name, sizeof(name), "limbo-%llu", e);
		fd = odpd_fdstore_take(x->m->restore_fds, name);
		if (fd < 0)
			continue;
		if (odpd_limbo_read(fd, &ent, &n) < 0) {
			log_warning("restart: %s is not a limbo", name);
			close(fd);
			continue;
		}
		close(fd);
		n_entries += n;
		for (size_t i = 0; i < n; i++) {
			uint32_t jid = (uint32_t)(ent[i] >> 32), handle = (uint32_t)ent[i];
			size_t k = 0;

			if (bsearch(&ent[i], x->kept, x->n_kept, sizeof(*x->kept), cmp_u64))
				continue;
			while (k < x->n_domains && !(x->domains[k] && x->domains[k]->save_id == jid))
				k++;
			if (k == x->n_domains)
				continue;            /* its PD's context closed: the MR with it */
			if (handle == ODPD_LIMBO_PENDING)
				pending[k] = true;   /* below, once every known one is gone */
			else
				swept += sweep_one(x->domains[k], handle);
		}
		free(ent);
	}
	/* bound: every MR of the journal and of the limbos, the PD, a
	 * verifier's QP and CQ, and room to spare */
	for (size_t k = 0; k < x->n_domains; k++)
		if (pending[k])
			swept += sweep_pending(x, x->domains[k], x->st->n_mrs + n_entries + 64);
	free(pending);
	x->m->restart_swept_mrs = swept;
	if (swept)
		log_notice("restart: deregistered %u MR(s) whose registration or release was in flight at the "
			   "crash", swept);
}

/* A connection kept: after a crash, its hit table retired, the answer to
 * its last request kept, and the event that makes its library send the
 * request it waits for again. */
static void resume_client(struct restoring *x, size_t i)
{
	const OdpdState__Client *pc = x->st->clients[i];
	struct odpd_client *c = x->clients[i];
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__RestartEvent ev = ODPD__RESTART_EVENT__INIT;
	struct odpd_err err = { 0 };
	char name[48];
	int fd;

	c->stored = true;                    /* (its socket is in the store: conn-ID) */
	snprintf(name, sizeof(name), "hit-%" PRIu64, pc->id);
	fd = odpd_fdstore_take(x->m->restore_fds, name);
	if (fd >= 0) {
		if (x->crashed && odpd_hittab_retire_fd(fd, &err) < 0)
			log_warning("restart: client %" PRIu64 ": its hit table: %s", pc->id, err.msg);
		close(fd);
	}
	if (!x->crashed)
		return;
	c->resume_id = pc->has_last_id ? pc->last_id : 0;
	if (pc->has_last_reply && pc->last_reply.len) {
		c->resume_reply = malloc(pc->last_reply.len);
		if (c->resume_reply) {
			memcpy(c->resume_reply, pc->last_reply.data, pc->last_reply.len);
			c->resume_len = pc->last_reply.len;
		}
	}
	/* (and in the next journal's snapshot, should it crash too) */
	c->jlast_id = c->resume_id;
	if (c->resume_reply && (c->jlast_reply = malloc(c->resume_len))) {
		memcpy(c->jlast_reply, c->resume_reply, c->resume_len);
		c->jlast_len = c->resume_len;
	}
	ev.has_last_id = 1;
	ev.last_id = c->resume_id;
	reply.has_id = reply.has_status = 1;
	reply.body_case = ODPD__REPLY__BODY_RESTART_EVENT;
	reply.restart_event = &ev;
	odpd_registry_event_sent(&c->holder);
	odpd_client_send(c, &reply);
}

void odpd_restart_restore(struct odpd_manager *m, struct odpd_restart *rs, struct odpd_fdstore *fds)
{
	struct restoring x = { .m = m, .st = rs->st };
	uint64_t t0 = mono_us();
	OdpdState__State *st = rs->st;
	unsigned kept = 0, dropped = 0;
	const char *bad = NULL;

	m->restore_fds = fds;
	if (st->n_devices > m->devices.n)
		bad = "it names more devices than odpd found";
	for (size_t i = 0; !bad && i < st->n_devices; i++)
		if (strcmp(st->devices[i], m->devices.dev[i].name) != 0 || m->devices.dev[i].removed)
			bad = "its devices are not the ones odpd found, in the same order";
	if (!bad && odpd_restart_unavailable(m) && odpd_fdstore_available())
		bad = odpd_restart_unavailable(m);
	if (bad) {
		log_warning("restart: the previous odpd's state cannot be used (%s): %zu connection(s) "
			    "and %zu MR(s) dropped", bad, st->n_clients, st->n_mrs);
		m->restore_fds = NULL;
		odpd_restart_drop(m, rs);
		return;
	}
	x.n_domains = st->n_domains;
	x.n_maps = st->n_mappings;
	x.crashed = rs->crashed;
	x.kept = calloc(st->n_mrs + 1, sizeof(*x.kept));
	if (m->cfg.live_restart && !odpd_restart_unavailable(m)) {
		/* the MRs taken back go into the next journal's limbo */
		uint32_t max_domain = 0;

		for (size_t i = 0; i < st->n_domains; i++)
			if (name_id(st->domains[i]->fd, "ctx") > max_domain)
				max_domain = name_id(st->domains[i]->fd, "ctx");
		if (odpd_journal_prepare(m->restart_epoch + 1, max_domain) < 0)
			log_warning("restart: no limbo for the next journal");
	}
	x.clients = calloc(st->n_clients + 1, sizeof(*x.clients));
	x.why = calloc(st->n_clients + 1, sizeof(*x.why));
	x.domains = calloc(st->n_domains + 1, sizeof(*x.domains));
	x.maps = calloc(st->n_mappings + 1, sizeof(*x.maps));
	x.mrs = calloc(st->n_mrs + 1, sizeof(*x.mrs));
	if (!x.clients || !x.why || !x.domains || !x.maps || !x.mrs) {
		log_error("restart: out of memory: every connection dropped");
		goto out;
	}
	if (st->next_client_id > m->next_client_id)
		m->next_client_id = st->next_client_id;
	if (st->generation > m->registry.generation)
		m->registry.generation = st->generation;
	/* Connections first: who they are is read from their sockets again. */
	for (size_t i = 0; i < st->n_clients; i++) {
		const OdpdState__Client *pc = st->clients[i];
		int fd = odpd_fdstore_take(fds, pc->fd);

		if (fd < 0) {
			log_warning("restart: client %" PRIu64 ": its connection was not in the fd store", pc->id);
			continue;
		}
		if (odpd_client_adopt(m, fd, pc->id, pc->name, pc->starttime, &x.clients[i]) < 0) {
			log_info("restart: client %" PRIu64 " could not be taken back (it exited?)", pc->id);
			x.clients[i] = NULL;
		}
	}
	for (size_t i = 0; i < st->n_shared; i++)
		/* (out of memory: its members say so below) */
		(void)odpd_registry_restore_shared(&m->registry, st->shared[i]->name, st->shared[i]->creator_uid);
	for (size_t i = 0; i < st->n_clients; i++) {
		struct odpd_shared_pd *spd;

		if (!x.clients[i] || !st->clients[i]->shared)
			continue;
		spd = odpd_registry_find_shared(&m->registry, st->clients[i]->shared);
		if (spd)
			odpd_registry_restore_join(&x.clients[i]->holder, spd, st->clients[i]->registered);
		else
			x.why[i] = "its shared PD could not be made again";
	}
	for (size_t i = 0; i < st->n_domains; i++)
		restore_domain(&x, st->domains[i]);
	for (size_t i = 0; i < st->n_mappings; i++) {
		const OdpdState__Mapping *pm = st->mappings[i];
		struct odpd_err err = { 0 };
		int fd;

		if (pm->id == 0 || pm->id > x.n_maps || x.maps[pm->id - 1])
			continue;
		fd = odpd_fdstore_take(fds, pm->fd);
		if (fd >= 0 && odpd_mapping_restore(&m->segs, fd, (uintptr_t)pm->addr, pm->in_window,
						    &x.maps[pm->id - 1], &err) < 0)
			log_warning("restart: segment %u: %s", pm->id, err.msg);
		else if (fd >= 0)
			x.maps[pm->id - 1]->save_id = name_id(pm->fd, "seg");
	}
	for (size_t i = 0; i < st->n_mrs; i++)
		restore_mr(&x, i);
	if (x.crashed)
		sweep_limbo(&x);
	for (size_t i = 0; i < st->n_clients; i++)
		restore_client(&x, i);
	/* What nobody holds any more goes as after any last release. */
	for (size_t i = 0; i < st->n_mrs; i++)
		if (x.mrs[i])
			odpd_registry_restore_orphan(&m->registry, x.mrs[i]);
	for (size_t i = 0; i < st->n_clients; i++)
		if (!x.clients[i])
			odpd_registry_restore_gone(&m->registry, st->clients[i]->id);
	odpd_registry_restore_settle(&m->registry);
	for (size_t i = 0; i < st->n_mappings; i++)
		if (x.maps[i] && x.maps[i]->refs == 0) {
			odpd_mapping_ref(x.maps[i]);
			odpd_mapping_put(&m->segs, x.maps[i]);
		}
	for (size_t i = 0; i < st->n_clients; i++) {
		char why[160];

		if (!x.clients[i]) {
			dropped++;
			continue;
		}
		if (!x.why[i]) {
			kept++;
			resume_client(&x, i);
			continue;
		}
		dropped++;
		snprintf(why, sizeof(why), "after the restart: %s", x.why[i]);
		odpd_client_disconnect(x.clients[i], why);
	}
	if (st->next_mr_id > m->registry.next_mr_id)
		m->registry.next_mr_id = st->next_mr_id;
	x.dropped_mrs = (unsigned)st->n_mrs - x.kept_mrs;
	log_notice("restart: kept %u connection(s) and %u MR(s) of odpd %s; dropped %u connection(s) and "
		   "%u MR(s); restored in %" PRIu64 " us", kept, x.kept_mrs, st->version ? st->version : "?",
		   dropped, x.dropped_mrs, mono_us() - t0);
	snprintf(m->restart_from, sizeof(m->restart_from), "%s", st->version ? st->version : "?");
	m->restart_crashed = x.crashed;
	m->restart_kept_clients = kept;
	m->restart_kept_mrs = x.kept_mrs;
	m->restart_dropped_clients = dropped;
	m->restart_dropped_mrs = x.dropped_mrs;
out:
	m->restore_fds = NULL;
	free(x.clients);
	free(x.why);
	free(x.domains);
	free(x.maps);
	free(x.mrs);
	free(x.kept);
	odpd_restart_free(rs);
}

/* ---------------------------------------------------------------- the journal */

void odpd_restart_journal_start(struct odpd_manager *m)
{
	struct odpd_domain *d;
	uint32_t max_domain = 0;
	uint32_t max_mapping = 0;

	LIST_FOREACH(d, &m->registry.domains, link)
		if (d->save_id > max_domain)
			max_domain = d->save_id;
	odpd_mapping_each(&m->segs, max_mapping_one, &max_mapping);
	(void)odpd_journal_start(m, build_state, m->restart_epoch, max_domain, max_mapping);
}

bool odpd_restart_in_use(const char *name, void *arg)
{
	struct odpd_manager *m = arg;
	struct in_use_map q = { 0 };
	struct odpd_domain *d;
	uint32_t id;

	if (odpd_journal_owns(name))
		return true;
	if ((id = name_id(name, "ctx"))) {
		LIST_FOREACH(d, &m->registry.domains, link)
			if (d->jstored && d->save_id == id)
				return true;
		return false;
	}
	if ((id = name_id(name, "seg"))) {
		q.id = id;
		odpd_mapping_each(&m->segs, in_use_map_one, &q);
		return q.found;
	}
	if ((id = name_id(name, "conn"))) {
		struct odpd_client *c = odpd_client_connected(m, id);

		return c && c->stored;
	}
	return false;                        /* hit tables are new, old journals and limbos go */
}
