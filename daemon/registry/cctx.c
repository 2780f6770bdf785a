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
#include "cctx.h"
#include "internal.h"

/* ---------------------------------------------------------------- batches */

/* Client-PD mode: an MR's import (NULL: none) undone and freed: its PD
 * unimported, its client context dropped (the last reference closes our copy
 * of the client's fd). */
void import_drop(struct odpd_import **pimp)
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
struct odpd_client_ctx *mr_cctx(const struct odpd_mr *mr)
{
	return !mr->implicit && mr->imp ? mr->imp->cctx : NULL;
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
void holder_unlink_client_ctx(struct odpd_registry *r, struct odpd_holder *h,
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
void cctx_drop(struct odpd_registry *r, struct odpd_holder *h, struct odpd_client_ctx *c)
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
struct odpd_client_ctx *holder_client_ctx(struct odpd_registry *r, struct odpd_holder *h, int fd,
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
void holder_drop_client_ctxs(struct odpd_registry *r, struct odpd_holder *h)
{
	while (!LIST_EMPTY(&h->cctxs))
		holder_unlink_client_ctx(r, h, LIST_FIRST(&h->cctxs));
}
