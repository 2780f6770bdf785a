/* SPDX-License-Identifier: MIT */
/* human.c - the human output: status's tables and the mrs table. */
#include "odpctl.h"

/* ------------------------------------------------------------ human output */

static void print_devices(const Odpd__StatusReply *st)
{
	struct table t = { .ncols = 9 };

	table_add(&t, "DEVICE");
	table_add(&t, "TRANSPORT");
	table_add(&t, "PORTS");
	table_add(&t, "ODP");
	table_add(&t, "IMPLICIT_ODP");
	table_add(&t, "ADVISE_MR");
	table_add(&t, "IMPORT");
	table_add(&t, "MAX_MR_SIZE");
	table_add(&t, "ODP_RC_CAPS");
	for (size_t i = 0; i < st->n_devices; i++) {
		const Odpd__Device *d = st->devices[i];
		char b1[48], b2[48], b3[HUMAN_LEN], b4[64];

		table_add(&t, "%s", d->name ? d->name : "-");
		table_add(&t, "%s", d->transport ? d->transport : "-");
		table_add(&t, "%" PRIu32, d->phys_port_cnt);
		table_add(&t, "%s", yes_no(d->odp));
		table_add(&t, "%s", yes_no(d->implicit_odp));
		table_add(&t, "%s", support_text(d->advise_mr, d->advise_mr_errno, b1));
		table_add(&t, "%s", support_text(d->import, d->import_errno, b2));
		table_add(&t, "%s", human_bytes(d->max_mr_size, b3));
		table_add(&t, "%s", odp_caps(d->odp_rc_caps, b4));
	}
	table_print(&t, "Devices");
}

void print_clients(const Odpd__StatusReply *st)
{
	struct table t = { .ncols = 9 };

	table_add(&t, "ID");
	table_add(&t, "PID");
	table_add(&t, "UID");
	table_add(&t, "NAME");
	table_add(&t, "PD");
	table_add(&t, "SEGMENTS");
	table_add(&t, "MRS");
	table_add(&t, "RELAXED");
	table_add(&t, "PINNED");
	for (size_t i = 0; i < st->n_clients; i++) {
		const Odpd__ClientInfo *c = st->clients[i];
		char b[HUMAN_LEN];

		table_add(&t, "%" PRIu64, c->id);
		table_add(&t, "%" PRId32, c->pid);
		table_add(&t, "%" PRIu32, c->uid);
		table_add(&t, "%s", c->name && *c->name ? c->name : "-");
		table_add(&t, "%s", pd_text(c->pd));
		table_add(&t, "%" PRIu32, c->segments);
		table_add(&t, "%" PRIu32, c->mrs);
		table_add(&t, "%" PRIu32, c->relaxed);
		table_add(&t, "%s", human_bytes(c->pinned_bytes, b));
	}
	table_print(&t, "Clients");
}

static void print_pds(const Odpd__StatusReply *st)
{
	struct table t = { .ncols = 5 };

	table_add(&t, "NAME");
	table_add(&t, "DEVICE");
	table_add(&t, "MEMBERS");
	table_add(&t, "MRS");
	table_add(&t, "CREATOR_UID");
	for (size_t i = 0; i < st->n_pds; i++) {
		const Odpd__PdInfo *pd = st->pds[i];

		table_add(&t, "%s", pd->name ? pd->name : "-");
		table_add(&t, "%s", pd->device && *pd->device ? pd->device : "-");
		table_add(&t, "%" PRIu32, pd->members);
		table_add(&t, "%" PRIu32, pd->mrs);
		table_add(&t, "%" PRIu32, pd->creator_uid);
	}
	table_print(&t, "Shared PDs");
}

static void print_quotas(const Odpd__StatusReply *st)
{
	struct table t = { .ncols = 9 };

	table_add(&t, "UID");
	table_add(&t, "USER");
	table_add(&t, "PINNED");
	table_add(&t, "LIMIT");
	table_add(&t, "RULE");
	table_add(&t, "MRS");
	table_add(&t, "CONNS");
	table_add(&t, "SEGS");
	table_add(&t, "MAPS");
	for (size_t i = 0; i < st->n_quotas; i++) {
		const Odpd__QuotaInfo *q = st->quotas[i];
		const char *user = user_name(q->uid);
		char b1[HUMAN_LEN], b2[HUMAN_LEN];

		table_add(&t, "%" PRIu32, q->uid);
		table_add(&t, "%s", user ? user : "-");
		table_add(&t, "%s", human_bytes(q->pinned_bytes, b1));
		table_add(&t, "%s", limit_text(q->limit, b2));
		table_add(&t, "%s", q->rule && *q->rule ? q->rule : "-");
		table_add(&t, "%" PRIu32, q->mrs);
		table_add(&t, "%" PRIu32, q->connections);
		table_add(&t, "%" PRIu32, q->segments);
		table_add(&t, "%" PRIu64, q->mappings);
	}
	table_print(&t, "Pinning quotas");
}

const char *const size_keys[N_SIZE_BUCKETS] = {
	"4k", "8k", "16k", "32k", "64k", "128k", "256k", "512k", "1m", "2m", "4m", "8m",
	"16m", "32m", "64m", "128m", "256m", "512m", "1g", "over_1g",
};

/* Bucket @i as the daemon sent it (0 when an older daemon sent none). */
uint64_t size_bucket(const Odpd__CacheStats *c, size_t i)
{
	return c && i < c->n_registration_sizes ? c->registration_sizes[i] : 0;
}

/* "Registration cache": "(none)" when the daemon sent no CacheStats. */
static void print_cache(const Odpd__StatusReply *st)
{
	const Odpd__CacheStats *c = st->cache;
	struct table t = { .ncols = 2 };
	char b[HUMAN_LEN];

	if (!c) {
		table_print(&t, "Registration cache");
		return;
	}
	table_add(&t, "Lookups:");
	table_add(&t, "%" PRIu64, c->lookups);
	table_add(&t, "Hits:");
	if (c->lookups)
		table_add(&t, "%" PRIu64 " (%.1f%%)", c->hits, 100.0 * (double)c->hits / (double)c->lookups);
	else
		table_add(&t, "%" PRIu64, c->hits);
	table_add(&t, "Misses:");
	table_add(&t, "%" PRIu64, c->misses);
	table_add(&t, "Evictions:");
	table_add(&t, "%" PRIu64, c->evictions);
	table_add(&t, "Registrations:");
	table_add(&t, "%" PRIu64, c->registrations);
	table_add(&t, "Deregistrations:");
	table_add(&t, "%" PRIu64, c->deregistrations);
	table_add(&t, "Relaxed pending:");
	table_add(&t, "%" PRIu32 " MRs, %s", c->relaxed_pending, human_bytes(c->relaxed_bytes, b));
	table_add(&t, "Invalidation batches:");
	table_add(&t, "%" PRIu64, c->flushes);
	table_add(&t, "Invalidated:");
	table_add(&t, "%" PRIu64, c->invalidated);
	table_add(&t, "Replaced:");
	table_add(&t, "%" PRIu64, c->replaced);
	table_add(&t, "Local hits:");
	table_add(&t, "%" PRIu64 " (answered in client processes, as they report)", c->local_hits);
	table_add(&t, "Revoked:");
	table_add(&t, "%" PRIu64 " (unused references taken back from client caches)", c->revoked);
	table_add(&t, "Gets:");
	table_add(&t, "%" PRIu64 " (registrations asked for, local hits included)", c->gets);
	table_add(&t, "Invalidated by cause:");
	table_add(&t, "flush %" PRIu64 ", eviction %" PRIu64 ", hole %" PRIu64 ", device %" PRIu64
		  ", expired %" PRIu64, c->invalidated_flush, c->invalidated_eviction, c->replaced,
		  c->invalidated_device, c->invalidated_expired);
	table_add(&t, "Registered:");
	table_add(&t, "%s", human_bytes(c->registered_bytes, b));
	{
		char sizes[N_SIZE_BUCKETS * 32] = "";
		size_t len = 0;

		for (size_t i = 0; i < N_SIZE_BUCKETS; i++)
			if (size_bucket(c, i) && len < sizeof(sizes))
				len += (size_t)snprintf(sizes + len, sizeof(sizes) - len, "%s%s%s %" PRIu64,
							len ? ", " : "", i + 1 < N_SIZE_BUCKETS ? "<=" : "",
							size_keys[i], size_bucket(c, i));
		table_add(&t, "Registration sizes:");
		table_add(&t, "%s", len ? sizes : "-");
	}
	table_print(&t, "Registration cache");
}

/* "On-demand paging": "(none)" when the daemon sent no OdpStats (older than ODP). */
static void print_odp(const Odpd__StatusReply *st)
{
	const Odpd__OdpStats *o = st->odp;
	struct table t = { .ncols = 2 };
	char b[HUMAN_LEN];

	if (!o) {
		table_print(&t, "On-demand paging");
		return;
	}
	table_add(&t, "ODP MRs:");
	table_add(&t, "%" PRIu32 ", %s", o->mrs, human_bytes(o->bytes, b));
	table_add(&t, "Implicit ODP MRs:");
	table_add(&t, "%" PRIu32 " (registrar processes: %" PRIu32 ")", o->implicit_mrs, o->registrars);
	table_add(&t, "Registrations:");
	table_add(&t, "%" PRIu64, o->registrations);
	table_add(&t, "Prefetches:");
	table_add(&t, "%" PRIu64 ", %s", o->prefetches, human_bytes(o->prefetch_bytes, b));
	table_add(&t, "Prefetch errors:");
	table_add(&t, "%" PRIu64, o->prefetch_errors);
	table_print(&t, "On-demand paging");
}

static void print_totals(const Odpd__StatusReply *st)
{
	struct table t = { .ncols = 2 };
	char b[HUMAN_LEN];

	table_add(&t, "Segments:");
	table_add(&t, "%" PRIu32, st->segments);
	table_add(&t, "Segment bytes:");
	table_add(&t, "%s", human_bytes(st->segment_bytes, b));
	table_add(&t, "MRs:");
	table_add(&t, "%" PRIu32, st->mrs);
	table_add(&t, "Max MRs:");
	if (st->has_max_mrs)
		table_add(&t, "%" PRIu32, st->max_mrs);
	else
		table_add(&t, "-");
	table_add(&t, "Pinned bytes:");
	table_add(&t, "%s", human_bytes(st->pinned_bytes, b));
	table_add(&t, "Max pinned:");
	table_add(&t, "%s", st->has_max_pinned ? limit_text(st->max_pinned, b) : "-");
	table_add(&t, "Registrations:");
	table_add(&t, "%" PRIu64, st->registrations);
	table_add(&t, "Deregistrations:");
	table_add(&t, "%" PRIu64, st->deregistrations);
	table_add(&t, "Errors:");
	table_add(&t, "%" PRIu64, st->errors);
	table_add(&t, "Clients releasing:");
	table_add(&t, "%" PRIu32, st->releasing);
	table_add(&t, "Fd limit:");
	if (st->has_fd_limit && st->fd_limit)
		table_add(&t, "%" PRIu64, st->fd_limit);
	else
		table_add(&t, "%s", st->has_fd_limit ? "unlimited" : "-");
	table_add(&t, "vm.max_map_count:");
	if (st->has_max_map_count && st->max_map_count)
		table_add(&t, "%" PRIu64, st->max_map_count);
	else
		table_add(&t, "-");
	table_add(&t, "Restart:");
	if (st->restart && st->restart->crashed)
		table_add(&t, "after a crash: kept %" PRIu32 " connection(s) and %" PRIu32 " MR(s) of odpd %s; "
			  "dropped %" PRIu32 " connection(s) and %" PRIu32 " MR(s); %" PRIu32 " MR(s) in flight "
			  "deregistered", st->restart->kept_clients, st->restart->kept_mrs,
			  st->restart->from_version ? st->restart->from_version : "?",
			  st->restart->dropped_clients, st->restart->dropped_mrs, st->restart->swept_mrs);
	else if (st->restart)
		table_add(&t, "kept %" PRIu32 " connection(s) and %" PRIu32 " MR(s) of odpd %s; dropped %" PRIu32
			  " connection(s) and %" PRIu32 " MR(s)", st->restart->kept_clients, st->restart->kept_mrs,
			  st->restart->from_version ? st->restart->from_version : "?",
			  st->restart->dropped_clients, st->restart->dropped_mrs);
	else
		table_add(&t, "-");
	table_add(&t, "fd store:");
	if (!st->fd_store)
		table_add(&t, "-");
	else if (st->fd_store->refused)
		table_add(&t, "%" PRIu32 " of %" PRIu32 " fds; FULL: %" PRIu64 " not stored, not kept across a "
			  "restart (raise FileDescriptorStoreMax=)", st->fd_store->stored, st->fd_store->max,
			  st->fd_store->refused);
	else if (st->fd_store->has_max)
		table_add(&t, "%" PRIu32 " of %" PRIu32 " fds", st->fd_store->stored, st->fd_store->max);
	else
		table_add(&t, "%" PRIu32 " fds (FileDescriptorStoreMax= not known)", st->fd_store->stored);
	table_add(&t, "Daemon PID:");
	table_add(&t, "%" PRId32, st->daemon_pid);
	table_add(&t, "Daemon version:");
	table_add(&t, "%s", st->daemon_version ? st->daemon_version : "-");
	table_print(&t, "Totals");
}

void print_human(const Odpd__StatusReply *st)
{
	print_devices(st);
	putchar('\n');
	print_clients(st);
	putchar('\n');
	print_pds(st);
	putchar('\n');
	print_quotas(st);
	putchar('\n');
	print_cache(st);
	putchar('\n');
	print_odp(st);
	putchar('\n');
	print_totals(st);
}

/* "0x1000-0x3000": [iova, iova + length), the end clamped at 2^64 - 1. */
const char *iova_range(uint64_t iova, uint64_t length, char buf[static 48])
{
	uint64_t end = iova + length < iova ? UINT64_MAX : iova + length;

	snprintf(buf, 48, "0x%" PRIx64 "-0x%" PRIx64, iova, end);
	return buf;
}

/* "0", or the count and the holding pids: "2 (1234,5678)". Malloc'ed. */
static char *holders_text(const Odpd__MrInfo *m)
{
	char *s = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&s, &len);

	if (!f)
		oom();
	fprintf(f, "%" PRIu32, m->holders);
	for (size_t i = 0; i < m->n_holder_pids; i++)
		fprintf(f, "%s%" PRId32, i ? "," : " (", m->holder_pids[i]);
	if (m->n_holder_pids)
		fputc(')', f);
	if (fclose(f) != 0)
		oom();
	return s;
}

void mrs_header(struct table *t)
{
	table_add(t, "ID");
	table_add(t, "PD");
	table_add(t, "DEVICE");
	table_add(t, "IOVA");
	table_add(t, "LENGTH");
	table_add(t, "ACCESS");
	table_add(t, "KIND");
	table_add(t, "LKEY");
	table_add(t, "RKEY");
	table_add(t, "HOLDERS");
	table_add(t, "STATE");
	table_add(t, "GEN");
	table_add(t, "UID");
	table_add(t, "AGE");
}

void mrs_row(struct table *t, const Odpd__MrInfo *m)
{
	char b1[48], b2[HUMAN_LEN], b3[48], b4[HUMAN_LEN];
	char *holders = holders_text(m);

	table_add(t, "%" PRIu64, m->id);
	table_add(t, "%s", pd_text(m->pd));
	table_add(t, "%s", m->device && *m->device ? m->device : "-");
	table_add(t, "%s", iova_range(m->iova, m->length, b1));
	table_add(t, "%s", human_bytes(m->length, b2));
	table_add(t, "%s", access_text(m->access, b3));
	table_add(t, "%s", mr_kind_name(m->kind));
	table_add(t, "0x%" PRIx32, m->lkey);
	table_add(t, "0x%" PRIx32, m->rkey);
	table_add(t, "%s", holders);
	table_add(t, "%s", mr_state_name(m->state));
	table_add(t, "%" PRIu64, m->generation);
	table_add(t, "%" PRIu32, m->uid);
	table_add(t, "%s", m->state == ODPD__MR_STATE__MR_STATE_RELAXED ?
		  human_age(m->age_ms, b4) : "-");
	free(holders);
}
