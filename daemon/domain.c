/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "domain.h"
#include "verify.h"

int odpd_domain_open(struct odpd_device *dev, struct odpd_domain **ret, struct odpd_err *err)
{
	struct odpd_domain *d = calloc(1, sizeof(*d));
	int e;

	if (!d)
		return err_set(err, ENOMEM, "out of memory");
	d->dev = dev;
	d->ctx = ibv_open_device(dev->ibdev);
	if (!d->ctx) {
		e = errno;
		free(d);
		return err_set(err, e, "ibv_open_device(%s): %s", dev->name, strerror(e));
	}
	d->pd = ibv_alloc_pd(d->ctx);
	if (!d->pd) {
		e = errno;
		ibv_close_device(d->ctx);
		free(d);
		return err_set(err, e, "ibv_alloc_pd(%s): %s", dev->name, strerror(e));
	}
	*ret = d;
	return 0;
}

void odpd_domain_close(struct odpd_domain *d)
{
	if (!d)
		return;
	odpd_verifier_free(d->verifier);
	ibv_dealloc_pd(d->pd);
	ibv_close_device(d->ctx);
	free(d);
}
