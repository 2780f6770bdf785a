/* SPDX-License-Identifier: MIT */
/*
 * mirror.c - the librdmacm mirror (client-PD mode): the daemon registers
 * into the caller's id->pd through the caller's cmd_fd, and the library
 * imports the MR (ibv_import_mr). Uses the default connection.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "libodpd-private.h"

struct mirror_entry {
	struct odpd_link link;          /* in conn->mirror_mrs */
	struct ibv_mr *mr;              /* imported */
	uint64_t handle;                /* the daemon's */
	struct odpd_segment *seg;
};

/* ---------------------------------------------------------------- the table */

static struct mirror_entry *mirror_find(struct odpd_conn *c, const struct ibv_mr *mr)
{
	struct odpd_link *l;

	for (l = c->mirror_mrs.next; l != &c->mirror_mrs; l = l->next) {
		struct mirror_entry *e = container_of(l, struct mirror_entry, link);

		if (e->mr == mr)
			return e;
	}
	return NULL;
}

/* conns_find() callback: does @c hold the mirror MR @key? */
static bool conn_has_mirror(struct odpd_conn *c, const void *key)
{
	bool has;

	tables_lock(c);
	has = mirror_find(c, key) != NULL;
	tables_unlock(c);
	return has;
}

static void mirror_insert(struct odpd_conn *c, struct mirror_entry *e)
{
	tables_lock(c);
	link_add_tail(&c->mirror_mrs, &e->link);
	e->seg->n_mrs++;
	tables_unlock(c);
}

static void mirror_remove(struct odpd_conn *c, struct mirror_entry *e)
{
	tables_lock(c);
	link_del(&e->link);
	e->seg->n_mrs--;
	tables_unlock(c);
}

void mirror_release_all(struct odpd_conn *c)
{
	struct odpd_link *l, *tmp;

	link_for_each_safe(l, tmp, &c->mirror_mrs) {
		struct mirror_entry *e = container_of(l, struct mirror_entry, link);

		link_del(l);
		ibv_unimport_mr(e->mr);
		free(e);
	}
}

/* ---------------------------------------------------------------- registration */

static int mirror_args(const char *what, const struct rdma_cm_id *id)
{
	if (!id || !id->verbs || !id->pd || !id->verbs->device)
		return errmsg_set(-EINVAL, "%s: %s", what,
				  !id ? "id is NULL" : !id->pd ? "id->pd is NULL" :
				  !id->verbs ? "id->verbs is NULL" : "id->verbs->device is NULL");
	return 0;
}

static int mirror_pd_args(const char *what, const struct ibv_pd *pd)
{
	if (!pd || !pd->context || !pd->context->device)
		return errmsg_set(-EINVAL, "%s: %s", what,
				  !pd ? "pd is NULL" : !pd->context ? "pd->context is NULL" :
				  "pd->context->device is NULL");
	return 0;
}

/*
 * Can this process's provider for @ctx's device import (ibv_import_mr at the
 * end of a mirror registration needs it)? Asked once per device name, with
 * ibv_import_device on a dup of @ctx's cmd_fd, so that a process whose own
 * libibverbs cannot import is refused before the daemon registers anything.
 * 0, or -EOPNOTSUPP with the message set.
 */
#define IMPORT_PROBES 8
static struct {
	char dev[64];
	int err;                        /* 0: imports; else errno */
} import_probe[IMPORT_PROBES];
static unsigned n_import_probes;
static pthread_mutex_t import_probe_lock = PTHREAD_MUTEX_INITIALIZER;

static int probe_local_import(struct ibv_context *ctx)
{
	struct ibv_context *imp;
	int fd = fcntl(ctx->cmd_fd, F_DUPFD_CLOEXEC, 0);

	if (fd < 0)
		return errno;
	imp = ibv_import_device(fd);
	if (!imp) {
		int e = errno > 0 ? errno : EOPNOTSUPP;
		close(fd);                      /* a failed import leaves the fd to us */
		return e;
	}
	ibv_close_device(imp);              /* closes the dup */
	return 0;
}

static int mirror_local_import(const char *what, struct ibv_context *ctx, const char *name)
{
	int err = -1;

	pthread_mutex_lock(&import_probe_lock);
	for (unsigned i = 0; i < n_import_probes; i++)
		if (strcmp(import_probe[i].dev, name) == 0)
			err = import_probe[i].err;
	if (err < 0) {
		err = probe_local_import(ctx);
		if (n_import_probes < IMPORT_PROBES && (err == 0 || err == EOPNOTSUPP)) {
			snprintf(import_probe[n_import_probes].dev, sizeof(import_probe[0].dev), "%s", name);
			import_probe[n_import_probes++].err = err;
		}
	}
	pthread_mutex_unlock(&import_probe_lock);
	/* Other failures (not a uverbs fd, no such device...) are the daemon's to judge. */
	if (err == EOPNOTSUPP)
		return errmsg_set(-err, "%s: device %s: this process's libibverbs provider cannot import "
				  "(ibv_import_device: %s), so it could not import the MR the daemon "
				  "would register; only providers that implement import (mlx5 today) can",
				  what, name, strerror(err));
	return 0;
}

/* The daemon must know @pd's device and must be able to import on it. */
static int mirror_device(struct odpd_conn *c, const char *what, const struct ibv_pd *pd,
			 const char **ret_name)
{
	const char *name = ibv_get_device_name(pd->context->device);
	const struct odpd_device_attr *d = name ? conn_find_device(c, name) : NULL;
	int r;

	if (!d)
		return errmsg_set(-ENODEV, "%s: device %s: not one of the daemon's devices",
				  what, name ? name : "(unnamed)");
	if (d->import != ODPD_SUPPORT_YES)
		return errmsg_set(-EOPNOTSUPP, "%s: device %s: its provider cannot import a context, PD "
				  "or MR (ibv_import_device: %s); only mlx5 implements "
				  "ibv_import_device today, Soft-RoCE (rxe) does not. Use odpd_reg() "
				  "(daemon PD) instead", what, name,
				  d->import == ODPD_SUPPORT_NO && d->import_errno > 0 ?
				  strerror(d->import_errno) : "not probed");
	r = mirror_local_import(what, pd->context, name);
	if (r < 0)
		return r;
	*ret_name = name;
	return 0;
}

/* Import the MR the daemon made in @pd's context; undo the registration if that fails. */
static int mirror_import(struct odpd_conn *c, const char *what, struct ibv_pd *pd,
			 const struct mr_result *res, struct ibv_mr **ret)
{
	struct ibv_mr *mr;
	int err;

	if (!res->has_kernel_handle) {
		mr_deregister(c, what, res->handle, false);
		return errmsg_set(-EIO, "%s: the daemon's reply has no kernel MR handle", what);
	}
	mr = ibv_import_mr(pd, res->kernel_handle);
	if (!mr) {
		err = errno > 0 ? errno : EIO;
		mr_deregister(c, what, res->handle, false);
		return errmsg_set(-err, "%s: ibv_import_mr: %m", what);
	}
	*ret = mr;
	return 0;
}

/* With c->lock held: check, register, import. */
static int mirror_reg_locked(struct odpd_conn *c, const char *what, struct ibv_pd *pd,
			     void *addr, size_t length, struct mr_request *q, struct mirror_entry *e)
{
	struct mr_result res;
	int r;

	r = conn_check(c, what);
	if (r >= 0)
		r = mirror_device(c, what, pd, &q->device);
	if (r >= 0)
		r = segment_lookup(c, what, addr, length, &e->seg);
	/* pinned: fault the pages here, so that this process's cgroup pays */
	if (r >= 0 && !e->seg->no_populate)
		r = segment_populate(e->seg, what, addr, length);
	if (r >= 0)
		r = mr_register(c, what, addr, length, q, &res);
	if (r >= 0)
		r = mirror_import(c, what, pd, &res, &e->mr);
	if (r < 0)
		return r;
	/* ibv_import_mr leaves addr NULL and reports the kernel MR's length. */
	e->mr->addr = addr;
	e->mr->length = length;
	e->handle = res.handle;
	mirror_insert(c, e);
	return 0;
}

int mirror_reg_pd(const char *what, struct ibv_pd *pd, void *addr, size_t length,
		  unsigned access, struct ibv_mr **ret)
{
	struct mr_request q = { .client_pd = true };
	struct mirror_entry *e;
	struct odpd_conn *c;
	int r;

	r = mirror_pd_args(what, pd);
	if (r >= 0)
		r = access_to_wire(what, access, &q.access, &q.kind);
	if (r >= 0)
		r = conn_default(&c);
	if (r < 0)
		return r;
	e = calloc(1, sizeof(*e));
	if (!e)
		return errmsg_set(-ENOMEM, "%s: %m", what);
	q.client_pd_handle = pd->handle;
	q.cmd_fd = pd->context->cmd_fd;

	pthread_mutex_lock(&c->lock);
	r = mirror_reg_locked(c, what, pd, addr, length, &q, e);
	pthread_mutex_unlock(&c->lock);
	if (r < 0) {
		free(e);
		return r;
	}
	*ret = e->mr;
	return 0;
}

static struct ibv_mr *mirror_public(const char *what, struct rdma_cm_id *id, void *addr,
				    size_t length, unsigned access)
{
	struct ibv_mr *mr = NULL;
	int r;

	errmsg_clear();
	r = mirror_args(what, id);
	if (r >= 0)
		r = mirror_reg_pd(what, id->pd, addr, length, access, &mr);
	return public_ptr(r, mr);
}

_public_ struct ibv_mr *odpd_reg_msgs(struct rdma_cm_id *id, void *addr, size_t length)
{
	return mirror_public("odpd_reg_msgs", id, addr, length, IBV_ACCESS_LOCAL_WRITE);
}

_public_ struct ibv_mr *odpd_reg_read(struct rdma_cm_id *id, void *addr, size_t length)
{
	return mirror_public("odpd_reg_read", id, addr, length,
			     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
}

_public_ struct ibv_mr *odpd_reg_write(struct rdma_cm_id *id, void *addr, size_t length)
{
	return mirror_public("odpd_reg_write", id, addr, length,
			     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
}

/* ---------------------------------------------------------------- odpd_dereg_mr */

/*
 * Deregister in the daemon first, then unimport (which only frees our
 * struct): if the daemon refuses, @mr stays valid and registered.
 */
/* With c->lock held: deregister @mr in the daemon and take its entry out (*@ret). */
static int mirror_take_locked(struct odpd_conn *c, const char *what, const struct ibv_mr *mr,
			      struct mirror_entry **ret)
{
	struct mirror_entry *e = mirror_find(c, mr);
	int r;

	if (!e)
		return errmsg_set(-ENOENT, "%s: this MR is no longer registered", what);
	r = mr_deregister(c, what, e->handle, false);
	if (r < 0)
		return r;
	mirror_remove(c, e);
	*ret = e;
	return 0;
}

int mirror_dereg(const char *what, struct ibv_mr *mr)
{
	/* Only default connections, which are never freed, hold mirror MRs. */
	struct odpd_conn *c = conns_find(conn_has_mirror, mr);
	struct mirror_entry *e = NULL;
	int r;

	if (!c)
		return errmsg_set(-ENOENT, "%s: this MR did not come from odpd_reg_msgs(), "
				  "odpd_reg_read() or odpd_reg_write()", what);
	pthread_mutex_lock(&c->lock);
	r = mirror_take_locked(c, what, mr, &e);
	pthread_mutex_unlock(&c->lock);
	if (r < 0)
		return r;
	ibv_unimport_mr(mr);
	free(e);
	return 0;
}

_public_ int odpd_dereg_mr(struct ibv_mr *mr)
{
	errmsg_clear();
	if (!mr)
		return public_int(errmsg_set(-EINVAL, "odpd_dereg_mr: mr is NULL"));
	return public_int(mirror_dereg("odpd_dereg_mr", mr));
}

/* ---------------------------------------------------------------- for the preload */

/*
 * Forget @mr without asking the daemon (its connection is gone, so the
 * daemon has let go of the MR already): the caller then destroys the MR in
 * its own context (ibv_dereg_mr), which also frees the struct. 0, or -ENOENT
 * if @mr is not a mirror MR.
 */
int mirror_forget(struct ibv_mr *mr)
{
	struct odpd_conn *c = conns_find(conn_has_mirror, mr);
	struct mirror_entry *e = NULL;

	if (!c)
		return -ENOENT;
	pthread_mutex_lock(&c->lock);
	e = mirror_find(c, mr);
	if (e)
		mirror_remove(c, e);
	pthread_mutex_unlock(&c->lock);
	if (!e)
		return -ENOENT;
	free(e);
	return 0;
}

/*
 * ibv_rereg_mr for a mirror MR: @fresh (a mirror MR just registered with the
 * new translation, PD or access) takes @mr's place. The daemon deregisters
 * @mr's old MR; @mr's public fields become @fresh's, so that the caller's
 * pointer stays valid (as ibv_rereg_mr keeps it), and @fresh's struct is
 * freed. On failure (the old MR could not be deregistered) nothing changes
 * and @fresh stays registered, for the caller to deregister.
 */
int mirror_swap(const char *what, struct ibv_mr *mr, struct ibv_mr *fresh)
{
	struct odpd_conn *c = conns_find(conn_has_mirror, mr);
	struct mirror_entry *old = NULL, *e;
	int r;

	if (!c)
		return errmsg_set(-ENOENT, "%s: this MR is not odpd's", what);
	pthread_mutex_lock(&c->lock);
	e = mirror_find(c, fresh);
	r = e ? mirror_take_locked(c, what, mr, &old) :
		errmsg_set(-ENOENT, "%s: the new MR is no longer registered", what);
	if (r >= 0) {
		tables_lock(c);
		*mr = *fresh;           /* the public part; the provider's part stays @mr's */
		e->mr = mr;
		tables_unlock(c);
	}
	pthread_mutex_unlock(&c->lock);
	if (r < 0)
		return r;
	ibv_unimport_mr(fresh);
	free(old);
	return 0;
}
