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
#include "mrlife.h"
#include "pds.h"
#include "verifyjob.h"
#include "internal.h"

static void verifier_reap(struct odpd_registry *r);

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

void verifier_unlist(struct odpd_registry *r, struct odpd_domain *d)
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

void on_verifier_timer(evutil_socket_t fd, short what, void *arg)
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
	if (--mr->busy == 0 && (mr->state == ODPD_MR_DEFERRED || mr->state == ODPD_MR_DEAD_DEFERRED)) {
		/* invalidated or dead meanwhile: left to us (mr_defer) */
		mr_undefer_batch(op->r, mr);
	} else if (op->anon && mr->refs == 0) {
		/* its holders let go meanwhile: ours was the last reference */
		if (mr->state != ODPD_MR_LIVE) {
			mr_gc(op->r, mr);
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
	if (ref->mr->state != ODPD_MR_LIVE)         /* held, so its device went away */
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
