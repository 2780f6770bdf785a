/* SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "domain.h"
#include "log.h"
#include "request.h"
#include "verify.h"

#define ACCESS_KNOWN (ODPD__ACCESS__ACCESS_LOCAL_WRITE | ODPD__ACCESS__ACCESS_REMOTE_READ | \
		      ODPD__ACCESS__ACCESS_REMOTE_WRITE | ODPD__ACCESS__ACCESS_REMOTE_ATOMIC)
#define ACCESS_REMOTE (ODPD__ACCESS__ACCESS_REMOTE_READ | ODPD__ACCESS__ACCESS_REMOTE_WRITE | \
		       ODPD__ACCESS__ACCESS_REMOTE_ATOMIC)
#define ACCESS_WRITES (ODPD__ACCESS__ACCESS_LOCAL_WRITE | ODPD__ACCESS__ACCESS_REMOTE_WRITE | \
		       ODPD__ACCESS__ACCESS_REMOTE_ATOMIC)

static int access_to_ibv(uint32_t a)
{
	return (a & ODPD__ACCESS__ACCESS_LOCAL_WRITE ? IBV_ACCESS_LOCAL_WRITE : 0) |
	       (a & ODPD__ACCESS__ACCESS_REMOTE_READ ? IBV_ACCESS_REMOTE_READ : 0) |
	       (a & ODPD__ACCESS__ACCESS_REMOTE_WRITE ? IBV_ACCESS_REMOTE_WRITE : 0) |
	       (a & ODPD__ACCESS__ACCESS_REMOTE_ATOMIC ? IBV_ACCESS_REMOTE_ATOMIC : 0);
}

/* Is @fd a uverbs character device of this host? Decided with statx and
 * sysfs only, before any ioctl can reach whatever the fd really is. */
static bool is_uverbs_fd(int fd)
{
	struct statx stx;
	struct dirent *de;
	bool found = false;
	DIR *d;

	if (statx(fd, "", AT_EMPTY_PATH, STATX_TYPE, &stx) < 0 || !S_ISCHR(stx.stx_mode))
		return false;
	d = opendir("/sys/class/infiniband_verbs");
	if (!d)
		return false;
	while (!found && (de = readdir(d))) {
		char path[300];
		unsigned maj, min;
		FILE *f;
		if (strncmp(de->d_name, "uverbs", 6) != 0)
			continue;
		snprintf(path, sizeof(path), "/sys/class/infiniband_verbs/%s/dev", de->d_name);
		f = fopen(path, "re");
		if (!f)
			continue;
		found = fscanf(f, "%u:%u", &maj, &min) == 2 &&
			maj == stx.stx_rdev_major && min == stx.stx_rdev_minor;
		fclose(f);
	}
	closedir(d);
	return found;
}

/* ---------------------------------------------------------------- reg */

struct reg_job {
	struct odpd_job job;
	struct odpd_client *c;
	uint64_t id;
	struct odpd_mr_entry *e;
	struct odpd_device *dev;
	unsigned dev_index;
	void *daemon_addr;
	int ibv_access;
	int cmd_fd;                      /* client-PD mode, consumed by the import */
	uint32_t pd_handle;
	struct odpd_err err;
	int r;
};

static int reg_import(struct reg_job *j)
{
	struct odpd_mr_entry *e = j->e;

	e->imp.ctx = ibv_import_device(j->cmd_fd);
	if (!e->imp.ctx)
		return err_set(&j->err, errno ? errno : EOPNOTSUPP, "ibv_import_device on your cmd_fd: %s "
			       "(only providers with import support, e.g. mlx5, can do client-PD mode)",
			       strerror(errno ? errno : EOPNOTSUPP));
	j->cmd_fd = -1;                  /* owned by the context now */
	e->imp.pd = ibv_import_pd(e->imp.ctx, j->pd_handle);
	if (!e->imp.pd)
		return err_set(&j->err, errno, "ibv_import_pd(%u): %s", j->pd_handle, strerror(errno));
	return 0;
}

static void reg_run(struct odpd_job *job)
{
	struct reg_job *j = (struct reg_job *)job;
	struct odpd_mr_entry *e = j->e;
	struct odpd_client *c = j->c;
	struct ibv_pd *pd;

	if (j->cmd_fd >= 0) {
		j->r = reg_import(j);
		if (j->r < 0)
			return;
		pd = e->imp.pd;
	} else {
		if (!c->domains[j->dev_index]) {
			j->r = odpd_domain_open(j->dev, &c->domains[j->dev_index], &j->err);
			if (j->r < 0)
				return;
		}
		e->dom = c->domains[j->dev_index];
		pd = e->dom->pd;
	}
	if ((uintptr_t)j->daemon_addr == e->iova)
		e->mr = ibv_reg_mr(pd, j->daemon_addr, e->length, j->ibv_access);
	else
		e->mr = ibv_reg_mr_iova(pd, j->daemon_addr, e->length, e->iova, j->ibv_access);
	if (!e->mr)
		j->r = err_set(&j->err, errno, "ibv_reg_mr%s on %s: %s",
			       (uintptr_t)j->daemon_addr == e->iova ? "" : "_iova", j->dev->name,
			       strerror(errno));
}

static void reply_mr(struct odpd_client *c, uint64_t id, const struct odpd_mr_entry *e)
{
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__MrReply mr = ODPD__MR_REPLY__INIT;

	mr.has_handle = mr.has_lkey = mr.has_rkey = mr.has_iova = mr.has_length = 1;
	mr.has_kernel_handle = mr.has_access = 1;
	mr.handle = e->handle;
	mr.lkey = e->mr->lkey;
	mr.rkey = e->mr->rkey;
	mr.iova = e->iova;
	mr.length = e->length;
	mr.kernel_handle = e->mr->handle;
	mr.access = e->access;
	reply.has_id = reply.has_status = 1;
	reply.id = id;
	reply.body_case = ODPD__REPLY__BODY_MR;
	reply.mr = &mr;
	odpd_client_send(c, &reply);
}

static void reg_done(struct odpd_job *job)
{
	struct reg_job *j = (struct reg_job *)job;
	struct odpd_client *c = j->c;
	struct odpd_mr_entry *e = j->e;

	if (j->cmd_fd >= 0)
		close(j->cmd_fd);
	if (j->r < 0) {
		if (e->imp.pd)
			ibv_unimport_pd(e->imp.pd);
		if (e->imp.ctx)
			ibv_close_device(e->imp.ctx);
		free(e);
		odpd_reply_err(c, j->id, &j->err);
	} else {
		e->handle = ++c->next_handle;
		LIST_INSERT_HEAD(&c->mrs, e, link);
		c->n_mrs++;
		c->mr_bytes += e->length;
		e->seg->n_mrs++;
		c->m->stats.registrations++;
		log_debug("client %llu: MR %" PRIu64 " [%#" PRIx64 ", +%" PRIu64 ") lkey %#x rkey %#x",
			  (unsigned long long)c->id, e->handle, e->iova, e->length, e->mr->lkey, e->mr->rkey);
		reply_mr(c, j->id, e);
	}
	free(j);
	odpd_client_job_done(c);
}

/* Find the client's segment holding [addr, addr + length). */
static int find_segment(struct odpd_client *c, uint64_t addr, uint64_t length,
			struct odpd_cseg **ret, struct odpd_err *err)
{
	struct odpd_cseg *s;

	if (length == 0)
		return err_set(err, EINVAL, "length 0");
	if (addr + length < addr)
		return err_set(err, EINVAL, "address %#" PRIx64 " + length %" PRIu64 " overflows", addr, length);
	LIST_FOREACH(s, &c->segs, link) {
		if (addr < s->client_addr || addr - s->client_addr >= s->length)
			continue;
		if (length > s->length - (addr - s->client_addr))
			return err_set(err, EINVAL, "[%#" PRIx64 ", +%" PRIu64 ") runs past the end of "
				       "segment %" PRIu64 " at %#" PRIx64 " (+%" PRIu64 ")", addr, length,
				       s->handle, s->client_addr, s->length);
		*ret = s;
		return 0;
	}
	return err_set(err, EINVAL, "%#" PRIx64 " is in none of your segments: allocate the buffer "
		       "with odpd_alloc() or attach its memfd with odpd_attach()", addr);
}

static int reg_check(struct odpd_client *c, const Odpd__RegMr *req, int fd, struct reg_job *j,
		     struct odpd_err *err)
{
	struct odpd_manager *m = c->m;
	uint32_t access = req->access;
	bool client_pd = req->has_client_pd && req->client_pd;
	struct odpd_cseg *s = NULL;
	int r;

	if (c->n_mrs >= m->cfg.max_mrs)
		return err_set(err, EDQUOT, "a client may hold at most %u MRs", m->cfg.max_mrs);
	if (access & ~(uint32_t)ACCESS_KNOWN)
		return err_set(err, EINVAL, "unknown access bits %#x", access & ~(uint32_t)ACCESS_KNOWN);
	if ((access & (ODPD__ACCESS__ACCESS_REMOTE_WRITE | ODPD__ACCESS__ACCESS_REMOTE_ATOMIC)) &&
	    !(access & ODPD__ACCESS__ACCESS_LOCAL_WRITE))
		return err_set(err, EINVAL, "remote write or atomic access needs local write access");
	switch (req->has_kind ? req->kind : ODPD__MR_KIND__MR_PINNED) {
	case ODPD__MR_KIND__MR_PINNED:
		break;
	case ODPD__MR_KIND__MR_ODP:
	case ODPD__MR_KIND__MR_IMPLICIT_ODP:
		return err_set(err, EOPNOTSUPP, "ODP registration is not implemented in this odpd yet; "
			       "register pinned");
	default:
		return err_set(err, EINVAL, "unknown MR kind %d", (int)req->kind);
	}
	r = find_segment(c, req->addr, req->length, &s, err);
	if (r < 0)
		return r;
	if ((access & ACCESS_WRITES) && !s->writable)
		return err_set(err, EACCES, "segment %" PRIu64 " is read-only (fd mode or write seal): "
			       "register it without write access", s->handle);
	if (client_pd) {
		if (!is_uverbs_fd(fd))
			return err_set(err, EINVAL, "client-PD mode: the fd is not a uverbs device of this host");
		if ((access & ACCESS_REMOTE) && !c->admin)
			return err_set(err, EPERM, "client-PD mode: remote access is granted to root and "
				       "the admin group only");
	}
	j->dev = odpd_devices_find(&m->devices, req->device);
	if (!j->dev)
		return err_set(err, ENODEV, m->devices.n ? "no device named %s" : "odpd has no RDMA device%s",
			       m->devices.n ? req->device : "");
	j->dev_index = (unsigned)(j->dev - m->devices.dev);
	j->e->seg = s;
	j->e->iova = req->addr;
	j->e->length = req->length;
	j->e->access = access;
	j->daemon_addr = s->map->addr + s->file_offset + (req->addr - s->client_addr);
	j->ibv_access = access_to_ibv(access);
	j->pd_handle = req->client_pd_handle;
	return 0;
}

void odpd_reg_mr(struct odpd_client *c, uint64_t id, const Odpd__RegMr *req, int fd)
{
	struct reg_job *j = calloc(1, sizeof(*j));
	struct odpd_err err = { 0 };

	if (!j || !(j->e = calloc(1, sizeof(*j->e)))) {
		free(j);
		if (fd >= 0)
			close(fd);
		odpd_client_send_error(c, id, ENOMEM, "out of memory");
		return;
	}
	if (reg_check(c, req, fd, j, &err) < 0) {
		if (fd >= 0)
			close(fd);
		free(j->e);
		free(j);
		odpd_reply_err(c, id, &err);
		return;
	}
	j->c = c;
	j->id = id;
	j->cmd_fd = fd;
	j->job.run = reg_run;
	j->job.done = reg_done;
	odpd_client_submit(c, &j->job);
}

/* ---------------------------------------------------------------- dereg */

void odpd_request_mr_release(struct odpd_mr_entry *e)
{
	int r = ibv_dereg_mr(e->mr);

	if (r)
		log_errno(LOG_ERR, r, "ibv_dereg_mr of MR %" PRIu64, e->handle);
	e->mr = NULL;
	if (e->imp.pd)
		ibv_unimport_pd(e->imp.pd);
	if (e->imp.ctx)
		ibv_close_device(e->imp.ctx);       /* closes our dup of the client's cmd_fd */
	e->imp.pd = NULL;
	e->imp.ctx = NULL;
}

struct mr_job {
	struct odpd_job job;
	struct odpd_client *c;
	uint64_t id;
	struct odpd_mr_entry *e;
	/* verify */
	uint64_t iova, length;
	uint32_t crc;
	const char *method;
	size_t buf_size;
	struct odpd_err err;
	int r;
};

static struct mr_job *mr_job_new(struct odpd_client *c, uint64_t id, struct odpd_mr_entry *e)
{
	struct mr_job *j = calloc(1, sizeof(*j));

	if (!j) {
		odpd_client_send_error(c, id, ENOMEM, "out of memory");
		return NULL;
	}
	j->c = c;
	j->id = id;
	j->e = e;
	return j;
}

static struct odpd_mr_entry *mr_find(struct odpd_client *c, uint64_t handle)
{
	struct odpd_mr_entry *e;

	LIST_FOREACH(e, &c->mrs, link)
		if (e->handle == handle)
			return e;
	return NULL;
}

static void dereg_run(struct odpd_job *job)
{
	odpd_request_mr_release(((struct mr_job *)job)->e);
}

static void dereg_done(struct odpd_job *job)
{
	struct mr_job *j = (struct mr_job *)job;
	struct odpd_client *c = j->c;
	Odpd__Reply reply = ODPD__REPLY__INIT;

	j->e->seg->n_mrs--;
	c->m->stats.deregistrations++;
	free(j->e);
	reply.has_id = reply.has_status = 1;
	reply.id = j->id;
	odpd_client_send(c, &reply);
	free(j);
	odpd_client_job_done(c);
}

void odpd_dereg_mr(struct odpd_client *c, uint64_t id, const Odpd__DeregMr *req)
{
	struct odpd_mr_entry *e = mr_find(c, req->handle);
	struct mr_job *j;

	if (!e) {
		odpd_client_send_error(c, id, ENOENT, "no such MR");
		return;
	}
	j = mr_job_new(c, id, e);
	if (!j)
		return;
	LIST_REMOVE(e, link);
	c->n_mrs--;
	c->mr_bytes -= e->length;
	j->job.run = dereg_run;
	j->job.done = dereg_done;
	odpd_client_submit(c, &j->job);
}

/* ---------------------------------------------------------------- verify */

static void verify_run(struct odpd_job *job)
{
	struct mr_job *j = (struct mr_job *)job;
	struct odpd_domain *dom = j->e->dom;

	if (!dom->verifier) {
		j->r = odpd_verifier_new(dom, j->buf_size, &dom->verifier, &j->err);
		if (j->r < 0)
			return;
	}
	j->r = odpd_verify_mr(dom->verifier, j->e->mr, j->iova, j->length,
			      (j->e->access & ODPD__ACCESS__ACCESS_REMOTE_READ) != 0,
			      &j->crc, &j->method, &j->err);
	if (j->r < 0) {                  /* the QPs may be in the error state now */
		odpd_verifier_free(dom->verifier);
		dom->verifier = NULL;
	}
}

static void verify_done(struct odpd_job *job)
{
	struct mr_job *j = (struct mr_job *)job;
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__VerifyReply vr = ODPD__VERIFY_REPLY__INIT;

	if (j->r < 0) {
		odpd_reply_err(j->c, j->id, &j->err);
	} else {
		vr.has_crc32 = vr.has_length = 1;
		vr.crc32 = j->crc;
		vr.length = j->length;
		vr.method = (char *)j->method;
		reply.has_id = reply.has_status = 1;
		reply.id = j->id;
		reply.body_case = ODPD__REPLY__BODY_VERIFY;
		reply.verify = &vr;
		odpd_client_send(j->c, &reply);
	}
	struct odpd_client *c = j->c;
	free(j);
	odpd_client_job_done(c);
}

void odpd_verify(struct odpd_client *c, uint64_t id, const Odpd__Verify *req)
{
	struct odpd_mr_entry *e = mr_find(c, req->handle);
	uint64_t iova, length;
	struct mr_job *j;

	if (!e) {
		odpd_client_send_error(c, id, ENOENT, "no such MR");
		return;
	}
	if (!e->dom) {
		odpd_client_send_error(c, id, EOPNOTSUPP, "verify reads daemon-PD MRs only; this MR lives "
				       "in your own PD (client-PD mode)");
		return;
	}
	iova = req->addr;
	length = req->length;
	if (iova == 0 && length == 0) {
		iova = e->iova;
		length = e->length;
	} else if (length == 0 || iova < e->iova || iova + length < iova ||
		   iova + length > e->iova + e->length) {
		odpd_client_send_error(c, id, EINVAL, "verify range is not inside the MR");
		return;
	}
	j = mr_job_new(c, id, e);
	if (!j)
		return;
	j->iova = iova;
	j->length = length;
	j->buf_size = c->m->cfg.verify_buffer;
	j->job.run = verify_run;
	j->job.done = verify_done;
	odpd_client_submit(c, &j->job);
}
