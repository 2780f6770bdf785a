/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <event2/event.h>
#include <systemd/sd-bus.h>

#include "bus.h"
#include "client.h"
#include "config.h"
#include "log.h"
#include "manager.h"

#define BUS_NAME "org.odpd1"
#define BUS_PATH "/org/odpd1"
#define CLIENT_PREFIX BUS_PATH "/client"
#define DEVICE_PREFIX BUS_PATH "/device"
/* Messages handled per turn of the loop before clients get theirs. */
#define BUS_BURST 64

/* A Flush() call: its message until answered (GetConnectionCredentials,
 * then the registry's flush). */
struct flush_call {
	struct flush_call *next, **pprev;
	struct odpd_bus *b;
	sd_bus_message *msg;                /* NULL: the bus went away meanwhile */
	uid_t uid;
	bool flushing;                      /* the registry holds it (flush_done) */
};

struct odpd_bus {
	struct odpd_manager *m;
	sd_bus *bus;
	struct event *ev;
	struct flush_call *calls;
	bool drop;                          /* give the connection up after this turn */
};

static void bus_rearm(struct odpd_bus *b);

/* ---------------------------------------------------------------- values */

static struct odpd_manager *manager_of(void *userdata)
{
	return ((struct odpd_bus *)userdata)->m;
}

static uint64_t n_clients(struct odpd_manager *m)
{
	const struct odpd_client *c;
	uint64_t n = 0;

	LIST_FOREACH(c, &m->clients, link)
		n += c->hello && !c->dead && !c->monitor;
	return n;
}

/* The registration size histogram's properties, bucket by bucket (the
 * CamelCase of odpctl stats' registrations_4k ... registrations_over_1g). */
#define SIZE_BUCKETS(X)                                                                         \
	X("Registrations4K") X("Registrations8K") X("Registrations16K") X("Registrations32K")  \
	X("Registrations64K") X("Registrations128K") X("Registrations256K")                      \
	X("Registrations512K") X("Registrations1M") X("Registrations2M") X("Registrations4M")   \
	X("Registrations8M") X("Registrations16M") X("Registrations32M") X("Registrations64M")  \
	X("Registrations128M") X("Registrations256M") X("Registrations512M")                     \
	X("Registrations1G") X("RegistrationsOver1G")
#define SIZE_NAME(n) n,
static const char *const size_names[] = { SIZE_BUCKETS(SIZE_NAME) };
_Static_assert(sizeof(size_names) / sizeof(size_names[0]) == ODPD_REG_SIZE_BUCKETS,
	       "a property per bucket");

/* The daemon-wide counters: the same sources as the Status reply (admin.c). */
static uint64_t manager_counter(struct odpd_manager *m, const char *name)
{
	const struct odpd_registry *r = &m->registry;
	static const char *const names[] = {
		"Devices", "Clients", "Segments", "SegmentBytes", "MRs", "PinnedBytes",
		"Registrations", "Deregistrations", "Errors", "CacheLookups", "CacheHits",
		"CacheMisses", "Evictions", "RelaxedPending", "RelaxedBytes", "Flushes",
		"Invalidated", "OdpMRs", "OdpBytes", "OdpRegistrations", "Prefetches",
		"PrefetchBytes", "PrefetchErrors", "ImplicitMRs", "Registrars", "DeviceRemovals",
		"LocalHits", "Revoked", "InvalidationBatches",
		"Gets", "InvalidatedFlush", "InvalidatedEviction", "InvalidatedHole",
		"InvalidatedDevice", "InvalidatedExpired", "RegisteredBytes",
		"RegistrationsOnLoop", "DeregistrationsOnLoop", "RingReleases",
	};
	const uint64_t values[] = {
		m->devices.n_live, n_clients(m), m->segs.count, m->segs.bytes, r->n_mrs, r->pinned,
		r->stats.registrations, r->stats.deregistrations, m->stats.errors + r->stats.ring_errors, r->stats.lookups,
		r->stats.hits, r->stats.misses, r->stats.evictions, r->n_relaxed, r->relaxed_bytes,
		r->stats.flushes, r->stats.invalidated, r->odp.mrs, r->odp.bytes, r->odp.registrations,
		r->odp.prefetches, r->odp.prefetch_bytes, r->odp.prefetch_errors, r->odp.implicit_mrs,
		r->odp.registrars, r->stats.device_removals, r->stats.local_hits, r->stats.revoked,
		r->stats.flushes,           /* InvalidationBatches: Flushes under its name */
		r->stats.gets, r->stats.inv_flush, r->stats.inv_eviction,
		r->stats.replaced,          /* InvalidatedHole: MRs a punched hole retired */
		r->stats.killed,            /* InvalidatedDevice: MRs that went with a device */
		r->stats.inv_expired, r->stats.registered_bytes,
		r->stats.loop_registrations, r->stats.loop_deregistrations, r->stats.ring_releases,
	};
	_Static_assert(sizeof(names) / sizeof(names[0]) == sizeof(values) / sizeof(values[0]),
		       "a value per name");

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(names[i], name) == 0)
			return values[i];
	for (size_t i = 0; i < ODPD_REG_SIZE_BUCKETS; i++)
		if (strcmp(size_names[i], name) == 0)
			return r->stats.reg_sizes[i];
	return 0;
}

static int prop_manager(sd_bus *bus, const char *path, const char *interface, const char *property,
			sd_bus_message *reply, void *userdata, sd_bus_error *error)
{
	(void)bus; (void)path; (void)interface; (void)error;
	if (!userdata)                       /* --bus-introspect */
		return sd_bus_message_append(reply, "t", (uint64_t)0);
	return sd_bus_message_append(reply, "t", manager_counter(manager_of(userdata), property));
}

static int prop_version(sd_bus *bus, const char *path, const char *interface, const char *property,
			sd_bus_message *reply, void *userdata, sd_bus_error *error)
{
	(void)bus; (void)path; (void)interface; (void)property; (void)userdata; (void)error;
	return sd_bus_message_append(reply, "s", ODPD_VERSION);
}

/* ---------------------------------------------------------------- clients */

static int prop_client(sd_bus *bus, const char *path, const char *interface, const char *property,
		       sd_bus_message *reply, void *userdata, sd_bus_error *error)
{
	const struct odpd_client *c = userdata;
	const struct odpd_cseg *s;
	const struct odpd_ref *ref;
	uint64_t seg_bytes = 0, mr_bytes = 0;

	(void)bus; (void)path; (void)interface; (void)error;
	if (!c)                              /* --bus-introspect: never read */
		return -ENOENT;
	if (strcmp(property, "Name") == 0)
		return sd_bus_message_append(reply, "s", c->name);
	if (strcmp(property, "SharedPD") == 0)
		return sd_bus_message_append(reply, "s", c->holder.spd ? c->holder.spd->name : "");
	LIST_FOREACH(s, &c->segs.list, link)
		seg_bytes += s->length;
	LIST_FOREACH(ref, &c->holder.refs, hlink)
		mr_bytes += ref->length;
	const struct { const char *name; uint64_t v; } t[] = {
		{ "Id", c->id }, { "Pid", (uint64_t)c->cred.pid }, { "Uid", c->cred.uid },
		{ "Gid", c->cred.gid }, { "Segments", c->segs.n }, { "SegmentBytes", seg_bytes },
		{ "MRs", c->holder.n_refs }, { "MRBytes", mr_bytes },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		if (strcmp(t[i].name, property) == 0)
			return sd_bus_message_append(reply, "t", t[i].v);
	return -ENOENT;
}

/* Is @path the one name of the object @prefix/@label, as the node
 * enumerators list it? sd_bus_path_decode() also takes the label's bytes
 * escaped where they need not be ("/org/odpd1/client/1" for ".../_31"). */
static bool path_is_canonical(const char *path, const char *prefix, const char *label)
{
	char *canon = NULL;
	bool ok = sd_bus_path_encode(prefix, label, &canon) >= 0 && strcmp(canon, path) == 0;

	free(canon);
	return ok;
}

static struct odpd_client *client_by_path(struct odpd_manager *m, const char *path)
{
	struct odpd_client *c;
	char *label = NULL, *end, canon[24];
	uint64_t id;

	if (sd_bus_path_decode(path, CLIENT_PREFIX, &label) <= 0 || !label)
		return NULL;
	errno = 0;
	id = strtoull(label, &end, 10);
	/* the id as client_enum writes it, nothing else: not " 1", "+1", "01",
	 * or "-18446744073709551615", which strtoull also reads as 1 */
	snprintf(canon, sizeof(canon), "%" PRIu64, id);
	if (errno || *end || end == label || strcmp(canon, label) != 0 ||
	    !path_is_canonical(path, CLIENT_PREFIX, label)) {
		free(label);
		return NULL;
	}
	free(label);
	LIST_FOREACH(c, &m->clients, link)
		if (c->id == id && c->hello && !c->dead && !c->monitor)
			return c;
	return NULL;
}

static int client_find(sd_bus *bus, const char *path, const char *interface, void *userdata,
		       void **found, sd_bus_error *error)
{
	struct odpd_client *c;

	(void)bus; (void)interface; (void)error;
	if (!userdata)
		return 0;
	c = client_by_path(manager_of(userdata), path);
	if (!c)
		return 0;
	*found = c;
	return 1;
}

/* A NULL-terminated vector of object paths, for a node enumerator. */
static int paths_add(char ***v, unsigned *n, const char *prefix, const char *label)
{
	char **nv = realloc(*v, (*n + 2) * sizeof(**v));

	if (!nv)
		return -ENOMEM;
	*v = nv;
	nv[*n + 1] = NULL;
	if (sd_bus_path_encode(prefix, label, &nv[*n]) < 0) {
		nv[*n] = NULL;
		return -ENOMEM;
	}
	(*n)++;
	return 0;
}

static void paths_free(char **v)
{
	for (char **p = v; p && *p; p++)
		free(*p);
	free(v);
}

static int client_enum(sd_bus *bus, const char *path, void *userdata, char ***nodes, sd_bus_error *error)
{
	struct odpd_client *c;
	char **v = NULL, label[32];
	unsigned n = 0;

	(void)bus; (void)path; (void)error;
	if (!userdata)
		return 0;
	LIST_FOREACH(c, &manager_of(userdata)->clients, link) {
		if (!c->hello || c->dead || c->monitor)
			continue;
		snprintf(label, sizeof(label), "%" PRIu64, c->id);
		if (paths_add(&v, &n, CLIENT_PREFIX, label) < 0) {
			paths_free(v);
			return -ENOMEM;
		}
	}
	*nodes = v;
	return 0;
}

/* ---------------------------------------------------------------- devices */

/* A device object's userdata: the bus and the device, one per slot. */
struct device_ref {
	struct odpd_bus *b;
	const struct odpd_device *d;
};
static struct device_ref device_refs[ODPD_MAX_DEVICES];

static const char *support_name(Odpd__Support s)
{
	return s == ODPD__SUPPORT__SUPPORT_YES ? "yes" : s == ODPD__SUPPORT__SUPPORT_NO ? "no" : "unknown";
}

static int prop_device(sd_bus *bus, const char *path, const char *interface, const char *property,
		       sd_bus_message *reply, void *userdata, sd_bus_error *error)
{
	const struct device_ref *ref = userdata;
	const struct odpd_device *d;
	struct odpd_bus *b;
	uint64_t mrs = 0, pds = 0;
	char guid[20];

	(void)bus; (void)path; (void)interface; (void)error;
	if (!ref)                            /* --bus-introspect: never read */
		return -ENOENT;
	b = ref->b;
	d = ref->d;
	if (strcmp(property, "Name") == 0)
		return sd_bus_message_append(reply, "s", d->name);
	if (strcmp(property, "NodeGUID") == 0) {
		snprintf(guid, sizeof(guid), "%04x:%04x:%04x:%04x", (unsigned)(d->node_guid >> 48) & 0xffff,
			 (unsigned)(d->node_guid >> 32) & 0xffff, (unsigned)(d->node_guid >> 16) & 0xffff,
			 (unsigned)d->node_guid & 0xffff);
		return sd_bus_message_append(reply, "s", guid);
	}
	if (strcmp(property, "Transport") == 0)
		return sd_bus_message_append(reply, "s", d->transport);
	if (strcmp(property, "FirmwareVersion") == 0)
		return sd_bus_message_append(reply, "s", d->fw_ver);
	if (strcmp(property, "ODP") == 0)
		return sd_bus_message_append(reply, "b", (int)d->odp);
	if (strcmp(property, "ImplicitODP") == 0)
		return sd_bus_message_append(reply, "b", (int)d->implicit_odp);
	if (strcmp(property, "AdviseMR") == 0)
		return sd_bus_message_append(reply, "s", support_name(d->advise_mr));
	if (strcmp(property, "Import") == 0)
		return sd_bus_message_append(reply, "s", support_name(d->import));
	if (strcmp(property, "Ports") == 0)
		return sd_bus_message_append(reply, "u", d->phys_port_cnt);
	if (strcmp(property, "MaxMRSize") == 0)
		return sd_bus_message_append(reply, "t", d->max_mr_size);
	/* an MR counts in its domain until it is released (mr->dom) */
	for (const struct odpd_domain *dom = LIST_FIRST(&b->m->registry.domains); dom;
	     dom = LIST_NEXT(dom, link)) {
		pds += dom->dev == d && !dom->retired;
		mrs += dom->dev == d ? dom->n_mrs : 0;
	}
	if (strcmp(property, "MRs") == 0)
		return sd_bus_message_append(reply, "t", mrs);
	if (strcmp(property, "PDs") == 0)
		return sd_bus_message_append(reply, "t", pds);
	return -ENOENT;
}

static int device_find(sd_bus *bus, const char *path, const char *interface, void *userdata,
		       void **found, sd_bus_error *error)
{
	struct odpd_manager *m;
	char *label = NULL;
	int r = 0;

	(void)bus; (void)interface; (void)error;
	if (!userdata || sd_bus_path_decode(path, DEVICE_PREFIX, &label) <= 0 || !label)
		return 0;
	m = manager_of(userdata);
	if (!path_is_canonical(path, DEVICE_PREFIX, label)) {
		free(label);
		return 0;
	}
	for (unsigned i = 0; i < m->devices.n && !r; i++)
		if (!m->devices.dev[i].removed && strcmp(m->devices.dev[i].name, label) == 0) {
			device_refs[i].b = userdata;
			device_refs[i].d = &m->devices.dev[i];
			*found = &device_refs[i];
			r = 1;
		}
	free(label);
	return r;
}

static int device_enum(sd_bus *bus, const char *path, void *userdata, char ***nodes, sd_bus_error *error)
{
	struct odpd_manager *m;
	char **v = NULL;
	unsigned n = 0;

	(void)bus; (void)path; (void)error;
	if (!userdata)
		return 0;
	m = manager_of(userdata);
	for (unsigned i = 0; i < m->devices.n; i++)
		if (!m->devices.dev[i].removed && paths_add(&v, &n, DEVICE_PREFIX, m->devices.dev[i].name) < 0) {
			paths_free(v);
			return -ENOMEM;
		}
	*nodes = v;
	return 0;
}

/* ---------------------------------------------------------------- Flush() */

static void call_free(struct flush_call *fc)
{
	if (fc->next)
		fc->next->pprev = fc->pprev;
	*fc->pprev = fc->next;
	sd_bus_message_unref(fc->msg);
	free(fc);
}

static void flush_done(void *arg, unsigned mrs, uint64_t bytes)
{
	struct flush_call *fc = arg;
	struct odpd_bus *b = fc->b;
	int r;

	if (!fc->msg) {                      /* bus_drop detached it: nobody to answer */
		log_info("D-Bus: Flush() by uid %u: %u relaxed MR(s), %" PRIu64 " bytes invalidated; "
			 "not answered: the bus is gone", (unsigned)fc->uid, mrs, bytes);
		free(fc);
		return;
	}
	r = sd_bus_reply_method_return(fc->msg, "ut", (uint32_t)mrs, bytes);
	if (r < 0)
		log_errno(LOG_WARNING, r, "D-Bus: answering Flush()");
	log_info("D-Bus: Flush() by uid %u: %u relaxed MR(s), %" PRIu64 " bytes invalidated",
		 (unsigned)fc->uid, mrs, bytes);
	call_free(fc);
	bus_rearm(b);
}

/* Root or a member of odpd's admin group (its primary group or a
 * supplementary one, read from /proc: dbus-daemon gives no groups). */
static bool caller_is_admin(const struct odpd_manager *m, uid_t uid, pid_t pid)
{
	char path[64], line[4096];
	bool admin = false;
	FILE *f;

	if (uid == 0)
		return true;
	if (!m->cfg.has_admin_gid || pid <= 0)
		return false;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return false;
	while (!admin && fgets(line, sizeof(line), f)) {
		char *p, *end;
		bool groups = strncmp(line, "Groups:", 7) == 0, gid = strncmp(line, "Gid:", 4) == 0;
		unsigned long v;

		if (!groups && !gid)
			continue;
		p = line + (groups ? 7 : 4);
		/* Gid: real effective saved fs -- the effective one only */
		if (gid) {
			strtoul(p, &end, 10);
			p = end;
		}
		for (;;) {
			v = strtoul(p, &end, 10);
			if (end == p)
				break;
			if (v == m->cfg.admin_gid)
				admin = true;
			p = end;
			if (gid)
				break;
		}
	}
	fclose(f);
	return admin;
}

static int flush_creds(sd_bus_message *reply, void *userdata, sd_bus_error *ret_error)
{
	struct flush_call *fc = userdata;
	struct odpd_bus *b = fc->b;
	const struct odpd_flush_sel all = { .all = true };
	uint32_t uid = UINT32_MAX, pid = 0;
	const char *key;
	int r;

	(void)ret_error;
	if (sd_bus_message_is_method_error(reply, NULL)) {
		const sd_bus_error *e = sd_bus_message_get_error(reply);
		sd_bus_reply_method_errorf(fc->msg, SD_BUS_ERROR_ACCESS_DENIED,
					   "Flush: cannot check the caller's credentials: %s",
					   e && e->message ? e->message : "error");
		goto out;
	}
	r = sd_bus_message_enter_container(reply, 'a', "{sv}");
	while (r >= 0 && (r = sd_bus_message_enter_container(reply, 'e', "sv")) > 0) {
		r = sd_bus_message_read(reply, "s", &key);
		if (r >= 0 && strcmp(key, "UnixUserID") == 0)
			r = sd_bus_message_read(reply, "v", "u", &uid);
		else if (r >= 0 && strcmp(key, "ProcessID") == 0)
			r = sd_bus_message_read(reply, "v", "u", &pid);
		else if (r >= 0)
			r = sd_bus_message_skip(reply, "v");
		if (r >= 0)
			r = sd_bus_message_exit_container(reply);
	}
	if (r < 0 || uid == UINT32_MAX) {
		sd_bus_reply_method_errorf(fc->msg, SD_BUS_ERROR_ACCESS_DENIED,
					   "Flush: the bus did not say who is calling");
		goto out;
	}
	fc->uid = uid;
	if (!caller_is_admin(b->m, uid, (pid_t)pid)) {
		log_ratelimited(LOG_NOTICE, "D-Bus: Flush() refused to uid %u (pid %u): not root or the "
				"admin group", (unsigned)uid, (unsigned)pid);
		sd_bus_reply_method_errorf(fc->msg, SD_BUS_ERROR_ACCESS_DENIED,
					   "Flush is for root and odpd's admin group only");
		goto out;
	}
	fc->flushing = true;
	if (odpd_registry_flush(&b->m->registry, &all, flush_done, fc) == 1)
		return 1;                        /* answered by flush_done */
	flush_done(fc, 0, 0);
	return 1;
out:
	call_free(fc);
	return 1;
}

static int method_flush(sd_bus_message *msg, void *userdata, sd_bus_error *error)
{
	struct odpd_bus *b = userdata;
	struct flush_call *fc;
	const char *sender = sd_bus_message_get_sender(msg);
	int r;

	if (!b)
		return sd_bus_error_set(error, SD_BUS_ERROR_NOT_SUPPORTED, "introspection only");
	if (!sender)
		return sd_bus_error_set(error, SD_BUS_ERROR_ACCESS_DENIED, "Flush: no sender");
	fc = calloc(1, sizeof(*fc));
	if (!fc)
		return -ENOMEM;
	fc->b = b;
	fc->msg = sd_bus_message_ref(msg);
	fc->next = b->calls;
	if (fc->next)
		fc->next->pprev = &fc->next;
	fc->pprev = &b->calls;
	b->calls = fc;
	/* Asked of the bus without waiting: the loop serves on meanwhile. */
	r = sd_bus_call_method_async(b->bus, NULL, "org.freedesktop.DBus", "/org/freedesktop/DBus",
				     "org.freedesktop.DBus", "GetConnectionCredentials", flush_creds, fc,
				     "s", sender);
	if (r < 0) {
		call_free(fc);
		return r;
	}
	return 1;
}

/* ---------------------------------------------------------------- vtables */

#define COUNTER(name) SD_BUS_PROPERTY(name, "t", prop_manager, 0, 0)
static const sd_bus_vtable manager_vtable[] = {
	SD_BUS_VTABLE_START(0),
	SD_BUS_PROPERTY("Version", "s", prop_version, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	COUNTER("Devices"), COUNTER("Clients"), COUNTER("Segments"), COUNTER("SegmentBytes"),
	COUNTER("MRs"), COUNTER("PinnedBytes"), COUNTER("Registrations"), COUNTER("Deregistrations"),
	COUNTER("Errors"), COUNTER("CacheLookups"), COUNTER("CacheHits"), COUNTER("CacheMisses"),
	COUNTER("Evictions"), COUNTER("RelaxedPending"), COUNTER("RelaxedBytes"), COUNTER("Flushes"),
	COUNTER("Invalidated"), COUNTER("OdpMRs"), COUNTER("OdpBytes"), COUNTER("OdpRegistrations"),
	COUNTER("Prefetches"), COUNTER("PrefetchBytes"), COUNTER("PrefetchErrors"),
	COUNTER("ImplicitMRs"), COUNTER("Registrars"), COUNTER("DeviceRemovals"),
	COUNTER("LocalHits"), COUNTER("Revoked"), COUNTER("InvalidationBatches"),
	COUNTER("Gets"), COUNTER("InvalidatedFlush"), COUNTER("InvalidatedEviction"),
	COUNTER("InvalidatedHole"), COUNTER("InvalidatedDevice"), COUNTER("InvalidatedExpired"),
	COUNTER("RegisteredBytes"),
	COUNTER("RegistrationsOnLoop"),
	COUNTER("DeregistrationsOnLoop"),
	COUNTER("RingReleases"),
#define SIZE_COUNTER(n) COUNTER(n),
	SIZE_BUCKETS(SIZE_COUNTER)
#undef SIZE_COUNTER
	SD_BUS_METHOD_WITH_ARGS("Flush", SD_BUS_NO_ARGS, SD_BUS_RESULT("u", mrs, "t", bytes),
				method_flush, SD_BUS_VTABLE_UNPRIVILEGED),
	SD_BUS_VTABLE_END
};
#undef COUNTER

#define CLIENT_T(name) SD_BUS_PROPERTY(name, "t", prop_client, 0, 0)
static const sd_bus_vtable client_vtable[] = {
	SD_BUS_VTABLE_START(0),
	SD_BUS_PROPERTY("Id", "t", prop_client, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("Pid", "t", prop_client, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("Uid", "t", prop_client, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("Gid", "t", prop_client, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("Name", "s", prop_client, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("SharedPD", "s", prop_client, 0, 0),
	CLIENT_T("Segments"), CLIENT_T("SegmentBytes"), CLIENT_T("MRs"), CLIENT_T("MRBytes"),
	SD_BUS_VTABLE_END
};
#undef CLIENT_T

static const sd_bus_vtable device_vtable[] = {
	SD_BUS_VTABLE_START(0),
	SD_BUS_PROPERTY("Name", "s", prop_device, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("NodeGUID", "s", prop_device, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("Transport", "s", prop_device, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("FirmwareVersion", "s", prop_device, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("Ports", "u", prop_device, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("MaxMRSize", "t", prop_device, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("ODP", "b", prop_device, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("ImplicitODP", "b", prop_device, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("AdviseMR", "s", prop_device, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("Import", "s", prop_device, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("MRs", "t", prop_device, 0, 0),
	SD_BUS_PROPERTY("PDs", "t", prop_device, 0, 0),
	SD_BUS_VTABLE_END
};

/* Publish on @bus with @b as userdata (NULL: introspection only, every
 * interface on BUS_PATH itself). */
static int publish(sd_bus *bus, struct odpd_bus *b)
{
	int r = sd_bus_add_object_vtable(bus, NULL, BUS_PATH, "org.odpd1.Manager", manager_vtable, b);

	if (r >= 0 && !b)
		r = sd_bus_add_object_vtable(bus, NULL, BUS_PATH, "org.odpd1.Client", client_vtable, NULL);
	if (r >= 0 && !b)
		r = sd_bus_add_object_vtable(bus, NULL, BUS_PATH, "org.odpd1.Device", device_vtable, NULL);
	if (r >= 0 && b)
		r = sd_bus_add_fallback_vtable(bus, NULL, CLIENT_PREFIX, "org.odpd1.Client", client_vtable,
					       client_find, b);
	if (r >= 0 && b)
		r = sd_bus_add_node_enumerator(bus, NULL, CLIENT_PREFIX, client_enum, b);
	if (r >= 0 && b)
		r = sd_bus_add_fallback_vtable(bus, NULL, DEVICE_PREFIX, "org.odpd1.Device", device_vtable,
					       device_find, b);
	if (r >= 0 && b)
		r = sd_bus_add_node_enumerator(bus, NULL, DEVICE_PREFIX, device_enum, b);
	return r;
}

/* ---------------------------------------------------------------- the loop */

static void bus_drop(struct odpd_bus *b)
{
	while (b->calls) {
		struct flush_call *fc = b->calls;

		if (!fc->flushing) {
			call_free(fc);
			continue;
		}
		/* The registry calls flush_done later: keep the struct, drop
		 * the message and the list's link. */
		b->calls = fc->next;
		if (fc->next)
			fc->next->pprev = &b->calls;
		sd_bus_message_unref(fc->msg);
		fc->msg = NULL;
	}
	if (b->ev)
		event_free(b->ev);
	b->ev = NULL;
	sd_bus_flush_close_unref(b->bus);
	b->bus = NULL;
}

static void on_bus(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_bus *b = arg;
	int r = 1;

	(void)fd;
	(void)what;
	/* Releases written into rings before a call was sent are done before
	 * it reads a counter, as for odpctl status (doc/design.md §11). */
	odpd_registry_take_all_releases(&b->m->registry);
	for (int i = 0; i < BUS_BURST && r > 0 && !b->drop; i++) {
		r = sd_bus_process(b->bus, NULL);
		if (r < 0) {
			log_errno(LOG_WARNING, r, "D-Bus: lost the bus; statistics over D-Bus are off "
				  "until odpd restarts");
			b->drop = true;
		}
	}
	if (b->drop) {
		bus_drop(b);
		return;
	}
	bus_rearm(b);
	if (r > 0)                           /* more to do: after the clients' turn */
		event_active(b->ev, EV_TIMEOUT, 0);
}

static void bus_rearm(struct odpd_bus *b)
{
	struct timeval tv, *tvp = NULL;
	struct timespec now;
	uint64_t until, now_us;
	short what = 0;
	int events;

	if (!b->bus)
		return;
	events = sd_bus_get_events(b->bus);
	if (events < 0) {
		log_errno(LOG_WARNING, events, "D-Bus: the connection is closed; statistics over "
			  "D-Bus are off until odpd restarts");
		bus_drop(b);
		return;
	}
	if (events & POLLIN)
		what |= EV_READ;
	if (events & POLLOUT)
		what |= EV_WRITE;
	if (sd_bus_get_timeout(b->bus, &until) >= 0 && until != UINT64_MAX) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		now_us = (uint64_t)now.tv_sec * 1000000u + (uint64_t)now.tv_nsec / 1000u;
		until = until > now_us ? until - now_us : 0;
		tv.tv_sec = (time_t)(until / 1000000u);
		tv.tv_usec = (suseconds_t)(until % 1000000u);
		tvp = &tv;
	}
	event_del(b->ev);
	event_assign(b->ev, b->m->base, sd_bus_get_fd(b->bus), what, on_bus, b);
	event_add(b->ev, tvp);
}

static int name_acquired(sd_bus_message *reply, void *userdata, sd_bus_error *ret_error)
{
	struct odpd_bus *b = userdata;

	(void)ret_error;
	if (sd_bus_message_is_method_error(reply, NULL)) {
		const sd_bus_error *e = sd_bus_message_get_error(reply);

		log_warning("D-Bus: cannot own %s (%s): statistics over D-Bus are off (is the policy "
			    "file org.odpd1.conf installed, or another odpd running?)", BUS_NAME,
			    e && e->message ? e->message : "error");
		b->drop = true;
		return 1;
	}
	log_info("D-Bus: %s on the system bus", BUS_NAME);
	return 1;
}

int odpd_bus_start(struct odpd_manager *m)
{
	struct odpd_bus *b = calloc(1, sizeof(*b));
	int r;

	if (!b)
		return log_errno(LOG_ERR, ENOMEM, "D-Bus");
	b->m = m;
	m->bus = b;
	r = sd_bus_open_system_with_description(&b->bus, "odpd");
	if (r < 0) {
		log_info("D-Bus: no system bus (%s): serving without it", strerror(-r));
		b->bus = NULL;
		return 0;
	}
	r = publish(b->bus, b);
	if (r >= 0)
		r = sd_bus_request_name_async(b->bus, NULL, BUS_NAME, 0, name_acquired, b);
	b->ev = r >= 0 ? event_new(m->base, -1, 0, on_bus, b) : NULL;
	if (r < 0 || !b->ev) {
		log_errno(LOG_WARNING, r < 0 ? r : -ENOMEM, "D-Bus: cannot publish %s; serving without it",
			  BUS_NAME);
		bus_drop(b);
		return 0;
	}
	bus_rearm(b);
	return 0;
}

void odpd_bus_stop(struct odpd_manager *m)
{
	struct odpd_bus *b = m->bus;

	if (!b)
		return;
	if (b->bus)
		bus_drop(b);
	free(b);
	m->bus = NULL;
}

/* ---------------------------------------------------------------- --bus-introspect */

static void *introspect_serve(void *arg)
{
	sd_bus *srv = arg;

	for (;;) {
		int r = sd_bus_process(srv, NULL);

		if (r < 0)
			break;
		if (r == 0 && sd_bus_wait(srv, UINT64_MAX) < 0)
			break;
	}
	return NULL;
}

int odpd_bus_introspect(FILE *out)
{
	sd_bus_error error = SD_BUS_ERROR_NULL;
	sd_bus_message *reply = NULL;
	sd_bus *srv = NULL, *cli = NULL;
	const char *xml;
	sd_id128_t id;
	pthread_t t;
	int sv[2], r;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return -errno;
	r = sd_id128_randomize(&id);
	if (r >= 0)
		r = sd_bus_new(&srv);
	if (r >= 0)
		r = sd_bus_set_fd(srv, sv[0], sv[0]);
	if (r >= 0)
		r = sd_bus_set_server(srv, 1, id);
	if (r >= 0)
		r = sd_bus_set_anonymous(srv, 1);
	if (r >= 0)
		r = publish(srv, NULL);
	if (r >= 0)
		r = sd_bus_start(srv);
	if (r < 0) {
		sd_bus_unref(srv);
		close(sv[0]);
		close(sv[1]);
		return r;
	}
	r = pthread_create(&t, NULL, introspect_serve, srv);
	if (r) {
		sd_bus_flush_close_unref(srv);
		close(sv[1]);
		return -r;
	}
	r = sd_bus_new(&cli);
	if (r >= 0)
		r = sd_bus_set_fd(cli, sv[1], sv[1]);
	else
		close(sv[1]);
	if (r >= 0)
		r = sd_bus_start(cli);
	if (r >= 0)
		r = sd_bus_call_method(cli, NULL, BUS_PATH, "org.freedesktop.DBus.Introspectable",
				       "Introspect", &error, &reply, "");
	if (r >= 0)
		r = sd_bus_message_read(reply, "s", &xml);
	if (r >= 0)
		fputs(xml, out);
	sd_bus_message_unref(reply);
	sd_bus_error_free(&error);
	sd_bus_flush_close_unref(cli);       /* the server sees the end and stops */
	pthread_join(t, NULL);
	sd_bus_flush_close_unref(srv);
	return r < 0 ? r : 0;
}
