/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * odpd.conf: limits of the registration cache and the pinning quotas, and
 * who may join which named shared PD. Parsed with inih; documented in
 * odpd.conf(5).
 *
 *   [limits]
 *   max-pinned = 50%          # whole daemon: K/M/G/T suffix, a % of MemTotal, or "unlimited"
 *   max-mrs = 1000000         # whole daemon
 *   default-pinned = memlock  # a client no rule matches: its RLIMIT_MEMLOCK, or a size
 *   relaxed-window-ms = 100
 *   relaxed-max-mrs = 4096
 *   relaxed-max-bytes = 1G
 *   hole-check-ms = 100       # pinned MRs client libraries may serve: holes looked for (0: never)
 *   default-connections = auto # per user, where no rule says otherwise (odpd.conf(5));
 *   default-segments = auto    # auto: from odpd's fd limit, at most 64 and 1024
 *   default-mapped = window   # bytes of odpd's address window; "window": a quarter of it
 *   default-mrs = 262144
 *   default-registrar-waits = 4  # implicit-ODP requests waiting for a registrar
 *   default-mappings = auto   # auto: a quarter of vm.max_map_count
 *   [user alice]              # also [user 1000], [group rdma], [group 27], [cgroup /kubepods.slice]
 *   max-pinned = 64G
 *   max-connections = 128     # and max-segments, max-mapped, max-mrs, max-registrar-waits, max-mappings
 *   remote-access = yes       # client-PD MRs may have remote access (else root/admin only)
 *   [pd training]             # a named shared PD (fnmatch pattern; first match in file order)
 *   users = alice bob 1001
 *   groups = rdma
 */

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define ODPD_CONF_DEFAULT "/etc/odpd/odpd.conf"
#define ODPD_UNLIMITED UINT64_MAX

enum odpd_rule_kind { ODPD_RULE_USER, ODPD_RULE_GROUP, ODPD_RULE_CGROUP };

/* What one user (uid) may hold at once, besides pinned bytes: a rule's
 * max-connections, max-segments, max-mapped, max-mrs, max-registrar-waits;
 * else [limits]'s default-connections ... default-registrar-waits. */
enum odpd_user_limit {
	ODPD_UL_CONNECTIONS,        /* connections */
	ODPD_UL_SEGMENTS,           /* attached segments (each keeps an fd in odpd) */
	ODPD_UL_MAPPED,             /* bytes of odpd's address window (a sparse segment: its size) */
	ODPD_UL_MRS,                /* MR references (odpd_reg() results held) */
	ODPD_UL_REGISTRAR_WAITS,    /* implicit-ODP requests waiting for a registrar (its
				     * user may stop it: each wait lasts up to its deadline) */
	ODPD_UL_MAPPINGS,           /* mappings in odpd (segments, hit tables), against vm.max_map_count */
	ODPD_N_UL
};
/*
 * A default that odpd works out from what it has (quota.h, struct
 * odpd_budget): default-connections, default-segments and
 * default-mappings = auto (the default: a fair share, a quarter, of
 * odpd's fds or of vm.max_map_count), default-mapped = window (a
 * quarter of odpd's address window). Never a value of its own: 0 is
 * refused as a limit.
 */
#define ODPD_LIMIT_AUTO 0
#define ODPD_MAPPED_QUARTER_WINDOW ODPD_LIMIT_AUTO
extern const char *const odpd_user_limit_names[ODPD_N_UL];   /* "connections", ... */

/* [user X] / [group X] / [cgroup /path]: a pinning limit for its subjects. */
struct odpd_rule {
	enum odpd_rule_kind kind;
	uid_t uid;                  /* ODPD_RULE_USER */
	gid_t gid;                  /* ODPD_RULE_GROUP */
	char *cgroup;               /* ODPD_RULE_CGROUP: absolute cgroup v2 path, no trailing '/' (but "/") */
	char *label;                /* "[user alice]", as written in the file, for messages */
	bool has_max_pinned;
	uint64_t max_pinned;        /* bytes, or ODPD_UNLIMITED */
	bool has[ODPD_N_UL];
	uint64_t max[ODPD_N_UL];    /* counts, or bytes for ODPD_UL_MAPPED; ODPD_UNLIMITED */
	bool has_remote_access;
	bool remote_access;         /* remote-access: client-PD MRs may have remote access */
	unsigned line;              /* of the section header */
	/* [user NAME] / [group NAME] whose NAME did not resolve (yet): the rule
	 * is in force only once it does (odpd_conf_resolve); uid/gid unset. */
	bool unresolved;
};

/* [pd PATTERN]: who may create or join the named shared PDs it matches. */
struct odpd_pd_policy {
	char *pattern;              /* fnmatch(3) pattern, no flags */
	char *label;                /* "[pd training]" */
	uid_t *uids;
	unsigned n_uids;
	gid_t *gids;
	unsigned n_gids;
	unsigned line;
};

/*
 * A user or group name of the file that did not resolve when it was read
 * (LDAP or sssd not up yet at boot): a [user NAME] or [group NAME] rule,
 * or one name of a [pd] section's users or groups. What it names is not
 * in force until odpd_conf_resolve() finds it.
 */
enum odpd_unresolved_kind { ODPD_UNRES_RULE, ODPD_UNRES_PD_USER, ODPD_UNRES_PD_GROUP };
struct odpd_unresolved {
	enum odpd_unresolved_kind kind;
	unsigned index;             /* in rules or pds */
	char *name;
	unsigned line;
	int error;                  /* of the last lookup: ENOENT (no such name) or another errno */
};

struct odpd_conf {
	char *path;                 /* the file read, NULL if none */
	/* [limits] */
	uint64_t max_pinned;        /* bytes; ODPD_UNLIMITED */
	uint64_t max_mrs;
	bool default_pinned_memlock;/* "memlock" (the default) */
	uint64_t default_pinned;    /* bytes, when !default_pinned_memlock */
	uint64_t relaxed_window_ms;
	uint64_t relaxed_max_mrs;
	uint64_t relaxed_max_bytes;
	uint64_t hole_check_ms;     /* 0: only at flush and at registration */
	uint64_t user_default[ODPD_N_UL];   /* per user; ODPD_LIMIT_AUTO: worked out (quota.h) */
	/* [odp] */
	bool prefetch_on_register;  /* every ODP registration prefetches (REG_PREFETCH) */
	struct odpd_rule *rules;
	unsigned n_rules;
	struct odpd_pd_policy *pds;
	unsigned n_pds;
	struct odpd_unresolved *unresolved;
	unsigned n_unresolved;
};

/* The defaults: max-pinned 50% of @mem_total, max-mrs 1000000, default-pinned
 * memlock, relaxed-window-ms 100, relaxed-max-mrs 4096, relaxed-max-bytes 1G,
 * hole-check-ms 100, default-connections auto, default-segments auto,
 * default-mapped window, default-mrs 262144, default-registrar-waits 4, default-mappings auto. */
void odpd_conf_defaults(struct odpd_conf *c, uint64_t mem_total);

/*
 * Read @path into @c (which holds the defaults). @must_exist: a missing file
 * is an error (--config given); otherwise a missing file leaves the defaults.
 * Unknown sections or keys, bad values, duplicate sections are errors; user
 * and group names that do not resolve are not (c->unresolved lists them): returns -EINVAL (or the errno of opening the file)
 * and writes "PATH:LINE: what is wrong" into @errbuf. On error @c is left
 * with whatever was parsed; the caller frees it.
 */
int odpd_conf_load(struct odpd_conf *c, const char *path, bool must_exist, uint64_t mem_total,
		   char *errbuf, size_t errlen);
void odpd_conf_free(struct odpd_conf *c);

/* The unresolved names of @c (odpd_conf_load keeps them, and warns of
 * none: the caller does): how many, and the warning for the @i-th,
 * "PATH:LINE: unknown user \"alice\" in [user alice]: not in force until
 * the name resolves". */
unsigned odpd_conf_n_unresolved(const struct odpd_conf *c);
void odpd_conf_unresolved_text(const struct odpd_conf *c, unsigned i, char *buf, size_t len);

/*
 * Look the unresolved names of @c up again; each that resolves now is put in
 * force (a rule that turns out to duplicate another is dropped instead) and
 * @report(@arg, message) is told. Returns how many were settled.
 */
unsigned odpd_conf_resolve(struct odpd_conf *c, void (*report)(void *arg, int level, const char *msg),
			   void *arg);

/*
 * A size: decimal bytes with an optional binary K/M/G/T suffix ("64G"), a
 * percentage of @mem_total ("50%", 0..100, whole numbers), or "unlimited"
 * (ODPD_UNLIMITED). -EINVAL for anything else, or on overflow.
 */
int odpd_conf_parse_size(const char *s, uint64_t mem_total, uint64_t *ret);

/* MemTotal of /proc/meminfo in bytes, 0 if unknown. */
uint64_t odpd_meminfo_total(void);

/*
 * The rule for a client: a [user] rule for @uid wins, then a [group] rule for
 * its primary @gid or any of @groups, then the [cgroup] rule with the longest
 * path that is a prefix of @cgroup at a '/' boundary ("/a" matches "/a" and
 * "/a/b", not "/ab"). Among several matching [group] rules, the first in the
 * file. NULL if none. Only rules that set max-pinned take part:
 * odpd_conf_match_rule_for(..., ODPD_RULE_KEY_PINNED, ...).
 */
const struct odpd_rule *odpd_conf_match_rule(const struct odpd_conf *c, uid_t uid, gid_t gid,
					     const gid_t *groups, unsigned n_groups,
					     const char *cgroup);
/* The same for one key: ODPD_RULE_KEY_PINNED, or an enum odpd_user_limit.
 * Each key is decided on its own, among the rules that set it (so a
 * [user alice] that sets only max-connections leaves her max-pinned to a
 * [group] rule, as before per-user limits existed); none: [limits]. */
#define ODPD_RULE_KEY_PINNED (-1)
#define ODPD_RULE_KEY_REMOTE (-2)   /* remote-access */
const struct odpd_rule *odpd_conf_match_rule_for(const struct odpd_conf *c, int key, uid_t uid, gid_t gid,
						 const gid_t *groups, unsigned n_groups,
						 const char *cgroup);

/*
 * May a client (uid, gid, groups) create or join the shared PD @name?
 * The first [pd] section whose pattern matches @name decides: allowed if the
 * uid or one of the groups is listed. With no matching section: allowed only
 * when @creator_uid (the uid that created the PD; pass @uid when the PD does
 * not exist yet) equals @uid. Returns true/false and, when refused, writes
 * the reason, naming the rule ("[pd training] lists neither uid 1001 nor its
 * groups" / "no [pd] section matches \"x\": only its creator, uid 1000, may
 * join") into @why.
 */
bool odpd_conf_pd_allowed(const struct odpd_conf *c, const char *name, uid_t uid, gid_t gid,
			  const gid_t *groups, unsigned n_groups, uid_t creator_uid,
			  char *why, size_t whylen);

/* Is @name a valid shared PD name: 1..63 bytes of [A-Za-z0-9._:@-]? */
bool odpd_conf_pd_name_valid(const char *name);
