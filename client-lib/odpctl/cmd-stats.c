/* SPDX-License-Identifier: MIT */
/* cmd-stats.c - odpctl stats (and --prometheus). */
#include "odpctl.h"

/*
 * The daemon-wide counters, one flat set: the same numbers as odpd's D-Bus
 * properties (org.odpd1.Manager; the name there is the CamelCase of the
 * key). counter: only grows (Prometheus _total); else a gauge.
 */
struct stat_def {
	const char *key;
	const char *help;
	bool counter;
};

static const struct stat_def stat_defs[] = {
	{ "devices", "RDMA devices odpd serves", false },
	{ "clients", "connected clients (admin tools not counted)", false },
	{ "segments", "segments mapped (distinct files)", false },
	{ "segment_bytes", "bytes of the segments mapped", false },
	{ "mrs", "MRs in the registration cache (held, relaxed, in flight)", false },
	{ "pinned_bytes", "distinct bytes pinned by pinned MRs", false },
	{ "registrations", "ibv_reg_mr calls that succeeded", true },
	{ "deregistrations", "ibv_dereg_mr calls", true },
	{ "errors", "error replies to clients", true },
	{ "cache_lookups", "registrations the cache could serve", true },
	{ "cache_hits", "registrations served from the cache", true },
	{ "cache_misses", "registrations that needed a new MR", true },
	{ "evictions", "relaxed MRs invalidated to make room", true },
	{ "relaxed_pending", "relaxed MRs waiting for invalidation", false },
	{ "relaxed_bytes", "bytes of the relaxed MRs waiting", false },
	{ "flushes", "invalidation batches (the older name of invalidation_batches)", true },
	{ "invalidated", "MRs deregistered by invalidation batches", true },
	{ "odp_mrs", "on-demand-paging MRs", false },
	{ "odp_bytes", "bytes of explicit ODP MRs", false },
	{ "odp_registrations", "ODP MRs registered", true },
	{ "prefetches", "ibv_advise_mr calls that succeeded", true },
	{ "prefetch_bytes", "bytes prefetched", true },
	{ "prefetch_errors", "ibv_advise_mr calls that failed", true },
	{ "implicit_mrs", "implicit ODP MRs", false },
	{ "registrars", "implicit-ODP registrar processes", false },
	{ "local_hits", "registrations client libraries answered in-process (as they report)", true },
	{ "revoked", "unused MR references taken back from client libraries' caches", true },
	{ "invalidation_batches", "batches of relaxed MRs invalidated", true },
	/* comparable with UCX's rcache statistics (odpctl(8)) */
	{ "gets", "registrations asked for: requests to odpd plus local hits", true },
	{ "invalidated_flush", "relaxed MRs invalidated by a flush", true },
	{ "invalidated_eviction", "relaxed MRs invalidated to make room (quotas, relaxed-max-*)", true },
	{ "invalidated_hole", "pinned MRs retired because a hole was punched under them", true },
	{ "invalidated_device", "MRs that went with a removed device", true },
	{ "invalidated_expired", "relaxed MRs invalidated as the relaxed window passed", true },
	{ "registered_bytes", "lengths of all registrations, added up", true },
	{ "registrations_on_loop", "registrations odpd made on its event loop (small, mapped, pinned)", true },
	{ "deregistrations_on_loop", "deregistrations odpd made on its event loop", true },
	{ "ring_releases", "MR references released through release rings, without a request", true },
#define SIZE_STAT(k, h) { "registrations_" k, "registrations of " h, true }
	SIZE_STAT("4k", "at most 4 KiB"), SIZE_STAT("8k", "4 KiB + 1 to 8 KiB"),
	SIZE_STAT("16k", "8 KiB + 1 to 16 KiB"), SIZE_STAT("32k", "16 KiB + 1 to 32 KiB"),
	SIZE_STAT("64k", "32 KiB + 1 to 64 KiB"), SIZE_STAT("128k", "64 KiB + 1 to 128 KiB"),
	SIZE_STAT("256k", "128 KiB + 1 to 256 KiB"), SIZE_STAT("512k", "256 KiB + 1 to 512 KiB"),
	SIZE_STAT("1m", "512 KiB + 1 to 1 MiB"), SIZE_STAT("2m", "1 MiB + 1 to 2 MiB"),
	SIZE_STAT("4m", "2 MiB + 1 to 4 MiB"), SIZE_STAT("8m", "4 MiB + 1 to 8 MiB"),
	SIZE_STAT("16m", "8 MiB + 1 to 16 MiB"), SIZE_STAT("32m", "16 MiB + 1 to 32 MiB"),
	SIZE_STAT("64m", "32 MiB + 1 to 64 MiB"), SIZE_STAT("128m", "64 MiB + 1 to 128 MiB"),
	SIZE_STAT("256m", "128 MiB + 1 to 256 MiB"), SIZE_STAT("512m", "256 MiB + 1 to 512 MiB"),
	SIZE_STAT("1g", "512 MiB + 1 to 1 GiB"), SIZE_STAT("over_1g", "more than 1 GiB"),
#undef SIZE_STAT
};
#define N_STATS (sizeof(stat_defs) / sizeof(stat_defs[0]))
/* where the size buckets start in stat_defs */
#define FIRST_SIZE_STAT (N_STATS - N_SIZE_BUCKETS)

static void stat_values(const Odpd__StatusReply *st, uint64_t *v)
{
	const Odpd__CacheStats *c = st->cache;
	const Odpd__OdpStats *d = st->odp;
	const uint64_t vals[N_STATS] = {
		st->n_devices, st->n_clients, st->segments, st->segment_bytes, st->mrs, st->pinned_bytes,
		st->registrations, st->deregistrations, st->errors,
		c ? c->lookups : 0, c ? c->hits : 0, c ? c->misses : 0, c ? c->evictions : 0,
		c ? c->relaxed_pending : 0, c ? c->relaxed_bytes : 0, c ? c->flushes : 0,
		c ? c->invalidated : 0,
		d ? d->mrs : 0, d ? d->bytes : 0, d ? d->registrations : 0, d ? d->prefetches : 0,
		d ? d->prefetch_bytes : 0, d ? d->prefetch_errors : 0, d ? d->implicit_mrs : 0,
		d ? d->registrars : 0,
		c ? c->local_hits : 0, c ? c->revoked : 0,
		c ? c->flushes : 0,
		c ? c->gets : 0, c ? c->invalidated_flush : 0, c ? c->invalidated_eviction : 0,
		c ? c->replaced : 0, c ? c->invalidated_device : 0, c ? c->invalidated_expired : 0,
		c ? c->registered_bytes : 0,
		c ? c->registrations_on_loop : 0, c ? c->deregistrations_on_loop : 0,
		c ? c->ring_releases : 0,
	};

	memcpy(v, vals, sizeof(vals));
	for (size_t i = 0; i < N_SIZE_BUCKETS; i++)
		v[FIRST_SIZE_STAT + i] = size_bucket(c, i);
}

/* The Prometheus text exposition format (node_exporter's textfile collector
 * reads it): odpd_KEY, with _total for counters. */
static void print_prometheus(const uint64_t *v)
{
	for (size_t i = 0; i < N_STATS; i++) {
		const struct stat_def *s = &stat_defs[i];
		const char *suffix = s->counter ? "_total" : "";

		printf("# HELP odpd_%s%s %s.\n", s->key, suffix, s->help);
		printf("# TYPE odpd_%s%s %s\n", s->key, suffix, s->counter ? "counter" : "gauge");
		printf("odpd_%s%s %" PRIu64 "\n", s->key, suffix, v[i]);
	}
	/* the size buckets once more, as one Prometheus histogram (cumulative) */
	uint64_t sum = 0;

	printf("# HELP odpd_registration_size_bytes Lengths of the registrations (MRs made).\n");
	printf("# TYPE odpd_registration_size_bytes histogram\n");
	for (size_t i = 0; i < N_SIZE_BUCKETS; i++) {
		sum += v[FIRST_SIZE_STAT + i];
		if (i + 1 < N_SIZE_BUCKETS)
			printf("odpd_registration_size_bytes_bucket{le=\"%" PRIu64 "\"} %" PRIu64 "\n",
			       (uint64_t)4096 << i, sum);
		else
			printf("odpd_registration_size_bytes_bucket{le=\"+Inf\"} %" PRIu64 "\n", sum);
	}
	for (size_t i = 0; i < N_STATS; i++)
		if (strcmp(stat_defs[i].key, "registered_bytes") == 0)
			printf("odpd_registration_size_bytes_sum %" PRIu64 "\n", v[i]);
	printf("odpd_registration_size_bytes_count %" PRIu64 "\n", sum);
}

int cmd_stats(int sock, const struct options *o)
{
	Odpd__Reply *rep = status_call(sock);
	uint64_t v[N_STATS];

	if (!rep)
		return EXIT_FAILURE;
	stat_values(rep->status_reply, v);
	if (o->prometheus) {
		print_prometheus(v);
	} else if (o->json) {
		json_object *root = json_obj();

		for (size_t i = 0; i < N_STATS; i++)
			put_u64_str(root, stat_defs[i].key, v[i]);
		json_print(root);
	} else {
		struct table t = { .ncols = 2 };

		table_add(&t, "COUNTER");
		table_add(&t, "VALUE");
		for (size_t i = 0; i < N_STATS; i++) {
			const char *k = stat_defs[i].key;
			size_t n = strlen(k);
			char b[HUMAN_LEN];

			table_add(&t, "%s", k);
			/* sizes in the units of every other table */
			if (n > 6 && strcmp(k + n - 6, "_bytes") == 0)
				table_add(&t, "%s", human_bytes(v[i], b));
			else
				table_add(&t, "%" PRIu64, v[i]);
		}
		table_print(&t, "Statistics");
	}
	odpd__reply__free_unpacked(rep, NULL);
	return EXIT_SUCCESS;
}
