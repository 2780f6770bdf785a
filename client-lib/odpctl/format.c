/* SPDX-License-Identifier: MIT */
/* format.c - formatting of values, and the tables of the human output. */
#include "odpctl.h"

int fail_status = EXIT_REFUSED;

void oom(void)
{
	fputs("odpctl: out of memory\n", stderr);
	exit(EXIT_FAILURE);
}

/* "odpctl: <what>: <strerror(err)>[: <fmt...>]" on stderr. */
__attribute__((format(printf, 3, 4)))
void fail(const char *what, int err, const char *fmt, ...)
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

/* 1536 -> "1.5 KiB", 4294967296 -> "4 GiB". */
const char *human_bytes(uint64_t v, char buf[static HUMAN_LEN])
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
const char *odp_caps(uint32_t caps, char buf[static 64])
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

const char *support_name(Odpd__Support s)
{
	switch (s) {
	case ODPD__SUPPORT__SUPPORT_YES: return "yes";
	case ODPD__SUPPORT__SUPPORT_NO: return "no";
	default: return "unknown";
	}
}

/* "yes", "unknown" or "no (EOPNOTSUPP)". */
const char *support_text(Odpd__Support s, int err, char buf[static 48])
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

const char *yes_no(bool b)
{
	return b ? "yes" : "no";
}

/* Access bits of the wire -> "lw,rr,rw,ra". */
const char *access_text(uint32_t access, char buf[static 48])
{
	static const struct bit_name names[] = {
		{ ODPD__ACCESS__ACCESS_LOCAL_WRITE, "lw" },
		{ ODPD__ACCESS__ACCESS_REMOTE_READ, "rr" },
		{ ODPD__ACCESS__ACCESS_REMOTE_WRITE, "rw" },
		{ ODPD__ACCESS__ACCESS_REMOTE_ATOMIC, "ra" },
	};

	return bits_text(access, names, sizeof(names) / sizeof(names[0]), ",", buf, 48);
}

const char *mr_state_name(Odpd__MrState s)
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

const char *mr_kind_name(Odpd__MrKind k)
{
	switch (k) {
	case ODPD__MR_KIND__MR_PINNED: return "pinned";
	case ODPD__MR_KIND__MR_ODP: return "odp";
	case ODPD__MR_KIND__MR_IMPLICIT_ODP: return "implicit_odp";
	default: return "unknown";
	}
}

const char *pd_text(const char *name)
{
	return name && *name ? name : PRIVATE_PD;
}

/* 850 -> "850ms", 12345 -> "12.3s", 245000 -> "4m05s", then "2h03m", "3d04h". */
const char *human_age(uint64_t ms, char buf[static HUMAN_LEN])
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
const char *limit_text(uint64_t v, char buf[static HUMAN_LEN])
{
	return v == UINT64_MAX ? "unlimited" : human_bytes(v, buf);
}

/* The user name of @uid, or NULL if the password database does not know it. */
const char *user_name(uint32_t uid)
{
	const struct passwd *pw = getpwuid((uid_t)uid);

	return pw && pw->pw_name && *pw->pw_name ? pw->pw_name : NULL;
}

/* ---------------------------------------------------------------- tables */

__attribute__((format(printf, 2, 3)))
void table_add(struct table *t, const char *fmt, ...)
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
void table_clear(struct table *t)
{
	for (size_t i = 0; i < t->ncells; i++)
		free(t->cells[i]);
	free(t->cells);
	t->cells = NULL;
	t->ncells = 0;
}

/* Print and empty @t. A table of at most one row (its header) prints "(none)". */
void table_print(struct table *t, const char *title)
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
