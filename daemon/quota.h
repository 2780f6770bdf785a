/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Pinning quotas. Pinned bytes are charged to accounts, one per uid, and
 * counted as distinct pages of each segment: overlapping MRs are not
 * counted twice. The registry works out how many bytes an MR's charge adds
 * or frees (from the MRs over the segment charged to the account, its
 * mapping's interval tree); the daemon as a whole counts distinct pages the
 * same way.
 *
 * A client's limit is fixed at connect: the rule of odpd.conf that matches
 * its user, group or cgroup, else default-pinned, whose default is the
 * client's own RLIMIT_MEMLOCK (read from /proc/PID/limits, checked against
 * its pidfd), or no limit if it holds CAP_IPC_LOCK (it could pin anything
 * itself). The account is checked against the limit of the client that
 * asks.
 */

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>

#include "conf.h"
#include "error.h"

struct odpd_mapping;

struct odpd_holder;

struct odpd_account {
	LIST_ENTRY(odpd_account) link;
	LIST_HEAD(, odpd_holder) ring_holders;  /* its holders with a release ring (registry/hits.c) */
	uid_t uid;
	unsigned refs;              /* clients + MR charges */
	uint64_t pinned;            /* bytes: distinct pages */
	unsigned mrs;               /* MRs charged */
	uint64_t held[ODPD_N_UL];   /* what the user's clients hold: connections, segments,
				     * mapped bytes, MR references, implicit requests waiting
				     * for a registrar (struct odpd_limit.max) */
	unsigned refusing;          /* its connections refused, not closed yet */
	uint64_t limit;             /* of the client that asked last */
	char rule[80];              /* where that limit came from */
};

struct odpd_quota {
	LIST_HEAD(, odpd_account) accounts;
	unsigned n_accounts;
};

/*
 * What odpd has to share among its users: its fds (RLIMIT_NOFILE, after
 * raising it at start), its mappings (vm.max_map_count, read at start and
 * at reload) and its segment window. The [limits] defaults that are
 * "auto" give each user a fair share, a quarter, of them:
 *  - fds: default-segments half of the quarter (each attached segment
 *    may keep an fd), default-connections the other half at
 *    ODPD_FDS_PER_CONNECTION fds each; never more than 1024 and 64,
 *    never fewer than 1;
 *  - mappings: default-mappings a quarter of vm.max_map_count, counted as
 *    ODPD_SEGMENT_MAPPINGS per attached segment and ODPD_HIT_MAPPINGS per
 *    hit table (what a connection's verbs objects map is bounded by
 *    its user's connections);
 *  - the window: default-mapped = window, a quarter of it.
 * A value written in odpd.conf wins; odpd_budget_warn() says where one
 * lets a user take more than a quarter.
 */
struct odpd_budget {
	uint64_t nofile;            /* 0: unlimited */
	uint64_t max_map_count;     /* 0: unknown (taken as the kernel's default, 65530) */
	uint64_t window_size;       /* bytes */
};

/* Is @fd (just received or accepted: the kernel gives the lowest free
 * number) so high, under a limit of @nofile fds (0: none), that odpd must
 * keep the rest for the clients it serves? @segment: a segment's fd, which
 * odpd would keep (a larger reserve). */
static inline bool odpd_fd_short(uint64_t nofile, int fd, bool segment)
{
	uint64_t reserve = segment ? 32 + nofile / 64 : 8 + nofile / 256;

	return nofile && (uint64_t)fd + reserve >= nofile;
}

/*
 * fds one connection may make odpd hold, as the auto defaults count them:
 * its socket and pidfd; for a device, its context (the command fd and the
 * async event fd), its verify buffer (a memfd), an imported client-PD
 * context, an implicit-ODP registrar (two sockets and a pidfd), and its
 * hit table's generation table (kept for systemd's fd store) — 10 with one
 * device, of which a plain client uses 6.
 */
#define ODPD_FDS_PER_CONNECTION 10
#define ODPD_MAX_MAP_COUNT_DEFAULT 65530

/* The budget's share of one user for each auto default of @c (the
 * defaults it sets itself are left out: @ret[k] = @c's). */
void odpd_budget_user_defaults(const struct odpd_conf *c, const struct odpd_budget *b,
			       uint64_t ret[ODPD_N_UL]);
/* Log a warning for each value in @c (a [limits] default or a rule's max)
 * that lets one user hold more than a quarter of @b's fds or mappings. */
void odpd_budget_warn(const struct odpd_conf *c, const struct odpd_budget *b);
/* vm.max_map_count, 0 if it cannot be read. */
uint64_t odpd_max_map_count(void);

/* What a client may pin, and what its user may hold, worked out at connect. */
struct odpd_limit {
	uint64_t max_pinned;        /* bytes, ODPD_UNLIMITED */
	char rule[80];              /* "[user alice]", "memlock", "default-pinned" */
	uint64_t max[ODPD_N_UL];    /* per user (conf.h); ODPD_UNLIMITED */
	char src[ODPD_N_UL][96];    /* "[user alice] max-connections in odpd.conf",
				     * "default-connections = auto: a quarter of odpd's 1024 fds" */
	bool remote_access;         /* a rule's remote-access = yes: client-PD MRs may be remote */
};

/*
 * The limit of the client (@pid, @pidfd, @uid, @gid, @groups): a rule of
 * @conf, else default-pinned, else its RLIMIT_MEMLOCK soft limit; and its
 * user's limits (a rule's, else [limits]'s; the auto ones are the user's
 * share of @budget).
 * -ESRCH if the process is gone (its pidfd says so) or its limits cannot be
 * read.
 */
int odpd_limit_for_client(const struct odpd_conf *conf, pid_t pid, int pidfd, uid_t uid, gid_t gid,
			  const gid_t *groups, unsigned n_groups, const struct odpd_budget *budget,
			  struct odpd_limit *ret);

/*
 * May @a's user take @n more of @l under @lim? 0, or the errno (EMFILE for
 * connections and segments, ENOSPC for mapped bytes, EDQUOT for MRs,
 * EAGAIN for registrar waits, ENOMEM for mappings, as mmap says at
 * vm.max_map_count) with @err naming the limit. Taking and giving back:
 * odpd_account_hold().
 */
int odpd_account_may(const struct odpd_account *a, const struct odpd_limit *lim, enum odpd_user_limit l,
		     uint64_t n, struct odpd_err *err);
void odpd_account_hold(struct odpd_account *a, enum odpd_user_limit l, int64_t n);

/* Parse the "Max locked memory" soft limit out of the text of /proc/PID/limits.
 * ODPD_UNLIMITED for "unlimited". -EINVAL if absent. */
int odpd_parse_memlock(const char *limits_text, uint64_t *ret);

/* The account of @uid (made on first use), with one more reference. NULL: ENOMEM. */
struct odpd_account *odpd_account_get(struct odpd_quota *q, uid_t uid);
void odpd_account_put(struct odpd_quota *q, struct odpd_account *a);

/* Charge one MR to @a: @added bytes it pins that @a had not pinned yet (0
 * for an ODP MR). Takes a reference on @a. */
void odpd_account_charge(struct odpd_account *a, uint64_t added);
/* Undo a charge: @freed bytes @a no longer pins. Drops the reference (and
 * may free @a: pass @q). */
void odpd_account_uncharge(struct odpd_quota *q, struct odpd_account *a, uint64_t freed);
