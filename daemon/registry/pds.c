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
#include "pds.h"
#include "relaxed.h"
#include "verifyjob.h"
#include "internal.h"
#include "keep.h"

static void domain_close_run(struct odpd_job *job);
static void domain_close_done(struct odpd_job *job);
static void domain_close_submit(void *arg);


struct close_job {
	struct odpd_job job;
	struct odpd_registry *r;
	struct odpd_domain *d;
	struct odpd_device *dev;
};

/* Close @d on a worker once nobody uses it and no MR is left in it. The
 * shared PD it belonged to goes too when it has no member and no domain
 * left, unless @keep_spd (the caller still looks at it). */
void domain_maybe_close(struct odpd_registry *r, struct odpd_domain *d, bool keep_spd)
{
	struct odpd_shared_pd *spd = d->spd;
	struct close_job *j;

	if (d->members || d->n_mrs || d->jobs)
		return;
	verifier_unlist(r, d);                 /* the close frees it */
	keep_domain_gone(d);
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

void shared_maybe_free(struct odpd_registry *r, struct odpd_shared_pd *spd)
{
	if (spd->members)
		return;
	for (unsigned i = 0; i < r->devices->n; i++)
		if (spd->doms[i])
			return;
	keep_shared_gone(spd->name);
	LIST_REMOVE(spd, link);
	r->n_shared--;
	free(spd->doms);
	free(spd);
}

/* The PD a holder registers into on device @i, made on first use. */
struct odpd_domain *holder_domain(struct odpd_registry *r, struct odpd_holder *h, unsigned i)
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

static bool match_domain(const struct odpd_mr *mr, const void *arg)
{
	return mr->dom == arg;
}

/* @d lost a member: with nobody left, its relaxed MRs can never be hit. */
void domain_leave(struct odpd_registry *r, struct odpd_domain *d, struct odpd_mr **list)
{
	if (--d->members == 0) {
		collect_relaxed(r, match_domain, d, list);
		domain_maybe_close(r, d, true);
	}
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
	if (op->rc == 0)
		keep_domain(d);                  /* (its context is a client's too now) */
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
