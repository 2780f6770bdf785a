/* SPDX-License-Identifier: MIT */
/*
 * odpctl - look at a running odpd and flush its registration cache.
 *
 * Speaks the wire protocol directly (proto/odpd-wire.h), not through
 * libodpd: a Hello, then admin requests (one, or one per page of ListMrs),
 * each answered by one Reply. Human tables by default, one JSON object with
 * --json. In the newer JSON (mrs, flush, and status's cache, odp, quotas and
 * totals.max_pinned) every uint64 field is a decimal string: JSON readers
 * such as jq and JavaScript round integers above 2^53.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <json.h>

#include "config.h"
#include "odpd-wire.h"


/* How long to wait for the daemon to answer one request. */
#define TIMEOUT_SEC 10
/* ... and a Flush, which is answered only when every MR it selected is
 * deregistered. */
#define FLUSH_TIMEOUT_SEC 120

/* Exit statuses (odpctl(8), EXIT STATUS). */
#define EXIT_REFUSED 1          /* odpd answered with an error, or another failure */
#define EXIT_USAGE 2            /* bad command line */
#define EXIT_NOT_RUNNING 3      /* no odpd at the socket (ENOENT, ECONNREFUSED), or it went away */
#define EXIT_DENIED 4           /* not allowed: the socket (EACCES) or odpd (EPERM, EACCES) */

/* What fail() saw last: the exit status of a failed run. */
static int fail_status = EXIT_REFUSED;

/* Longest shared PD name (JoinPd.name: 1..63 bytes of [A-Za-z0-9._:@-]). */
#define PD_NAME_MAX 63

struct command;

struct options {
	const char *socket;
	bool json;
	bool has_pid;                /* --pid */
	int32_t pid;
	const char *pd;              /* --pd, NULL if not given */
	bool prometheus;             /* stats --prometheus */
	const struct command *cmd;
};

static void oom(void)
{
	fputs("odpctl: out of memory\n", stderr);
	exit(EXIT_FAILURE);
}

/* "odpctl: <what>: <strerror(err)>[: <fmt...>]" on stderr. */
__attribute__((format(printf, 3, 4)))
static void fail(const char *what, int err, const char *fmt, ...)
{
	fail_status = err == EPERM || err == EACCES ? EXIT_DENIED :
		      err == ENOENT || err == ECONNREFUSED || err == ECONNRESET || err == EPIPE ||
		      err == ENOTCONN ? EXIT_NOT_RUNNING : EXIT_REFUSED;
	fprintf(stderr, "odpctl: %s: %s", what, strerror(err));
	if (fmt && *fmt) {
		va_list ap;

		va_start(ap, fmt);
		fputs(": ", stderr);
		vfprintf(stderr, fmt, ap);
		va_end(ap);
	}
	fputc('\n', stderr);
}

/* ------------------------------------------------------------ formatting */

#define HUMAN_LEN 24

/* 1536 -> "1.5 KiB", 4294967296 -> "4 GiB". */
static const char *human_bytes(uint64_t v, char buf[static HUMAN_LEN])
{
	static const char units[] = "KMGTPE";
	double d = (double)v;
	unsigned i = 0;

	while (i < 6 && d >= 1023.95) {
		d /= 1024;
		i++;
	}
	if (i == 0)
		snprintf(buf, HUMAN_LEN, "%" PRIu64 " B", v);
	else if (v % (UINT64_C(1) << (10 * i)) == 0)
		snprintf(buf, HUMAN_LEN, "%" PRIu64 " %ciB", v >> (10 * i), units[i - 1]);
	else
		snprintf(buf, HUMAN_LEN, "%.1f %ciB", d, units[i - 1]);
	return buf;
}

struct bit_name {
	uint32_t bit;
	const char *name;
};

/* The names of the bits set in @bits joined by @sep, unknown bits in hex,
 * "-" for none. */
static const char *bits_text(uint32_t bits, const struct bit_name *names, size_t n_names,
			     const char *sep, char *buf, size_t len)
{
	size_t n = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < n_names; i++) {
		if (!(bits & names[i].bit))
			continue;
		bits &= ~names[i].bit;
		n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? sep : "", names[i].name);
	}
	if (bits)
		snprintf(buf + n, len - n, "%s0x%" PRIx32, n ? sep : "", bits);
	return buf[0] ? buf : "-";
}

/* IBV_ODP_SUPPORT_* bits -> "SEND|RECV|...". */
static const char *odp_caps(uint32_t caps, char buf[static 64])
{
	static const struct bit_name names[] = {
		{ IBV_ODP_SUPPORT_SEND, "SEND" },
		{ IBV_ODP_SUPPORT_RECV, "RECV" },
		{ IBV_ODP_SUPPORT_WRITE, "WRITE" },
		{ IBV_ODP_SUPPORT_READ, "READ" },
		{ IBV_ODP_SUPPORT_ATOMIC, "ATOMIC" },
		{ IBV_ODP_SUPPORT_SRQ_RECV, "SRQ" },
		/* in rdma-core 65's <infiniband/verbs.h>, not in Debian 12's (44) */
		{ 1u << 6, "FLUSH" },          /* IBV_ODP_SUPPORT_FLUSH */
		{ 1u << 7, "ATOMIC_WRITE" },   /* IBV_ODP_SUPPORT_ATOMIC_WRITE */
	};

	return bits_text(caps, names, sizeof(names) / sizeof(names[0]), "|", buf, 64);
}

static const char *support_name(Odpd__Support s)
{
	switch (s) {
	case ODPD__SUPPORT__SUPPORT_YES: return "yes";
	case ODPD__SUPPORT__SUPPORT_NO: return "no";
	default: return "unknown";
	}
}

/* "yes", "unknown" or "no (EOPNOTSUPP)". */
static const char *support_text(Odpd__Support s, int err, char buf[static 48])
{
	if (s != ODPD__SUPPORT__SUPPORT_NO)
		return support_name(s);
	const char *name = err > 0 ? strerrorname_np(err) : NULL;
	if (name)
		snprintf(buf, 48, "no (%s)", name);
	else
		snprintf(buf, 48, "no (errno %d)", err);
	return buf;
}

static const char *yes_no(bool b)
{
	return b ? "yes" : "no";
}

/* Access bits of the wire -> "lw,rr,rw,ra". */
static const char *access_text(uint32_t access, char buf[static 48])
{
	static const struct bit_name names[] = {
		{ ODPD__ACCESS__ACCESS_LOCAL_WRITE, "lw" },
		{ ODPD__ACCESS__ACCESS_REMOTE_READ, "rr" },
		{ ODPD__ACCESS__ACCESS_REMOTE_WRITE, "rw" },
		{ ODPD__ACCESS__ACCESS_REMOTE_ATOMIC, "ra" },
	};

	return bits_text(access, names, sizeof(names) / sizeof(names[0]), ",", buf, 48);
}

static const char *mr_state_name(Odpd__MrState s)
{
	switch (s) {
	case ODPD__MR_STATE__MR_STATE_REGISTERING: return "registering";
	case ODPD__MR_STATE__MR_STATE_LIVE: return "live";
	case ODPD__MR_STATE__MR_STATE_RELAXED: return "relaxed";
	case ODPD__MR_STATE__MR_STATE_INVALIDATING: return "invalidating";
	case ODPD__MR_STATE__MR_STATE_KEPT: return "kept";
	default: return "unknown";
	}
}

static const char *mr_kind_name(Odpd__MrKind k)
{
	switch (k) {
	case ODPD__MR_KIND__MR_PINNED: return "pinned";
	case ODPD__MR_KIND__MR_ODP: return "odp";
	case ODPD__MR_KIND__MR_IMPLICIT_ODP: return "implicit_odp";
	default: return "unknown";
	}
}

/* A shared PD's name, or "(private)" for the empty name of a private PD:
 * parentheses never occur in a PD name. Tables and JSON alike. */
#define PRIVATE_PD "(private)"
static const char *pd_text(const char *name)
{
	return name && *name ? name : PRIVATE_PD;
}

/* 850 -> "850ms", 12345 -> "12.3s", 245000 -> "4m05s", then "2h03m", "3d04h". */
static const char *human_age(uint64_t ms, char buf[static HUMAN_LEN])
{
	uint64_t s = ms / 1000;

	if (ms < 1000)
		snprintf(buf, HUMAN_LEN, "%" PRIu64 "ms", ms);
	else if (s < 60)
		snprintf(buf, HUMAN_LEN, "%" PRIu64 ".%" PRIu64 "s", s, ms % 1000 / 100);
	else if (s < 3600)
		snprintf(buf, HUMAN_LEN, "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
	else if (s < 86400)
		snprintf(buf, HUMAN_LEN, "%" PRIu64 "h%02" PRIu64 "m", s / 3600, s % 3600 / 60);
	else
		snprintf(buf, HUMAN_LEN, "%" PRIu64 "d%02" PRIu64 "h", s / 86400, s % 86400 / 3600);
	return buf;
}

/* A byte limit: "unlimited" for UINT64_MAX, else as human_bytes. */
static const char *limit_text(uint64_t v, char buf[static HUMAN_LEN])
{
	return v == UINT64_MAX ? "unlimited" : human_bytes(v, buf);
}

/* The user name of @uid, or NULL if the password database does not know it. */
static const char *user_name(uint32_t uid)
{
	const struct passwd *pw = getpwuid((uid_t)uid);

	return pw && pw->pw_name && *pw->pw_name ? pw->pw_name : NULL;
}

/* ---------------------------------------------------------------- tables */

/*
 * Cells are added row by row, the first row usually being the header;
 * columns are as wide as their widest cell, two spaces apart. Control
 * characters in cells (names come from clients) are shown as '?'.
 */
#define TABLE_MAX_COLS 16

struct table {
	size_t ncols;                /* 1 .. TABLE_MAX_COLS */
	size_t ncells;
	char **cells;
};

__attribute__((format(printf, 2, 3)))
static void table_add(struct table *t, const char *fmt, ...)
{
	va_list ap;
	char *s;

	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) < 0)
		oom();
	va_end(ap);
	for (char *p = s; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';

	char **cells = realloc(t->cells, (t->ncells + 1) * sizeof(*cells));
	if (!cells)
		oom();
	t->cells = cells;
	t->cells[t->ncells++] = s;
}

/* Empty @t without printing it. */
static void table_clear(struct table *t)
{
	for (size_t i = 0; i < t->ncells; i++)
		free(t->cells[i]);
	free(t->cells);
	t->cells = NULL;
	t->ncells = 0;
}

/* Print and empty @t. A table of at most one row (its header) prints "(none)". */
static void table_print(struct table *t, const char *title)
{
	size_t width[TABLE_MAX_COLS] = { 0 };

	printf("%s:\n", title);
	if (t->ncells <= t->ncols) {
		puts("  (none)");
	} else {
		for (size_t i = 0; i < t->ncells; i++) {
			size_t len = strlen(t->cells[i]);
			if (len > width[i % t->ncols])
				width[i % t->ncols] = len;
		}
		for (size_t i = 0; i < t->ncells; i++) {
			size_t col = i % t->ncols;
			if (col == 0)
				fputs("  ", stdout);
			if (col + 1 < t->ncols)
				printf("%-*s  ", (int)width[col], t->cells[i]);
			else
				printf("%s\n", t->cells[i]);
		}
	}
	table_clear(t);
}

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

static void print_clients(const Odpd__StatusReply *st)
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

/* The registration size histogram (CacheStats.registration_sizes): bucket
 * i counts registrations of at most 4 KiB << i, the last one the larger. */
#define N_SIZE_BUCKETS 20
static const char *const size_keys[N_SIZE_BUCKETS] = {
	"4k", "8k", "16k", "32k", "64k", "128k", "256k", "512k", "1m", "2m", "4m", "8m",
	"16m", "32m", "64m", "128m", "256m", "512m", "1g", "over_1g",
};

/* Bucket @i as the daemon sent it (0 when an older daemon sent none). */
static uint64_t size_bucket(const Odpd__CacheStats *c, size_t i)
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
	table_add(&t, "Daemon PID:");
	table_add(&t, "%" PRId32, st->daemon_pid);
	table_add(&t, "Daemon version:");
	table_add(&t, "%s", st->daemon_version ? st->daemon_version : "-");
	table_print(&t, "Totals");
}

static void print_human(const Odpd__StatusReply *st)
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
static const char *iova_range(uint64_t iova, uint64_t length, char buf[static 48])
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

/* The columns of the mrs table. */
#define MRS_COLS 14

static void mrs_header(struct table *t)
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

static void mrs_row(struct table *t, const Odpd__MrInfo *m)
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

/* ------------------------------------------------------------- JSON output */

/* A new JSON object; odpctl dies without memory. */
static json_object *json_obj(void)
{
	json_object *o = json_object_new_object();

	if (!o)
		oom();
	return o;
}

static void put_u64(json_object *o, const char *key, uint64_t v)
{
	json_object_object_add(o, key, json_object_new_uint64(v));
}

/* A uint64 as a decimal string: JSON readers (jq, JavaScript) round integers
 * above 2^53. The rule for every 64-bit field (odpctl(8), JSON OUTPUT). */
static void put_u64_str(json_object *o, const char *key, uint64_t v)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%" PRIu64, v);
	json_object_object_add(o, key, json_object_new_string(buf));
}

/* An address or key as the tables show it: a hex string, "0x7f3a5c000000". */
static void put_hex(json_object *o, const char *key, uint64_t v)
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

static void put_str(json_object *o, const char *key, const char *v)
{
	json_object_object_add(o, key, json_object_new_string(v ? v : ""));
}

static void put_bool(json_object *o, const char *key, bool v)
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

static json_object *json_client(const Odpd__ClientInfo *c)
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

static json_object *json_mr(const Odpd__MrInfo *m)
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
static void json_print(json_object *root)
{
	puts(json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
					    JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(root);
}

static void print_json(const Odpd__StatusReply *st)
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

/* ----------------------------------------------------------------- talking */

/* Wait at most @sec seconds for each reply. Returns 0 or -1 after printing why. */
static int set_reply_timeout(int sock, int sec)
{
	struct timeval tv = { .tv_sec = sec };

	if (setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0) {
		fail("setsockopt(SO_RCVTIMEO)", errno, NULL);
		return -1;
	}
	return 0;
}

/* The reply timeout of @sock in seconds, for messages. */
static long reply_timeout(int sock)
{
	struct timeval tv = { .tv_sec = TIMEOUT_SEC };
	socklen_t len = sizeof(tv);

	if (getsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, &len) < 0)
		return TIMEOUT_SEC;
	return (long)tv.tv_sec;
}

/* Returns a connected socket, or -1 after printing why. */
static int connect_daemon(const char *path)
{
	struct timeval tv = { .tv_sec = TIMEOUT_SEC };
	int sock, err;
	char *what;

	if (asprintf(&what, "connect to %s", path) < 0)
		oom();
	sock = odpd_wire_connect(path);
	if (sock >= 0 && (setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
			  setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)) {
		err = errno;
		close(sock);
		sock = -err;
	}
	if (sock < 0) {
		err = -sock;
		fail(what, err, err == ENOENT || err == ECONNREFUSED ?
		     "is odpd running? (another socket: --socket or $" ODPD_SOCKET_ENV ")" : NULL);
		sock = -1;
	}
	free(what);
	return sock;
}

/*
 * Wait for the reply to request @id. Events (id 0, status 0) are skipped;
 * an error with id 0 is the daemon refusing a packet it could not read, so
 * it is ours. Returns the reply, or NULL after printing why.
 */
static Odpd__Reply *receive_reply(int sock, uint64_t id, const char *what)
{
	static uint8_t buf[ODPD_MAX_PACKET + 1];

	for (;;) {
		struct odpd_packet p;
		int r = odpd_wire_recv(sock, buf, sizeof(buf), &p, 0);

		if (r == -EAGAIN) {
			fail(what, ETIMEDOUT, "no reply from odpd within %ld s", reply_timeout(sock));
			return NULL;
		}
		if (r < 0) {
			fail(what, -r, NULL);
			return NULL;
		}
		odpd_packet_close_fds(&p);
		if (p.eof) {
			fail(what, ECONNRESET, "odpd closed the connection");
			return NULL;
		}
		if (p.truncated || p.ctrunc) {
			fail(what, EMSGSIZE, "reply larger than %u bytes or with too many fds",
			     ODPD_MAX_PACKET);
			return NULL;
		}
		Odpd__Reply *rep = odpd__reply__unpack(NULL, p.len, buf);
		if (!rep) {
			fail(what, EBADMSG, "cannot parse odpd's reply");
			return NULL;
		}
		if (rep->id == id || (rep->id == 0 && rep->status != 0))
			return rep;
		if (rep->id != 0) {
			fail(what, EBADMSG, "reply to request %" PRIu64 ", expected %" PRIu64,
			     rep->id, id);
			odpd__reply__free_unpacked(rep, NULL);
			return NULL;
		}
		odpd__reply__free_unpacked(rep, NULL);
	}
}

/* The requests odpctl sends that the daemon answers only for admins. */
static bool is_admin_request(Odpd__Request__BodyCase c)
{
	return c == ODPD__REQUEST__BODY_STATUS || c == ODPD__REQUEST__BODY_LIST_MRS ||
	       c == ODPD__REQUEST__BODY_FLUSH;
}

/*
 * Send @req, wait for its reply, check its status and that it carries a
 * @want body. Returns the reply, or NULL after printing why.
 */
static Odpd__Reply *call(int sock, Odpd__Request *req, const char *what,
			 Odpd__Reply__BodyCase want)
{
	int r = odpd_wire_send(sock, &req->base, NULL, 0, 0);
	if (r < 0) {
		fail(what, r == -EAGAIN ? ETIMEDOUT : -r, NULL);
		return NULL;
	}

	Odpd__Reply *rep = receive_reply(sock, req->id, what);
	if (!rep)
		return NULL;
	if (rep->status != 0) {
		const char *msg = rep->message ? rep->message : "";

		fail(what, rep->status, *msg ? "%s" : NULL, msg);
		if (rep->status == EPERM && (is_admin_request(req->body_case) ||
					     req->body_case == ODPD__REQUEST__BODY_HELLO))
			fputs("odpctl: run odpctl as root or as a member of odpd's admin group "
			      "(odpd --admin-group)\n", stderr);
	} else if (rep->body_case != want) {
		fail(what, EBADMSG, "odpd's reply lacks the expected body");
	} else {
		return rep;
	}
	odpd__reply__free_unpacked(rep, NULL);
	return NULL;
}

static int hello(int sock)
{
	Odpd__Hello body = ODPD__HELLO__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Reply *rep;

	body.has_version = true;
	body.version = ODPD_PROTOCOL_VERSION;
	body.client_name = (char *)"odpctl";
	body.has_monitor = true;             /* not listed as a client */
	body.monitor = true;
	req.has_id = true;
	req.id = 1;
	req.body_case = ODPD__REQUEST__BODY_HELLO;
	req.hello = &body;

	rep = call(sock, &req, "hello", ODPD__REPLY__BODY_HELLO);
	if (!rep)
		return -1;
	if (rep->hello->version != ODPD_PROTOCOL_VERSION) {
		fail("hello", EPROTONOSUPPORT, "odpd speaks protocol versions %" PRIu32
		     "..%" PRIu32 ", odpctl speaks %u", rep->hello->version_min,
		     rep->hello->version_max, ODPD_PROTOCOL_VERSION);
		odpd__reply__free_unpacked(rep, NULL);
		return -1;
	}
	odpd__reply__free_unpacked(rep, NULL);
	return 0;
}

static int client_cmp(const void *a, const void *b)
{
	const Odpd__ClientInfo *x = *(Odpd__ClientInfo *const *)a, *y = *(Odpd__ClientInfo *const *)b;

	return x->id < y->id ? -1 : x->id > y->id;
}

/* Status, for the commands that show a part of it; its clients sorted by id. */
static Odpd__Reply *status_call(int sock)
{
	Odpd__Status body = ODPD__STATUS__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Reply *rep;

	req.has_id = true;
	req.id = 2;
	req.body_case = ODPD__REQUEST__BODY_STATUS;
	req.status = &body;
	rep = call(sock, &req, "status", ODPD__REPLY__BODY_STATUS_REPLY);
	if (rep && rep->status_reply->n_clients > 1)
		qsort(rep->status_reply->clients, rep->status_reply->n_clients,
		      sizeof(rep->status_reply->clients[0]), client_cmp);
	return rep;
}

static int cmd_status(int sock, const struct options *o)
{
	Odpd__Reply *rep = status_call(sock);

	if (!rep)
		return EXIT_FAILURE;
	if (o->json)
		print_json(rep->status_reply);
	else
		print_human(rep->status_reply);
	odpd__reply__free_unpacked(rep, NULL);
	return EXIT_SUCCESS;
}

/* One page of ListMrs (the filters of @o) after @after (none: the first),
 * or NULL after printing why. */
static Odpd__Reply *list_mrs(int sock, const struct options *o, uint64_t id, const uint64_t *after,
			     const char *what)
{
	Odpd__ListMrs body = ODPD__LIST_MRS__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;

	body.has_pid = o->has_pid;
	body.pid = o->pid;
	body.pd = (char *)o->pd;
	body.has_after = after != NULL;
	body.after = after ? *after : 0;
	req.has_id = true;
	req.id = id;
	req.body_case = ODPD__REQUEST__BODY_LIST_MRS;
	req.list_mrs = &body;
	return call(sock, &req, what, ODPD__REPLY__BODY_MRS);
}

/*
 * Ask for the page of MRs after @after (none: the first page) and add its
 * MRs to @t or, with --json, to @list. Returns the reply (the caller frees
 * it), or NULL after printing why.
 */
static Odpd__Reply *mrs_page(int sock, const struct options *o, uint64_t id, const uint64_t *after,
			     struct table *t, json_object *list)
{
	Odpd__Reply *rep = list_mrs(sock, o, id, after, "mrs");

	if (!rep)
		return NULL;
	for (size_t i = 0; i < rep->mrs->n_mrs; i++) {
		if (list)
			json_object_array_add(list, json_mr(rep->mrs->mrs[i]));
		else
			mrs_row(t, rep->mrs->mrs[i]);
	}
	return rep;
}

/* ListMrs page by page (after = the last id while more), then one table or
 * one JSON object {"mrs": [...]}. */
static int cmd_mrs(int sock, const struct options *o)
{
	struct table t = { .ncols = MRS_COLS };
	json_object *list = NULL;
	uint64_t id = 2, after = 0;
	bool have_after = false, more = true;

	if (o->json) {
		list = json_object_new_array();
		if (!list)
			oom();
	} else {
		mrs_header(&t);
	}
	while (more) {
		Odpd__Reply *rep = mrs_page(sock, o, id++, have_after ? &after : NULL, &t, list);
		const Odpd__MrsReply *m;

		if (!rep)
			goto fail;
		m = rep->mrs;
		more = m->more;
		/* A page that does not move the cursor would be asked for forever. */
		if (more && (m->n_mrs == 0 || (have_after && m->mrs[m->n_mrs - 1]->id <= after))) {
			fail("mrs", EBADMSG, "odpd announces more MRs but its page does not "
			     "go past id %" PRIu64, after);
			odpd__reply__free_unpacked(rep, NULL);
			goto fail;
		}
		if (more) {
			after = m->mrs[m->n_mrs - 1]->id;
			have_after = true;
		}
		odpd__reply__free_unpacked(rep, NULL);
	}

	if (list) {
		json_object *root = json_obj();

		json_object_object_add(root, "mrs", list);
		json_print(root);
	} else {
		table_print(&t, "MRs");
	}
	return EXIT_SUCCESS;

fail:
	json_object_put(list);
	table_clear(&t);
	return EXIT_FAILURE;
}

/* Flush: all without a filter, else pid and/or pd. A barrier: the reply
 * comes when every selected MR is deregistered, hence the long timeout. */
static int cmd_flush(int sock, const struct options *o)
{
	Odpd__Flush body = ODPD__FLUSH__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Reply *rep;
	char b[HUMAN_LEN];

	body.has_all = !o->has_pid && !o->pd;
	body.all = body.has_all;
	body.has_pid = o->has_pid;
	body.pid = o->pid;
	body.pd = (char *)o->pd;
	req.has_id = true;
	req.id = 2;
	req.body_case = ODPD__REQUEST__BODY_FLUSH;
	req.flush = &body;

	if (set_reply_timeout(sock, FLUSH_TIMEOUT_SEC) < 0)
		return EXIT_FAILURE;
	rep = call(sock, &req, "flush", ODPD__REPLY__BODY_FLUSH);
	if (!rep)
		return EXIT_FAILURE;
	if (o->json) {
		json_object *root = json_obj();

		put_u64(root, "mrs", rep->flush->mrs);
		put_u64_str(root, "bytes", rep->flush->bytes);
		json_print(root);
	} else {
		printf("flushed %" PRIu32 " MRs, %s\n", rep->flush->mrs, human_bytes(rep->flush->bytes, b));
	}
	odpd__reply__free_unpacked(rep, NULL);
	return EXIT_SUCCESS;
}

/*
 * Verify: every live (held) MR of a daemon PD that --pid/--pd select, read
 * back through the MR by the HCA (odpd's verify: RDMA READ, or WRITE from
 * the lkey for local-only MRs); prints each one's CRC-32, or why it could
 * not be read. Fails (status 1) if any could not.
 */
static int cmd_verify(int sock, const struct options *o)
{
	struct table t = { .ncols = 6 };
	json_object *list = o->json ? json_object_new_array() : NULL;
	uint64_t after = 0, id = 10;
	bool more = true, first = true;
	unsigned failed = 0, done = 0;

	if (o->json && !list)
		oom();
	table_add(&t, "ID");
	table_add(&t, "IOVA");
	table_add(&t, "LENGTH");
	table_add(&t, "KIND");
	table_add(&t, "CRC32");
	table_add(&t, "HOW");
	if (set_reply_timeout(sock, FLUSH_TIMEOUT_SEC) < 0)
		goto fail;
	while (more) {
		Odpd__Reply *page = list_mrs(sock, o, ++id, first ? NULL : &after, "verify: list");

		if (!page)
			goto fail;
		for (size_t i = 0; i < page->mrs->n_mrs; i++) {
			const Odpd__MrInfo *m = page->mrs->mrs[i];
			Odpd__AdminVerify vb = ODPD__ADMIN_VERIFY__INIT;
			Odpd__Request vr = ODPD__REQUEST__INIT;
			Odpd__Reply *rep;
			char what[64], crc[16] = "-", how[160];

			after = m->id;
			if ((m->state != ODPD__MR_STATE__MR_STATE_LIVE && m->state != ODPD__MR_STATE__MR_STATE_KEPT) ||
			    m->kind == ODPD__MR_KIND__MR_IMPLICIT_ODP)
				continue;
			vb.has_mr_id = true;
			vb.mr_id = m->id;
			vr.has_id = true;
			vr.id = ++id;
			vr.body_case = ODPD__REQUEST__BODY_ADMIN_VERIFY;
			vr.admin_verify = &vb;
			snprintf(what, sizeof(what), "verify MR %" PRIu64, m->id);
			rep = call(sock, &vr, what, ODPD__REPLY__BODY_VERIFY);
			done++;
			if (rep) {
				snprintf(crc, sizeof(crc), "%08" PRIx32, rep->verify->crc32);
				snprintf(how, sizeof(how), "%s", rep->verify->method ? rep->verify->method : "");
			} else {
				failed++;
				if (fail_status == EXIT_DENIED || fail_status == EXIT_NOT_RUNNING) {
					odpd__reply__free_unpacked(page, NULL);
					goto fail;
				}
				snprintf(how, sizeof(how), "failed (see above)");
			}
			if (list) {
				json_object *e = json_obj();

				put_u64_str(e, "id", m->id);
				put_hex(e, "iova", m->iova);
				put_u64_str(e, "length", m->length);
				put_str(e, "kind", mr_kind_name(m->kind));
				put_str(e, "crc32", rep ? crc : "");
				put_str(e, "method", rep ? how : "");
				put_bool(e, "ok", rep != NULL);
				json_object_array_add(list, e);
			} else {
				char b1[48], b2[HUMAN_LEN];

				table_add(&t, "%" PRIu64, m->id);
				table_add(&t, "%s", iova_range(m->iova, m->length, b1));
				table_add(&t, "%s", human_bytes(m->length, b2));
				table_add(&t, "%s", mr_kind_name(m->kind));
				table_add(&t, "%s", crc);
				table_add(&t, "%s", how);
			}
			odpd__reply__free_unpacked(rep, NULL);
		}
		more = page->mrs->more;
		first = false;
		odpd__reply__free_unpacked(page, NULL);
	}
	if (list) {
		json_print(list);
		table_clear(&t);                 /* its header only */
	} else {
		table_print(&t, "Verified MRs");
	}
	if (!o->json)
		printf("%u MR(s) read back, %u failed\n", done - failed, failed);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
fail:
	table_clear(&t);
	json_object_put(list);                   /* NULL: nothing */
	return EXIT_FAILURE;
}

/* Reload: odpd reads its configuration file again. */
static int cmd_reload(int sock, const struct options *o)
{
	Odpd__Reload body = ODPD__RELOAD__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Reply *rep;

	req.has_id = true;
	req.id = 2;
	req.body_case = ODPD__REQUEST__BODY_RELOAD;
	req.reload = &body;
	rep = call(sock, &req, "reload", ODPD__REPLY__BODY_RELOAD);
	if (!rep)
		return EXIT_FAILURE;
	if (o->json) {
		json_object *root = json_obj();

		put_str(root, "summary", rep->reload->summary);
		json_print(root);
	} else {
		printf("reloaded %s\n", rep->reload->summary ? rep->reload->summary : "");
	}
	odpd__reply__free_unpacked(rep, NULL);
	return EXIT_SUCCESS;
}

static int cmd_clients(int sock, const struct options *o)
{
	Odpd__Reply *rep = status_call(sock);
	const Odpd__StatusReply *st;

	if (!rep)
		return EXIT_FAILURE;
	st = rep->status_reply;
	if (o->json) {
		json_object *list = json_object_new_array();

		if (!list)
			oom();
		for (size_t i = 0; i < st->n_clients; i++)
			json_object_array_add(list, json_client(st->clients[i]));
		json_print(list);
	} else {
		print_clients(st);
	}
	odpd__reply__free_unpacked(rep, NULL);
	return EXIT_SUCCESS;
}

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

static int cmd_stats(int sock, const struct options *o)
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

/* -------------------------------------------------------------------- main */

struct command {
	const char *name;
	int (*run)(int sock, const struct options *o);
	bool filters;                /* takes --pid and --pd */
	const char *args;            /* its options, for its --help */
	const char *help;            /* what it does, for its --help */
};

static const struct command commands[] = {
	{ "status", cmd_status, false, "[-j]",
	  "Show odpd's devices, connected clients (by id), shared PDs, pinning quotas,\n"
	  "registration cache and on-demand paging counters, and totals.\n" },
	{ "mrs", cmd_mrs, true, "[-j] [--pid PID] [--pd NAME]",
	  "List the MRs of odpd's registration cache: range, length, access, kind,\n"
	  "keys, holders, state, generation. --pid: those process PID holds or last\n"
	  "released; --pd: those of the shared PD NAME.\n" },
	{ "flush", cmd_flush, true, "[-j] [--pid PID] [--pd NAME]",
	  "Deregister relaxed MRs (released, kept registered for reuse) now and wait\n"
	  "until they are (up to 120 s); prints the MRs and bytes released. MRs that\n"
	  "clients hold are not touched. --pid, --pd: only the relaxed MRs of that\n"
	  "process or shared PD.\n" },
	{ "clients", cmd_clients, false, "[-j]",
	  "List the connected clients, by id: pid, uid, name, PD, segments, MRs,\n"
	  "relaxed MRs, pinned bytes (ODP MRs pin nothing and count in no PINNED).\n" },
	{ "verify", cmd_verify, true, "[-j] [--pid PID] [--pd NAME]",
	  "Read every live MR of every client (or those --pid and --pd select) back\n"
	  "through the HCA (RDMA READ, or WRITE from the lkey for local-only MRs) and\n"
	  "print its CRC-32. This reads all of the registered memory over the device:\n"
	  "on a busy production node it takes bandwidth and time. Exit status 1 if\n"
	  "any MR could not be read.\n" },
	{ "stats", cmd_stats, false, "[-j | --prometheus]",
	  "Print odpd's counters as one flat set (the same numbers as its D-Bus\n"
	  "properties); --prometheus: the Prometheus text format, for node_exporter's\n"
	  "textfile collector.\n" },
	{ "reload", cmd_reload, false, "[-j]",
	  "Make odpd read its configuration file again (as SIGHUP does). On an error\n"
	  "in the file odpd keeps the configuration in use; odpctl prints FILE:LINE\n"
	  "and exits 1.\n" },
};

/* "odpctl CMD --help". */
static void command_usage(const struct command *c)
{
	printf("Usage: odpctl [-s PATH] %s %s\n\n%s\n"
	       "  -s, --socket PATH odpd's socket (default: $%s, else %s)\n"
	       "  -j, --json        print JSON instead of tables\n%s%s"
	       "\nSee odpctl(8).\n", c->name, c->args, c->help, ODPD_SOCKET_ENV, ODPD_SOCKET_DEFAULT,
	       c->filters ? "      --pid PID     only the MRs of process PID\n"
			    "      --pd NAME     only the MRs of the shared PD NAME\n" : "",
	       c->run == cmd_stats ? "      --prometheus  the Prometheus text format\n" : "");
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: odpctl [OPTIONS] COMMAND\n"
		"\n"
		"Show the state of the odpd RDMA registration daemon, flush its cache.\n"
		"\n"
		"Commands (admin: root or odpd --admin-group):\n"
		"  status            devices, clients, shared PDs, pinning quotas,\n"
		"                    registration cache and totals\n"
		"  mrs               the MRs of the registration cache\n"
		"  flush             deregister relaxed MRs now and wait until they are;\n"
		"                    prints the MRs and bytes released\n"
		"  clients           the connected clients\n"
		"  stats             the daemon's counters (also on D-Bus: org.odpd1)\n"
		"  verify            read every live MR of every client back through the\n"
		"                    HCA (CRC-32): reads all registered memory\n"
		"  reload            re-read odpd's configuration file (as SIGHUP does)\n"
		"\n"
		"Options:\n"
		"  -s, --socket PATH odpd's socket (default: $%s, else %s)\n"
		"  -j, --json        print one JSON object instead of tables\n"
		"      --pid PID     mrs, flush, verify: only the MRs of process PID\n"
		"      --pd NAME     mrs, flush, verify: only the MRs of the shared PD NAME\n"
		"      --prometheus  stats: the Prometheus text format (node_exporter's\n"
		"                    textfile collector)\n"
		"  -h, --help        show this help; COMMAND --help: that command's\n"
		"  -V, --version     show the version\n"
		"\n"
		"Exit status: 0 done, 1 refused by odpd (or another failure), 2 usage,\n"
		"3 odpd not running, 4 access denied. See odpctl(8).\n",
		ODPD_SOCKET_ENV, ODPD_SOCKET_DEFAULT);
}

/* --pid: a decimal process id, 1 .. INT32_MAX. */
static int parse_pid(const char *s, int32_t *ret)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || *s == '-' || *s == '+' || v < 1 || v > INT32_MAX) {
		fprintf(stderr, "odpctl: --pid: '%s' is not a process id\n", s);
		return -1;
	}
	*ret = (int32_t)v;
	return 0;
}

/* --pd: 1..63 bytes of [A-Za-z0-9._:@-], as JoinPd.name. */
static int check_pd_name(const char *s)
{
	size_t len = strlen(s);

	if (len >= 1 && len <= PD_NAME_MAX &&
	    strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:@-") == len)
		return 0;
	fprintf(stderr, "odpctl: --pd: '%s' is not a shared PD name "
		"(1..%d bytes of A-Z a-z 0-9 . _ : @ -)\n", s, PD_NAME_MAX);
	return -1;
}

/* Returns -1 to exit with EXIT_USAGE, 1 to exit with 0, 0 to go on. */
static int parse_args(int argc, char **argv, struct options *o)
{
	enum { OPT_PID = 0x100, OPT_PD, OPT_PROMETHEUS };
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },
		{ "pid", required_argument, NULL, OPT_PID },
		{ "pd", required_argument, NULL, OPT_PD },
		{ "prometheus", no_argument, NULL, OPT_PROMETHEUS },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	bool help = false;
	int c;

	while ((c = getopt_long(argc, argv, "s:jhV", longopts, NULL)) != -1) {
		switch (c) {
		case 's':
			if (!*optarg) {
				fputs("odpctl: --socket: empty path\n", stderr);
				return -1;
			}
			o->socket = optarg;
			break;
		case 'j':
			o->json = true;
			break;
		case OPT_PID:
			if (parse_pid(optarg, &o->pid) < 0)
				return -1;
			o->has_pid = true;
			break;
		case OPT_PD:
			if (check_pd_name(optarg) < 0)
				return -1;
			o->pd = optarg;
			break;
		case OPT_PROMETHEUS:
			o->prometheus = true;
			break;
		case 'h':
			help = true;
			break;
		case 'V':
			printf("odpctl %s (protocol %u)\n", ODPD_VERSION, ODPD_PROTOCOL_VERSION);
			return 1;
		default:
			return -1;
		}
	}
	if (help && optind >= argc) {
		usage(stdout);
		return 1;
	}
	if (optind >= argc) {
		fputs("odpctl: no command given\n", stderr);
		return -1;
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (strcmp(argv[optind], commands[i].name) == 0)
			o->cmd = &commands[i];
	if (!o->cmd) {
		fprintf(stderr, "odpctl: unknown command '%s'\n", argv[optind]);
		return -1;
	}
	if (help) {
		command_usage(o->cmd);
		return 1;
	}
	if (optind + 1 < argc) {
		fprintf(stderr, "odpctl: %s: unexpected argument '%s'\n", o->cmd->name,
			argv[optind + 1]);
		return -1;
	}
	if (o->prometheus && (o->cmd->run != cmd_stats || o->json)) {
		fprintf(stderr, "odpctl: %s: --prometheus applies only to stats, without --json\n",
			o->cmd->name);
		return -1;
	}
	if (!o->cmd->filters && (o->has_pid || o->pd)) {
		fprintf(stderr, "odpctl: %s: --pid and --pd apply only to mrs, flush and verify\n",
			o->cmd->name);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct options o = { 0 };
	int r, sock;

	/* getopt's complaints name argv[0]: the program, not its path */
	argv[0] = program_invocation_short_name;
	r = parse_args(argc, argv, &o);
	if (r < 0) {
		fputs("Try 'odpctl --help'.\n", stderr);
		return EXIT_USAGE;
	}
	if (r > 0)
		return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
	if (!o.socket) {
		o.socket = getenv(ODPD_SOCKET_ENV);
		if (!o.socket || !*o.socket)
			o.socket = ODPD_SOCKET_DEFAULT;     /* unset or empty: the default */
	}

	sock = connect_daemon(o.socket);
	if (sock < 0)
		return fail_status;
	r = hello(sock) < 0 ? EXIT_FAILURE : o.cmd->run(sock, &o);
	close(sock);
	if (r != EXIT_SUCCESS)
		r = fail_status;

	errno = 0;
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fail("stdout", errno ? errno : EIO, NULL);
		return EXIT_FAILURE;
	}
	return r;
}
