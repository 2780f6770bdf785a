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
#include "mrlife.h"
#include "witness.h"
#include "internal.h"
#include "keep.h"

static bool batch_split_implicit(struct odpd_registry *r, struct odpd_mr **list, bool flush);

/*
 * @mr (invalidated or dead) has verifies reading through it: it is batched
 * when the last one ends (verify_done), under a batch number reserved now,
 * so that a flush from now on waits for it as for the batches in flight.
 */
void mr_defer(struct odpd_registry *r, struct odpd_mr *mr)
{
	struct odpd_deferred *d = malloc(sizeof(*d));

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
uint64_t mr_undefer(struct odpd_registry *r, struct odpd_mr *mr)
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
void implicit_dereg_answered(void *arg, int rc, const struct odpd_err *err, uint32_t handle)
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

static void batch_run(struct odpd_job *job);
static void batch_mr_done(struct odpd_registry *r, struct odpd_mr *mr);

bool batch_loop_kind(const struct odpd_mr *list)
{
	const struct odpd_mr *mr = list;

	return mr && !mr->batch_next && mr->mr && mr->pinned && !mr->implicit && !mr_cctx(mr) &&
	       odpd_mr_length(mr) <= ODPD_LOOP_REG_MAX;
}

/*
 * The last reference to one small pinned MR went: deregistered here, on the
 * loop, rather than in a batch on a worker, when nothing can make the loop
 * wait (no worker holds the segment's witness lock). True when done.
 */
bool batch_on_loop(struct odpd_registry *r, struct odpd_mr *list)
{
	struct odpd_mr *mr = list;
	struct odpd_batch tmp = { .r = r, .mrs = list };

	if (!batch_loop_kind(mr))
		return false;
	if (mr->witnessed) {
		/* witness_end, without waiting: a worker pinning in the segment
		 * holds the lock. Early is harmless: the MR is out of the cache,
		 * nothing asks whether it is current. */
		if (pthread_mutex_trylock(&mr->map->witness_lock) != 0)
			return false;
		mr->witnessed = false;
		pthread_mutex_unlock(&mr->map->witness_lock);
	}
	batch_run(&tmp.job);                 /* (witness_end: nothing left to do) */
	batch_mr_done(r, mr);
	r->stats.deregistrations++;
	r->stats.loop_deregistrations++;
	return true;
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
			if (e) {
				log_errno(LOG_ERR, e, "ibv_dereg_mr of MR %" PRIu64, mr->node.seq);
			} else {
				keep_limbo_leave(mr->limbo);
				mr->limbo = 0;
			}
			mr->mr = NULL;
		}
		witness_end(mr);
		if (!mr->implicit)                 /* (imp and registrar share their place) */
			import_drop(&mr->imp);
	}
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

void waiters_check(struct odpd_registry *r, bool later);

/* An MR a batch deregistered: DEAD, freed, or, its device gone and still
 * held by clients, freed with its last reference. */
static void batch_mr_done(struct odpd_registry *r, struct odpd_mr *mr)
{
	mr_dead(r, mr);
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
void waiters_check(struct odpd_registry *r, bool later)
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
void start_batch_seq(struct odpd_registry *r, struct odpd_mr *list, bool flush, struct odpd_waiter *w,
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

void start_batch(struct odpd_registry *r, struct odpd_mr *list, bool flush, struct odpd_waiter *w)
{
	start_batch_seq(r, list, flush, w, 0);
}
