/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "quota.h"
#include "segment.h"

int odpd_parse_memlock(const char *text, uint64_t *ret)
{
	const char *line = strstr(text, "Max locked memory");
	char soft[32];

	if (!line || sscanf(line + strlen("Max locked memory"), " %31s", soft) != 1)
		return -EINVAL;
	if (strcmp(soft, "unlimited") == 0) {
		*ret = ODPD_UNLIMITED;
		return 0;
	}
	char *end;
	errno = 0;
	unsigned long long v = strtoull(soft, &end, 10);
	if (errno || end == soft || *end)
		return -EINVAL;
	*ret = v;
	return 0;
}

static int read_text(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	size_t len = 0;
	ssize_t n;

	if (fd < 0)
		return -errno;
	while (len < cap - 1 && (n = read(fd, buf + len, cap - 1 - len)) > 0)
		len += (size_t)n;
	close(fd);
	buf[len] = 0;
	return 0;
}

/* The cgroup v2 path of @pid ("0::/a/b" in /proc/PID/cgroup), or "". */
static void read_cgroup(pid_t pid, char *buf, size_t cap)
{
	char path[64], text[4096];
	const char *p;

	buf[0] = 0;
	snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	if (read_text(path, text, sizeof(text)) < 0)
		return;
	p = strstr(text, "0::");
	if (p && (p == text || p[-1] == '\n'))
		snprintf(buf, cap, "%.*s", (int)strcspn(p + 3, "\n"), p + 3);
}

/* Does /proc/PID/status say the process holds CAP_IPC_LOCK (effective)? */
static bool has_ipc_lock(const char *status_text)
{
	const char *p = strstr(status_text, "\nCapEff:");
	unsigned long long caps;

	return p && sscanf(p + strlen("\nCapEff:"), " %llx", &caps) == 1 && (caps >> 14) & 1;
}

static uint64_t clamp(uint64_t v, uint64_t lo, uint64_t hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

static uint64_t map_count(const struct odpd_budget *b)
{
	return b->max_map_count ? b->max_map_count : ODPD_MAX_MAP_COUNT_DEFAULT;
}

void odpd_budget_user_defaults(const struct odpd_conf *c, const struct odpd_budget *b,
			       uint64_t ret[ODPD_N_UL])
{
	const uint64_t half = b->nofile / 4 / 2;     /* of a quarter of the fds */

	for (int k = 0; k < ODPD_N_UL; k++)
		ret[k] = c->user_default[k];
	if (ret[ODPD_UL_CONNECTIONS] == ODPD_LIMIT_AUTO)
		ret[ODPD_UL_CONNECTIONS] = b->nofile ? clamp(half / ODPD_FDS_PER_CONNECTION, 1, 64) : 64;
	if (ret[ODPD_UL_SEGMENTS] == ODPD_LIMIT_AUTO)
		ret[ODPD_UL_SEGMENTS] = b->nofile ? clamp(half, 1, 1024) : 1024;
	if (ret[ODPD_UL_MAPPED] == ODPD_MAPPED_QUARTER_WINDOW)
		ret[ODPD_UL_MAPPED] = b->window_size / 4;
	if (ret[ODPD_UL_MAPPINGS] == ODPD_LIMIT_AUTO)
		ret[ODPD_UL_MAPPINGS] = clamp(map_count(b) / 4, 1, UINT64_MAX);
}

/* How the auto default of @k was worked out, for messages. */
static void auto_src(const struct odpd_budget *b, int k, char *buf, size_t cap)
{
	if (k == ODPD_UL_MAPPED)
		snprintf(buf, cap, "default-mapped = window: a quarter of odpd's window");
	else if (k == ODPD_UL_MAPPINGS)
		snprintf(buf, cap, "default-mappings = auto: a quarter of vm.max_map_count %" PRIu64,
			 map_count(b));
	else if (b->nofile)
		snprintf(buf, cap, "default-%s = auto: from odpd's fd limit of %" PRIu64,
			 odpd_user_limit_names[k], b->nofile);
	else
		snprintf(buf, cap, "default-%s = auto", odpd_user_limit_names[k]);
}

/* The fds a user may make odpd hold under @conns connections and @segs segments. */
static uint64_t fds_of(uint64_t conns, uint64_t segs)
{
	if (conns == ODPD_UNLIMITED || segs == ODPD_UNLIMITED ||
	    conns > (UINT64_MAX - segs) / ODPD_FDS_PER_CONNECTION)
		return ODPD_UNLIMITED;
	return conns * ODPD_FDS_PER_CONNECTION + segs;
}

static void warn_fds(const struct odpd_budget *b, const char *who, uint64_t conns, uint64_t segs)
{
	uint64_t fds = fds_of(conns, segs);

	if (!b->nofile || fds <= b->nofile / 4)
		return;
	if (fds == ODPD_UNLIMITED)
		log_warning("odpd.conf: %s let one user hold any number of odpd's %" PRIu64 " fds "
			    "(unlimited): the others may be refused when it does", who, b->nofile);
	else
		log_warning("odpd.conf: %s let one user hold up to %" PRIu64 " of odpd's %" PRIu64
			    " fds (%" PRIu64 " connections at %d, %" PRIu64 " segments), more than a "
			    "quarter: the others may be refused when it does", who, fds, b->nofile, conns,
			    ODPD_FDS_PER_CONNECTION, segs);
}

static void warn_mappings(const struct odpd_budget *b, const char *who, uint64_t n)
{
	if (n == ODPD_UNLIMITED)
		log_warning("odpd.conf: %s lets one user make odpd hold any number of mappings "
			    "(vm.max_map_count %" PRIu64 "): the others may be refused when it does",
			    who, map_count(b));
	else if (n > map_count(b) / 4)
		log_warning("odpd.conf: %s lets one user make odpd hold %" PRIu64 " mappings, more "
			    "than a quarter of vm.max_map_count %" PRIu64 ": the others may be refused "
			    "when it does", who, n, map_count(b));
}

void odpd_budget_warn(const struct odpd_conf *c, const struct odpd_budget *b)
{
	uint64_t def[ODPD_N_UL];
	char who[160];

	odpd_budget_user_defaults(c, b, def);
	if (c->user_default[ODPD_UL_CONNECTIONS] != ODPD_LIMIT_AUTO ||
	    c->user_default[ODPD_UL_SEGMENTS] != ODPD_LIMIT_AUTO)
		warn_fds(b, "[limits] default-connections and default-segments", def[ODPD_UL_CONNECTIONS],
			 def[ODPD_UL_SEGMENTS]);
	if (c->user_default[ODPD_UL_MAPPINGS] != ODPD_LIMIT_AUTO)
		warn_mappings(b, "[limits] default-mappings", def[ODPD_UL_MAPPINGS]);
	for (unsigned i = 0; i < c->n_rules; i++) {
		const struct odpd_rule *r = &c->rules[i];

		if (r->has[ODPD_UL_CONNECTIONS] || r->has[ODPD_UL_SEGMENTS]) {
			snprintf(who, sizeof(who), "%s (line %u) max-connections and max-segments",
				 r->label, r->line);
			warn_fds(b, who, r->has[ODPD_UL_CONNECTIONS] ? r->max[ODPD_UL_CONNECTIONS] :
				 def[ODPD_UL_CONNECTIONS], r->has[ODPD_UL_SEGMENTS] ?
				 r->max[ODPD_UL_SEGMENTS] : def[ODPD_UL_SEGMENTS]);
		}
		if (r->has[ODPD_UL_MAPPINGS]) {
			snprintf(who, sizeof(who), "%s (line %u) max-mappings", r->label, r->line);
			warn_mappings(b, who, r->max[ODPD_UL_MAPPINGS]);
		}
	}
}

uint64_t odpd_max_map_count(void)
{
	char text[64];
	unsigned long long v;

	if (read_text("/proc/sys/vm/max_map_count", text, sizeof(text)) < 0 ||
	    sscanf(text, "%llu", &v) != 1)
		return 0;
	return v;
}

int odpd_limit_for_client(const struct odpd_conf *conf, pid_t pid, int pidfd, uid_t uid, gid_t gid,
			  const gid_t *groups, unsigned n_groups, const struct odpd_budget *budget,
			  struct odpd_limit *ret)
{
	const struct odpd_rule *rule;
	char path[64], text[4096], cgroup[1024];
	uint64_t memlock, def[ODPD_N_UL];
	int r;

	read_cgroup(pid, cgroup, sizeof(cgroup));
	odpd_budget_user_defaults(conf, budget, def);
	for (int k = 0; k < ODPD_N_UL; k++) {
		rule = odpd_conf_match_rule_for(conf, k, uid, gid, groups, n_groups, cgroup);
		if (rule) {
			ret->max[k] = rule->max[k];
			snprintf(ret->src[k], sizeof(ret->src[k]), "%s max-%s in odpd.conf", rule->label,
				 odpd_user_limit_names[k]);
		} else if (conf->user_default[k] == ODPD_LIMIT_AUTO) {
			ret->max[k] = def[k];
			auto_src(budget, k, ret->src[k], sizeof(ret->src[k]));
		} else {
			ret->max[k] = def[k];
			snprintf(ret->src[k], sizeof(ret->src[k]), "default-%s in odpd.conf",
				 odpd_user_limit_names[k]);
		}
	}
	rule = odpd_conf_match_rule_for(conf, ODPD_RULE_KEY_REMOTE, uid, gid, groups, n_groups, cgroup);
	ret->remote_access = rule && rule->remote_access;
	rule = odpd_conf_match_rule(conf, uid, gid, groups, n_groups, cgroup);
	if (rule) {
		ret->max_pinned = rule->max_pinned;
		snprintf(ret->rule, sizeof(ret->rule), "%s", rule->label);
	} else if (!conf->default_pinned_memlock) {
		ret->max_pinned = conf->default_pinned;
		snprintf(ret->rule, sizeof(ret->rule), "default-pinned");
	} else {
		snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
		if (read_text(path, text, sizeof(text)) < 0)
			return -ESRCH;
		if (has_ipc_lock(text)) {
			/* It could pin without limit itself: so it may here. */
			ret->max_pinned = ODPD_UNLIMITED;
			snprintf(ret->rule, sizeof(ret->rule), "CAP_IPC_LOCK");
			goto check;
		}
		snprintf(path, sizeof(path), "/proc/%d/limits", (int)pid);
		r = read_text(path, text, sizeof(text));
		if (r < 0)
			return -ESRCH;
		if (odpd_parse_memlock(text, &memlock) < 0)
			return -ESRCH;
		ret->max_pinned = memlock;
		snprintf(ret->rule, sizeof(ret->rule), "memlock");
	}
check:
	/* The pid named the client only if it is still running now. */
	if (!odpd_pidfd_alive(pidfd))
		return -ESRCH;
	return 0;
}

int odpd_account_may(const struct odpd_account *a, const struct odpd_limit *lim, enum odpd_user_limit l,
		     uint64_t n, struct odpd_err *err)
{
	static const int code[ODPD_N_UL] = {
		[ODPD_UL_CONNECTIONS] = EMFILE, [ODPD_UL_SEGMENTS] = EMFILE,
		[ODPD_UL_MAPPED] = ENOSPC, [ODPD_UL_MRS] = EDQUOT,
		[ODPD_UL_REGISTRAR_WAITS] = EAGAIN,      /* try again once one is answered */
		[ODPD_UL_MAPPINGS] = ENOMEM,
	};
	static const char *const what[ODPD_N_UL] = {
		[ODPD_UL_CONNECTIONS] = "connections", [ODPD_UL_SEGMENTS] = "attached segments",
		[ODPD_UL_MAPPED] = "bytes of odpd's address window", [ODPD_UL_MRS] = "MR references",
		[ODPD_UL_REGISTRAR_WAITS] = "implicit-ODP requests waiting for a registrar",
		[ODPD_UL_MAPPINGS] = "mappings in odpd (segments, hit tables)",
	};
	uint64_t max = lim->max[l], held = a->held[l];

	if (max == ODPD_UNLIMITED || (n <= max && held <= max - n))
		return 0;
	return err_set(err, code[l], "per-user limit: uid %u would hold %" PRIu64 " %s, over its limit "
		       "of %" PRIu64 " (%s)", (unsigned)a->uid, held + n, what[l], max, lim->src[l]);
}

void odpd_account_hold(struct odpd_account *a, enum odpd_user_limit l, int64_t n)
{
	a->held[l] += (uint64_t)n;
}

struct odpd_account *odpd_account_get(struct odpd_quota *q, uid_t uid)
{
	struct odpd_account *a;

	LIST_FOREACH(a, &q->accounts, link)
		if (a->uid == uid) {
			a->refs++;
			return a;
		}
	a = calloc(1, sizeof(*a));
	if (!a)
		return NULL;
	a->uid = uid;
	a->refs = 1;
	LIST_INIT(&a->ring_holders);
	a->limit = ODPD_UNLIMITED;
	LIST_INSERT_HEAD(&q->accounts, a, link);
	q->n_accounts++;
	return a;
}

void odpd_account_put(struct odpd_quota *q, struct odpd_account *a)
{
	if (!a || --a->refs > 0)
		return;
	LIST_REMOVE(a, link);
	q->n_accounts--;
	free(a);
}

void odpd_account_charge(struct odpd_account *a, uint64_t added)
{
	a->pinned += added;
	a->mrs++;
	a->refs++;
}

void odpd_account_uncharge(struct odpd_quota *q, struct odpd_account *a, uint64_t freed)
{
	a->pinned -= freed;
	a->mrs--;
	odpd_account_put(q, a);
}
