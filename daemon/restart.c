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
#include "restart.h"
#include "verify.h"

#define QUIESCE_TICK_MS 10
#define QUIESCE_READ_MS 2000           /* a client's replies wait to be read this long at most */
#define QUIESCE_MAX_MS 30000           /* within systemd's TimeoutStopSec= (90 s) */
#define STATE_MAX (256u << 20)          /* bytes of state a new odpd reads at most */

struct odpd_restart {
	OdpdState__State *st;
};

static uint64_t mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ---------------------------------------------------------------- the stop */

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
	if (!c->hello || c->refused)
		return "it had not said Hello";
	if (c->monitor)
		return "an admin tool";
	if (!c->has_holder)
		return "no state";
	return odpd_registry_holder_unkeepable(&c->m->registry, &c->holder);
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

/* What the state names, as it is written. */
struct writer {
	struct odpd_manager *m;
	uint64_t *ctimes;                   /* by mapping save_id - 1: its ctime in ns (0: unknown) */
	OdpdState__State st;
	unsigned n_domains, n_maps;
	struct odpd_mr **mrs;
	size_t n_mrs, cap_mrs;
	char **stored;                      /* names stored so far, to take back on a failure */
	size_t n_stored, cap_stored;
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

static int store(struct writer *w, const char *name, int fd)
{
	int r;

	if (w->n_stored == w->cap_stored) {
		size_t cap = w->cap_stored ? w->cap_stored * 2 : 16;
		char **a = realloc(w->stored, cap * sizeof(*a));

		if (a) {
			w->stored = a;
			w->cap_stored = cap;
		}
	}
	if (w->n_stored == w->cap_stored || !(w->stored[w->n_stored] = strdup(name))) {
		w->err = -ENOMEM;                /* not stored: nothing to take back */
		return -ENOMEM;
	}
	r = odpd_fdstore_put(name, fd);
	if (r < 0 && !w->err) {
		log_errno(LOG_WARNING, -r, "fd store: cannot store %s", name);
		w->err = r;
	}
	w->n_stored++;                       /* (removing a name not stored does no harm) */
	return r;
}

/* A hand-over that failed: nothing it stored may stay in systemd's store,
 * where a connection's socket would keep its client waiting on a dead odpd
 * (and a context its MRs pinned) until the next odpd starts. */
static void unstore(struct writer *w)
{
	for (size_t i = 0; i < w->n_stored; i++)
		if (odpd_fdstore_remove(w->stored[i]) < 0)
			log_warning("fd store: cannot remove %s", w->stored[i]);
	if (w->n_stored)
		odpd_fdstore_sync();
}

static void save_mapping(struct odpd_mapping *map, void *arg)
{
	struct writer *w = arg;
	OdpdState__Mapping *pm;
	OdpdState__Mapping **a;

	map->save_id = 0;
	if (!map->refs)
		return;
	a = realloc(w->st.mappings, (w->st.n_mappings + 1) * sizeof(*a));
	pm = calloc(1, sizeof(*pm));
	if (!a || !pm) {
		free(pm);
		if (a)
			w->st.mappings = a;
		w->err = -ENOMEM;
		return;
	}
	w->st.mappings = a;
	odpd_state__mapping__init(pm);
	map->save_id = ++w->n_maps;
	pm->id = map->save_id;
	pm->fd = fd_name("seg", pm->id);
	pm->addr = (uintptr_t)map->addr;
	pm->has_in_window = 1;
	pm->in_window = map->in_window;
	a[w->st.n_mappings++] = pm;
	if (pm->fd)
		store(w, pm->fd, map->fd);
	else
		w->err = -ENOMEM;
}

static void ctime_one(struct odpd_mapping *map, void *arg)
{
	struct writer *w = arg;
	struct timespec ts;

	if (map->save_id && odpd_mapping_ctime(map, &ts) == 0)
		w->ctimes[map->save_id - 1] = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Every saved mapping's ctime, once the coarse clock has passed them all:
 * a change after the read then stamps a later ctime. */
static void read_ctimes(struct writer *w)
{
	struct timespec now;
	uint64_t newest = 0;

	w->ctimes = calloc(w->n_maps + 1, sizeof(*w->ctimes));
	if (!w->ctimes)
		return;                      /* no MR proven: all stale after the restart */
	odpd_mapping_each(&w->m->segs, ctime_one, w);
	for (unsigned i = 0; i < w->n_maps; i++)
		if (w->ctimes[i] > newest)
			newest = w->ctimes[i];
	for (int i = 0; i < 100; i++) {       /* a tick or two of the coarse clock */
		clock_gettime(CLOCK_REALTIME_COARSE, &now);
		if ((uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec > newest)
			return;
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	}
	memset(w->ctimes, 0, (w->n_maps + 1) * sizeof(*w->ctimes));
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
	if (c->holder.spd)
		pc->shared = strdup(c->holder.spd->name);
	pc->segments = calloc(c->segs.n + 1, sizeof(*pc->segments));
	pc->refs = calloc(c->holder.n_refs + 1, sizeof(*pc->refs));
	if (!pc->fd || !pc->name || !pc->segments || !pc->refs || (c->holder.spd && !pc->shared))
		return pc;                   /* (freed with the state; w->err set by the caller) */
	LIST_FOREACH(s, &c->segs.list, link) {
		OdpdState__Segment *ps = calloc(1, sizeof(*ps));

		if (!ps)
			return pc;
		odpd_state__segment__init(ps);
		ps->handle = s->handle;
		ps->mapping = s->map->save_id;
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

static OdpdState__Mr *save_mr(struct writer *w, struct odpd_mr *mr)
{
	OdpdState__Mr *pm = calloc(1, sizeof(*pm));
	uint64_t ctime = w->ctimes ? w->ctimes[mr->map->save_id - 1] : 0;
	unsigned n = 0;

	if (!pm)
		return NULL;
	odpd_state__mr__init(pm);
	pm->id = mr->node.seq;
	pm->domain = mr->dom->save_id;
	pm->mapping = mr->map->save_id;
	pm->start = mr->node.start;
	pm->end = mr->node.end;
	pm->iova = mr->iova;
	pm->has_access = 1;
	pm->access = mr->access;
	pm->handle = mr->mr->handle;
	pm->has_lkey = pm->has_rkey = 1;
	pm->lkey = mr->mr->lkey;
	pm->rkey = mr->mr->rkey;
	pm->has_relaxed = 1;
	pm->relaxed = mr->state == ODPD_MR_RELAXED;
	if (pm->relaxed) {
		pm->has_relaxed_by = pm->has_relaxed_pid = pm->has_relaxed_ms = 1;
		pm->relaxed_by = mr->relaxed_by;
		pm->relaxed_pid = mr->relaxed_pid;
		pm->relaxed_ms = mr->relaxed_ms;
	}
	pm->has_ctime_ns = pm->has_ctime_ok = pm->has_owner = pm->has_cached = pm->has_invalidated = 1;
	/* Proven current against a settled ctime read before: the next odpd
	 * serves it while the ctime stays (a punched hole moves it). */
	pm->ctime_ns = ctime;
	pm->ctime_ok = ctime && odpd_registry_mr_current(&w->m->registry, mr, ctime);
	pm->owner = mr->owner_id;
	pm->cached = mr->cached;
	pm->invalidated = mr->invalidated;
	for (struct odpd_charge *c = odpd_mr_first_charge(mr); c; c = c->next)
		n++;
	pm->charges = calloc(n + 1, sizeof(*pm->charges));
	if (!pm->charges)
		return pm;
	for (struct odpd_charge *c = odpd_mr_first_charge(mr); c; c = c->next) {
		OdpdState__Charge *pc = calloc(1, sizeof(*pc));

		if (!pc)
			break;
		odpd_state__charge__init(pc);
		pc->uid = c->acct->uid;
		pc->has_refs = 1;
		pc->refs = c->refs;
		pm->charges[pm->n_charges++] = pc;
	}
	return pm;
}

/* Free the fields of a message built here with calloc and strdup, as
 * protobuf-c frees what it unpacked (the message itself is the caller's). */
static void state_free_built(OdpdState__State *st)
{
	OdpdState__State *heap = malloc(sizeof(*heap));

	if (!heap)
		return;                      /* stopping anyway: the process exits */
	*heap = *st;
	protobuf_c_message_free_unpacked(&heap->base, NULL);
}

static int write_state(struct writer *w, int *ret_fd)
{
	size_t len = odpd_state__state__get_packed_size(&w->st);
	uint8_t *buf = malloc(len ? len : 1);
	int fd;

	if (!buf)
		return -ENOMEM;
	odpd_state__state__pack(&w->st, buf);
	fd = memfd_create("odpd-state", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || write(fd, buf, len) != (ssize_t)len ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0) {
		int e = errno ? errno : EIO;

		if (fd >= 0)
			close(fd);
		free(buf);
		return -e;
	}
	free(buf);
	log_info("restart: state of %zu bytes written", len);
	*ret_fd = fd;
	return 0;
}

/* Everything quiet: store it all. 0, or -errno with nothing usable stored
 * (the next odpd finds no state and drops what it got). */
static int hand_over(struct odpd_manager *m)
{
	struct odpd_registry *r = &m->registry;
	struct writer w = { .m = m };
	struct odpd_domain *d;
	struct odpd_client *c;
	struct odpd_mr *mr;
	unsigned n_clients = 0;
	uint64_t t0 = mono_us();
	int fd, rc;

	odpd_state__state__init(&w.st);
	w.st.format = ODPD_STATE_FORMAT;
	w.st.version = strdup(ODPD_VERSION);
	w.st.has_window_base = w.st.has_window_size = 1;
	{
		size_t size;

		w.st.window_base = odpd_window_base(m->segs.window, &size);
		w.st.window_size = size;
	}
	w.st.has_next_client_id = w.st.has_next_mr_id = w.st.has_generation = 1;
	w.st.next_client_id = m->next_client_id;
	w.st.next_mr_id = r->next_mr_id;
	w.st.generation = r->generation;
	w.st.devices = calloc(m->devices.n + 1, sizeof(char *));
	for (unsigned i = 0; w.st.devices && i < m->devices.n; i++)
		w.st.devices[w.st.n_devices++] = strdup(m->devices.dev[i].name);
	/* Shared PDs. */
	{
		struct odpd_shared_pd *spd;

		w.st.shared = calloc(r->n_shared + 1, sizeof(*w.st.shared));
		LIST_FOREACH(spd, &r->shared, link) {
			OdpdState__SharedPd *ps = w.st.shared ? calloc(1, sizeof(*ps)) : NULL;

			if (!ps) {
				w.err = -ENOMEM;
				break;
			}
			odpd_state__shared_pd__init(ps);
			ps->name = strdup(spd->name);
			ps->has_creator_uid = 1;
			ps->creator_uid = spd->creator_uid;
			w.st.shared[w.st.n_shared++] = ps;
		}
	}
	/* Domains: their contexts' command fds. An idle verifier goes first:
	 * its QP, CQ and bounce MR would stay in the context unknown. */
	LIST_FOREACH(d, &r->domains, link) {
		OdpdState__Domain *pd, **a;

		d->save_id = 0;
		if (!d->pd || d->retired)
			continue;
		odpd_verifier_free(d->verifier);
		d->verifier = NULL;
		a = realloc(w.st.domains, (w.st.n_domains + 1) * sizeof(*a));
		pd = calloc(1, sizeof(*pd));
		if (!a || !pd) {
			free(pd);
			if (a)
				w.st.domains = a;
			w.err = -ENOMEM;
			break;
		}
		w.st.domains = a;
		odpd_state__domain__init(pd);
		d->save_id = ++w.n_domains;
		pd->id = d->save_id;
		pd->dev_index = d->dev_index;
		if (d->spd)
			pd->shared = strdup(d->spd->name);
		pd->has_owner = pd->has_pd_handle = pd->has_exported = 1;
		pd->owner = d->owner_id;
		pd->pd_handle = d->pd->handle;
		pd->exported = d->exported;
		pd->fd = fd_name("ctx", pd->id);
		a[w.st.n_domains++] = pd;
		if (pd->fd)
			store(&w, pd->fd, d->ctx->cmd_fd);
	}
	odpd_mapping_each(&m->segs, save_mapping, &w);
	read_ctimes(&w);
	/* Connections, their segments and references. */
	w.st.clients = calloc(m->n_clients + 1, sizeof(*w.st.clients));
	LIST_FOREACH(c, &m->clients, link) {
		OdpdState__Client *pc;

		if (!w.st.clients || client_unkeepable(c)) {
			w.err = w.err ? w.err : -EAGAIN;
			break;
		}
		pc = save_client(&w, c);
		if (!pc) {
			w.err = -ENOMEM;
			break;
		}
		w.st.clients[w.st.n_clients++] = pc;
		n_clients++;
		odpd_registry_hits_freeze(&c->holder);
		store(&w, pc->fd, c->fd);
	}
	/* MRs: those held, and the relaxed ones. */
	TAILQ_FOREACH(mr, &r->relaxed, rlink)
		if (add_mr(&w, mr) < 0)
			w.err = -ENOMEM;
	if (w.mrs) {
		qsort(w.mrs, w.n_mrs, sizeof(*w.mrs), cmp_mr);
		w.st.mrs = calloc(w.n_mrs + 1, sizeof(*w.st.mrs));
		for (size_t i = 0; w.st.mrs && i < w.n_mrs; i++) {
			if (i && w.mrs[i] == w.mrs[i - 1])
				continue;
			if (!odpd_registry_mr_keepable(w.mrs[i]) || !w.mrs[i]->dom->save_id ||
			    !w.mrs[i]->map->save_id) {
				w.err = w.err ? w.err : -EAGAIN;
				continue;
			}
			w.st.mrs[w.st.n_mrs] = save_mr(&w, w.mrs[i]);
			if (!w.st.mrs[w.st.n_mrs])
				w.err = -ENOMEM;
			else
				w.st.n_mrs++;
		}
	}
	free(w.mrs);
	free(w.ctimes);
	if (!w.err)
		w.err = write_state(&w, &fd);
	if (!w.err) {
		store(&w, "state", fd);
		close(fd);
	}
	rc = odpd_fdstore_sync();
	if (rc < 0 && !w.err)
		w.err = rc;
	if (!w.err)
		log_notice("restart: handed %u connection(s), %u PD(s), %u segment(s) and %zu MR(s) to "
			   "systemd's fd store for the next odpd in %" PRIu64 " us", n_clients, w.n_domains,
			   w.n_maps, w.st.n_mrs, mono_us() - t0);
	rc = w.err;
	if (rc < 0)
		unstore(&w);
	for (size_t i = 0; i < w.n_stored; i++)
		free(w.stored[i]);
	free(w.stored);
	state_free_built(&w.st);
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

struct odpd_restart *odpd_restart_read(struct odpd_manager *m, struct odpd_fdstore *st)
{
	struct odpd_restart *rs;
	OdpdState__State *s;
	struct stat sb;
	uint8_t *buf;
	int fd = odpd_fdstore_take(st, "state");

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
};

static struct odpd_mr *mr_by_id(struct restoring *x, uint64_t id)
{
	size_t lo = 0, hi = x->st->n_mrs;

	while (lo < hi) {                    /* the state lists MRs by id */
		size_t mid = (lo + hi) / 2;

		if (x->st->mrs[mid]->id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < x->st->n_mrs && x->st->mrs[lo]->id == id ? x->mrs[lo] : NULL;
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
	}
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
	x->mrs[i] = mr;
	x->kept_mrs++;
}

static void restore_client(struct restoring *x, size_t i)
{
	const OdpdState__Client *pc = x->st->clients[i];
	struct odpd_client *c = x->clients[i];

	if (!c)
		return;
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
		if (!mr)
			x->why[i] = "an MR of its could not be imported again";
		else if (!odpd_registry_restore_ref(&x->m->registry, &c->holder, mr, pr->handle, pr->iova,
						    pr->length, seg))
			x->why[i] = "out of memory";
		else if (seg)
			seg->n_mrs++;
	}
	c->holder.registered = c->holder.registered || pc->registered;
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
	}
	for (size_t i = 0; i < st->n_mrs; i++)
		restore_mr(&x, i);
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
	odpd_restart_free(rs);
}
