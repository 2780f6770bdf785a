/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "domain.h"
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
	if (!d)
		return;
	odpd_verifier_free(d->verifier);
	if (d->pd)
		ibv_dealloc_pd(d->pd);
	if (d->ctx)
		ibv_close_device(d->ctx);
	pthread_mutex_destroy(&d->lock);
	free(d);
}
