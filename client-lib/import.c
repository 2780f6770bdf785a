/* SPDX-License-Identifier: MIT */
/*
 * import.c - daemon-PD mode for applications: odpd_import_pd() imports the
 * device context and PD that the connection's registrations live in, so the
 * application can make its CQs and QPs there and use odpd_reg() keys.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "libodpd-private.h"

void import_release(struct odpd_conn *c)
{
	/* Never ibv_dealloc_pd: the PD is the daemon's. */
	if (c->imp_pd)
		ibv_unimport_pd(c->imp_pd);
	if (c->imp_ctx)
		ibv_close_device(c->imp_ctx);   /* closes our copy of the cmd_fd */
	c->imp_pd = NULL;
	c->imp_ctx = NULL;
}

/* With c->lock held: ask the daemon, then import the context and the PD. */
static int import_locked(struct odpd_conn *c, const char *what)
{
	Odpd__ImportPd ip = ODPD__IMPORT_PD__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Reply *reply = NULL;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	uint32_t handle;
	int fd = -1, r, err;

	if (c->imp_pd)
		return 0;
	r = conn_check(c, what);
	if (r < 0)
		return r;
	ip.device = c->device;
	req.body_case = ODPD__REQUEST__BODY_IMPORT_PD;
	req.import_pd = &ip;
	r = conn_call_fd(c, what, &req, NULL, 0, ODPD__REPLY__BODY_IMPORT_PD, &reply, &fd);
	if (r < 0)
		return r;
	if (!reply->import_pd->has_pd_handle) {
		conn_reply_free(c, reply);
		close(fd);
		return errmsg_set(-EIO, "%s: the daemon's reply names no PD", what);
	}
	handle = reply->import_pd->pd_handle;
	conn_reply_free(c, reply);

	ctx = ibv_import_device(fd);
	if (!ctx) {
		err = errno > 0 ? errno : EIO;
		close(fd);                      /* a failed import leaves the fd to us */
		return errmsg_set(-err, "%s: ibv_import_device: %s%s", what, strerror(err),
				  err == EOPNOTSUPP ? " (this process's libibverbs provider cannot "
				  "import; only providers that implement it, mlx5 today, can)" : "");
	}
	pd = ibv_import_pd(ctx, handle);
	if (!pd) {
		err = errno > 0 ? errno : EIO;
		ibv_close_device(ctx);
		return errmsg_set(-err, "%s: ibv_import_pd(%u): %s", what, handle, strerror(err));
	}
	c->imp_ctx = ctx;
	c->imp_pd = pd;
	return 0;
}

_public_ struct ibv_pd *odpd_import_pd(struct odpd_conn *conn)
{
	const char *what = "odpd_import_pd";
	struct ibv_pd *pd;
	int r;

	errmsg_clear();
	if (!conn)
		return public_ptr(errmsg_set(-EINVAL, "%s: conn is NULL", what), NULL);
	pthread_mutex_lock(&conn->lock);
	r = import_locked(conn, what);
	pd = conn->imp_pd;
	pthread_mutex_unlock(&conn->lock);
	return public_ptr(r, pd);
}
