/* SPDX-License-Identifier: MIT */
/* json.c - the JSON output (--json). */
#include "odpctl.h"

/* ------------------------------------------------------------- JSON output */

/* A new JSON object; odpctl dies without memory. */
json_object *json_obj(void)
{
	json_object *o = json_object_new_object();

	if (!o)
		oom();
	return o;
}

void put_u64(json_object *o, const char *key, uint64_t v)
{
	json_object_object_add(o, key, json_object_new_uint64(v));
}

/* A uint64 as a decimal string: JSON readers (jq, JavaScript) round integers
 * above 2^53. The rule for every 64-bit field (odpctl(8), JSON OUTPUT). */
void put_u64_str(json_object *o, const char *key, uint64_t v)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%" PRIu64, v);
	json_object_object_add(o, key, json_object_new_string(buf));
}

/* An address or key as the tables show it: a hex string, "0x7f3a5c000000". */
void put_hex(json_object *o, const char *key, uint64_t v)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "0x%" PRIx64, v);
	json_object_object_add(o, key, json_object_new_string(buf));
}

/* A limit: "unlimited" for none (2^64 - 1), else as put_u64_str. */
static void put_limit_str(json_object *o, const char *key, uint64_t v)
{
	if (v == UINT64_MAX)
		json_object_object_add(o, key, json_object_new_string("unlimited"));
	else
		put_u64_str(o, key, v);
}

/* A GUID as ibv_devinfo prints it: xxxx:xxxx:xxxx:xxxx. */
static void put_guid(json_object *o, const char *key, uint64_t g)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%04x:%04x:%04x:%04x", (unsigned)(g >> 48) & 0xffff,
		 (unsigned)(g >> 32) & 0xffff, (unsigned)(g >> 16) & 0xffff, (unsigned)g & 0xffff);
	json_object_object_add(o, key, json_object_new_string(buf));
}

static void put_i64(json_object *o, const char *key, int64_t v)
{
	json_object_object_add(o, key, json_object_new_int64(v));
}

void put_str(json_object *o, const char *key, const char *v)
{
	json_object_object_add(o, key, json_object_new_string(v ? v : ""));
}

void put_bool(json_object *o, const char *key, bool v)
{
	json_object_object_add(o, key, json_object_new_boolean(v));
}

static json_object *json_device(const Odpd__Device *d)
{
	json_object *o = json_object_new_object();

	put_str(o, "name", d->name);
	put_guid(o, "node_guid", d->node_guid);
	put_str(o, "transport", d->transport);
	put_str(o, "fw_ver", d->fw_ver);
	put_u64(o, "phys_port_cnt", d->phys_port_cnt);
	put_u64_str(o, "max_mr_size", d->max_mr_size);
	put_u64_str(o, "odp_general_caps", d->odp_general_caps);
	put_u64(o, "odp_rc_caps", d->odp_rc_caps);
	put_u64(o, "odp_uc_caps", d->odp_uc_caps);
	put_u64(o, "odp_ud_caps", d->odp_ud_caps);
	put_bool(o, "odp", d->odp);
	put_bool(o, "implicit_odp", d->implicit_odp);
	put_str(o, "advise_mr", support_name(d->advise_mr));
	put_i64(o, "advise_mr_errno", d->advise_mr_errno);
	put_str(o, "import", support_name(d->import));
	put_i64(o, "import_errno", d->import_errno);
	return o;
}

json_object *json_client(const Odpd__ClientInfo *c)
{
	json_object *o = json_object_new_object();

	put_u64_str(o, "id", c->id);
	put_i64(o, "pid", c->pid);
	put_u64(o, "uid", c->uid);
	put_u64(o, "gid", c->gid);
	put_str(o, "name", c->name);
	put_u64(o, "segments", c->segments);
	put_u64_str(o, "segment_bytes", c->segment_bytes);
	put_u64(o, "mrs", c->mrs);
	put_u64_str(o, "pinned_bytes", c->pinned_bytes);
	put_str(o, "pd", pd_text(c->pd));
	put_u64(o, "relaxed", c->relaxed);
	put_u64_str(o, "local_hits", c->local_hits);
	put_u64(o, "hit_slots", c->hit_slots);
	return o;
}

static json_object *json_cache(const Odpd__CacheStats *c)
{
	static const Odpd__CacheStats none = ODPD__CACHE_STATS__INIT;
	json_object *o = json_object_new_object();

	if (!c)
		c = &none;
	put_u64_str(o, "lookups", c->lookups);
	put_u64_str(o, "hits", c->hits);
	put_u64_str(o, "misses", c->misses);
	put_u64_str(o, "evictions", c->evictions);
	put_u64_str(o, "registrations", c->registrations);
	put_u64_str(o, "deregistrations", c->deregistrations);
	put_u64(o, "relaxed_pending", c->relaxed_pending);
	put_u64_str(o, "relaxed_bytes", c->relaxed_bytes);
	put_u64_str(o, "flushes", c->flushes);             /* the older name */
	put_u64_str(o, "invalidation_batches", c->flushes);
	put_u64_str(o, "invalidated", c->invalidated);
	put_u64_str(o, "replaced", c->replaced);
	put_u64_str(o, "local_hits", c->local_hits);
	put_u64_str(o, "revoked", c->revoked);
	put_u64_str(o, "gets", c->gets);
	put_u64_str(o, "invalidated_flush", c->invalidated_flush);
	put_u64_str(o, "invalidated_eviction", c->invalidated_eviction);
	put_u64_str(o, "invalidated_hole", c->replaced);
	put_u64_str(o, "invalidated_device", c->invalidated_device);
	put_u64_str(o, "invalidated_expired", c->invalidated_expired);
	put_u64_str(o, "registered_bytes", c->registered_bytes);
	put_u64_str(o, "registrations_on_loop", c->registrations_on_loop);
	put_u64_str(o, "deregistrations_on_loop", c->deregistrations_on_loop);
	put_u64_str(o, "ring_releases", c->ring_releases);
	{
		json_object *a = json_object_new_array();

		if (!a)
			oom();
		for (size_t i = 0; i < N_SIZE_BUCKETS; i++) {
			char buf[24];

			snprintf(buf, sizeof(buf), "%" PRIu64, size_bucket(c, i));
			json_object_array_add(a, json_object_new_string(buf));
		}
		json_object_object_add(o, "registration_sizes", a);
	}
	return o;
}

/* All zero when the daemon sent no OdpStats (an odpd older than ODP). */
static json_object *json_odp(const Odpd__OdpStats *s)
{
	static const Odpd__OdpStats none = ODPD__ODP_STATS__INIT;
	json_object *o = json_obj();

	if (!s)
		s = &none;
	put_u64(o, "mrs", s->mrs);
	put_u64_str(o, "bytes", s->bytes);
	put_u64_str(o, "registrations", s->registrations);
	put_u64_str(o, "prefetches", s->prefetches);
	put_u64_str(o, "prefetch_bytes", s->prefetch_bytes);
	put_u64_str(o, "prefetch_errors", s->prefetch_errors);
	put_u64(o, "implicit_mrs", s->implicit_mrs);
	put_u64(o, "registrars", s->registrars);
	return o;
}

static json_object *json_quota(const Odpd__QuotaInfo *q)
{
	json_object *o = json_object_new_object();

	put_u64(o, "uid", q->uid);
	put_str(o, "user", user_name(q->uid));
	put_u64_str(o, "pinned_bytes", q->pinned_bytes);
	put_limit_str(o, "limit", q->limit);
	put_str(o, "rule", q->rule);
	put_u64(o, "mrs", q->mrs);
	put_u64(o, "connections", q->connections);
	put_u64(o, "segments", q->segments);
	put_u64_str(o, "mappings", q->mappings);
	return o;
}

static json_object *json_pd(const Odpd__PdInfo *pd)
{
	json_object *o = json_object_new_object();

	put_str(o, "name", pd->name);
	put_str(o, "device", pd->device);
	put_u64(o, "members", pd->members);
	put_u64(o, "mrs", pd->mrs);
	put_u64(o, "creator_uid", pd->creator_uid);
	return o;
}

json_object *json_mr(const Odpd__MrInfo *m)
{
	json_object *o = json_object_new_object();
	json_object *pids = json_object_new_array();

	if (!o || !pids)
		oom();
	for (size_t i = 0; i < m->n_holder_pids; i++)
		json_object_array_add(pids, json_object_new_int64(m->holder_pids[i]));
	put_u64_str(o, "id", m->id);
	put_str(o, "pd", pd_text(m->pd));
	put_u64_str(o, "client_id", m->client_id);
	put_str(o, "device", m->device);
	put_hex(o, "iova", m->iova);
	put_u64_str(o, "length", m->length);
	put_u64(o, "access", m->access);
	put_str(o, "kind", mr_kind_name(m->kind));
	put_hex(o, "lkey", m->lkey);
	put_hex(o, "rkey", m->rkey);
	put_u64(o, "holders", m->holders);
	json_object_object_add(o, "holder_pids", pids);
	put_str(o, "state", mr_state_name(m->state));
	put_u64_str(o, "generation", m->generation);
	put_u64_str(o, "segment_dev", m->segment_dev);
	put_u64_str(o, "segment_ino", m->segment_ino);
	put_u64_str(o, "offset", m->offset);
	put_u64(o, "uid", m->uid);
	put_u64_str(o, "age_ms", m->age_ms);
	return o;
}

/* Print @root, pretty, and free it. */
void json_print(json_object *root)
{
	puts(json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
					    JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(root);
}

void print_json(const Odpd__StatusReply *st)
{
	json_object *root = json_object_new_object();
	json_object *daemon = json_object_new_object();
	json_object *devices = json_object_new_array();
	json_object *clients = json_object_new_array();
	json_object *pds = json_object_new_array();
	json_object *quotas = json_object_new_array();
	json_object *totals = json_object_new_object();

	if (!root || !daemon || !devices || !clients || !pds || !quotas || !totals)
		oom();
	put_str(daemon, "version", st->daemon_version);
	put_i64(daemon, "pid", st->daemon_pid);
	for (size_t i = 0; i < st->n_devices; i++)
		json_object_array_add(devices, json_device(st->devices[i]));
	for (size_t i = 0; i < st->n_clients; i++)
		json_object_array_add(clients, json_client(st->clients[i]));
	for (size_t i = 0; i < st->n_pds; i++)
		json_object_array_add(pds, json_pd(st->pds[i]));
	for (size_t i = 0; i < st->n_quotas; i++)
		json_object_array_add(quotas, json_quota(st->quotas[i]));
	put_u64(totals, "segments", st->segments);
	put_u64_str(totals, "segment_bytes", st->segment_bytes);
	put_u64(totals, "mrs", st->mrs);
	put_u64_str(totals, "pinned_bytes", st->pinned_bytes);
	put_u64_str(totals, "registrations", st->registrations);
	put_u64_str(totals, "deregistrations", st->deregistrations);
	put_u64_str(totals, "errors", st->errors);
	put_u64(totals, "monitors", st->monitors);
	put_u64(totals, "releasing", st->releasing);
	put_limit_str(totals, "max_pinned", st->max_pinned);
	put_u64(totals, "max_mrs", st->max_mrs);
	if (st->has_fd_limit && st->fd_limit == 0)
		json_object_object_add(totals, "fd_limit", json_object_new_string("unlimited"));
	else
		put_u64_str(totals, "fd_limit", st->fd_limit);
	put_u64_str(totals, "max_map_count", st->max_map_count);
	if (st->restart) {
		json_object *rs = json_object_new_object();

		json_object_object_add(rs, "from_version", json_object_new_string(st->restart->from_version ?
										   st->restart->from_version : ""));
		put_u64(rs, "kept_clients", st->restart->kept_clients);
		put_u64(rs, "kept_mrs", st->restart->kept_mrs);
		put_u64(rs, "dropped_clients", st->restart->dropped_clients);
		put_u64(rs, "dropped_mrs", st->restart->dropped_mrs);
		json_object_object_add(rs, "crashed", json_object_new_boolean(st->restart->crashed));
		put_u64(rs, "swept_mrs", st->restart->swept_mrs);
		json_object_object_add(root, "restart", rs);
	}
	if (st->fd_store) {
		json_object *fs = json_object_new_object();

		put_u64(fs, "stored", st->fd_store->stored);
		if (st->fd_store->has_max)
			put_u64(fs, "max", st->fd_store->max);
		put_u64_str(fs, "refused", st->fd_store->refused);
		json_object_object_add(root, "fd_store", fs);
	}
	json_object_object_add(root, "daemon", daemon);
	json_object_object_add(root, "devices", devices);
	json_object_object_add(root, "clients", clients);
	json_object_object_add(root, "pds", pds);
	json_object_object_add(root, "quotas", quotas);
	json_object_object_add(root, "cache", json_cache(st->cache));
	json_object_object_add(root, "odp", json_odp(st->odp));
	json_object_object_add(root, "totals", totals);
	json_print(root);
}
