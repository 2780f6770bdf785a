/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "domain.h"
#include "log.h"
#include "verify.h"

struct odpd_domain *odpd_domain_new(struct odpd_device *dev, unsigned dev_index)
{
	struct odpd_domain *d = calloc(1, sizeof(*d));

	if (!d)
		return NULL;
	d->dev = dev;
	d->dev_index = dev_index;
	pthread_mutex_init(&d->lock, NULL);
	LIST_INIT(&d->buckets);
	return d;
}

int odpd_domain_open_locked(struct odpd_domain *d, struct odpd_err *err)
{
	int e;

	if (d->pd)
		return 0;
	d->ctx = ibv_open_device(d->dev->ibdev);
	if (!d->ctx) {
		e = errno;
		return err_set(err, e, "ibv_open_device(%s): %s", d->dev->name, strerror(e));
	}
	d->pd = ibv_alloc_pd(d->ctx);
	if (!d->pd) {
		e = errno;
		ibv_close_device(d->ctx);
		d->ctx = NULL;
		return err_set(err, e, "ibv_alloc_pd(%s): %s", d->dev->name, strerror(e));
	}
	return 0;
}

void odpd_domain_close(struct odpd_domain *d)
{
	int e;

	if (!d)
		return;
	odpd_verifier_free(d->verifier);
	if (d->pd && (e = ibv_dealloc_pd(d->pd)) != 0) {
		/*
		 * A client that imported this context (ImportPd) left objects in
		 * the PD: its QPs, CQs or MRs, e.g. because it was killed. Free
		 * our struct only (unimport); closing our cmd_fd below destroys
		 * them once no process holds the context's file any more.
		 */
		log_warning("%s: PD of a closing domain still in use (%s)%s; closing the context "
			    "releases what is left in it", d->dev->name, strerror(e),
			    d->exported ? ": objects an importing client left behind" : "");
		ibv_unimport_pd(d->pd);
	}
	if (d->ctx)
		ibv_close_device(d->ctx);
	pthread_mutex_destroy(&d->lock);
	free(d);
}
