/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

int odpd_limit_for_client(const struct odpd_conf *conf, pid_t pid, int pidfd, uid_t uid, gid_t gid,
			  const gid_t *groups, unsigned n_groups, uint64_t window_size,
			  struct odpd_limit *ret)
{
	const struct odpd_rule *rule;
	char path[64], text[4096], cgroup[1024];
	uint64_t memlock;
	int r;

	read_cgroup(pid, cgroup, sizeof(cgroup));
	for (int k = 0; k < ODPD_N_UL; k++) {
		rule = odpd_conf_match_rule_for(conf, k, uid, gid, groups, n_groups, cgroup);
		if (rule) {
			ret->max[k] = rule->max[k];
			snprintf(ret->src[k], sizeof(ret->src[k]), "%s max-%s", rule->label,
				 odpd_user_limit_names[k]);
		} else {
			ret->max[k] = conf->user_default[k];
			snprintf(ret->src[k], sizeof(ret->src[k]), "default-%s", odpd_user_limit_names[k]);
		}
	}
	rule = odpd_conf_match_rule_for(conf, ODPD_RULE_KEY_REMOTE, uid, gid, groups, n_groups, cgroup);
	ret->remote_access = rule && rule->remote_access;
	if (ret->max[ODPD_UL_MAPPED] == ODPD_MAPPED_QUARTER_WINDOW)
		ret->max[ODPD_UL_MAPPED] = window_size / 4;
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
	};
	static const char *const what[ODPD_N_UL] = {
		[ODPD_UL_CONNECTIONS] = "connections", [ODPD_UL_SEGMENTS] = "attached segments",
		[ODPD_UL_MAPPED] = "bytes of odpd's address window", [ODPD_UL_MRS] = "MR references",
		[ODPD_UL_REGISTRAR_WAITS] = "implicit-ODP requests waiting for a registrar",
	};
	uint64_t max = lim->max[l], held = a->held[l];

	if (max == ODPD_UNLIMITED || (n <= max && held <= max - n))
		return 0;
	return err_set(err, code[l], "uid %u would hold %" PRIu64 " %s, over its limit of %" PRIu64
		       " (%s in odpd.conf)", (unsigned)a->uid, held + n, what[l], max, lim->src[l]);
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
