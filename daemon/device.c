/* SPDX-License-Identifier: MIT */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "device.h"
#include "log.h"

static const char *transport_name(struct ibv_context *ctx)
{
	struct ibv_port_attr pa;

	if (ctx->device->transport_type == IBV_TRANSPORT_IWARP)
		return "iWARP";
	if (ibv_query_port(ctx, 1, &pa) == 0 && pa.link_layer == IBV_LINK_LAYER_ETHERNET)
		return "RoCE";
	if (ctx->device->transport_type == IBV_TRANSPORT_IB)
		return "InfiniBand";
	return "unknown";
}

/* Can this provider import a context? Ask it with a dup of our own cmd_fd. */
static void probe_import(struct odpd_device *d, struct ibv_context *ctx)
{
	int fd = fcntl(ctx->cmd_fd, F_DUPFD_CLOEXEC, 3);
	struct ibv_context *imported;

	if (fd < 0) {
		d->import = ODPD__SUPPORT__SUPPORT_UNKNOWN;
		d->import_errno = errno;
		return;
	}
	imported = ibv_import_device(fd);
	if (!imported) {
		d->import = ODPD__SUPPORT__SUPPORT_NO;
		d->import_errno = errno ? errno : EOPNOTSUPP;
		close(fd);                       /* a failed import leaves the fd to us */
		return;
	}
	d->import = ODPD__SUPPORT__SUPPORT_YES;
	ibv_close_device(imported);              /* closes the dup */
}

/*
 * Does ibv_advise_mr work? Only an ODP MR may be asked: advising a pinned MR
 * has oopsed rxe (TESTBED.md, rxe defect 3). One page of a private memfd,
 * registered ODP with iova == addr, prefetched for write with FLUSH.
 */
static void probe_advise(struct odpd_device *d, struct ibv_context *ctx)
{
	const size_t len = 4096;
	struct ibv_pd *pd = NULL;
	struct ibv_mr *mr = NULL;
	void *buf = MAP_FAILED;
	int r;

	d->advise_mr = ODPD__SUPPORT__SUPPORT_UNKNOWN;
	if (!d->odp || !(d->odp_rc_caps & IBV_ODP_SUPPORT_WRITE))
		return;
	buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pd = buf == MAP_FAILED ? NULL : ibv_alloc_pd(ctx);
	if (pd)
		mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	if (!mr) {
		d->advise_mr_errno = errno;
		log_errno(LOG_WARNING, errno, "%s: cannot register an ODP probe MR", d->name);
		goto out;
	}
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = (uint32_t)len, .lkey = mr->lkey };
	r = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1);
	d->advise_mr = r == 0 ? ODPD__SUPPORT__SUPPORT_YES : ODPD__SUPPORT__SUPPORT_NO;
	d->advise_mr_errno = r;
out:
	if (mr)
		ibv_dereg_mr(mr);
	if (pd)
		ibv_dealloc_pd(pd);
	if (buf != MAP_FAILED)
		munmap(buf, len);
}

static int device_probe(struct odpd_device *d, struct ibv_device *ibdev)
{
	struct ibv_device_attr_ex ax;
	struct ibv_context *ctx;
	int r;

	memset(d, 0, sizeof(*d));
	snprintf(d->name, sizeof(d->name), "%s", ibv_get_device_name(ibdev));
	d->ibdev = ibdev;
	d->node_guid = be64toh(ibv_get_device_guid(ibdev));
	ctx = ibv_open_device(ibdev);
	if (!ctx)
		return log_errno(LOG_ERR, errno, "%s: ibv_open_device", d->name);
	memset(&ax, 0, sizeof(ax));
	r = ibv_query_device_ex(ctx, NULL, &ax);
	if (r) {
		ibv_close_device(ctx);
		return log_errno(LOG_ERR, r, "%s: ibv_query_device_ex", d->name);
	}
	snprintf(d->transport, sizeof(d->transport), "%s", transport_name(ctx));
	snprintf(d->fw_ver, sizeof(d->fw_ver), "%s", ax.orig_attr.fw_ver);
	d->phys_port_cnt = ax.orig_attr.phys_port_cnt;
	d->max_mr_size = ax.orig_attr.max_mr_size;
	d->odp_general_caps = ax.odp_caps.general_caps;
	d->odp_rc_caps = ax.odp_caps.per_transport_caps.rc_odp_caps;
	d->odp_uc_caps = ax.odp_caps.per_transport_caps.uc_odp_caps;
	d->odp_ud_caps = ax.odp_caps.per_transport_caps.ud_odp_caps;
	d->odp = (d->odp_general_caps & IBV_ODP_SUPPORT) != 0;
	d->implicit_odp = (d->odp_general_caps & IBV_ODP_SUPPORT_IMPLICIT) != 0;
	probe_import(d, ctx);
	probe_advise(d, ctx);
	/* The probe's context stays open: its async events watch the device. */
	d->watch = ctx;
	log_info("device %s: %s, %u port(s), ODP %s, implicit ODP %s, advise_mr %s, import %s",
		 d->name, d->transport, d->phys_port_cnt, d->odp ? "yes" : "no",
		 d->implicit_odp ? "yes" : "no",
		 d->advise_mr == ODPD__SUPPORT__SUPPORT_YES ? "yes" :
		 d->advise_mr == ODPD__SUPPORT__SUPPORT_NO ? strerror(d->advise_mr_errno) : "not probed",
		 d->import == ODPD__SUPPORT__SUPPORT_YES ? "yes" : strerror(d->import_errno));
	return 0;
}

static bool wanted(const char *name, char *const *names, unsigned n_names)
{
	if (n_names == 0)
		return true;
	for (unsigned i = 0; i < n_names; i++)
		if (strcmp(names[i], name) == 0)
			return true;
	return false;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int odpd_devices_open(char *const *names, unsigned n_names, struct odpd_devices *ret)
{
	int n = 0;

	memset(ret, 0, sizeof(*ret));
	ret->names = names;
	ret->n_names = n_names;
	ret->scanned_ns = mono_ns();
	ret->list = ibv_get_device_list(&n);
	if (!ret->list) {
		/* No uverbs support in this kernel at all: serve without devices. */
		log_errno(LOG_WARNING, errno, "ibv_get_device_list");
		n = 0;
	}
	ret->dev = calloc(ODPD_MAX_DEVICES, sizeof(*ret->dev));
	if (!ret->dev) {
		odpd_devices_close(ret);
		return -ENOMEM;
	}
	for (int i = 0; i < n && ret->n < ODPD_MAX_DEVICES; i++) {
		if (!wanted(ibv_get_device_name(ret->list[i]), names, n_names))
			continue;
		if (device_probe(&ret->dev[ret->n], ret->list[i]) == 0)
			ret->n++;
	}
	ret->n_live = ret->n;
	for (unsigned i = 0; i < n_names; i++)
		if (!odpd_devices_find(ret, names[i])) {
			log_error("device %s: not found or not usable", names[i]);
			odpd_devices_close(ret);
			return -ENODEV;
		}
	if (ret->n == 0)
		log_warning("no RDMA device: clients can attach segments, registration fails with ENODEV");
	return 0;
}

static bool listed(struct ibv_device **list, const char *name)
{
	for (unsigned i = 0; list && list[i]; i++)
		if (strcmp(ibv_get_device_name(list[i]), name) == 0)
			return true;
	return false;
}

unsigned odpd_devices_rescan(struct odpd_devices *d, unsigned *added, unsigned *gone, unsigned *n_gone)
{
	struct ibv_device **list, ***old;
	unsigned n_added = 0;
	int n = 0;

	*n_gone = 0;
	d->scanned_ns = mono_ns();
	list = ibv_get_device_list(&n);
	if (!list)
		return 0;
	for (unsigned i = 0; i < d->n; i++)
		if (!d->dev[i].removed && !listed(list, d->dev[i].name))
			gone[(*n_gone)++] = i;
	for (int i = 0; i < n; i++) {
		const char *name = ibv_get_device_name(list[i]);
		struct odpd_device *slot = NULL;
		unsigned k;

		if (!wanted(name, d->names, d->n_names) || odpd_devices_find(d, name))
			continue;
		for (k = 0; k < d->n && !slot; k++)   /* a drained slot of its name, a new one, any drained one */
			if (d->dev[k].removed && d->dev[k].n_domains == 0 && strcmp(d->dev[k].name, name) == 0)
				slot = &d->dev[k];
		if (!slot && d->n < ODPD_MAX_DEVICES)
			slot = &d->dev[d->n++];
		for (k = 0; k < d->n && !slot; k++)
			if (d->dev[k].removed && d->dev[k].n_domains == 0)
				slot = &d->dev[k];
		if (!slot) {
			log_error("device %s: no free device slot (%u devices came and went with MRs "
				  "still referring to them)", name, ODPD_MAX_DEVICES);
			continue;
		}
		if (device_probe(slot, list[i]) < 0) {
			memset(slot, 0, sizeof(*slot));
			slot->removed = true;          /* a drained slot, free again */
			snprintf(slot->name, sizeof(slot->name), "%s", name);
			continue;
		}
		d->n_live++;
		added[n_added++] = (unsigned)(slot - d->dev);
	}
	/*
	 * Devices of the earlier list may still be open (a domain closing on a
	 * worker, a removed slot): keep that list until shutdown. One list per
	 * scan that found a change; scans are rare and rate-limited.
	 */
	if (n_added == 0) {
		ibv_free_device_list(list);
		return 0;
	}
	old = realloc(d->old, (d->n_old + 1) * sizeof(*d->old));
	if (!old) {
		log_error("out of memory keeping a device list: the new devices are not used");
		for (unsigned i = 0; i < n_added; i++) {
			struct odpd_device *s = &d->dev[added[i]];
			ibv_close_device(s->watch);
			s->watch = NULL;
			s->removed = true;
			d->n_live--;
		}
		ibv_free_device_list(list);
		return 0;
	}
	d->old = old;
	d->old[d->n_old++] = d->list;
	d->list = list;
	return n_added;
}

void odpd_devices_close(struct odpd_devices *d)
{
	for (unsigned i = 0; d->dev && i < d->n; i++)
		if (d->dev[i].watch)
			ibv_close_device(d->dev[i].watch);
	free(d->dev);
	for (unsigned i = 0; i < d->n_old; i++)
		if (d->old[i])
			ibv_free_device_list(d->old[i]);
	free(d->old);
	if (d->list)
		ibv_free_device_list(d->list);
	memset(d, 0, sizeof(*d));
}

struct odpd_device *odpd_devices_find(struct odpd_devices *d, const char *name)
{
	for (unsigned i = 0; i < d->n; i++)
		if (!d->dev[i].removed && (!name || !*name || strcmp(d->dev[i].name, name) == 0))
			return &d->dev[i];
	return NULL;
}

struct odpd_device *odpd_devices_find_any(struct odpd_devices *d, const char *name)
{
	struct odpd_device *found = NULL;

	for (unsigned i = 0; i < d->n; i++)
		if (!name || !*name || strcmp(d->dev[i].name, name) == 0) {
			if (!d->dev[i].removed)
				return &d->dev[i];
			found = &d->dev[i];
		}
	return found;
}

void odpd_device_to_proto(const struct odpd_device *d, Odpd__Device *o)
{
	o->name = (char *)d->name;
	o->transport = (char *)d->transport;
	o->fw_ver = (char *)d->fw_ver;
#define SET(field, value) do { o->has_##field = 1; o->field = (value); } while (0)
	SET(node_guid, d->node_guid);
	SET(phys_port_cnt, d->phys_port_cnt);
	SET(max_mr_size, d->max_mr_size);
	SET(odp_general_caps, d->odp_general_caps);
	SET(odp_rc_caps, d->odp_rc_caps);
	SET(odp_uc_caps, d->odp_uc_caps);
	SET(odp_ud_caps, d->odp_ud_caps);
	SET(odp, d->odp);
	SET(implicit_odp, d->implicit_odp);
	SET(advise_mr, d->advise_mr);
	SET(advise_mr_errno, d->advise_mr_errno);
	SET(import, d->import);
	SET(import_errno, d->import_errno);
#undef SET
}

/* One allocation: the pointer array, then the messages. free() releases both. */
int odpd_devices_to_proto(const struct odpd_devices *d, Odpd__Device ***ret)
{
	unsigned n = d->n_live, k = 0;
	Odpd__Device **ptrs = calloc(1, (n + 1) * sizeof(*ptrs) + n * sizeof(Odpd__Device));
	Odpd__Device *devs;

	if (!ptrs)
		return -ENOMEM;
	devs = (Odpd__Device *)(ptrs + n + 1);
	for (unsigned i = 0; i < d->n && k < n; i++) {
		if (d->dev[i].removed)
			continue;
		odpd__device__init(&devs[k]);
		odpd_device_to_proto(&d->dev[i], &devs[k]);
		ptrs[k] = &devs[k];
		k++;
	}
	*ret = ptrs;
	return (int)k;
}
