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
#include "advise.h"
#include "pds.h"
#include "internal.h"

/* ---------------------------------------------------------------- prefetch (ibv_advise_mr) */

/* On the loop: count a prefetch's result; a failure is logged, never hidden. */
void prefetch_count(struct odpd_registry *r, const struct odpd_device *dev, int rc, uint64_t bytes)
{
	if (rc == 0) {
		r->odp.prefetches++;
		r->odp.prefetch_bytes += bytes;
		return;
	}
	r->odp.prefetch_errors++;
	log_warning("%s: ibv_advise_mr: %s", dev->name, strerror(rc));
}

struct advise_op {
	struct odpd_job job;
	struct odpd_registry *r;
	struct odpd_domain *d;
	const struct odpd_device *dev;
	struct ibv_pd *pd;
	uint32_t advice, flags;
	unsigned n;
	uint64_t bytes;
	odpd_advise_cb cb;
	void *arg;
	int rc;                             /* ibv_advise_mr's (errno) */
	struct ibv_sge sges[];
};

static void advise_run(struct odpd_job *job)
{
	struct advise_op *op = (struct advise_op *)job;

	op->rc = ibv_advise_mr(op->pd, (enum ibv_advise_mr_advice)op->advice, op->flags, op->sges, op->n);
}

static void advise_done(struct odpd_job *job)
{
	struct advise_op *op = (struct advise_op *)job;
	struct odpd_err err = { 0 };

	prefetch_count(op->r, op->dev, op->rc, op->bytes);
	if (op->rc && op->dev->removed)
		op->rc = ENODEV;
	if (op->rc)
		err_set(&err, op->rc, "ibv_advise_mr on %s: %s%s", op->dev->name,
			op->dev->removed ? "the device was removed" : strerror(op->rc),
			op->rc == EOPNOTSUPP ? " (the provider has no advise_mr: rdma-core's rxe has it "
			"from v58)" : "");
	op->cb(op->arg, op->rc ? -op->rc : 0, &err, op->bytes);
	op->d->jobs--;
	domain_maybe_close(op->r, op->d, false);
	free(op);
}

/* The MR @h holds whose lkey is @lkey, or NULL. */
static struct odpd_mr *holder_mr_by_lkey(const struct odpd_holder *h, uint32_t lkey)
{
	const struct odpd_ref *ref;

	LIST_FOREACH(ref, &h->refs, hlink)
		if (ref->mr->state == ODPD_MR_LIVE && ref->mr->mr && ref->mr->mr->lkey == lkey)
			return ref->mr;
	return NULL;
}

static int advise_check_sge(const struct odpd_holder *h, uint32_t advice, const struct odpd_sge *g,
			    unsigned i, struct odpd_mr **ret, struct odpd_err *err)
{
	struct odpd_mr *mr = holder_mr_by_lkey(h, g->lkey);

	if (!mr)
		return err_set(err, EINVAL, "sge %u: lkey %#x names no MR of this connection", i, g->lkey);
	if (mr->pinned)
		return err_set(err, EINVAL, "sge %u: lkey %#x is a pinned MR: only ODP MRs can be "
			       "advised (advising a pinned MR has oopsed rxe)", i, g->lkey);
	if (mr->dom == NULL)
		return err_set(err, EINVAL, "sge %u: not an MR of odpd's PD", i);
	if (mr->dom->retired)
		return err_set(err, ENODEV, "sge %u: the MR's device was removed", i);
	if (g->length == 0 || g->addr < mr->iova || g->addr + g->length < g->addr ||
	    g->addr + g->length > mr->iova + odpd_mr_length(mr))
		return err_set(err, EINVAL, "sge %u: [%#" PRIx64 ", +%u) is not inside its MR [%#" PRIx64
			       ", +%" PRIu64 ")", i, g->addr, g->length, mr->iova, odpd_mr_length(mr));
	if (advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE && !(mr->access & ODPD__ACCESS__ACCESS_LOCAL_WRITE))
		return err_set(err, EPERM, "sge %u: PREFETCH_WRITE on an MR without local write access", i);
	*ret = mr;
	return 0;
}

int odpd_registry_advise(struct odpd_registry *r, struct odpd_holder *h, uint32_t advice, uint32_t flags,
			 const struct odpd_sge *sges, unsigned n, odpd_advise_cb cb, void *arg,
			 struct odpd_err *err)
{
	struct odpd_domain *d = NULL;
	struct advise_op *op;
	uint64_t bytes = 0;
	int rc;

	if (advice > IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
		return err_set(err, EINVAL, "unknown advice %u (PREFETCH 0, PREFETCH_WRITE 1, "
			       "PREFETCH_NO_FAULT 2)", advice);
	if (flags & ~(uint32_t)IBV_ADVISE_MR_FLAG_FLUSH)
		return err_set(err, EINVAL, "unknown advise flags %#x (only IBV_ADVISE_MR_FLAG_FLUSH)",
			       flags & ~(uint32_t)IBV_ADVISE_MR_FLAG_FLUSH);
	if (n == 0 || n > ODPD_ADVISE_MAX_SGE)
		return err_set(err, EINVAL, "%u ranges: 1 to %u", n, ODPD_ADVISE_MAX_SGE);
	for (unsigned i = 0; i < n; i++) {
		struct odpd_mr *mr = NULL;

		rc = advise_check_sge(h, advice, &sges[i], i, &mr, err);
		if (rc < 0)
			return rc;
		if (d && mr->dom != d)
			return err_set(err, EINVAL, "sge %u: another PD than sge 0's (one device per call)", i);
		d = mr->dom;
		bytes += sges[i].length;
	}
	if (d->dev->advise_mr != ODPD__SUPPORT__SUPPORT_YES)
		return err_set(err, EOPNOTSUPP, "device %s: its provider has no ibv_advise_mr (%s; "
			       "rdma-core's rxe provider has it from v58)", d->dev->name,
			       d->dev->advise_mr_errno ? strerror(d->dev->advise_mr_errno) : "not probed");
	op = calloc(1, sizeof(*op) + n * sizeof(op->sges[0]));
	if (!op)
		return err_set(err, ENOMEM, "out of memory");
	op->r = r;
	op->d = d;
	d->jobs++;                           /* the PD stays open until it is done */
	op->dev = d->dev;
	op->pd = d->pd;                      /* open: it has registered MRs */
	op->advice = advice;
	op->flags = flags;
	op->n = n;
	op->bytes = bytes;
	op->cb = cb;
	op->arg = arg;
	for (unsigned i = 0; i < n; i++)      /* ODP: iova is odpd's own address */
		op->sges[i] = (struct ibv_sge){ .addr = sges[i].addr, .length = sges[i].length,
						.lkey = sges[i].lkey };
	op->job.run = advise_run;
	op->job.done = advise_done;
	op->job.lane = ODPD_LANE_USER(h->uid);
	odpd_pool_submit(r->pool, &op->job);
	return 1;
}
