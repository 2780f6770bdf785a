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
#include "registry.h"
#include "verify.h"

#define PAGE 4096ull
#define ACCESS_REMOTE (ODPD__ACCESS__ACCESS_REMOTE_READ | ODPD__ACCESS__ACCESS_REMOTE_WRITE | \
		       ODPD__ACCESS__ACCESS_REMOTE_ATOMIC)

/* MRs and references come from slabs, whose objects are 8-byte aligned. */
_Static_assert(_Alignof(struct odpd_mr) <= 8 && _Alignof(struct odpd_ref) <= 8,
	       "struct odpd_mr and struct odpd_ref must fit the slab's 8-byte alignment");

/* A batch of MRs deregistered together on a worker. */
struct odpd_batch {
	struct odpd_job job;
	LIST_ENTRY(odpd_batch) link;
	struct odpd_registry *r;
	uint64_t seq;
	struct odpd_mr *mrs;                /* by batch_next */
	unsigned n;
	unsigned n_dereg;                   /* of them registered in the kernel */
	uint64_t bytes;
	bool flush;                         /* a flush, not a plain deregistration */
	bool implicit_only;                 /* of implicit MRs only: no barrier waits for it */
	unsigned registrar_waits;           /* implicit MRs' registrars yet to answer:
					     * submitted once none is left */
};

/* An MR a verify reads through when it was invalidated or its device went
 * away (dead_stage 1): verify_done batches it under the number reserved here. */
struct odpd_deferred {
	struct odpd_deferred *next;
	struct odpd_mr *mr;
	uint64_t seq;                       /* 0: none reserved (no memory for this) */
};

/* Someone waiting for batches: a flush barrier (every batch up to seq) or a
 * deregistration (that one batch). */
struct odpd_waiter {
	LIST_ENTRY(odpd_waiter) link;
	uint64_t seq;
	bool only;
	uint64_t own;                       /* the batch whose MRs it counts, 0: none */
	odpd_done_cb cb;
	void *arg;
	unsigned mrs;
	uint64_t bytes;
};

/* A time in ns (a file's ctime: unique until 2554). */
static uint64_t ts_ns(const struct timespec *ts)
{
	return (uint64_t)ts->tv_sec * 1000000000ull + (uint64_t)ts->tv_nsec;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts_ns(&ts);
}

static int access_to_ibv(uint32_t a)
{
	return (a & ODPD__ACCESS__ACCESS_LOCAL_WRITE ? IBV_ACCESS_LOCAL_WRITE : 0) |
	       (a & ODPD__ACCESS__ACCESS_REMOTE_READ ? IBV_ACCESS_REMOTE_READ : 0) |
	       (a & ODPD__ACCESS__ACCESS_REMOTE_WRITE ? IBV_ACCESS_REMOTE_WRITE : 0) |
	       (a & ODPD__ACCESS__ACCESS_REMOTE_ATOMIC ? IBV_ACCESS_REMOTE_ATOMIC : 0);
}

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

static void relaxed_arm(struct odpd_registry *r);
static void prefetch_count(struct odpd_registry *r, const struct odpd_device *dev, int rc, uint64_t bytes);
static void start_batch(struct odpd_registry *r, struct odpd_mr *list, bool flush, struct odpd_waiter *w);
static bool batch_split_implicit(struct odpd_registry *r, struct odpd_mr **list, bool flush);

/* ---------------------------------------------------------------- charges */

/* An MR's charges: charge0 in place (acct NULL: free), then charge0.next. */
static struct odpd_charge *charge_find(const struct odpd_mr *mr, const struct odpd_account *a)
{
	if (mr->charge0.acct == a && a)
		return (struct odpd_charge *)&mr->charge0;
	for (struct odpd_charge *c = mr->charge0.next; c; c = c->next)
		if (c->acct == a)
			return c;
	return NULL;
}

/*
 * Distinct pinned bytes, from the MRs over a segment (map->mrs): what of
 * [s, e) no other pinned MR charged to an account, or counted by the
 * daemon, covers. An MR asks before its own charge or count is set, and
 * after it is cleared.
 */
static bool charged_to(const struct odpd_inode *n, const void *acct)
{
	const struct odpd_mr *mr = (const struct odpd_mr *)n;

	return mr->pinned && charge_find(mr, acct);
}

static bool counted(const struct odpd_inode *n, const void *arg)
{
	(void)arg;
	return ((const struct odpd_mr *)n)->counted;
}

static uint64_t account_uncovered(struct odpd_mapping *map, const struct odpd_account *a, uint64_t s, uint64_t e)
{
	return odpd_itree_uncovered(&map->mrs, s, e, charged_to, a);
}

static uint64_t mr_uncovered(struct odpd_mr *mr, bool (*pred)(const struct odpd_inode *n, const void *arg),
			     const void *arg)
{
	return odpd_itree_uncovered(&mr->map->mrs, mr->node.start, mr->node.end, pred, arg);
}

/* Charge @a for @mr's pages (once per account and MR). */
static int charge_add(struct odpd_registry *r, struct odpd_mr *mr, struct odpd_account *a,
		      struct odpd_charge **ret)
{
	struct odpd_charge *c = mr->charge0.acct ? calloc(1, sizeof(*c)) : &mr->charge0;

	(void)r;
	if (!c)
		return -ENOMEM;
	c->refs = 0;
	odpd_account_charge(a, mr->pinned ? mr_uncovered(mr, charged_to, a) : 0);
	c->acct = a;
	if (c != &mr->charge0) {
		c->next = mr->charge0.next;
		mr->charge0.next = c;
	}
	*ret = c;
	return 0;
}

static void charge_drop(struct odpd_registry *r, struct odpd_mr *mr, struct odpd_charge *c)
{
	struct odpd_account *a = c->acct;

	/* out of the MR's charges first: its pages then count as uncovered */
	if (c == &mr->charge0)
		c->acct = NULL;
	else
		for (struct odpd_charge **pc = &mr->charge0.next; *pc; pc = &(*pc)->next)
			if (*pc == c) {
				*pc = c->next;
				break;
			}
	odpd_account_uncharge(&r->quota, a, mr->pinned ? mr_uncovered(mr, charged_to, a) : 0);
	if (c != &mr->charge0)
		free(c);
}

/* The daemon's own count of distinct pinned pages. */
static void global_charge(struct odpd_registry *r, struct odpd_mr *mr)
{
	if (!mr->pinned || mr->counted)
		return;
	r->pinned += mr_uncovered(mr, counted, NULL);
	mr->counted = true;
}

static void global_uncharge(struct odpd_registry *r, struct odpd_mr *mr)
{
	if (!mr->counted)
		return;
	mr->counted = false;
	r->pinned -= mr_uncovered(mr, counted, NULL);
}

/* ---------------------------------------------------------------- domains */

static void domain_close_run(struct odpd_job *job);
static void domain_close_done(struct odpd_job *job);
static void domain_close_submit(void *arg);
static void verifier_unlist(struct odpd_registry *r, struct odpd_domain *d);

struct close_job {
	struct odpd_job job;
	struct odpd_registry *r;
	struct odpd_domain *d;
	struct odpd_device *dev;
};

static void shared_maybe_free(struct odpd_registry *r, struct odpd_shared_pd *spd);

/* Close @d on a worker once nobody uses it and no MR is left in it. The
 * shared PD it belonged to goes too when it has no member and no domain
 * left, unless @keep_spd (the caller still looks at it). */
static void domain_maybe_close(struct odpd_registry *r, struct odpd_domain *d, bool keep_spd)
{
	struct odpd_shared_pd *spd = d->spd;
	struct close_job *j;

	if (d->members || d->n_mrs || d->jobs)
		return;
	verifier_unlist(r, d);                 /* the close frees it */
	LIST_REMOVE(d, link);
	if (spd) {
		spd->doms[d->dev_index] = NULL;
		if (!keep_spd)
			shared_maybe_free(r, spd);
	}
	d->spd = NULL;
	if (d->registrar) {
		odpd_registrar_stop(d->registrar);   /* it exits on EOF; reaped below */
		r->odp.registrars--;
	}
	j = calloc(1, sizeof(*j));
	if (!j) {                              /* never leak a context: close it here */
		log_error("out of memory: closing a PD on the event loop");
		d->dev->n_domains--;
		odpd_domain_close(d);
		return;
	}
	j->r = r;
	j->d = d;
	j->dev = d->dev;
	j->job.run = domain_close_run;
	j->job.done = domain_close_done;
	r->pending++;
	if (d->registrar) {
		/* The PD closes once its registrar has exited (its imported
		 * context with it): the loop waits for that, never a worker (its
		 * user may have stopped it). */
		struct odpd_registrar *g = d->registrar;

		d->registrar = NULL;
		odpd_registrar_reap(g, domain_close_submit, j);
		return;
	}
	odpd_pool_submit(r->pool, &j->job);
}

static void domain_close_submit(void *arg)
{
	struct close_job *j = arg;

	odpd_pool_submit(j->r->pool, &j->job);
}

static void domain_close_run(struct odpd_job *job)
{
	odpd_domain_close(((struct close_job *)job)->d);
}

static void domain_close_done(struct odpd_job *job)
{
	struct close_job *j = (struct close_job *)job;

	j->dev->n_domains--;
	j->r->pending--;
	free(j);
}

static void shared_maybe_free(struct odpd_registry *r, struct odpd_shared_pd *spd)
{
	if (spd->members)
		return;
	for (unsigned i = 0; i < r->devices->n; i++)
		if (spd->doms[i])
			return;
	LIST_REMOVE(spd, link);
	r->n_shared--;
	free(spd->doms);
	free(spd);
}

/* The PD a holder registers into on device @i, made on first use. */
static struct odpd_domain *holder_domain(struct odpd_registry *r, struct odpd_holder *h, unsigned i)
{
	struct odpd_domain **slot = h->spd ? &h->spd->doms[i] : &h->domains[i];
	struct odpd_domain *d = *slot;

	if (d)
		return d;
	d = odpd_domain_new(&r->devices->dev[i], i);
	if (!d)
		return NULL;
	d->dev->n_domains++;
	d->spd = h->spd;
	d->owner_id = h->spd ? 0 : h->id;
	d->members = h->spd ? h->spd->members : 1;
	LIST_INSERT_HEAD(&r->domains, d, link);
	*slot = d;
	return d;
}

struct odpd_domain *odpd_registry_holder_domain(struct odpd_registry *r, struct odpd_holder *h,
						unsigned dev_index)
{
	return holder_domain(r, h, dev_index);
}

int odpd_registry_start_registrar(struct odpd_registry *r, struct odpd_domain *d, const char *label,
				  uid_t uid, gid_t gid, struct odpd_err *err)
{
	int rc = odpd_registrar_spawn(r->base, label, uid, gid, &d->registrar, err);

	if (rc == 0)
		r->odp.registrars++;
	return rc;
}

static void registrar_reaped(void *arg)
{
	((struct odpd_registry *)arg)->pending--;
}

void odpd_registry_drop_registrar(struct odpd_registry *r, struct odpd_domain *d)
{
	struct odpd_registrar *g = d->registrar;

	if (!g)
		return;
	d->registrar = NULL;
	r->odp.registrars--;
	r->pending++;                        /* odpd stops once it is reaped */
	odpd_registrar_reap(g, registrar_reaped, r);
}

/* Into / out of its mapping's tree (loop; workers walk it under tree_lock).
 * Inserted right after mr_new: its id (node.seq) must be the largest in the
 * tree (odpd_itree_insert aborts otherwise: the order would break). */
static void map_insert(struct odpd_mr *mr)
{
	pthread_mutex_lock(&mr->map->tree_lock);
	odpd_itree_insert(&mr->map->mrs, &mr->node);
	pthread_mutex_unlock(&mr->map->tree_lock);
	mr->in_map = true;
}

static void map_remove(struct odpd_mr *mr)
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
static void mr_unindex(struct odpd_mr *mr)
{
	mr->cached = false;
}

/* ---------------------------------------------------------------- the relaxed queue */

static void relaxed_remove(struct odpd_registry *r, struct odpd_mr *mr)
{
	TAILQ_REMOVE(&r->relaxed, mr, rlink);
	r->n_relaxed--;
	r->relaxed_bytes -= odpd_mr_length(mr);
}

/*
 * @mr (invalidated or dead) has verifies reading through it: it is batched
 * when the last one ends (verify_done), under a batch number reserved now,
 * so that a flush from now on waits for it as for the batches in flight.
 */
static void mr_defer(struct odpd_registry *r, struct odpd_mr *mr)
{
	struct odpd_deferred *d = malloc(sizeof(*d));

	mr->dead_stage = 1;
	if (!d) {
		log_error("out of memory: a flush may not wait for MR %" PRIu64, mr->node.seq);
		return;
	}
	d->mr = mr;
	d->seq = ++r->batch_seq;
	d->next = r->deferred;
	r->deferred = d;
}

/* Take @mr's deferral off the list: its reserved batch number, or 0. */
static uint64_t mr_undefer(struct odpd_registry *r, struct odpd_mr *mr)
{
	for (struct odpd_deferred **pd = &r->deferred; *pd; pd = &(*pd)->next)
		if ((*pd)->mr == mr) {
			struct odpd_deferred *d = *pd;
			uint64_t seq = d->seq;

			*pd = d->next;
			free(d);
			return seq;
		}
	return 0;
}

/* Invalidate: out of the cache and the queue, a new generation, into @list. */
static void mr_invalidate(struct odpd_registry *r, struct odpd_mr *mr, struct odpd_mr **list)
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
static unsigned collect_relaxed(struct odpd_registry *r, bool (*match)(const struct odpd_mr *, const void *),
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

static bool match_all(const struct odpd_mr *mr, const void *arg)
{
	(void)mr;
	(void)arg;
	return true;
}

static void flush_queue(struct odpd_registry *r, const char *why)
{
	struct odpd_mr *list = NULL;
	unsigned n = collect_relaxed(r, match_all, NULL, &list);

	if (n) {
		log_debug("registry: invalidating %u relaxed MR(s): %s", n, why);
		start_batch(r, list, true, NULL);
	}
	relaxed_arm(r);
}

static void on_relaxed_timer(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	flush_queue(arg, "relaxed window passed");
}

/* The timer fires when the oldest relaxed MR passes the relaxed window. */
static void relaxed_arm(struct odpd_registry *r)
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

/* ---------------------------------------------------------------- the witness view */

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

/* Is @ts (a file's ctime) earlier than the current coarse clock, the clock
 * the kernel stamps inodes with? Then any later change stamps a later time. */
static bool ctime_settled(const struct timespec *ts)
{
	struct timespec now;

	clock_gettime(CLOCK_REALTIME_COARSE, &now);
	return now.tv_sec > ts->tv_sec || (now.tv_sec == ts->tv_sec && now.tv_nsec > ts->tv_nsec);
}

static void witness_populate(uint64_t s, uint64_t e, void *arg)
{
	struct odpd_mapping *map = arg;

	/* errors leave pages absent: the MR then just never proves current */
	madvise(map->witness + s, e - s, MADV_POPULATE_READ);
}

/*
 * Worker, before the pin: the baseline ctime, then the witness pages of the
 * range that no other MR relies on. A hole punched after this zaps them (and
 * moves ctime), so the MR never proves current again; punched before the pin
 * is the same. Page faults move ctime too (file_update_time on every first
 * write fault of a shared mapping), so ctime alone would make needless
 * misses, and at the clock's tick granularity it could miss a punch.
 */
static bool pages_present(struct odpd_registry *r, uintptr_t addr, uint64_t length, bool loop);
static int scan_absent(int pagemap_fd, uintptr_t start, uintptr_t end,
		       bool (*fn)(uintptr_t s, uintptr_t e, void *arg), void *arg);

/* Workers: is every page of [@addr, +@length) of one of odpd's views mapped
 * already? Only asked where PAGEMAP_SCAN answers in one walk, cheaper than
 * populating pages again; without it: no (populate). */
static bool mapped_already(struct odpd_registry *r, const void *addr, uint64_t length)
{
	return r->pagemap_scan && pages_present(r, (uintptr_t)addr, length, false);
}

/*
 * A read fault maps the page cache pages around it too (fault-around, up to
 * the page table it lands in; a huge page maps whole), covered witness
 * pages included: one a hole punch zapped from under an MR, whose offset
 * the file has a page for again since, would come back and make that MR
 * look current while it pins the orphan. So before witness pages of [@s,
 * @e) are populated, every covered witness page within that reach must be
 * present; if one is not, the epoch moves first, and no MR pinned before
 * proves current again. Workers, under witness_lock.
 */
struct witness_guard {
	struct odpd_registry *r;
	struct odpd_mapping *map;
	uint64_t at;                        /* start of the covered stretch in view */
	bool absent;
};

static void guard_covered(struct witness_guard *g, uint64_t s, uint64_t e)
{
	if (!g->absent && s < e && !pages_present(g->r, (uintptr_t)(g->map->witness + s), e - s, false))
		g->absent = true;
}

static void guard_gap(uint64_t s, uint64_t e, void *arg)
{
	struct witness_guard *g = arg;

	guard_covered(g, g->at, s);
	g->at = e;
}

/*
 * Witness coverage: the pinned MRs that rely on their witness pages (their
 * witnessed flag), from map->mrs. Workers, under witness_lock, which keeps
 * those flags still: what the loop adds to the tree or takes out of it
 * meanwhile is never witnessed. The tree is locked only while walked.
 */
static bool is_witnessed(const struct odpd_inode *n, const void *arg)
{
	(void)arg;
	return ((const struct odpd_mr *)n)->witnessed;
}

static bool witnessed_visit(struct odpd_inode *n, void *arg)
{
	return is_witnessed(n, arg);
}

/* Does a witnessed MR cover any of [s, e)? (The first one found ends the walk.) */
static bool witness_covers(struct odpd_mapping *map, uint64_t s, uint64_t e)
{
	struct odpd_inode *n;

	pthread_mutex_lock(&map->tree_lock);
	n = odpd_itree_find_overlapping(&map->mrs, s, e, witnessed_visit, NULL);
	pthread_mutex_unlock(&map->tree_lock);
	return n != NULL;
}

/* @fn for each part of [s, e) no witnessed MR covers, ascending; listed a
 * few at a time, the tree unlocked while @fn runs (it may fault pages). */
static void witness_for_each_gap(struct odpd_mapping *map, uint64_t s, uint64_t e,
				 void (*fn)(uint64_t gs, uint64_t ge, void *arg), void *arg)
{
	struct odpd_gap g[16];

	while (s < e) {
		unsigned n;

		pthread_mutex_lock(&map->tree_lock);
		n = odpd_itree_gaps(&map->mrs, s, e, is_witnessed, NULL, g, 16, &s);
		pthread_mutex_unlock(&map->tree_lock);
		for (unsigned i = 0; i < n; i++)
			fn(g[i].start, g[i].end, arg);
	}
}

/* An absent run of witness pages: does an MR's witness cover any of it? */
static bool absent_covered(uintptr_t s, uintptr_t e, void *arg)
{
	struct witness_guard *g = arg;

	return witness_covers(g->map, s - (uintptr_t)g->map->witness, e - (uintptr_t)g->map->witness);
}

static void witness_guard(struct odpd_registry *r, struct odpd_mapping *map, uint64_t s, uint64_t e)
{
	/* Fault-around stays within the page table of the faulting address (a
	 * span of 512 entries of 4 KiB, 2 MiB, aligned in the address space,
	 * not in the file); a huge page maps whole. */
	const uint64_t reach = map->page_size > (PAGE / 8) * PAGE ? map->page_size : (PAGE / 8) * PAGE;
	uintptr_t w = (uintptr_t)map->witness, vlo = (w + s) & ~(uintptr_t)(reach - 1),
		  vhi = (w + e + reach - 1) & ~(uintptr_t)(reach - 1);
	uint64_t lo = vlo < w ? 0 : vlo - w, hi = vhi - w;
	struct witness_guard g = { .r = r, .map = map, .at = lo };
	int k = -1;

	if (hi > map->size)
		hi = map->size;
	/* One walk for the absent runs (PAGEMAP_SCAN), not one per covered stretch. */
	if (r->pagemap_scan)
		k = scan_absent(r->pagemap_fd, (uintptr_t)(map->witness + lo), (uintptr_t)(map->witness + hi),
				absent_covered, &g);
	if (k >= 0) {
		g.absent = k == 1;
	} else {
		witness_for_each_gap(map, lo, hi, guard_gap, &g);
		guard_covered(&g, g.at, hi);
	}
	if (g.absent)
		atomic_fetch_add_explicit(&map->witness_epoch, 1, memory_order_acq_rel);
}

static void witness_begin(struct odpd_registry *r, struct odpd_mr *mr)
{
	struct odpd_mapping *map = mr->map;
	uint8_t *w;
	struct stat st;

	if (fstat(map->fd, &st) == 0) {       /* open while the MR holds the mapping */
		mr->ctime_ns = ts_ns(&st.st_ctim);
		mr->ctime_ok = ctime_settled(&st.st_ctim);
	}
	if (!map->witness)
		return;
	w = map->witness + mr->node.start;
	/* Every witness page there present (PAGEMAP_SCAN: one walk without
	 * touching the pages, cheaper than populating): nothing to put back. */
	if (!mapped_already(r, w, odpd_mr_length(mr))) {
		witness_guard(r, map, mr->node.start, mr->node.end);
		witness_for_each_gap(map, mr->node.start, mr->node.end, witness_populate, map);
		/* Pages other MRs' witness covers, zapped: a hole was punched
		 * there since their pins. This MR needs them back; a new epoch
		 * keeps the older MRs of the segment from ever proving current
		 * again (witness_guard moved it already where it saw that). */
		if (!pages_present(r, (uintptr_t)w, odpd_mr_length(mr), false)) {
			atomic_fetch_add_explicit(&map->witness_epoch, 1, memory_order_acq_rel);
			madvise(w, odpd_mr_length(mr), MADV_POPULATE_READ);
		}
	}
	mr->witness_epoch = atomic_load_explicit(&map->witness_epoch, memory_order_acquire);
	mr->witnessed = true;
}

/* Resident runs of [@addr, @addr + @length) of a shared file mapping
 * (mincore(2): the page cache), each handed to @fn. */
static void for_each_resident_run(uint8_t *addr, uint64_t length, void (*fn)(uint8_t *a, uint64_t n, void *arg),
				  void *arg)
{
	unsigned char vec[4096];
	uint8_t *run = NULL;

	for (uint64_t done = 0; done < length;) {
		uint64_t n = length - done < sizeof(vec) * PAGE ? length - done : sizeof(vec) * PAGE;

		if (mincore(addr + done, n, vec) < 0)
			memset(vec, 0, sizeof(vec));   /* nothing known resident: nothing mapped */
		for (uint64_t i = 0; i < n / PAGE; i++) {
			uint8_t *pg = addr + done + i * PAGE;

			if ((vec[i] & 1) && !run)
				run = pg;
			else if (!(vec[i] & 1) && run) {
				fn(run, (uint64_t)(pg - run), arg);
				run = NULL;
			}
		}
		done += n;
	}
	if (run)
		fn(run, (uint64_t)(addr + length - run), arg);
}

static void populate_run(uint8_t *a, uint64_t n, void *arg)
{
	int *rc = arg;

	if (madvise(a, n, MADV_POPULATE_READ) < 0 && !*rc)
		*rc = errno;
}

struct ahead {
	struct odpd_mapping *map;
	int rc;
};

static void ahead_gap(uint64_t s, uint64_t e, void *arg)
{
	struct ahead *a = arg;

	for_each_resident_run(a->map->witness + s, e - s, populate_run, &a->rc);
}

/*
 * Worker: map odpd's view of [@start, @start + @length) of @map (file
 * offsets, whole pages) ahead of registrations (MapSegment), and the witness
 * pages there that no MR relies on. Only pages the page cache has (the
 * client faulted them in, as it says): read faults on them allocate
 * nothing, so a client cannot make odpd's cgroup pay. The witness part goes
 * in steps of 16 MiB, each under witness_lock and after witness_guard.
 * 0 or an errno of madvise.
 */
int odpd_registry_map_ahead(struct odpd_registry *r, struct odpd_mapping *map, uint64_t start, uint64_t length)
{
	const uint64_t step = 16u << 20;
	struct ahead a = { .map = map }, w = { .map = map };

	/* mapped already (an earlier MapSegment or MR): one scan says so */
	if (!mapped_already(r, map->addr + start, length))
		for_each_resident_run(map->addr + start, length, populate_run, &a.rc);
	/* the witness only helps: its errors leave pages for the registration */
	for (uint64_t s = start; !a.rc && map->witness && s < start + length; s += step) {
		uint64_t e = start + length - s < step ? start + length : s + step;

		if (mapped_already(r, map->witness + s, e - s))
			continue;
		pthread_mutex_lock(&map->witness_lock);
		witness_guard(r, map, s, e);
		witness_for_each_gap(map, s, e, ahead_gap, &w);
		pthread_mutex_unlock(&map->witness_lock);
	}
	return a.rc;
}

static void witness_end(struct odpd_mr *mr)
{
	struct odpd_mapping *map = mr->map;

	if (!mr->witnessed)
		return;
	pthread_mutex_lock(&map->witness_lock);
	mr->witnessed = false;
	pthread_mutex_unlock(&map->witness_lock);
}

/* PAGEMAP_SCAN (Linux 6.7): the kernel finds the first page that is not
 * present, instead of 8 bytes a page read by us. Declared here for older
 * headers. */
#ifndef PAGEMAP_SCAN
struct page_region {
	uint64_t start, end, categories;
};

struct pm_scan_arg {
	uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
	uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};

#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#define PAGE_IS_PRESENT (1 << 3)
#endif

/* 1: every page of [start, end) present, 0: not, -1: no PAGEMAP_SCAN here. */
static int scan_present(int pagemap_fd, uintptr_t start, uintptr_t end)
{
	struct page_region absent;
	struct pm_scan_arg arg = {
		.size = sizeof(arg), .start = start, .end = end,
		.vec = (uintptr_t)&absent, .vec_len = 1, .max_pages = 1,
		.category_inverted = PAGE_IS_PRESENT, .category_mask = PAGE_IS_PRESENT,
		.return_mask = PAGE_IS_PRESENT,
	};
	int n = ioctl(pagemap_fd, PAGEMAP_SCAN, &arg);

	if (n < 0)
		return errno == ENOTTY || errno == EINVAL ? -1 : 0;
	return n == 0 && arg.walk_end == end;
}

/* Each run of absent pages in [start, end), to @fn until it returns true
 * (then true). -1: no PAGEMAP_SCAN here, or it failed. */
static int scan_absent(int pagemap_fd, uintptr_t start, uintptr_t end,
		       bool (*fn)(uintptr_t s, uintptr_t e, void *arg), void *arg)
{
	/* zeroed: valgrind cannot know that the kernel writes them */
	struct page_region runs[64] = { { 0 } };

	while (start < end) {
		struct pm_scan_arg a = {
			.size = sizeof(a), .start = start, .end = end,
			.vec = (uintptr_t)runs, .vec_len = 64,
			.category_inverted = PAGE_IS_PRESENT, .category_mask = PAGE_IS_PRESENT,
			.return_mask = PAGE_IS_PRESENT,
		};
		int n = ioctl(pagemap_fd, PAGEMAP_SCAN, &a);

		if (n < 0 || a.walk_end <= start)
			return -1;
		for (int i = 0; i < n; i++)
			if (fn(runs[i].start, runs[i].end, arg))
				return 1;
		start = a.walk_end;
	}
	return 0;
}

/* Are the witness view's pages of [@addr, +@length) all present? On the
 * loop (@loop) a kernel without PAGEMAP_SCAN is remembered; workers only
 * read that. */
static bool pages_present(struct odpd_registry *r, uintptr_t addr, uint64_t length, bool loop)
{
	uint64_t buf[512];
	uint64_t first = addr / PAGE, n = length / PAGE;

	if (r->pagemap_fd < 0)
		return false;
	if (r->pagemap_scan) {
		int k = scan_present(r->pagemap_fd, addr, addr + length);
		if (k >= 0)
			return k == 1;
		if (loop) {
			r->pagemap_scan = false;         /* an older kernel: read entries */
			log_info("registry: no PAGEMAP_SCAN in this kernel; reading /proc/self/pagemap entries");
		}
	}
	for (uint64_t done = 0; done < n;) {
		size_t k = n - done < 512 ? (size_t)(n - done) : 512;
		ssize_t got = pread(r->pagemap_fd, buf, k * sizeof(buf[0]), (off_t)((first + done) * 8));
		if (got != (ssize_t)(k * sizeof(buf[0])))
			return false;
		for (size_t i = 0; i < k; i++)
			if (!(buf[i] >> 63 & 1))       /* PM_PRESENT */
				return false;
		done += k;
	}
	return true;
}

/* Are all witness pages of @mr present, and none put back since its pin
 * (nothing punched since)? Loop thread. */
static bool witness_present(struct odpd_registry *r, const struct odpd_mr *mr)
{
	if (!mr->witnessed ||
	    mr->witness_epoch != atomic_load_explicit(&mr->map->witness_epoch, memory_order_acquire))
		return false;
	return pages_present(r, (uintptr_t)(mr->map->witness + mr->node.start), odpd_mr_length(mr), true);
}

/* ---------------------------------------------------------------- batches */

/* Client-PD mode: an MR's import (NULL: none) undone and freed: its PD
 * unimported, its client context dropped (the last reference closes our copy
 * of the client's fd). */
static void import_drop(struct odpd_import **pimp)
{
	struct odpd_import *imp = *pimp;

	if (!imp)
		return;
	if (imp->pd)
		ibv_unimport_pd(imp->pd);
	odpd_client_ctx_put(imp->cctx);
	free(imp);
	*pimp = NULL;
}

/* The client context a client-PD MR is in, or NULL. */
static struct odpd_client_ctx *mr_cctx(const struct odpd_mr *mr)
{
	return !mr->implicit && mr->imp ? mr->imp->cctx : NULL;
}

/*
 * An implicit MR is deregistered by the registrar that registered it (on the
 * loop, before its batch goes to a worker: implicit_dereg_start), then
 * odpd's import of it is dropped (batch_run). If that registrar is gone or
 * does not answer, the MR stays in the PD's context until the PD closes
 * (with its client): destroying it by handle from here could hit another
 * MR, had the registrar destroyed it after all and the client's own made
 * since taken its handle. It reaches nothing meanwhile: its address space
 * is gone or going.
 */
static void implicit_dereg_answered(void *arg, int rc, const struct odpd_err *err, uint32_t handle)
{
	struct odpd_batch *b = arg;

	if (rc < 0)
		log_warning("implicit ODP MR (kernel handle %u): %s; it goes when its PD closes", handle,
			    err ? err->msg : "its registrar has exited");
	if (b && --b->registrar_waits == 0)
		odpd_pool_submit(b->r->pool, &b->job);
}

/* Ask the registrars of @b's implicit MRs to deregister them; @b goes to a
 * worker when the last one has answered (now, if none asked). @b NULL (out
 * of memory): asked, nothing waits. */
static void implicit_dereg_start(struct odpd_batch *b, struct odpd_mr *list)
{
	if (b)
		b->registrar_waits = 1;        /* until every one is asked */
	for (struct odpd_mr *mr = list; mr; mr = mr->batch_next) {
		if (!mr->implicit || !mr->mr)
			continue;
		if (odpd_registrar_dereg(mr->registrar, mr->mr->handle, implicit_dereg_answered, b) == 0) {
			if (b)
				b->registrar_waits++;
		} else {
			implicit_dereg_answered(NULL, -EPIPE, NULL, mr->mr->handle);
		}
	}
	if (b)
		implicit_dereg_answered(b, 0, NULL, 0);
}

static void batch_run(struct odpd_job *job)
{
	struct odpd_batch *b = (struct odpd_batch *)job;

	for (struct odpd_mr *mr = b->mrs; mr; mr = mr->batch_next) {
		if (mr->mr && mr->implicit) {
			ibv_unimport_mr(mr->mr);   /* its registrar was asked (implicit_dereg_start) */
			mr->mr = NULL;
		} else if (mr->mr) {
			int e = ibv_dereg_mr(mr->mr);
			if (e)
				log_errno(LOG_ERR, e, "ibv_dereg_mr of MR %" PRIu64, mr->node.seq);
			mr->mr = NULL;
		}
		witness_end(mr);
		if (!mr->implicit)                 /* (imp and registrar share their place) */
			import_drop(&mr->imp);
	}
}

/* The MR is gone from the kernel: release its charges, pins and PD, on the
 * loop. A dead MR's holders keep the struct until they let go (mr_free). */
static void mr_strip(struct odpd_registry *r, struct odpd_mr *mr)
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

static void mr_free(struct odpd_registry *r, struct odpd_mr *mr)
{
	mr_strip(r, mr);
	r->n_mrs--;
	if (mr->map)
		odpd_mapping_put(r->segs, mr->map);
	if (mr->implicit)
		odpd_registrar_put(mr->registrar);
	odpd_slab_free(&r->mr_slab, mr);
}

static bool waiter_ready(const struct odpd_registry *r, const struct odpd_waiter *w)
{
	const struct odpd_batch *b;

	LIST_FOREACH(b, &r->batches, link)
		if (w->only ? b->seq == w->seq : b->seq <= w->seq && !b->implicit_only)
			return false;
	for (const struct odpd_deferred *d = r->deferred; d; d = d->next)
		if (w->only ? d->seq == w->seq : d->seq <= w->seq)
			return false;
	return true;
}

static void waiters_check(struct odpd_registry *r, bool later);

/* An MR a batch deregistered: freed, or, dead and still held by clients,
 * released (charges, pins, its PD) and freed with its last reference. */
static void batch_mr_done(struct odpd_registry *r, struct odpd_mr *mr)
{
	if (mr->state == ODPD_MR_DEAD && mr->refs > 0) {
		mr->dead_stage = 3;
		mr_strip(r, mr);
	} else {
		mr_free(r, mr);
	}
}

static void batch_done(struct odpd_job *job)
{
	struct odpd_batch *b = (struct odpd_batch *)job;
	struct odpd_registry *r = b->r;
	struct odpd_waiter *w;

	LIST_REMOVE(b, link);
	r->pending--;
	while (b->mrs) {
		struct odpd_mr *mr = b->mrs;
		b->mrs = mr->batch_next;
		batch_mr_done(r, mr);
	}
	r->stats.deregistrations += b->n_dereg;
	if (b->flush) {
		r->stats.flushes++;
		r->stats.invalidated += b->n;
	}
	LIST_FOREACH(w, &r->waiters, link)
		if (w->own == b->seq) {
			w->mrs += b->n;
			w->bytes += b->bytes;
		}
	free(b);
	waiters_check(r, false);
}

static void on_waiter_later(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_waiter *w = arg;

	(void)fd;
	(void)what;
	w->cb(w->arg, w->mrs, w->bytes);
	free(w);
}

/* Answer @w on the next turn of the loop: never from inside the call that
 * made it, whose caller has not yet marked its client as waiting. */
static void waiter_fire_later(struct odpd_registry *r, struct odpd_waiter *w)
{
	static const struct timeval now = { 0, 0 };

	if (event_base_once(r->base, -1, EV_TIMEOUT, on_waiter_later, w, &now) < 0) {
		log_error("out of memory: answering a deregistration at once");
		on_waiter_later(-1, 0, w);
	}
}

/* Answer the waiters nothing is left for: now, or (@later) on the loop's
 * next turn, for a call in progress whose client is not yet waiting. */
static void waiters_check(struct odpd_registry *r, bool later)
{
	struct odpd_waiter *w, *wn;

	for (w = LIST_FIRST(&r->waiters); w; w = wn) {
		wn = LIST_NEXT(w, link);
		if (!waiter_ready(r, w))
			continue;
		LIST_REMOVE(w, link);
		if (later) {
			waiter_fire_later(r, w);
		} else {
			w->cb(w->arg, w->mrs, w->bytes);
			free(w);
		}
	}
}

/* Deregister @list (by batch_next) on a worker. @w (optional, its callback
 * set) waits for it. An empty list (what was invalidated was all deferred
 * to its verifies, mr_defer) is no batch. */
static void start_batch_seq(struct odpd_registry *r, struct odpd_mr *list, bool flush, struct odpd_waiter *w,
			    uint64_t seq)
{
	struct odpd_batch *b;

	if (!list) {
		if (w)
			waiter_fire_later(r, w);
		return;
	}
	if (!w && !seq && batch_split_implicit(r, &list, flush))
		return;
	b = calloc(1, sizeof(*b));
	if (!b) {
		/* No memory for the job: deregister here rather than leak a pin. */
		struct odpd_batch tmp = { .r = r, .mrs = list };
		log_error("out of memory: deregistering on the event loop");
		implicit_dereg_start(NULL, list);
		batch_run(&tmp.job);
		for (struct odpd_mr *mr = list, *n; mr; mr = n) {
			n = mr->batch_next;
			batch_mr_done(r, mr);
		}
		if (w)
			waiter_fire_later(r, w);
		waiters_check(r, true);            /* no batch for what they waited for (seq) */
		return;
	}
	b->r = r;
	b->seq = seq ? seq : ++r->batch_seq;
	b->mrs = list;
	b->flush = flush;
	b->implicit_only = true;
	for (struct odpd_mr *mr = list; mr; mr = mr->batch_next) {
		b->n++;
		b->n_dereg += mr->mr != NULL || mr_cctx(mr) != NULL;
		b->bytes += odpd_mr_length(mr);
		b->implicit_only &= mr->implicit;
	}
	if (w) {
		w->seq = w->own = b->seq;
		w->only = true;
		LIST_INSERT_HEAD(&r->waiters, w, link);
	}
	b->job.run = batch_run;
	b->job.done = batch_done;
	LIST_INSERT_HEAD(&r->batches, b, link);
	r->pending++;
	implicit_dereg_start(b, list);      /* then submitted */
}

/* A list of implicit MRs and others, that nothing waits for: the implicit
 * ones (waiting for their registrars, which their users may have stopped)
 * in a batch of their own, so that no flush waits for them. True if @list
 * was split and both parts started. */
static bool batch_split_implicit(struct odpd_registry *r, struct odpd_mr **list, bool flush)
{
	struct odpd_mr *imp = NULL, *rest = NULL, *mr, *next;

	for (mr = *list; mr; mr = mr->batch_next)
		if (mr->implicit)
			break;
	if (!mr)
		return false;
	for (mr = *list; mr; mr = next) {
		next = mr->batch_next;
		if (mr->implicit) {
			mr->batch_next = imp;
			imp = mr;
		} else {
			mr->batch_next = rest;
			rest = mr;
		}
	}
	if (!rest) {
		*list = imp;
		return false;
	}
	start_batch_seq(r, imp, flush, NULL, 0);
	start_batch_seq(r, rest, flush, NULL, 0);
	return true;
}

static void start_batch(struct odpd_registry *r, struct odpd_mr *list, bool flush, struct odpd_waiter *w)
{
	start_batch_seq(r, list, flush, w, 0);
}

/* ---------------------------------------------------------------- hit tables */

static void hits_arm(struct odpd_registry *r);
static void holes_arm(struct odpd_registry *r);

/*
 * A slot in the holder's hit table for a reference its library may serve
 * again by itself: a daemon-PD MR over a segment that the cache would serve
 * (not no-cache, not implicit, not client-PD).
 */
static void ref_hit_slot(struct odpd_registry *r, struct odpd_holder *h, struct odpd_ref *ref,
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
static void ref_slot_end(struct odpd_registry *r, struct odpd_ref *ref, bool put)
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
static void mr_hits_invalidate(struct odpd_mr *mr)
{
	struct odpd_ref *ref;

	LIST_FOREACH(ref, &mr->holders, mlink)
		if (ref->slot)
			odpd_hittab_invalidate(ref->holder->hits, ref->slot, ref->ticket);
}

static void ref_drop(struct odpd_registry *r, struct odpd_ref *ref, bool relaxed, struct odpd_mr **dereg);

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
static unsigned holder_revoke(struct odpd_registry *r, struct odpd_holder *h, bool idle,
			      struct odpd_mr **list)
{
	struct odpd_ref *ref, *next;
	unsigned n = 0;

	if (!h->hits)
		return 0;
	for (ref = LIST_FIRST(&h->refs); ref; ref = next) {
		next = LIST_NEXT(ref, hlink);
		if (ref->slot && ref_revoke(r, ref, idle, list))
			n++;
	}
	return n;
}

/*
 * The periodic looks at hit tables (unused references, holes) take at most
 * this many holders per tick, round-robin from where the last tick stopped:
 * with 10,000 clients a tick costs the loop what one with 256 does, and each
 * table is looked at every ceil(holders / 256) ticks instead of every tick.
 */
#define ODPD_LOOK_HOLDERS 256

/* The next @h to look at from *@cursor, and the cursor past it. */
static struct odpd_holder *look_next(struct odpd_registry *r, struct odpd_holder **cursor)
{
	struct odpd_holder *h = *cursor ? *cursor : LIST_FIRST(&r->holders);

	*cursor = h ? LIST_NEXT(h, rlink) : NULL;
	return h;
}

static void on_hit_timer(evutil_socket_t fd, short what, void *arg)
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
static void timer_every(struct event *ev, bool on, uint64_t ms)
{
	struct timeval tv = { .tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000 * 1000) };

	if (!on)
		evtimer_del(ev);
	else if (!evtimer_pending(ev, NULL))
		evtimer_add(ev, &tv);
}

/* Every relaxed window while any client has a hit table. */
static void hits_arm(struct odpd_registry *r)
{
	uint64_t ms = r->conf->relaxed_window_ms;

	timer_every(r->hit_timer, r->n_hit_tables > 0, ms ? ms : 1);
}

int odpd_registry_open_hits(struct odpd_registry *r, struct odpd_holder *h, uint32_t slots, int use_fd,
			    int *ret_gen_fd, struct odpd_err *err)
{
	uint64_t charge;
	int rc;

	if (h->hits)
		return err_set(err, EALREADY, "this connection has a hit table already");
	/* its two mappings are odpd address space the user pays for */
	charge = odpd_hittab_mapped(slots);
	rc = odpd_account_may(h->acct, &h->limit, ODPD_UL_MAPPED, charge, err);
	if (rc == 0)
		rc = odpd_account_may(h->acct, &h->limit, ODPD_UL_MAPPINGS, ODPD_HIT_MAPPINGS, err);
	if (rc < 0)
		return rc;
	rc = odpd_hittab_open(slots, use_fd, &h->hits, ret_gen_fd, err);
	if (rc < 0)
		return rc;
	odpd_account_hold(h->acct, ODPD_UL_MAPPED, (int64_t)charge);
	odpd_account_hold(h->acct, ODPD_UL_MAPPINGS, ODPD_HIT_MAPPINGS);
	r->n_hit_tables++;
	hits_arm(r);
	return 0;
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
		h->local_hits = local_hits;
	}
	if (has_seen)
		odpd_hittab_seen(h->hits, seen);
}

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

static struct odpd_ref *ref_new(struct odpd_registry *r, struct odpd_holder *h, struct odpd_mr *mr,
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
	ref_hit_slot(r, h, ref, q);
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
static void ref_drop(struct odpd_registry *r, struct odpd_ref *ref, bool relaxed, struct odpd_mr **dereg)
{
	struct odpd_holder *h = ref->holder;
	struct odpd_mr *mr = ref->mr;
	struct odpd_charge *c = charge_find(mr, h->acct);

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
	if (mr->state == ODPD_MR_DEAD) {
		/* deregistered already: free it; in a batch or waiting for a
		 * verify: that frees it */
		if (mr->dead_stage == 3)
			mr_free(r, mr);
		return;
	}
	if (relaxed && mr->cached && mr->state == ODPD_MR_LIVE) {
		/* c (refs 0) stays: the relaxed MR is still charged to its last holder */
		mr->state = ODPD_MR_RELAXED;
		mr->relaxed_ms = (uint32_t)((now_ns() + 999999) / 1000000);  /* never early */
		mr->relaxed_pid = h->pid;
		mr->relaxed_by = h->id;
		TAILQ_INSERT_TAIL(&r->relaxed, mr, rlink);
		r->n_relaxed++;
		r->relaxed_bytes += odpd_mr_length(mr);
		if (r->n_relaxed > r->conf->relaxed_max_mrs || r->relaxed_bytes > r->conf->relaxed_max_bytes)
			flush_queue(r, "relaxed-max-mrs or relaxed-max-bytes passed");
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
	if (deferred)
		for (const struct odpd_deferred *d = r->deferred; d && !seq; d = d->next)
			seq = d->mr == mr ? d->seq : 0;
	if (!list && !seq)
		return 0;
	w = calloc(1, sizeof(*w));
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

struct cctx_job {
	struct odpd_job job;
	struct odpd_registry *r;
	struct odpd_client_ctx *c;
};

static void cctx_put_run(struct odpd_job *job)
{
	odpd_client_ctx_put(((struct cctx_job *)job)->c);
}

static void cctx_put_done(struct odpd_job *job)
{
	((struct cctx_job *)job)->r->pending--;
	free(job);
}

/* Take @c off @h's list and drop the list's reference; a last one closes on a
 * worker (closing the last copy of a dead client's fd destroys its objects). */
static void holder_unlink_client_ctx(struct odpd_registry *r, struct odpd_holder *h,
				     struct odpd_client_ctx *c)
{
	struct cctx_job *j;

	LIST_REMOVE(c, link);
	c->linked = false;
	h->n_cctxs--;
	/* never imported and nobody else holds it: a plain close(), here */
	if (!c->ctx && atomic_load(&c->refs) == 1) {
		odpd_client_ctx_put(c);
		return;
	}
	j = calloc(1, sizeof(*j));
	if (!j) {
		odpd_client_ctx_put(c);
		return;
	}
	j->r = r;
	j->c = c;
	j->job.run = cctx_put_run;
	j->job.done = cctx_put_done;
	r->pending++;
	odpd_pool_submit(r->pool, &j->job);
}

/*
 * A context no MR and no request uses (only the list holds it) is not kept:
 * odpd holds no copy of a client's fd it does not need. Only the loop takes
 * references, so a count of 1 seen here stays 1.
 */
static void holder_forget_idle(struct odpd_registry *r, struct odpd_holder *h, struct odpd_client_ctx *c)
{
	if (c && c->linked && atomic_load(&c->refs) == 1)
		holder_unlink_client_ctx(r, h, c);
}

/*
 * Drop a reference (a request's, an MR's) to @c (NULL: none), then forget
 * @c if only @h's list still holds it. Whether it is on the list is read
 * before the put: the loop alone takes it off, and while it is on, the
 * list's reference keeps it; once off (its device went away), this put may
 * be the last one, and @c is gone after it.
 */
static void cctx_drop(struct odpd_registry *r, struct odpd_holder *h, struct odpd_client_ctx *c)
{
	bool linked = c && c->linked;

	odpd_client_ctx_put(c);
	if (linked)
		holder_forget_idle(r, h, c);
}

/*
 * Client-PD mode: the holder's imported context that @fd is a copy of, or a
 * new one (imported on a worker by the first registration). Takes @fd.
 * Returns a reference for the request, or NULL with @err: ENOMEM, or EMFILE
 * when the connection already has ODPD_MAX_CLIENT_CTXS contexts in use.
 */
static struct odpd_client_ctx *holder_client_ctx(struct odpd_registry *r, struct odpd_holder *h, int fd,
						 struct odpd_err *err)
{
	struct odpd_client_ctx *c, *next;

	LIST_FOREACH(c, &h->cctxs, link)
		if (odpd_client_ctx_is(c, fd)) {
			close(fd);
			odpd_client_ctx_get(c);
			return c;
		}
	if (h->n_cctxs >= ODPD_MAX_CLIENT_CTXS)
		for (c = LIST_FIRST(&h->cctxs); c; c = next) {
			next = LIST_NEXT(c, link);
			holder_forget_idle(r, h, c);
		}
	if (h->n_cctxs >= ODPD_MAX_CLIENT_CTXS) {
		close(fd);
		err_set(err, EMFILE, "client-PD mode: a connection may use at most %u device contexts "
			"with MRs in them at once", ODPD_MAX_CLIENT_CTXS);
		return NULL;
	}
	c = odpd_client_ctx_new(fd);
	if (!c) {
		err_set(err, ENOMEM, "out of memory");
		return NULL;
	}
	odpd_client_ctx_get(c);              /* the list's */
	LIST_INSERT_HEAD(&h->cctxs, c, link);
	c->linked = true;
	h->n_cctxs++;
	return c;
}

/* Drop the holder's references to its client contexts. */
static void holder_drop_client_ctxs(struct odpd_registry *r, struct odpd_holder *h)
{
	while (!LIST_EMPTY(&h->cctxs))
		holder_unlink_client_ctx(r, h, LIST_FIRST(&h->cctxs));
}

static bool match_remote_owned(const struct odpd_mr *mr, const void *arg)
{
	return (mr->access & ACCESS_REMOTE) && mr->owner_id == *(const uint64_t *)arg;
}

static bool match_domain(const struct odpd_mr *mr, const void *arg)
{
	return mr->dom == arg;
}

/* @d lost a member: with nobody left, its relaxed MRs can never be hit. */
static void domain_leave(struct odpd_registry *r, struct odpd_domain *d, struct odpd_mr **list)
{
	if (--d->members == 0) {
		collect_relaxed(r, match_domain, d, list);
		domain_maybe_close(r, d, true);
	}
}

void odpd_holder_release(struct odpd_registry *r, struct odpd_holder *h)
{
	struct odpd_mr *list = NULL;

	while (!LIST_EMPTY(&h->refs))
		ref_drop(r, LIST_FIRST(&h->refs), false, &list);
	if (h->hits) {
		odpd_account_hold(h->acct, ODPD_UL_MAPPED, -(int64_t)odpd_hittab_mapped(odpd_hittab_slots(h->hits)));
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

struct odpd_shared_pd *odpd_registry_find_shared(struct odpd_registry *r, const char *name)
{
	struct odpd_shared_pd *spd;

	LIST_FOREACH(spd, &r->shared, link)
		if (strcmp(spd->name, name) == 0)
			return spd;
	return NULL;
}

int odpd_registry_join(struct odpd_registry *r, struct odpd_holder *h, const char *name,
		       bool *ret_created, unsigned *ret_members, struct odpd_err *err)
{
	struct odpd_shared_pd *spd = odpd_registry_find_shared(r, name);
	bool created = false;

	if (h->spd)
		return err_set(err, EALREADY, "this connection already joined the shared PD \"%s\"",
			       h->spd->name);
	if (h->registered)
		return err_set(err, EBUSY, "join a shared PD before the connection's first registration");
	if (!spd) {
		spd = calloc(1, sizeof(*spd));
		if (spd)
			spd->doms = calloc(ODPD_MAX_DEVICES, sizeof(*spd->doms));
		if (!spd || !spd->doms) {
			free(spd);
			return err_set(err, ENOMEM, "out of memory");
		}
		snprintf(spd->name, sizeof(spd->name), "%s", name);
		spd->creator_uid = h->uid;
		LIST_INSERT_HEAD(&r->shared, spd, link);
		r->n_shared++;
		created = true;
	}
	spd->members++;
	for (unsigned i = 0; i < r->devices->n; i++)
		if (spd->doms[i])
			spd->doms[i]->members++;
	h->spd = spd;
	*ret_created = created;
	*ret_members = spd->members;
	return 0;
}

/* ---------------------------------------------------------------- lookup */

struct lookup {
	struct odpd_registry *r;
	const struct odpd_holder *h;
	const struct odpd_domain *dom;      /* MRs of this PD ... */
	uint64_t base;                      /* ... whose iova - offset is this */
	struct odpd_mapping *map;
	uint64_t s, e;
	uint32_t access;
	bool odp;                           /* the kind asked for: ODP or pinned */
	bool ctime_read;                    /* once, before the first witness check */
	bool have_ctime;
	struct timespec ctime;
	struct odpd_mr *stale;              /* pinned MRs over replaced pages, by batch_next */
	struct odpd_mr *registering;        /* the first that will serve it once registered */
};

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
	if (mr->state == ODPD_MR_INVALIDATING)
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
static void holes_check(struct odpd_registry *r, struct odpd_holder *h)
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

static void on_hole_timer(evutil_socket_t fd, short what, void *arg)
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
static void holes_arm(struct odpd_registry *r)
{
	uint64_t ms = r->conf->hole_check_ms;

	timer_every(r->hole_timer, r->n_hit_pinned > 0 && ms > 0, ms);
}

static struct odpd_mr *cache_lookup(struct odpd_registry *r, struct odpd_domain *d, const struct odpd_reg_req *q,
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

/* ---------------------------------------------------------------- quotas */

static bool match_account(const struct odpd_mr *mr, const void *arg)
{
	const struct odpd_charge *c = odpd_mr_first_charge(mr);

	return c && c->acct == arg;   /* a relaxed MR has one charge */
}

/*
 * Can @h's account take @mr's pages (@need_global: a new MR, so the daemon's
 * limits too)? 0, or -EDQUOT / -ENOMEM with @err; *@evict: relaxed MRs whose
 * invalidation would make room (moved into it).
 */
static int quota_check(struct odpd_registry *r, struct odpd_holder *h, struct odpd_mapping *map,
		       uint64_t s, uint64_t e, bool pinned, bool need_global, bool may_evict,
		       struct odpd_mr **evict, struct odpd_err *err)
{
	const struct odpd_conf *conf = r->conf;
	struct odpd_account *a = h->acct;
	uint64_t want = pinned ? account_uncovered(map, a, s, e) : 0;
	uint64_t gwant = pinned && need_global ? odpd_itree_uncovered(&map->mrs, s, e, counted, NULL) : 0;

	a->limit = h->limit.max_pinned;
	snprintf(a->rule, sizeof(a->rule), "%s", h->limit.rule);
	if (want && (want > h->limit.max_pinned || a->pinned > h->limit.max_pinned - want)) {
		/* (relaxed MRs a verify still reads are deregistered after it:
		 * they make no room yet) */
		if (may_evict && collect_relaxed(r, match_account, a, evict) && *evict)
			return 0;
		/* EDQUOT also means a connection's or a user's MR count (mr.c,
		 * quota.c): the message says which limit it is */
		return err_set(err, EDQUOT, "pinning quota: pinning %" PRIu64 " more bytes would pass uid "
			       "%u's limit of %" PRIu64 " bytes (%s; %" PRIu64 " pinned): release MRs, or "
			       "raise it with a rule in odpd.conf", want, h->uid, h->limit.max_pinned,
			       h->limit.rule, a->pinned);
	}
	if (!need_global)
		return 0;
	if ((gwant && (gwant > conf->max_pinned || r->pinned > conf->max_pinned - gwant)) ||
	    r->n_mrs >= conf->max_mrs) {
		if (may_evict && collect_relaxed(r, match_all, NULL, evict) && *evict)
			return 0;
		/* ENOMEM also means out of memory (odpd's, or the kernel's pin):
		 * the message names the daemon-wide limit */
		if (r->n_mrs >= conf->max_mrs)
			return err_set(err, ENOMEM, "daemon-wide limit: odpd holds its limit of %" PRIu64
				       " MRs (max-mrs in odpd.conf), for all users together; not a lack of "
				       "memory", conf->max_mrs);
		return err_set(err, ENOMEM, "daemon-wide limit: pinning %" PRIu64 " more bytes would pass "
			       "odpd's max-pinned of %" PRIu64 " bytes (%" PRIu64 " pinned, all users "
			       "together; max-pinned in odpd.conf); not a lack of memory", gwant,
			       conf->max_pinned, r->pinned);
	}
	return 0;
}

/* ---------------------------------------------------------------- registration */

struct reg_op {
	struct odpd_job job;
	struct odpd_registry *r;
	struct odpd_holder *h;
	struct odpd_reg_req q;
	odpd_reg_cb cb;
	void *arg;
	struct odpd_mr *mr;
	bool evicted;
	void *daemon_addr;
	int ibv_access;
	struct reg_op *next_joiner;         /* waiting for the same REGISTERING MR */
	struct odpd_client_ctx *cctx;       /* client-PD mode: a reference, until the MR takes it */
	int prefetch_rc;                    /* REG_PREFETCH: ibv_advise_mr's result (errno) */
	uint32_t implicit_handle;           /* the registrar's implicit MR, to import */
	struct odpd_err err;
	int rc;
};

static int reg_start(struct reg_op *op, struct odpd_ref **ret_ref, struct odpd_err *err);

static int reg_import(struct reg_op *op)
{
	struct odpd_mr *mr = op->mr;
	int r;

	r = odpd_client_ctx_import(mr->imp->cctx, &op->err);
	if (r < 0)
		return r;
	mr->imp->pd = ibv_import_pd(mr->imp->cctx->ctx, op->q.pd_handle);
	if (!mr->imp->pd)
		return err_set(&op->err, errno, "ibv_import_pd(%u): %s", op->q.pd_handle, strerror(errno));
	return 0;
}

/* REG_PREFETCH: map the whole ODP MR now, writable if it may be written, in
 * calls of up to 1 GiB (ibv_sge.length has 32 bits). 0 or the verb's errno. */
static int prefetch_whole(struct ibv_pd *pd, const struct odpd_mr *mr)
{
	const uint64_t chunk = 1ull << 30;
	enum ibv_advise_mr_advice advice = mr->access & ODPD__ACCESS__ACCESS_LOCAL_WRITE ?
		IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE : IBV_ADVISE_MR_ADVICE_PREFETCH;

	for (uint64_t off = 0; off < odpd_mr_length(mr); off += chunk) {
		struct ibv_sge sge = {
			.addr = mr->iova + off, .lkey = mr->mr->lkey,
			.length = (uint32_t)(odpd_mr_length(mr) - off < chunk ? odpd_mr_length(mr) - off : chunk),
		};
		int rc = ibv_advise_mr(pd, advice, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1);

		if (rc)
			return rc;
	}
	return 0;
}

static void reg_run(struct odpd_job *job)
{
	struct reg_op *op = (struct reg_op *)job;
	struct odpd_mr *mr = op->mr;
	struct ibv_pd *pd;
	int e;

	if (mr_cctx(mr)) {                     /* client-PD mode */
		op->rc = reg_import(op);
		if (op->rc < 0)
			return;
		pd = mr->imp->pd;
	} else {
		pthread_mutex_lock(&mr->dom->lock);
		op->rc = odpd_domain_open_locked(mr->dom, &op->err);
		pthread_mutex_unlock(&mr->dom->lock);
		if (op->rc < 0)
			return;
		pd = mr->dom->pd;
	}
	if (!mr->pinned) {
		/* ODP: nothing to fault or witness; the device pages on demand,
		 * following whatever pages the segment has then. iova is odpd's
		 * own address (checked by the caller). */
		mr->mr = ibv_reg_mr(pd, op->daemon_addr, odpd_mr_length(mr), op->ibv_access);
		if (!mr->mr)
			op->rc = err_set(&op->err, errno, "ibv_reg_mr (ODP) on %s: %s", op->q.dev->name,
					 strerror(errno));
		else if (op->q.prefetch)
			op->prefetch_rc = prefetch_whole(pd, mr);
		return;
	}
	/*
	 * Map odpd's view of the range first with read faults: they map
	 * neighbouring pages too (fault-around), and as shmem needs no write
	 * notification they map them writable, so the pin faults nothing. A pin
	 * that faults writes page by page took 207 ms for 256 MiB in the VM,
	 * this 58 + 18 ms; and write faults would move the segment's ctime.
	 * Mapped already (MapSegment, an earlier MR there): one PAGEMAP_SCAN
	 * walk finds that faster than populating walks the pages again.
	 */
	if (!mapped_already(op->r, op->daemon_addr, odpd_mr_length(mr)))
		madvise(op->daemon_addr, odpd_mr_length(mr), MADV_POPULATE_READ);
	/* Witness, then pin, as one step among the segment's registrations. */
	pthread_mutex_lock(&mr->map->witness_lock);
	witness_begin(op->r, mr);
	if ((uintptr_t)op->daemon_addr == mr->iova)
		mr->mr = ibv_reg_mr(pd, op->daemon_addr, odpd_mr_length(mr), op->ibv_access);
	else
		mr->mr = ibv_reg_mr_iova(pd, op->daemon_addr, odpd_mr_length(mr), mr->iova, op->ibv_access);
	e = errno;                           /* the verb's, before anything else can set it */
	pthread_mutex_unlock(&mr->map->witness_lock);
	if (!mr->mr)
		witness_end(mr);                 /* nothing relies on those pages */
	if (!mr->mr)
		op->rc = err_set(&op->err, e, "ibv_reg_mr%s on %s: %s%s",
				 (uintptr_t)op->daemon_addr == mr->iova ? "" : "_iova", op->q.dev->name,
				 strerror(e), e == ENOMEM ? " (the kernel could not pin the pages: the host, "
				 "or odpd's memory cgroup, is short of memory; not an odpd.conf limit)" : "");
}

static int reg_hit(struct reg_op *op, struct odpd_mr *mr, struct odpd_ref **ret_ref, struct odpd_err *err);

/* The requests that waited for an MR being registered: served by @mr, or,
 * when its registration failed (@mr NULL), asked again from the start. */
static void joiners_answer(struct reg_op *list, struct odpd_mr *mr)
{
	for (struct reg_op *op = list, *next; op; op = next) {
		struct odpd_err err = { 0 };
		struct odpd_ref *ref = NULL;
		int rc;

		next = op->next_joiner;
		rc = mr ? reg_hit(op, mr, &ref, &err) : reg_start(op, &ref, &err);
		if (rc == 1)
			continue;                   /* it waits again */
		op->cb(op->arg, rc, &err, ref, rc == 0);
		free(op);
	}
}

static void reg_done(struct odpd_job *job)
{
	struct reg_op *op = (struct reg_op *)job;
	struct odpd_registry *r = op->r;
	struct odpd_mr *mr = op->mr;
	struct reg_op *joiners = mr->joiners;
	struct odpd_ref *ref = NULL;

	mr->joiners = NULL;
	/* The device went away meanwhile: whatever the verb said, it is gone. */
	if (op->q.dev->removed) {
		char was[sizeof(op->err.msg)];

		snprintf(was, sizeof(was), "%s", op->rc < 0 ? op->err.msg : "");
		op->rc = err_set(&op->err, ENODEV, "device %s was removed%s%s", op->q.dev->name,
				 *was ? ": " : "", was);
	}
	/* Checked again here: other requests of the user may have taken its
	 * last MR references while this one was on a worker. */
	if (op->rc == 0 &&
	    odpd_account_may(op->h->acct, &op->h->limit, ODPD_UL_MRS, 1, &op->err) == 0) {
		ref = ref_new(op->r, op->h, mr, &op->q);
		if (!ref)
			op->rc = err_set(&op->err, ENOMEM, "out of memory");
	} else if (op->rc == 0) {
		op->rc = -op->err.code;
	}
	if (op->rc < 0) {
		/* Registered but no memory for the reference: deregister on a
		 * worker. Never registered: nothing for a worker to do. */
		if (mr->mr) {
			struct odpd_mr *list = NULL;
			mr_invalidate(r, mr, &list);
			start_batch(r, list, false, NULL);
		} else {
			struct odpd_client_ctx *cctx = mr_cctx(mr);

			if (cctx) {
				mr->imp->cctx = NULL;    /* its reference, dropped below */
				import_drop(&mr->imp);
				cctx_drop(r, op->h, cctx);
			}
			mr_unindex(mr);
			mr_free(r, mr);
		}
		op->cb(op->arg, op->rc, &op->err, NULL, false);
		joiners_answer(joiners, NULL);
	} else {
		mr->state = ODPD_MR_LIVE;
		charge_find(mr, op->h->acct)->refs++;
		r->stats.registrations++;
		if (!mr->pinned)
			r->odp.registrations++;
		if (op->q.prefetch) {
			prefetch_count(r, op->q.dev, op->prefetch_rc, odpd_mr_length(mr));
			/* an errno (Linux's are below 256); anything else says EIO */
			mr->prefetch_errno = op->prefetch_rc > 0 && op->prefetch_rc < 256 ?
					     (uint8_t)op->prefetch_rc : op->prefetch_rc ? EIO : 0;
		}
		log_debug("registry: MR %" PRIu64 " [%#" PRIx64 ", +%" PRIu64 ") lkey %#x rkey %#x",
			  mr->node.seq, mr->iova, odpd_mr_length(mr), mr->mr->lkey, mr->mr->rkey);
		op->cb(op->arg, 0, NULL, ref, false);
		joiners_answer(joiners, mr);
	}
	free(op);
}

/* Relaxed MRs were invalidated to make room: try once more. */
static void reg_retry(void *arg, unsigned mrs, uint64_t bytes)
{
	struct reg_op *op = arg;
	struct odpd_ref *ref = NULL;
	struct odpd_err err = { 0 };
	int rc;

	(void)mrs;
	(void)bytes;
	op->evicted = true;
	rc = reg_start(op, &ref, &err);
	if (rc == 1)
		return;
	cctx_drop(op->r, op->h, op->cctx);
	op->cb(op->arg, rc, &err, ref, rc == 0);
	free(op);
}

/* Invalidate @evict (relaxed MRs in the way of a quota), then try @op once
 * more. Returns 1 (the answer comes through op->cb), or -ENOMEM. */
static int evict_then_retry(struct reg_op *op, struct odpd_mr *evict, struct odpd_err *err)
{
	struct odpd_waiter *w = calloc(1, sizeof(*w));

	for (struct odpd_mr *mr = evict; mr; mr = mr->batch_next)
		op->r->stats.evictions++;          /* MRs invalidated to make room */
	if (w) {
		w->cb = reg_retry;
		w->arg = op;
	}
	start_batch(op->r, evict, true, w);
	return w ? 1 : err_set(err, ENOMEM, "out of memory");
}

/* A hit: @h takes a reference on @mr. */
static int reg_hit(struct reg_op *op, struct odpd_mr *mr, struct odpd_ref **ret_ref, struct odpd_err *err)
{
	struct odpd_registry *r = op->r;
	struct odpd_holder *h = op->h;
	struct odpd_charge *c = charge_find(mr, h->acct), *relaxed_charge = NULL;
	struct odpd_mr *evict = NULL;
	bool new_charge = false;
	int rc;

	rc = odpd_account_may(h->acct, &h->limit, ODPD_UL_MRS, 1, err);   /* also for joiners */
	if (rc < 0)
		return rc;
	if (!c) {
		rc = quota_check(r, h, mr->map, mr->node.start, mr->node.end, mr->pinned, false,
				 !op->evicted, &evict, err);
		if (rc < 0)
			return rc;
		if (evict)                     /* (never @mr: not charged to this account) */
			return evict_then_retry(op, evict, err);
		if (mr->state == ODPD_MR_RELAXED)
			relaxed_charge = odpd_mr_first_charge(mr);  /* the last holder's, refs 0 */
		rc = charge_add(r, mr, h->acct, &c);
		if (rc < 0)
			return err_set(err, ENOMEM, "out of memory");
		new_charge = true;
	}
	*ret_ref = ref_new(r, h, mr, &op->q);
	if (!*ret_ref) {
		if (new_charge)
			charge_drop(r, mr, c);
		return err_set(err, ENOMEM, "out of memory");
	}
	c->refs++;
	if (mr->state == ODPD_MR_RELAXED) {
		relaxed_remove(r, mr);
		mr->state = ODPD_MR_LIVE;
		if (relaxed_charge && relaxed_charge->refs == 0)
			charge_drop(r, mr, relaxed_charge);
		relaxed_arm(r);
	}
	r->stats.hits++;
	return 0;
}

static struct odpd_mr *mr_new(struct odpd_registry *r, struct reg_op *op, struct odpd_domain *d,
			      uint64_t s, uint64_t e)
{
	struct odpd_mr *mr = odpd_slab_zalloc(&r->mr_slab);

	if (!mr)
		return NULL;
	mr->node.seq = ++r->next_mr_id;        /* its id, and its place among equal starts */
	mr->dom = d;
	mr->map = op->q.map;                 /* NULL: implicit */
	mr->node.start = s;
	mr->node.end = e;
	mr->iova = op->q.iova - op->q.offset + s;
	mr->access = op->q.access;
	mr->pinned = !op->q.odp && !op->q.implicit;
	mr->implicit = op->q.implicit;
	if (mr->implicit) {
		r->odp.mrs++;
		r->odp.implicit_mrs++;
	} else if (!mr->pinned) {
		r->odp.mrs++;
		r->odp.bytes += odpd_mr_length(mr);
	}
	mr->state = ODPD_MR_REGISTERING;
	mr->owner_id = op->h->id;
	LIST_INIT(&mr->holders);
	return mr;
}

static int reg_miss(struct reg_op *op, struct odpd_domain *d, uint64_t s, uint64_t e, struct odpd_err *err)
{
	struct odpd_registry *r = op->r;
	struct odpd_mr *mr, *evict = NULL;
	struct odpd_import *imp = NULL;
	struct odpd_charge *c;
	int rc;

	rc = quota_check(r, op->h, op->q.map, s, e, !op->q.odp, true, !op->evicted, &evict, err);
	if (rc < 0)
		return rc;
	if (evict)
		return evict_then_retry(op, evict, err);
	/* Client-PD mode: the import's place (few MRs need one: it is not in
	 * the MR), with the context set here, where device removal reads it. */
	if (op->cctx && !(imp = calloc(1, sizeof(*imp))))
		return err_set(err, ENOMEM, "out of memory");
	mr = mr_new(r, op, d, s, e);
	if (!mr) {
		free(imp);
		return err_set(err, ENOMEM, "out of memory");
	}
	/* In its mapping's tree from now on, in the cache unless no-cache: a
	 * request for it meanwhile waits for it. */
	map_insert(mr);
	mr->cached = d && !op->q.no_cache;
	/* Reserve the quota now, so that requests in flight cannot overbook it. */
	global_charge(r, mr);
	if (charge_add(r, mr, op->h->acct, &c) < 0) {
		global_uncharge(r, mr);
		map_remove(mr);
		if (!mr->pinned) {
			r->odp.mrs--;
			r->odp.bytes -= odpd_mr_length(mr);
		}
		odpd_slab_free(&r->mr_slab, mr);
		free(imp);
		return err_set(err, ENOMEM, "out of memory");
	}
	if (imp) {
		mr->imp = imp;
		imp->cctx = op->cctx;        /* the request's reference is the MR's now */
		op->cctx = NULL;
	}
	odpd_mapping_ref(mr->map);
	r->n_mrs++;
	if (d)
		d->n_mrs++;
	op->mr = mr;
	op->daemon_addr = mr->map->addr + s;
	op->ibv_access = access_to_ibv(op->q.access) | (op->q.odp ? IBV_ACCESS_ON_DEMAND : 0);
	op->job.run = reg_run;
	op->job.done = reg_done;
	/* Pinning 16 MiB and more takes long: it leaves a worker to others. */
	op->job.big = mr->pinned && odpd_mr_length(mr) >= (16u << 20);
	op->job.lane = ODPD_LANE_USER(op->h->uid);
	odpd_pool_submit(r->pool, &op->job);
	return 1;
}

/*
 * An implicit ODP MR, in three steps: a worker opens the domain's PD (if
 * not yet open); the loop asks the domain's registrar (started by the
 * caller, with the client's segments mapped) to import the PD (once) and
 * register; a worker imports the MR by handle, and from then on it is an
 * MR of the PD like any other, for replies, verify and advise. No worker
 * waits for the registrar: its user may have stopped it (implicit.h).
 */
static void implicit_open_run(struct odpd_job *job)
{
	struct reg_op *op = (struct reg_op *)job;
	struct odpd_domain *d = op->mr->dom;

	pthread_mutex_lock(&d->lock);
	op->rc = odpd_domain_open_locked(d, &op->err);
	pthread_mutex_unlock(&d->lock);
}

static void implicit_import_run(struct odpd_job *job)
{
	struct reg_op *op = (struct reg_op *)job;
	struct odpd_mr *mr = op->mr;

	mr->mr = ibv_import_mr(mr->dom->pd, op->implicit_handle);
	if (!mr->mr) {
		int e = errno ? errno : EOPNOTSUPP;

		op->rc = err_set(&op->err, e, "ibv_import_mr of the registrar's implicit ODP MR: %s",
				 strerror(e));
	}
}

static void implicit_dereg_answered(void *arg, int rc, const struct odpd_err *err, uint32_t handle);

static void implicit_imported(struct odpd_job *job)
{
	struct reg_op *op = (struct reg_op *)job;

	/* Not imported: the registrar's MR must not outlive the request. */
	if (!op->mr->mr && odpd_registrar_dereg(op->mr->registrar, op->implicit_handle,
						implicit_dereg_answered, NULL) < 0)
		implicit_dereg_answered(NULL, -EPIPE, NULL, op->implicit_handle);
	reg_done(job);
}

static void implicit_registered(void *arg, int rc, const struct odpd_err *err, uint32_t handle)
{
	struct reg_op *op = arg;

	if (rc < 0) {
		op->rc = rc;
		op->err = *err;
		reg_done(&op->job);
		return;
	}
	op->implicit_handle = handle;
	op->job.run = implicit_import_run;
	op->job.done = implicit_imported;
	odpd_pool_submit(op->r->pool, &op->job);
}

static void implicit_opened(struct odpd_job *job)
{
	struct reg_op *op = (struct reg_op *)job;
	struct odpd_mr *mr = op->mr;
	struct odpd_domain *d = mr->dom;
	int rc;

	if (op->rc < 0 || op->q.dev->removed) {
		reg_done(job);
		return;
	}
	/* The PD is open (its MR keeps it so): its context's cmd_fd is read
	 * here, after the worker that opened it. */
	rc = odpd_registrar_reg(mr->registrar, d->ctx->cmd_fd, d->pd->handle, (uint32_t)op->ibv_access,
				implicit_registered, op);
	if (rc < 0) {
		op->rc = err_set(&op->err, -rc, "the implicit-ODP registrar (pid %d) %s",
				 (int)odpd_registrar_pid(mr->registrar),
				 rc == -EPIPE ? "has exited" : strerror(-rc));
		reg_done(job);
	}
}

/* An implicit ODP MR: never a cache hit (the client registers it once and
 * keeps it), counted as an ODP MR without bytes, no pages charged. */
static int reg_implicit(struct reg_op *op, struct odpd_err *err)
{
	struct odpd_registry *r = op->r;
	struct odpd_domain *d = holder_domain(r, op->h, (unsigned)(op->q.dev - r->devices->dev));
	struct odpd_mr *mr, *evict = NULL;
	struct odpd_charge *c;
	int rc;

	if (!d || !d->registrar)
		return err_set(err, d ? EINVAL : ENOMEM, d ? "no implicit-ODP registrar for this PD" :
			       "out of memory");
	op->h->registered = true;
	rc = quota_check(r, op->h, NULL, 0, 0, false, true, !op->evicted, &evict, err);
	if (rc < 0)
		return rc;
	if (evict)
		return evict_then_retry(op, evict, err);
	mr = mr_new(r, op, d, 0, UINT64_MAX);
	if (!mr)
		return err_set(err, ENOMEM, "out of memory");
	if (charge_add(r, mr, op->h->acct, &c) < 0) {
		r->odp.mrs--;
		r->odp.implicit_mrs--;
		odpd_slab_free(&r->mr_slab, mr);
		return err_set(err, ENOMEM, "out of memory");
	}
	mr->iova = 0;
	mr->registrar = d->registrar;        /* read on the loop, kept by the MR */
	odpd_registrar_get(mr->registrar);
	r->n_mrs++;
	d->n_mrs++;
	op->mr = mr;
	op->ibv_access = access_to_ibv(op->q.access);
	op->job.run = implicit_open_run;
	op->job.done = implicit_opened;
	op->job.lane = ODPD_LANE_USER(op->h->uid);
	odpd_pool_submit(r->pool, &op->job);
	return 1;
}

static int reg_start(struct reg_op *op, struct odpd_ref **ret_ref, struct odpd_err *err)
{
	struct odpd_registry *r = op->r;
	const struct odpd_reg_req *q = &op->q;
	bool client_pd = op->cctx != NULL;
	uint64_t s = q->offset & ~(PAGE - 1);
	uint64_t e = (q->offset + q->length + PAGE - 1) & ~(PAGE - 1);
	struct odpd_domain *d = NULL;
	struct odpd_mr *mr;
	struct lookup l = { .r = r, .h = op->h, .s = s, .e = e, .access = q->access, .odp = q->odp };

	if (q->dev->removed)
		return err_set(err, ENODEV, "device %s was removed", q->dev->name);
	if (q->implicit)
		return reg_implicit(op, err);
	if (e > q->map->size)
		e = q->map->size;
	if (!client_pd) {
		d = holder_domain(r, op->h, (unsigned)(q->dev - r->devices->dev));
		if (!d)
			return err_set(err, ENOMEM, "out of memory");
	}
	op->h->registered = true;
	if (d && !q->no_cache) {
		if (!op->evicted)
			r->stats.lookups++;
		mr = cache_lookup(r, d, q, &l);
		if (mr)
			return reg_hit(op, mr, ret_ref, err);
		if (l.registering) {
			/* Served when that MR is registered (reg_done): N processes
			 * of a shared PD asking at once still make one MR. */
			op->next_joiner = l.registering->joiners;
			l.registering->joiners = op;
			return 1;
		}
		if (!op->evicted)
			r->stats.misses++;
	}
	return reg_miss(op, d, s, e, err);
}

int odpd_registry_reg(struct odpd_registry *r, struct odpd_holder *h, const struct odpd_reg_req *q,
		      odpd_reg_cb cb, void *arg, struct odpd_ref **ret_ref, struct odpd_err *err)
{
	struct reg_op *op = calloc(1, sizeof(*op));
	int rc;

	if (!op) {
		if (q->cmd_fd >= 0)
			close(q->cmd_fd);
		return err_set(err, ENOMEM, "out of memory");
	}
	op->r = r;
	op->h = h;
	op->q = *q;
	op->cb = cb;
	op->arg = arg;
	if (q->cmd_fd >= 0) {
		op->q.cmd_fd = -1;
		op->q.no_cache = true;           /* client-PD: the client's own PD */
		op->cctx = holder_client_ctx(r, h, q->cmd_fd, err);
		if (!op->cctx) {
			free(op);
			return -err->code;
		}
	}
	rc = reg_start(op, ret_ref, err);
	if (rc != 1) {
		cctx_drop(r, h, op->cctx);
		free(op);
	}
	return rc;
}

/* ---------------------------------------------------------------- flush */

int odpd_registry_flush(struct odpd_registry *r, const struct odpd_flush_sel *sel,
			odpd_done_cb cb, void *arg)
{
	struct odpd_mr *list = NULL;
	struct odpd_waiter *w;
	struct odpd_holder *h;
	uint64_t seq0;

	/* What client caches keep unused is released first (relaxed), then
	 * flushed with the rest. */
	r->hole_pass++;
	LIST_FOREACH(h, &r->holders, rlink) {
		if (!h->hits || !flush_selects(sel, h))
			continue;
		holes_check(r, h);
		holder_revoke(r, h, false, &list);
	}
	collect_relaxed(r, match_sel, sel, &list);
	relaxed_arm(r);
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
	w->seq = r->batch_seq;              /* a barrier: every batch up to the newest */
	/* it counts only what it selected (none when start_batch, out of
	 * memory, deregistered it here) */
	w->own = r->batch_seq != seq0 ? r->batch_seq : 0;
	LIST_INSERT_HEAD(&r->waiters, w, link);
	waiters_check(r, true);             /* nothing in flight after all */
	return 1;
}

/* ---------------------------------------------------------------- idle verifiers */

/*
 * A PD's verifier (verify.h: a CQ, a loopback QP pair and a bounce buffer)
 * is made by the first verify that needs it and kept idle for
 * verify-idle-ms after the last, then freed on a worker: a client that
 * verified once costs odpd nothing for it once idle (issue 23: a verifier
 * is most of a megabyte). The PDs with one kept idle wait in a list, oldest
 * first (every one waits as long), behind one timer.
 */
static uint64_t now_ms(void)
{
	return now_ns() / 1000000;
}

/* The timer fires when the oldest idle verifier has been idle long enough. */
static void verifier_arm(struct odpd_registry *r)
{
	struct odpd_domain *d = TAILQ_FIRST(&r->idle_verifiers);
	uint64_t now, due;
	struct timeval tv;

	if (!d) {
		evtimer_del(r->verifier_timer);
		return;
	}
	now = now_ms();
	due = d->verifier_idle_at > now ? d->verifier_idle_at - now : 0;
	tv.tv_sec = (time_t)(due / 1000);
	tv.tv_usec = (suseconds_t)(due % 1000 * 1000);
	evtimer_add(r->verifier_timer, &tv);
}

static void verifier_unlist(struct odpd_registry *r, struct odpd_domain *d)
{
	if (!d->verifier_idle_at)
		return;
	TAILQ_REMOVE(&r->idle_verifiers, d, idle_link);
	d->verifier_idle_at = 0;
}

/* A verify of @d put its verifier back: idle from now on, the newest. */
static void verifier_idle(struct odpd_registry *r, struct odpd_domain *d)
{
	verifier_unlist(r, d);
	d->verifier_idle_at = now_ms() + r->verify_idle_ms;
	TAILQ_INSERT_TAIL(&r->idle_verifiers, d, idle_link);
	if (!evtimer_pending(r->verifier_timer, NULL))
		verifier_arm(r);
}

/* Frees the verifiers of @n PDs that have been idle long enough, all in one
 * job, and one such job at a time: under load the daemon's lane gets one
 * turn in many, and a job per PD, or per turn of the timer, would fall
 * behind the verifies that make them; meanwhile what comes due waits for
 * the next job. */
struct verifier_job {
	struct odpd_job job;
	struct odpd_registry *r;
	unsigned n;
	struct odpd_domain *d[];
};

static void verifier_reap(struct odpd_registry *r);

static void verifier_free_run(struct odpd_job *job)
{
	struct verifier_job *j = (struct verifier_job *)job;

	for (unsigned i = 0; i < j->n; i++) {
		struct odpd_domain *d = j->d[i];
		struct odpd_verifier *v;

		pthread_mutex_lock(&d->lock);
		v = d->verifier;                 /* none if a verify took it meanwhile */
		d->verifier = NULL;
		pthread_mutex_unlock(&d->lock);
		odpd_verifier_free(v);
	}
}

static void verifier_free_done(struct odpd_job *job)
{
	struct verifier_job *j = (struct verifier_job *)job;
	struct odpd_registry *r = j->r;

	r->pending--;
	r->verifier_reaping = false;
	for (unsigned i = 0; i < j->n; i++) {
		j->d[i]->jobs--;
		domain_maybe_close(r, j->d[i], false);
	}
	free(j);
	verifier_reap(r);                    /* what came due meanwhile */
}

/* Free every verifier idle long enough, unless a job doing so is in flight:
 * then its end comes back here. */
static void verifier_reap(struct odpd_registry *r)
{
	struct odpd_domain *d;
	struct verifier_job *j;
	const uint64_t now = now_ms();
	unsigned n = 0;

	if (r->verifier_reaping)
		return;
	TAILQ_FOREACH(d, &r->idle_verifiers, idle_link) {
		if (d->verifier_idle_at > now)
			break;
		n += d->verifies == 0;
	}
	j = n ? calloc(1, sizeof(*j) + n * sizeof(j->d[0])) : NULL;
	if (n && !j) {                           /* kept a while longer */
		struct timeval tv = { 0, 100000 };

		evtimer_add(r->verifier_timer, &tv);
		return;
	}
	while ((d = TAILQ_FIRST(&r->idle_verifiers)) && d->verifier_idle_at <= now) {
		verifier_unlist(r, d);
		if (d->verifies)                 /* one runs: its end lists the PD again */
			continue;
		d->jobs++;                       /* the PD stays open until it is done */
		j->d[j->n++] = d;
	}
	if (j) {
		j->r = r;
		r->pending++;
		r->verifier_reaping = true;
		j->job.run = verifier_free_run;
		j->job.done = verifier_free_done;
		j->job.lane = ODPD_LANE_DAEMON;
		j->job.big = j->n > 16;          /* never every worker at once */
		odpd_pool_submit(r->pool, &j->job);
	}
	verifier_arm(r);
}

static void on_verifier_timer(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	verifier_reap(arg);
}

/* ---------------------------------------------------------------- verify */

struct verify_op {
	struct odpd_job job;
	struct odpd_registry *r;
	struct odpd_mr *mr;
	bool anon;                          /* holds a reference of its own (admin) */
	uint64_t iova, length;
	bool probe;                         /* READ with rkey, not the MR's */
	uint32_t rkey;
	size_t buf_size;
	bool keep;                          /* keep the verifier idle afterwards (verify-idle-ms) */
	odpd_verify_cb cb;
	void *arg;
	uint32_t crc;
	const char *method;
	struct odpd_err err;
	int rc;
};

static void verify_run(struct odpd_job *job)
{
	struct verify_op *op = (struct verify_op *)job;
	struct odpd_domain *d = op->mr->dom;
	struct odpd_verifier *v;

	/* Take the idle verifier, if there is one: no lock is held during the
	 * verify, and two verifies of one PD each use one of their own. */
	pthread_mutex_lock(&d->lock);
	v = d->verifier;
	d->verifier = NULL;
	pthread_mutex_unlock(&d->lock);
	if (!v)
		op->rc = odpd_verifier_new(d, op->buf_size, &v, &op->err);
	if (op->rc == 0) {
		struct odpd_keys k = { op->mr->mr->lkey, op->probe ? op->rkey : op->mr->mr->rkey };
		op->rc = odpd_verify_mr(v, &k, op->iova, op->length,
					op->probe || (op->mr->access & ODPD__ACCESS__ACCESS_REMOTE_READ),
					op->probe || op->mr->pinned ? 0 : op->mr->iova + odpd_mr_length(op->mr),
					&op->crc, &op->method, &op->err);
	}
	/* Put back, to be kept idle (verify_done lists the PD), unless its QPs
	 * may be in the error state now, none is kept (verify-idle-ms 0) or
	 * another verify's is kept already. */
	if (op->rc == 0 && op->keep) {
		pthread_mutex_lock(&d->lock);
		if (!d->verifier) {
			d->verifier = v;
			v = NULL;
		}
		pthread_mutex_unlock(&d->lock);
	}
	odpd_verifier_free(v);
}

static void verify_done(struct odpd_job *job)
{
	struct verify_op *op = (struct verify_op *)job;
	struct odpd_mr *mr = op->mr;
	struct odpd_domain *d = mr->dom;     /* kept while busy */

	if (d->dev->removed && op->rc < 0) {
		char was[sizeof(op->err.msg)];

		snprintf(was, sizeof(was), "%s", op->err.msg);
		op->rc = err_set(&op->err, ENODEV, "device %s was removed: %s", d->dev->name, was);
	}
	op->cb(op->arg, op->rc, &op->err, op->crc, op->length, op->method);
	d->jobs--;
	d->verifies--;
	if (op->keep)                        /* (a PD that closes below leaves the list) */
		verifier_idle(op->r, d);         /* its verifier, or another's, or none */
	if (op->anon)
		mr->refs--;
	if (--mr->busy == 0 && mr->dead_stage == 1) {
		/* invalidated or dead meanwhile: left to us (mr_defer) */
		mr->dead_stage = mr->state == ODPD_MR_DEAD ? 2 : 0;
		mr->batch_next = NULL;
		start_batch_seq(op->r, mr, false, NULL, mr_undefer(op->r, mr));
	} else if (op->anon && mr->refs == 0) {
		/* its holders let go meanwhile: ours was the last reference */
		if (mr->state == ODPD_MR_DEAD) {
			if (mr->dead_stage == 3)
				mr_free(op->r, mr);
		} else {
			struct odpd_mr *list = NULL;

			mr_invalidate(op->r, mr, &list);
			start_batch(op->r, list, false, NULL);
		}
	} else {
		domain_maybe_close(op->r, d, false);
	}
	free(op);
}

static int verify_start(struct odpd_registry *r, struct odpd_mr *mr, uint64_t iova, uint64_t length,
			const uint32_t *probe_rkey, size_t buf_size, odpd_verify_cb cb, void *arg, bool anon,
			unsigned long lane, struct odpd_err *err)
{
	struct verify_op *op;

	if (mr->busy == ODPD_MR_MAX_BUSY)
		return err_set(err, EBUSY, "%u verifies already read through this MR: try again later",
			       (unsigned)ODPD_MR_MAX_BUSY);
	op = calloc(1, sizeof(*op));
	if (!op)
		return err_set(err, ENOMEM, "out of memory");
	op->r = r;
	op->mr = mr;
	op->anon = anon;
	mr->refs += anon;                    /* no release deregisters it under the worker */
	mr->busy++;
	mr->dom->jobs++;
	mr->dom->verifies++;
	op->probe = probe_rkey != NULL;
	op->rkey = probe_rkey ? *probe_rkey : 0;
	op->iova = iova;
	op->length = length;
	op->buf_size = buf_size;
	op->keep = r->verify_idle_ms > 0;
	op->cb = cb;
	op->arg = arg;
	op->job.run = verify_run;
	op->job.done = verify_done;
	op->job.lane = lane;
	odpd_pool_submit(r->pool, &op->job);
	return 1;
}

int odpd_registry_verify(struct odpd_registry *r, struct odpd_ref *ref, uint64_t iova, uint64_t length,
			 const uint32_t *probe_rkey, size_t buf_size, odpd_verify_cb cb, void *arg,
			 struct odpd_err *err)
{
	if (ref->mr->state == ODPD_MR_DEAD)
		return err_set(err, ENODEV, "the MR's device was removed");
	if (!ref->mr->dom)
		return err_set(err, EOPNOTSUPP, "verify reads daemon-PD MRs only; this MR lives in your "
			       "own PD (client-PD mode)");
	if (ref->mr->implicit && !probe_rkey && length == 0)
		return err_set(err, EINVAL, "an implicit ODP MR spans the whole address space: name the "
			       "range to verify");
	if (probe_rkey) {
		if (length == 0 || iova + length < iova)
			return err_set(err, EINVAL, "a probe needs an address and a length");
	} else if (iova == 0 && length == 0) {
		iova = ref->iova;
		length = ref->length;
	} else if (length == 0 || iova < ref->mr->iova || iova + length < iova ||
		   iova + length > ref->mr->iova + odpd_mr_length(ref->mr)) {
		/* the MR's whole (page-rounded) range: libodpd's local hits share
		 * a reference over any part of it */
		return err_set(err, EINVAL, "verify range is not inside the MR");
	}
	return verify_start(r, ref->mr, iova, length, probe_rkey, buf_size, cb, arg, false,
			    ODPD_LANE_USER(ref->holder->uid), err);
}

int odpd_registry_verify_mr(struct odpd_registry *r, uint64_t mr_id, size_t buf_size, odpd_verify_cb cb,
			    void *arg, struct odpd_err *err)
{
	struct odpd_mr *mr;

	for (mr = odpd_registry_next_mr(r, NULL); mr; mr = odpd_registry_next_mr(r, mr))
		if (mr->node.seq == mr_id)
			break;
	if (!mr)
		return err_set(err, ENOENT, "no MR %" PRIu64, mr_id);
	if (mr->state != ODPD_MR_LIVE)
		return err_set(err, EBUSY, "MR %" PRIu64 " is %s, not held: only live MRs are verified",
			       mr_id, odpd_mr_state_name(mr->state));
	if (!mr->dom)
		return err_set(err, EOPNOTSUPP, "MR %" PRIu64 " is in a client's own PD (client-PD mode)",
			       mr_id);
	if (mr->implicit)
		return err_set(err, EINVAL, "MR %" PRIu64 " is implicit ODP: it has no range to read",
			       mr_id);
	return verify_start(r, mr, mr->iova, odpd_mr_length(mr), NULL, buf_size, cb, arg, true, ODPD_LANE_DAEMON,
			    err);
}

/* ---------------------------------------------------------------- prefetch (ibv_advise_mr) */

/* On the loop: count a prefetch's result; a failure is logged, never hidden. */
static void prefetch_count(struct odpd_registry *r, const struct odpd_device *dev, int rc, uint64_t bytes)
{
	if (rc == 0) {
		r->odp.prefetches++;
		r->odp.prefetch_bytes += bytes;
		return;
	}
	r->odp.prefetch_errors++;
	log_warning("%s: ibv_advise_mr: %s", dev->name, strerror(rc));
}

struct advise_op {
	struct odpd_job job;
	struct odpd_registry *r;
	struct odpd_domain *d;
	const struct odpd_device *dev;
	struct ibv_pd *pd;
	uint32_t advice, flags;
	unsigned n;
	uint64_t bytes;
	odpd_advise_cb cb;
	void *arg;
	int rc;                             /* ibv_advise_mr's (errno) */
	struct ibv_sge sges[];
};

static void advise_run(struct odpd_job *job)
{
	struct advise_op *op = (struct advise_op *)job;

	op->rc = ibv_advise_mr(op->pd, (enum ibv_advise_mr_advice)op->advice, op->flags, op->sges, op->n);
}

static void advise_done(struct odpd_job *job)
{
	struct advise_op *op = (struct advise_op *)job;
	struct odpd_err err = { 0 };

	prefetch_count(op->r, op->dev, op->rc, op->bytes);
	if (op->rc && op->dev->removed)
		op->rc = ENODEV;
	if (op->rc)
		err_set(&err, op->rc, "ibv_advise_mr on %s: %s%s", op->dev->name,
			op->dev->removed ? "the device was removed" : strerror(op->rc),
			op->rc == EOPNOTSUPP ? " (the provider has no advise_mr: rdma-core's rxe has it "
			"from v58)" : "");
	op->cb(op->arg, op->rc ? -op->rc : 0, &err, op->bytes);
	op->d->jobs--;
	domain_maybe_close(op->r, op->d, false);
	free(op);
}

/* The MR @h holds whose lkey is @lkey, or NULL. */
static struct odpd_mr *holder_mr_by_lkey(const struct odpd_holder *h, uint32_t lkey)
{
	const struct odpd_ref *ref;

	LIST_FOREACH(ref, &h->refs, hlink)
		if (ref->mr->state != ODPD_MR_DEAD && ref->mr->mr && ref->mr->mr->lkey == lkey)
			return ref->mr;
	return NULL;
}

static int advise_check_sge(const struct odpd_holder *h, uint32_t advice, const struct odpd_sge *g,
			    unsigned i, struct odpd_mr **ret, struct odpd_err *err)
{
	struct odpd_mr *mr = holder_mr_by_lkey(h, g->lkey);

	if (!mr)
		return err_set(err, EINVAL, "sge %u: lkey %#x names no MR of this connection", i, g->lkey);
	if (mr->pinned)
		return err_set(err, EINVAL, "sge %u: lkey %#x is a pinned MR: only ODP MRs can be "
			       "advised (advising a pinned MR has oopsed rxe)", i, g->lkey);
	if (mr->dom == NULL)
		return err_set(err, EINVAL, "sge %u: not an MR of odpd's PD", i);
	if (mr->dom->retired)
		return err_set(err, ENODEV, "sge %u: the MR's device was removed", i);
	if (g->length == 0 || g->addr < mr->iova || g->addr + g->length < g->addr ||
	    g->addr + g->length > mr->iova + odpd_mr_length(mr))
		return err_set(err, EINVAL, "sge %u: [%#" PRIx64 ", +%u) is not inside its MR [%#" PRIx64
			       ", +%" PRIu64 ")", i, g->addr, g->length, mr->iova, odpd_mr_length(mr));
	if (advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE && !(mr->access & ODPD__ACCESS__ACCESS_LOCAL_WRITE))
		return err_set(err, EPERM, "sge %u: PREFETCH_WRITE on an MR without local write access", i);
	*ret = mr;
	return 0;
}

int odpd_registry_advise(struct odpd_registry *r, struct odpd_holder *h, uint32_t advice, uint32_t flags,
			 const struct odpd_sge *sges, unsigned n, odpd_advise_cb cb, void *arg,
			 struct odpd_err *err)
{
	struct odpd_domain *d = NULL;
	struct advise_op *op;
	uint64_t bytes = 0;
	int rc;

	if (advice > IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
		return err_set(err, EINVAL, "unknown advice %u (PREFETCH 0, PREFETCH_WRITE 1, "
			       "PREFETCH_NO_FAULT 2)", advice);
	if (flags & ~(uint32_t)IBV_ADVISE_MR_FLAG_FLUSH)
		return err_set(err, EINVAL, "unknown advise flags %#x (only IBV_ADVISE_MR_FLAG_FLUSH)",
			       flags & ~(uint32_t)IBV_ADVISE_MR_FLAG_FLUSH);
	if (n == 0 || n > ODPD_ADVISE_MAX_SGE)
		return err_set(err, EINVAL, "%u ranges: 1 to %u", n, ODPD_ADVISE_MAX_SGE);
	for (unsigned i = 0; i < n; i++) {
		struct odpd_mr *mr = NULL;

		rc = advise_check_sge(h, advice, &sges[i], i, &mr, err);
		if (rc < 0)
			return rc;
		if (d && mr->dom != d)
			return err_set(err, EINVAL, "sge %u: another PD than sge 0's (one device per call)", i);
		d = mr->dom;
		bytes += sges[i].length;
	}
	if (d->dev->advise_mr != ODPD__SUPPORT__SUPPORT_YES)
		return err_set(err, EOPNOTSUPP, "device %s: its provider has no ibv_advise_mr (%s; "
			       "rdma-core's rxe provider has it from v58)", d->dev->name,
			       d->dev->advise_mr_errno ? strerror(d->dev->advise_mr_errno) : "not probed");
	op = calloc(1, sizeof(*op) + n * sizeof(op->sges[0]));
	if (!op)
		return err_set(err, ENOMEM, "out of memory");
	op->r = r;
	op->d = d;
	d->jobs++;                           /* the PD stays open until it is done */
	op->dev = d->dev;
	op->pd = d->pd;                      /* open: it has registered MRs */
	op->advice = advice;
	op->flags = flags;
	op->n = n;
	op->bytes = bytes;
	op->cb = cb;
	op->arg = arg;
	for (unsigned i = 0; i < n; i++)      /* ODP: iova is odpd's own address */
		op->sges[i] = (struct ibv_sge){ .addr = sges[i].addr, .length = sges[i].length,
						.lkey = sges[i].lkey };
	op->job.run = advise_run;
	op->job.done = advise_done;
	op->job.lane = ODPD_LANE_USER(h->uid);
	odpd_pool_submit(r->pool, &op->job);
	return 1;
}

/* ---------------------------------------------------------------- export (daemon-PD mode) */

struct export_op {
	struct odpd_job job;
	struct odpd_registry *r;
	struct odpd_domain *d;
	odpd_export_cb cb;
	void *arg;
	int fd;
	uint32_t pd_handle;
	struct odpd_err err;
	int rc;
};

static void export_run(struct odpd_job *job)
{
	struct export_op *op = (struct export_op *)job;
	struct odpd_domain *d = op->d;

	pthread_mutex_lock(&d->lock);
	op->rc = odpd_domain_open_locked(d, &op->err);
	if (op->rc == 0) {
		op->fd = fcntl(d->ctx->cmd_fd, F_DUPFD_CLOEXEC, 3);
		if (op->fd < 0) {
			op->rc = err_set(&op->err, errno, "duplicating the context's cmd_fd: %s",
					 strerror(errno));
		} else {
			op->pd_handle = d->pd->handle;
			d->exported = true;
		}
	}
	pthread_mutex_unlock(&d->lock);
}

static void export_done(struct odpd_job *job)
{
	struct export_op *op = (struct export_op *)job;
	struct odpd_domain *d = op->d;

	if (d->retired) {                    /* its device went away meanwhile */
		if (op->fd >= 0)
			close(op->fd);
		op->fd = -1;
		op->rc = err_set(&op->err, ENODEV, "device %s was removed", d->dev->name);
	}
	op->cb(op->arg, op->rc, &op->err, op->fd, op->pd_handle);
	d->jobs--;
	domain_maybe_close(op->r, d, false);
	free(op);
}

int odpd_registry_export_pd(struct odpd_registry *r, struct odpd_holder *h, struct odpd_device *dev,
			    odpd_export_cb cb, void *arg, struct odpd_err *err)
{
	struct export_op *op;
	struct odpd_domain *d;

	if (dev->removed)
		return err_set(err, ENODEV, "device %s was removed", dev->name);
	if (dev->import != ODPD__SUPPORT__SUPPORT_YES)
		return err_set(err, EOPNOTSUPP, "device %s: its provider cannot import (ibv_import_device: "
			       "%s), so odpd cannot hand its PD over; import needs a provider that "
			       "implements it (mlx5 today)", dev->name,
			       strerror(dev->import_errno ? dev->import_errno : EOPNOTSUPP));
	op = calloc(1, sizeof(*op));
	d = op ? holder_domain(r, h, (unsigned)(dev - r->devices->dev)) : NULL;
	if (!d) {
		free(op);
		return err_set(err, ENOMEM, "out of memory");
	}
	h->registered = true;                /* bound to this PD: too late to join another */
	op->r = r;
	op->d = d;
	d->jobs++;
	op->cb = cb;
	op->arg = arg;
	op->fd = -1;
	op->job.run = export_run;
	op->job.done = export_done;
	op->job.lane = ODPD_LANE_USER(h->uid);
	odpd_pool_submit(r->pool, &op->job);
	return 1;
}

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

/* Is live, relaxed or registering @mr on @dev? MRs in a batch (invalidating,
 * dead) are not looked at: a worker may be dropping their import now. */
static bool mr_on(const struct odpd_mr *mr, const struct odpd_device *dev)
{
	if (mr->state == ODPD_MR_INVALIDATING || mr->state == ODPD_MR_DEAD)
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
			mrs += ref->mr->state != ODPD_MR_DEAD && mr_on(ref->mr, dev);
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
			mr_unindex(mr);
			mr->state = ODPD_MR_DEAD;
			mr->invalidated = true;
			mr_hits_invalidate(mr);
			killed++;
			if (mr->busy) {
				mr_defer(r, mr);         /* verify_done deregisters it */
				continue;
			}
			mr->dead_stage = 2;
			mr->batch_next = list;
			list = mr;
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
}
