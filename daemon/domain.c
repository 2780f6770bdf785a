/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <linux/kcmp.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "domain.h"
#include "implicit.h"
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
	if (d->registrar)                   /* only when out of memory: the loop reaps it first */
		odpd_registrar_reap_now(d->registrar);
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

/* ---------------------------------------------------------------- client contexts */

struct odpd_client_ctx *odpd_client_ctx_new(int fd)
{
	struct odpd_client_ctx *c = calloc(1, sizeof(*c));

	if (!c) {
		close(fd);
		return NULL;
	}
	pthread_mutex_init(&c->lock, NULL);
	c->fd = fd;
	atomic_init(&c->refs, 1);
	return c;
}

bool odpd_client_ctx_is(const struct odpd_client_ctx *c, int fd)
{
	pid_t self = getpid();

	return syscall(SYS_kcmp, self, self, KCMP_FILE, c->fd, fd) == 0;
}

void odpd_client_ctx_get(struct odpd_client_ctx *c)
{
	atomic_fetch_add(&c->refs, 1);
}

void odpd_client_ctx_put(struct odpd_client_ctx *c)
{
	if (!c || atomic_fetch_sub(&c->refs, 1) != 1)
		return;
	if (c->ctx)
		ibv_close_device(c->ctx);        /* closes c->fd */
	else
		close(c->fd);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

int odpd_client_ctx_import(struct odpd_client_ctx *c, struct odpd_err *err)
{
	int r = 0;

	pthread_mutex_lock(&c->lock);
	if (!c->ctx) {
		c->ctx = ibv_import_device(c->fd);   /* a failure leaves the fd to us */
		if (!c->ctx) {
			int e = errno > 0 ? errno : EOPNOTSUPP;
			r = err_set(err, e, "ibv_import_device on your cmd_fd: %s%s", strerror(e),
				    e == EOPNOTSUPP ? " (client-PD mode needs a provider that can import: "
				    "mlx5 today)" : "");
		}
	}
	pthread_mutex_unlock(&c->lock);
	return r;
}
