/* SPDX-License-Identifier: MIT */
/* Unit tests of daemon/conf.c: odpd.conf parsing, sizes, rule matching and
 * the shared-PD policy. */
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "conf.h"
#include "quota.h"

#define KIB ((uint64_t)1 << 10)
#define MIB ((uint64_t)1 << 20)
#define GIB ((uint64_t)1 << 30)
#define TIB ((uint64_t)1 << 40)
#define MEM (16 * GIB)          /* the mem_total the tests pretend */
#define NOUSER "no-such-user-odpd-test"
#define NOGROUP "no-such-group-odpd-test"
/* Names that resolve only once late_names is set (the directory service
 * came up): getpwnam_r and getgrnam_r are wrapped (-Wl,--wrap, meson.build). */
#define LATEUSER "late-user-odpd-test"
#define LATEGROUP "late-group-odpd-test"
#define LATE_ID 4711

static bool late_names;

int __real_getpwnam_r(const char *name, struct passwd *pw, char *buf, size_t len,
		      struct passwd **res);
int __wrap_getpwnam_r(const char *name, struct passwd *pw, char *buf, size_t len,
		      struct passwd **res);
int __real_getgrnam_r(const char *name, struct group *gr, char *buf, size_t len,
		      struct group **res);
int __wrap_getgrnam_r(const char *name, struct group *gr, char *buf, size_t len,
		      struct group **res);

int __wrap_getpwnam_r(const char *name, struct passwd *pw, char *buf, size_t len,
		      struct passwd **res)
{
	if (strcmp(name, LATEUSER) != 0)
		return __real_getpwnam_r(name, pw, buf, len, res);
	*res = NULL;
	if (!late_names)
		return 0;
	*pw = (struct passwd){ .pw_name = (char *)LATEUSER, .pw_uid = LATE_ID, .pw_gid = LATE_ID };
	*res = pw;
	(void)buf;
	(void)len;
	return 0;
}

int __wrap_getgrnam_r(const char *name, struct group *gr, char *buf, size_t len,
		      struct group **res)
{
	if (strcmp(name, LATEGROUP) != 0)
		return __real_getgrnam_r(name, gr, buf, len, res);
	*res = NULL;
	if (!late_names)
		return EIO;             /* as when the directory service is not reachable */
	*gr = (struct group){ .gr_name = (char *)LATEGROUP, .gr_gid = LATE_ID };
	*res = gr;
	(void)buf;
	(void)len;
	return 0;
}

static char dir[] = "/tmp/test-conf.XXXXXX";
static char path[PATH_MAX];     /* dir/odpd.conf */

/* ------------------------------------------------------------ helpers */

static int setup(void **state)
{
	(void)state;
	if (!mkdtemp(dir))
		return -1;
	snprintf(path, sizeof(path), "%s/odpd.conf", dir);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	unlink(path);
	return rmdir(dir);
}

/* Write @len bytes of @text into the test's odpd.conf, mode 0644. */
static void write_conf_len(const char *text, size_t len)
{
	FILE *f = fopen(path, "we");

	assert_non_null(f);
	assert_int_equal(fwrite(text, 1, len, f), len);
	assert_int_equal(fclose(f), 0);
	assert_int_equal(chmod(path, 0644), 0);
}

static void write_conf(const char *text)
{
	write_conf_len(text, strlen(text));
}

/* Defaults for MEM, then @text loaded from the file. */
static int load_text(struct odpd_conf *c, const char *text, char *err, size_t errlen)
{
	write_conf(text);
	odpd_conf_defaults(c, MEM);
	return odpd_conf_load(c, path, true, MEM, err, errlen);
}

static void load_ok(struct odpd_conf *c, const char *text)
{
	char err[512] = "";
	int r = load_text(c, text, err, sizeof(err));

	if (r != 0)
		print_error("unexpected error: %s\n", err);
	assert_int_equal(r, 0);
	assert_string_equal(err, "");
}

/* @err must be "PATH:LINE: ..." and contain @needle. */
static void check_error(const char *err, unsigned line, const char *needle)
{
	char prefix[PATH_MAX + 32];

	snprintf(prefix, sizeof(prefix), "%s:%u: ", path, line);
	if (strncmp(err, prefix, strlen(prefix)) != 0 || !strstr(err, needle)) {
		print_error("error \"%s\"\nwanted \"%s...%s...\"\n", err, prefix, needle);
		fail();
	}
}

/* Loading @text fails with -EINVAL and an error on @line containing @needle. */
static void load_fails_mem(const char *text, uint64_t mem, unsigned line, const char *needle)
{
	struct odpd_conf c;
	char err[512] = "";

	write_conf(text);
	odpd_conf_defaults(&c, mem);
	assert_int_equal(odpd_conf_load(&c, path, true, mem, err, sizeof(err)), -EINVAL);
	check_error(err, line, needle);
	odpd_conf_free(&c);
}

static void load_fails(const char *text, unsigned line, const char *needle)
{
	load_fails_mem(text, MEM, line, needle);
}

static void assert_defaults(const struct odpd_conf *c, uint64_t max_pinned)
{
	assert_int_equal(c->max_pinned, max_pinned);
	assert_int_equal(c->max_mrs, 1000000);
	assert_true(c->default_pinned_memlock);
	assert_int_equal(c->relaxed_window_ms, 100);
	assert_int_equal(c->relaxed_max_mrs, 4096);
	assert_int_equal(c->relaxed_max_bytes, GIB);
	assert_int_equal(c->n_rules, 0);
	assert_int_equal(c->n_pds, 0);
	assert_null(c->rules);
	assert_null(c->pds);
}

/* ------------------------------------------------------------ defaults and files */

static void test_defaults(void **state)
{
	(void)state;
	struct odpd_conf c;

	odpd_conf_defaults(&c, MEM);
	assert_null(c.path);
	assert_defaults(&c, 8 * GIB);
	odpd_conf_free(&c);

	odpd_conf_defaults(&c, 1001);           /* rounded down */
	assert_int_equal(c.max_pinned, 500);
	odpd_conf_free(&c);

	/* MemTotal unknown: no daemon-wide limit rather than a limit of 0 */
	odpd_conf_defaults(&c, 0);
	assert_int_equal(c.max_pinned, ODPD_UNLIMITED);
	odpd_conf_free(&c);
}

/* The example of the issue, as written there but for the user. */
static const char issue_example[] =
	"[limits]\n"
	"max-pinned = 50%          # whole daemon\n"
	"max-mrs = 1000000\n"
	"default-pinned = memlock  # a client with no rule below: its own RLIMIT_MEMLOCK (the default), or a size\n"
	"relaxed-window-ms = 100\n"
	"relaxed-max-mrs = 4096\n"
	"relaxed-max-bytes = 1G\n"
	"[user root]               # also [user 1000], [group rdma], [cgroup /kubepods.slice]\n"
	"max-pinned = 64G\n";

static void test_issue_example(void **state)
{
	(void)state;
	const uint64_t mem = 10 * GIB + 3;
	struct odpd_conf c;
	char err[512] = "x";

	write_conf(issue_example);
	odpd_conf_defaults(&c, MEM);
	/* different values first, so that every key must be read to pass */
	c.max_pinned = 1;
	c.max_mrs = 2;
	c.default_pinned_memlock = false;
	c.relaxed_window_ms = 3;
	c.relaxed_max_mrs = 4;
	c.relaxed_max_bytes = 5;
	assert_int_equal(odpd_conf_load(&c, path, true, mem, err, sizeof(err)), 0);
	assert_string_equal(err, "");
	assert_string_equal(c.path, path);
	assert_int_equal(c.max_pinned, 5 * GIB + 1);
	assert_int_equal(c.max_mrs, 1000000);
	assert_true(c.default_pinned_memlock);
	assert_int_equal(c.relaxed_window_ms, 100);
	assert_int_equal(c.relaxed_max_mrs, 4096);
	assert_int_equal(c.relaxed_max_bytes, GIB);
	assert_int_equal(c.n_rules, 1);
	assert_int_equal(c.n_pds, 0);
	assert_int_equal(c.rules[0].kind, ODPD_RULE_USER);
	assert_int_equal(c.rules[0].uid, 0);
	assert_true(c.rules[0].has_max_pinned);
	assert_int_equal(c.rules[0].max_pinned, 64 * GIB);
	assert_int_equal(c.rules[0].line, 8);
	assert_string_equal(c.rules[0].label, "[user root]");
	assert_ptr_equal(odpd_conf_match_rule(&c, 0, 0, NULL, 0, "/"), &c.rules[0]);
	assert_null(odpd_conf_match_rule(&c, 1000, 1000, NULL, 0, "/"));
	odpd_conf_free(&c);
}

/* Every kind of section and the syntax around them. */
static void test_full_file(void **state)
{
	(void)state;
	static const char long_cg[] =
		"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0123.slice";
	struct odpd_conf c;

	load_ok(&c,
		"\xEF\xBB\xBF; odpd.conf\r\n"                    /* 1: BOM, CRLF */
		"# a comment\n"                                 /* 2 */
		"\n"                                            /* 3 */
		"  [limits]\n"                                  /* 4: indented header */
		"max-pinned: 1T ; inline\n"                     /* 5: ':' separator */
		"max-mrs = unlimited\n"                         /* 6 */
		"default-pinned = 8m\t# after a tab\n"          /* 7 */
		"relaxed-window-ms=0\n"                         /* 8 */
		"relaxed-max-bytes = 100%\n"                    /* 9 */
		"[user 4242]\n"                                 /* 10: no passwd entry */
		"max-pinned = unlimited\n"                      /* 11 */
		"[group root]\n"                                /* 12 */
		"max-pinned = 2G\n"                             /* 13 */
		"[cgroup /kubepods.slice/]\n"                   /* 14: trailing '/' */
		"max-pinned = 1%\n"                             /* 15 */
		"[cgroup /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0123.slice]\n"
		"max-pinned = 3K\n"                             /* 17 */
		"[pd training]   ; the team's\n"               /* 18 */
		"users = root, 1001\t1002,,\n"                  /* 19 */
		"        1003 # indented: more users\n"         /* 20 */
		"groups = root daemon\n"                        /* 21 */
		"[pd secret]\n"                                 /* 22: nobody */
		"[user daemon]\n");                             /* 23: no max-pinned */

	assert_string_equal(c.path, path);
	assert_int_equal(c.max_pinned, TIB);
	assert_int_equal(c.max_mrs, ODPD_UNLIMITED);
	assert_false(c.default_pinned_memlock);
	assert_int_equal(c.default_pinned, 8 * MIB);
	assert_int_equal(c.relaxed_window_ms, 0);
	assert_int_equal(c.relaxed_max_mrs, 4096);     /* untouched */
	assert_int_equal(c.relaxed_max_bytes, MEM);

	assert_int_equal(c.n_rules, 5);
	assert_int_equal(c.rules[0].kind, ODPD_RULE_USER);
	assert_int_equal(c.rules[0].uid, 4242);
	assert_int_equal(c.rules[0].max_pinned, ODPD_UNLIMITED);
	assert_int_equal(c.rules[0].line, 10);
	assert_int_equal(c.rules[1].kind, ODPD_RULE_GROUP);
	assert_int_equal(c.rules[1].gid, 0);
	assert_int_equal(c.rules[1].max_pinned, 2 * GIB);
	assert_string_equal(c.rules[1].label, "[group root]");
	assert_int_equal(c.rules[2].kind, ODPD_RULE_CGROUP);
	assert_string_equal(c.rules[2].cgroup, "/kubepods.slice");
	assert_string_equal(c.rules[2].label, "[cgroup /kubepods.slice/]");
	assert_int_equal(c.rules[2].max_pinned, MEM / 100);
	assert_string_equal(c.rules[3].cgroup, long_cg);
	assert_int_equal(c.rules[3].max_pinned, 3 * KIB);
	assert_int_equal(c.rules[3].line, 16);
	assert_int_equal(c.rules[4].kind, ODPD_RULE_USER);
	assert_int_equal(c.rules[4].uid, 1);
	assert_false(c.rules[4].has_max_pinned);
	assert_int_equal(c.rules[4].line, 23);

	assert_int_equal(c.n_pds, 2);
	assert_string_equal(c.pds[0].pattern, "training");
	assert_string_equal(c.pds[0].label, "[pd training]");
	assert_int_equal(c.pds[0].line, 18);
	assert_int_equal(c.pds[0].n_uids, 4);
	assert_int_equal(c.pds[0].uids[0], 0);
	assert_int_equal(c.pds[0].uids[1], 1001);
	assert_int_equal(c.pds[0].uids[2], 1002);
	assert_int_equal(c.pds[0].uids[3], 1003);
	assert_int_equal(c.pds[0].n_gids, 2);
	assert_int_equal(c.pds[0].gids[0], 0);
	assert_int_equal(c.pds[0].gids[1], 1);
	assert_string_equal(c.pds[1].pattern, "secret");
	assert_int_equal(c.pds[1].n_uids, 0);
	assert_int_equal(c.pds[1].n_gids, 0);
	assert_int_equal(c.pds[1].line, 22);
	odpd_conf_free(&c);
}

/* A file that is empty, or only comments, leaves the defaults. */
static void test_empty_file(void **state)
{
	(void)state;
	struct odpd_conf c;

	load_ok(&c, "");
	assert_string_equal(c.path, path);
	assert_defaults(&c, 8 * GIB);
	odpd_conf_free(&c);
	load_ok(&c, "# nothing\n; at all\n\n   \n");
	assert_defaults(&c, 8 * GIB);
	odpd_conf_free(&c);
}

static void test_missing_file(void **state)
{
	(void)state;
	char missing[PATH_MAX + 16], err[512] = "x";
	struct odpd_conf c;

	snprintf(missing, sizeof(missing), "%s/none.conf", dir);
	odpd_conf_defaults(&c, MEM);
	assert_int_equal(odpd_conf_load(&c, missing, false, MEM, err, sizeof(err)), 0);
	assert_null(c.path);
	assert_defaults(&c, 8 * GIB);
	assert_string_equal(err, "");

	assert_int_equal(odpd_conf_load(&c, missing, true, MEM, err, sizeof(err)), -ENOENT);
	assert_null(c.path);
	assert_non_null(strstr(err, missing));
	assert_non_null(strstr(err, strerror(ENOENT)));
	odpd_conf_free(&c);

	/* a directory is no file, even when it need not exist */
	odpd_conf_defaults(&c, MEM);
	assert_int_equal(odpd_conf_load(&c, dir, false, MEM, err, sizeof(err)), -EISDIR);
	assert_non_null(strstr(err, dir));
	odpd_conf_free(&c);
}

/* Anyone who could write the file could give themselves any quota. */
static void test_world_writable(void **state)
{
	(void)state;
	struct odpd_conf c;
	char err[512] = "";

	write_conf("[limits]\nmax-pinned = 1G\n");
	assert_int_equal(chmod(path, 0646), 0);
	odpd_conf_defaults(&c, MEM);
	assert_int_equal(odpd_conf_load(&c, path, false, MEM, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, path));
	assert_non_null(strstr(err, "anyone may write it"));
	assert_int_equal(c.max_pinned, 8 * GIB);
	odpd_conf_free(&c);
}

/* On an error @c keeps what was parsed, and odpd_conf_free frees it. */
static void test_error_keeps_parsed(void **state)
{
	(void)state;
	struct odpd_conf c;
	char err[512];

	assert_int_equal(load_text(&c,
				   "[limits]\nmax-mrs = 7\n[cgroup /a]\nmax-pinned = 1G\n"
				   "[pd x]\nusers = 0\n[limits]\nmax-mrs = 9\n",
				   err, sizeof(err)), -EINVAL);
	check_error(err, 7, "duplicate section [limits] (first on line 1)");
	assert_int_equal(c.max_mrs, 7);
	assert_int_equal(c.n_rules, 1);
	assert_int_equal(c.n_pds, 1);
	assert_int_equal(c.pds[0].n_uids, 1);
	odpd_conf_free(&c);
	assert_null(c.rules);
	assert_int_equal(c.n_rules, 0);
}

/* odpd_conf_free leaves @c zeroed and usable again. */
static void test_free_reuse(void **state)
{
	(void)state;
	static const struct odpd_conf zero;
	struct odpd_conf c;

	load_ok(&c, "[user 0]\nmax-pinned = 1G\n[pd a*]\nusers = 1\ngroups = 2\n");
	odpd_conf_free(&c);
	assert_memory_equal(&c, &zero, sizeof(c));
	odpd_conf_free(&c);             /* twice is harmless */

	load_ok(&c, issue_example);
	assert_int_equal(c.n_rules, 1);
	/* loading again into a loaded conf adds to it and replaces the path */
	char err[512];
	write_conf("[cgroup /]\nmax-pinned = 1M\n");
	assert_int_equal(odpd_conf_load(&c, path, true, MEM, err, sizeof(err)), 0);
	assert_int_equal(c.n_rules, 2);
	assert_string_equal(c.path, path);
	odpd_conf_free(&c);
}

/* ------------------------------------------------------------ errors */

static void test_errors_limits(void **state)
{
	(void)state;
	load_fails("[limits]\nfoo = 1\n", 2, "unknown key \"foo\" in [limits]");
	load_fails("# c\n\n; c\n[limits]\n\nmax-pinned = 12Q\n", 6,
		   "bad size \"12Q\" for max-pinned (use e.g. 64G, 50% or unlimited)");
	load_fails("[limits]\nmax-pinned = 101%\n", 2, "bad size \"101%\" for max-pinned");
	load_fails("[limits]\nmax-pinned = -1\n", 2, "bad size \"-1\" for max-pinned");
	load_fails("[limits]\nmax-pinned =\n", 2, "bad size \"\" for max-pinned");
	load_fails("[limits]\nmax-pinned = 1G # c\nmax-pinned = 2G\n", 3,
		   "duplicate key \"max-pinned\" in [limits] (first on line 2)");
	load_fails("[limits]\nrelaxed-max-bytes = lots\n", 2, "bad size \"lots\" for relaxed-max-bytes");
	load_fails("[limits]\nmax-mrs = 1e6\n", 2, "bad number \"1e6\" for max-mrs");
	load_fails("[limits]\nmax-mrs = 1K\n", 2, "bad number \"1K\" for max-mrs");
	load_fails("[limits]\nrelaxed-max-mrs = unlimited\n", 2,
		   "bad number \"unlimited\" for relaxed-max-mrs");
	load_fails("[limits]\nrelaxed-window-ms = 86400001\n", 2,
		   "bad number \"86400001\" for relaxed-window-ms");
	load_fails("[limits]\nrelaxed-window-ms = -5\n", 2, "bad number \"-5\" for relaxed-window-ms");
	load_fails("[limits]\ndefault-pinned = rlimit\n", 2, "bad value \"rlimit\" for default-pinned");
	/* '#' only starts a comment after whitespace */
	load_fails("[limits]\ndefault-pinned = 8m#c\n", 2, "bad value \"8m#c\" for default-pinned");
	/* a percentage without MemTotal */
	load_fails_mem("[limits]\nmax-pinned = 50%\n", 0, 2, "the size of memory is unknown");
	load_fails_mem("[limits]\ndefault-pinned = 5%\n", 0, 2, "bad value \"5%\" for default-pinned");
	/* an indented line continues the value before it */
	load_fails("[limits]\nmax-mrs = 5\n  6\n", 3, "indented line continues the value of max-mrs");
	load_fails("[limits]\nmax-mrs = 5\n  max-pinned = 1G\n", 3,
		   "indented line continues the value of max-mrs");
	load_fails("[limits x]\n", 1, "[limits] takes no argument");
}

static void test_errors_sections(void **state)
{
	(void)state;
	load_fails("[limit]\n", 1, "unknown section [limit]");
	load_fails("[limits]\n[Limits]\n", 2, "unknown section [Limits]");
	load_fails("[limits]\n\n[limits]   # again\n", 3, "duplicate section [limits] (first on line 1)");
	load_fails("[user root]\n[user 0]\n", 2, "duplicate section [user 0]: [user root] on line 1");
	load_fails("[group 0]\nmax-pinned = 1G\n[group root]\n", 3,
		   "duplicate section [group root]: [group 0] on line 1");
	load_fails("[cgroup /a]\n[cgroup /a/]\n", 2, "duplicate section [cgroup /a/]: [cgroup /a] on line 1");
	load_fails("[pd x*]\n[pd x*]\n", 2, "duplicate section [pd x*] (first on line 1)");
	/* the same subject in another kind is no duplicate; a different one neither */
	load_fails("[user 0]\n[group 0]\n[cgroup /0]\n[pd 0]\n[user 1]\n[nope]\n", 6, "unknown section");
	load_fails("[cgroup kubepods.slice]\n", 1, "bad cgroup path in [cgroup kubepods.slice]");
	load_fails("[cgroup /a/../b]\n", 1, "bad cgroup path");
	load_fails("[cgroup /a//b]\n", 1, "bad cgroup path");
	load_fails("[cgroup /a/./b]\n", 1, "bad cgroup path");
	load_fails("[cgroup]\n", 1, "[cgroup] needs a path");
	load_fails("[user]\n", 1, "[user] needs a name or id");
	load_fails("[group  ]\n", 1, "[group] needs a name or id");
	load_fails("[pd]\n", 1, "[pd] needs a PD name pattern");
	load_fails("[pd a b]\n", 1, "bad PD name pattern in [pd a b]");
	load_fails("[pd a/b]\n", 1, "bad PD name pattern in [pd a/b]");
	load_fails("[pd gpu[0-9]]\n", 1, "text after the section header");
	load_fails("[user 4294967295]\n", 1, "unknown user \"4294967295\"");
	load_fails("[user -1]\n", 1, "unknown user \"-1\"");
}

static void test_errors_rules_and_pds(void **state)
{
	(void)state;
	load_fails("[user 0]\nrelaxed-max-mrs = 5\n", 2, "unknown key \"relaxed-max-mrs\" in [user 0]");
	load_fails("[user 0]\nmax-connections = 0\n", 2, "max-connections = 0 would refuse every request");
	load_fails("[user 0]\nmax-segments = many\n", 2, "bad number \"many\" for max-segments");
	load_fails("[group 0]\nmax-mapped = 5X\n", 2, "bad size \"5X\" for max-mapped");
	load_fails("[user 0]\nmax-mrs = 1\nmax-mrs = 2\n", 3, "duplicate key \"max-mrs\" in [user 0]");
	load_fails("[limits]\ndefault-mrs = 0\n", 2, "default-mrs = 0 would refuse every request");
	load_fails("[limits]\ndefault-registrar-waits = 0\n", 2,
		   "default-registrar-waits = 0 would refuse every request");
	load_fails("[limits]\ndefault-mapped = lots\n", 2, "bad size \"lots\" for default-mapped");
	load_fails("[cgroup /]\nmax-pinned = 5X\n", 2, "bad size \"5X\" for max-pinned");
	load_fails("[group 0]\nmax-pinned = 1G\nmax-pinned = 1G\n", 3,
		   "duplicate key \"max-pinned\" in [group 0]");
	load_fails("[pd t]\nusers = 1\nusers = 2\n", 3, "duplicate key \"users\" in [pd t] (first on line 2)");
	load_fails("[pd t]\nusers = 1\n  groups = 2\n", 3, "indented line continues the value of users");
	load_fails("[pd t]\nmembers = 1\n", 2, "unknown key \"members\" in [pd t]");
}

/* odpd_conf_resolve's reports, for the test below. */
static char reported[4][1024];
static int n_reported;

static void report(void *arg, int level, const char *msg)
{
	(void)arg;
	(void)level;
	if (n_reported < 4)
		snprintf(reported[n_reported], sizeof(reported[0]), "%s", msg);
	n_reported++;
}

/*
 * A user or group name that does not resolve when the file is read (LDAP
 * or sssd not up yet) is not an error: what names it is not in force, with
 * a warning naming file:line, until odpd_conf_resolve() finds it; a name
 * that later resolves to the subject of another rule is dropped.
 */
static void test_names_resolved_later(void **state)
{
	struct odpd_conf c;
	char text[1024];
	gid_t none[1] = { 0 };

	(void)state;
	late_names = false;
	load_ok(&c, "[user " LATEUSER "]\nmax-pinned = 1G\n"          /* 1 */
		    "[group " LATEGROUP "]\nmax-pinned = 2G\n"         /* 3 */
		    "[user " NOUSER "]\nmax-pinned = 3G\n"             /* 5 */
		    "[pd t]\nusers = root " LATEUSER "\n"               /* 7 */
		    "groups = " LATEGROUP "\n"                          /* 9 */
		    "[user 4712]\nmax-mrs = 5\n");                      /* 10 */
	assert_int_equal(c.n_rules, 4);
	assert_int_equal(odpd_conf_n_unresolved(&c), 5);
	odpd_conf_unresolved_text(&c, 0, text, sizeof(text));
	check_error(text, 1, "unknown user \"" LATEUSER "\" in [user " LATEUSER "]: not in force");
	odpd_conf_unresolved_text(&c, 1, text, sizeof(text));
	check_error(text, 3, "looking up group \"" LATEGROUP "\" in [group " LATEGROUP "]: ");
	odpd_conf_unresolved_text(&c, 3, text, sizeof(text));
	check_error(text, 8, "unknown user \"" LATEUSER "\" in users of [pd t]");
	/* not in force: uid 4711 matches neither rule nor [pd t] */
	assert_null(odpd_conf_match_rule(&c, LATE_ID, LATE_ID, NULL, 0, NULL));
	assert_false(odpd_conf_pd_allowed(&c, "t", LATE_ID, 1, none, 0, 0, NULL, 0));
	assert_false(odpd_conf_pd_allowed(&c, "t", 1, LATE_ID, none, 0, 0, NULL, 0));
	assert_true(odpd_conf_pd_allowed(&c, "t", 0, 0, none, 0, 1, NULL, 0));
	/* nothing resolves yet: nothing changes */
	n_reported = 0;
	assert_int_equal(odpd_conf_resolve(&c, report, NULL), 0);
	assert_int_equal(n_reported, 0);
	assert_int_equal(odpd_conf_n_unresolved(&c), 5);
	/* the directory comes up */
	late_names = true;
	assert_int_equal(odpd_conf_resolve(&c, report, NULL), 4);
	assert_int_equal(n_reported, 4);
	assert_int_equal(odpd_conf_n_unresolved(&c), 1);          /* NOUSER */
	check_error(reported[0], 1, "\"" LATEUSER "\" in [user " LATEUSER "] resolves now (uid 4711)");
	assert_ptr_equal(odpd_conf_match_rule(&c, LATE_ID, 1, NULL, 0, NULL), &c.rules[0]);
	assert_ptr_equal(odpd_conf_match_rule(&c, 1, LATE_ID, NULL, 0, NULL), &c.rules[1]);
	assert_true(odpd_conf_pd_allowed(&c, "t", LATE_ID, 1, none, 0, 0, NULL, 0));
	assert_true(odpd_conf_pd_allowed(&c, "t", 1, LATE_ID, none, 0, 0, NULL, 0));
	odpd_conf_free(&c);

	/* resolving to the subject of another rule: dropped, with a warning */
	late_names = false;
	load_ok(&c, "[user 4711]\nmax-pinned = 1G\n[user " LATEUSER "]\nmax-pinned = 2G\n");
	late_names = true;
	n_reported = 0;
	assert_int_equal(odpd_conf_resolve(&c, report, NULL), 1);
	check_error(reported[0], 3, "now resolves to uid 4711, which [user 4711] on line 1 already has");
	assert_ptr_equal(odpd_conf_match_rule(&c, LATE_ID, 1, NULL, 0, NULL), &c.rules[0]);
	assert_int_equal(odpd_conf_n_unresolved(&c), 0);
	odpd_conf_free(&c);
	late_names = false;
}

static void test_errors_syntax(void **state)
{
	(void)state;
	char text[512];

	load_fails("max-pinned = 1G\n", 1, "key \"max-pinned\" outside any section");
	load_fails("[limits]\njunk\n", 2, "expected [section], key = value or a comment");
	load_fails("[limits]\nmax-mrs ; = 5\n", 2, "expected [section], key = value or a comment");
	load_fails("[limits\nmax-mrs = 5\n", 1, "no ']' closes the section header");
	load_fails("[limits ;]\n", 1, "no ']' closes the section header");
	load_fails("[limits] max-mrs = 5\n", 1, "text after the section header: \"max-mrs = 5\"");
	/* a line longer than inih's buffer is refused, not cut in two */
	memset(text, 0, sizeof(text));
	strcpy(text, "[limits]\n# ");
	memset(text + strlen(text), 'x', 300);
	strcat(text, "\nmax-mrs = 5\n");
	load_fails(text, 2, "the line is longer than");
	/* a NUL byte would hide the rest of the line */
	{
		static const char nul[] = "[limits]\nmax-mrs = 5\0 junk\n";
		struct odpd_conf c;
		char err[512];

		write_conf_len(nul, sizeof(nul) - 1);
		odpd_conf_defaults(&c, MEM);
		assert_int_equal(odpd_conf_load(&c, path, true, MEM, err, sizeof(err)), -EINVAL);
		check_error(err, 2, "NUL byte");
		odpd_conf_free(&c);
	}
}

/* A small or absent error buffer is no problem. */
static void test_error_buffer(void **state)
{
	(void)state;
	struct odpd_conf c;
	char err[8];

	write_conf("[nope]\n");
	odpd_conf_defaults(&c, MEM);
	assert_int_equal(odpd_conf_load(&c, path, true, MEM, NULL, 0), -EINVAL);
	assert_int_equal(odpd_conf_load(&c, path, true, MEM, err, sizeof(err)), -EINVAL);
	assert_int_equal(strlen(err), sizeof(err) - 1);
	assert_memory_equal(err, path, sizeof(err) - 1);
	odpd_conf_free(&c);
}

/* ------------------------------------------------------------ sizes */

static void test_sizes(void **state)
{
	(void)state;
	static const struct { const char *s; uint64_t mem, want; } good[] = {
		{ "0", MEM, 0 },
		{ "1", MEM, 1 },
		{ "4096", MEM, 4096 },
		{ "1K", MEM, KIB },
		{ "1k", MEM, KIB },
		{ "3M", MEM, 3 * MIB },
		{ "3m", MEM, 3 * MIB },
		{ "64G", MEM, 64 * GIB },
		{ "64g", MEM, 64 * GIB },
		{ "2T", MEM, 2 * TIB },
		{ "2t", MEM, 2 * TIB },
		{ "0K", MEM, 0 },
		{ "007", MEM, 7 },
		{ "unlimited", MEM, ODPD_UNLIMITED },
		{ "0%", MEM, 0 },
		{ "50%", 1000, 500 },
		{ "33%", 1000, 330 },
		{ "1%", 199, 1 },
		{ "100%", MEM, MEM },
		{ "50%", 0, 0 },
		{ "100%", UINT64_MAX, UINT64_MAX },
		{ "50%", UINT64_MAX, UINT64_MAX / 2 },
		{ "18446744073709551615", MEM, UINT64_MAX },
		{ "16777215T", MEM, 16777215 * TIB },
		{ "17179869183G", MEM, 17179869183 * GIB },
	};
	static const char *const bad[] = {
		"", "-1", "+1", " 1", "1 ", "1.5G", "K", "1KB", "1KiB", "1Ki", "1P", "1e3", "0x10",
		"18446744073709551616", "99999999999999999999999", "16777216T", "17179869184G",
		"Unlimited", "unlimited ", "infinity", "%", "101%", "1000%", "-1%", "1.5%", "50 %",
		"50%%", "K1", "1 K",
	};
	uint64_t v;

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		v = 12345;
		if (odpd_conf_parse_size(good[i].s, good[i].mem, &v) != 0 || v != good[i].want) {
			print_error("\"%s\" of %llu: got %llu\n", good[i].s,
				    (unsigned long long)good[i].mem, (unsigned long long)v);
			fail();
		}
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		v = 12345;
		if (odpd_conf_parse_size(bad[i], MEM, &v) != -EINVAL || v != 12345) {
			print_error("\"%s\" was accepted as %llu\n", bad[i], (unsigned long long)v);
			fail();
		}
	}
}

static void test_meminfo_total(void **state)
{
	(void)state;
	struct sysinfo si;

	/* both come from the kernel's totalram_pages */
	assert_int_equal(sysinfo(&si), 0);
	assert_int_equal(odpd_meminfo_total(), (uint64_t)si.totalram * si.mem_unit);
}

/* ------------------------------------------------------------ rules */

static const char rules_conf[] =
	"[cgroup /]\nmax-pinned = 1K\n"             /* rules[0] */
	"[cgroup /a/b]\nmax-pinned = 3K\n"          /* rules[1]: before its prefix */
	"[cgroup /a]\nmax-pinned = 2K\n"            /* rules[2] */
	"[group 4242]\nmax-pinned = 4K\n"           /* rules[3] */
	"[group 4343]\nmax-pinned = 5K\n"           /* rules[4] */
	"[user 5000]\nmax-pinned = 6K\n"            /* rules[5] */
	"[user 7000]\n"                             /* rules[6]: sets nothing */
	"[group 4444]\n"                            /* rules[7]: sets nothing */
	"[cgroup /a/b/c]\n";                        /* rules[8]: sets nothing */

/* Per-user limits: [limits] defaults, a rule's own keys, and a rule that
 * sets only some of them matches (the rest come from [limits]). */
static void test_user_limits(void **state)
{
	struct odpd_conf c;
	const struct odpd_rule *r;

	(void)state;
	odpd_conf_defaults(&c, 0);
	assert_int_equal(c.user_default[ODPD_UL_CONNECTIONS], ODPD_LIMIT_AUTO);
	assert_int_equal(c.user_default[ODPD_UL_SEGMENTS], ODPD_LIMIT_AUTO);
	assert_int_equal(c.user_default[ODPD_UL_MAPPED], ODPD_MAPPED_QUARTER_WINDOW);
	assert_int_equal(c.user_default[ODPD_UL_MRS], 262144);
	assert_int_equal(c.user_default[ODPD_UL_REGISTRAR_WAITS], 4);
	assert_int_equal(c.user_default[ODPD_UL_MAPPINGS], ODPD_LIMIT_AUTO);
	odpd_conf_free(&c);
	load_ok(&c, "[limits]\ndefault-connections = 8\ndefault-segments = unlimited\n"
		    "default-mapped = 1G\ndefault-mrs = 100\ndefault-registrar-waits = 2\n"
		    "[user 5000]\nmax-connections = 2\nmax-registrar-waits = 16\n"
		    "[group 4242]\nmax-pinned = 1K\nmax-mapped = 64K\nmax-mrs = 9\nmax-segments = 3\n");
	assert_int_equal(c.user_default[ODPD_UL_CONNECTIONS], 8);
	assert_true(c.user_default[ODPD_UL_SEGMENTS] == ODPD_UNLIMITED);
	assert_int_equal(c.user_default[ODPD_UL_MAPPED], GIB);
	assert_int_equal(c.user_default[ODPD_UL_MRS], 100);
	assert_int_equal(c.user_default[ODPD_UL_REGISTRAR_WAITS], 2);
	assert_int_equal(odpd_conf_match_rule_for(&c, ODPD_UL_REGISTRAR_WAITS, 5000, 4242, NULL, 0,
						  NULL)->max[ODPD_UL_REGISTRAR_WAITS], 16);
	assert_null(odpd_conf_match_rule_for(&c, ODPD_UL_REGISTRAR_WAITS, 6000, 4242, NULL, 0, NULL));
	/* each key on its own: uid 5000's connections from its [user] rule, its
	 * pinned bytes and MRs from its group's, as if the [user] rule said nothing */
	r = odpd_conf_match_rule_for(&c, ODPD_UL_CONNECTIONS, 5000, 4242, NULL, 0, NULL);
	assert_ptr_equal(r, &c.rules[0]);
	assert_int_equal(r->max[ODPD_UL_CONNECTIONS], 2);
	assert_ptr_equal(odpd_conf_match_rule(&c, 5000, 4242, NULL, 0, NULL), &c.rules[1]);
	assert_ptr_equal(odpd_conf_match_rule_for(&c, ODPD_UL_MRS, 5000, 4242, NULL, 0, NULL), &c.rules[1]);
	assert_null(odpd_conf_match_rule_for(&c, ODPD_UL_CONNECTIONS, 6000, 4242, NULL, 0, NULL));
	assert_null(odpd_conf_match_rule(&c, 5000, 1, NULL, 0, NULL));
	r = odpd_conf_match_rule_for(&c, ODPD_UL_MAPPED, 6000, 4242, NULL, 0, NULL);
	assert_ptr_equal(r, &c.rules[1]);
	assert_int_equal(r->max[ODPD_UL_MAPPED], 64 * KIB);
	assert_int_equal(r->max[ODPD_UL_MRS], 9);
	assert_int_equal(r->max[ODPD_UL_SEGMENTS], 3);
	odpd_conf_free(&c);
	load_ok(&c, "[limits]\ndefault-mapped = window\n");
	assert_int_equal(c.user_default[ODPD_UL_MAPPED], ODPD_MAPPED_QUARTER_WINDOW);
	odpd_conf_free(&c);
	load_ok(&c, "[limits]\ndefault-connections = auto\ndefault-segments = auto\ndefault-mappings = 7\n"
		    "[user 5000]\nmax-mappings = unlimited\n");
	assert_int_equal(c.user_default[ODPD_UL_CONNECTIONS], ODPD_LIMIT_AUTO);
	assert_int_equal(c.user_default[ODPD_UL_SEGMENTS], ODPD_LIMIT_AUTO);
	assert_int_equal(c.user_default[ODPD_UL_MAPPINGS], 7);
	assert_true(c.rules[0].max[ODPD_UL_MAPPINGS] == ODPD_UNLIMITED);
	odpd_conf_free(&c);
	load_fails("[limits]\ndefault-mrs = auto\n", 2, "bad number \"auto\" for default-mrs");
	load_fails("[user 5000]\nmax-segments = auto\n", 2, "bad number \"auto\" for max-segments");
}

/*
 * The auto defaults are a user's fair share, a quarter, of what odpd has:
 * half of a quarter of its fds for segments, the other half for
 * connections (ODPD_FDS_PER_CONNECTION each), at most 1024 and 64, at
 * least 1; a quarter of vm.max_map_count for mappings; a quarter of the
 * window for bytes. Values set in the file stay.
 */
static void test_budget_defaults(void **state)
{
	struct odpd_conf c;
	uint64_t def[ODPD_N_UL];
	struct odpd_budget b = { .nofile = 1024, .max_map_count = 65530, .window_size = 4ull << 40 };

	(void)state;
	odpd_conf_defaults(&c, 0);
	odpd_budget_user_defaults(&c, &b, def);
	assert_int_equal(def[ODPD_UL_SEGMENTS], 128);
	assert_int_equal(def[ODPD_UL_CONNECTIONS], 128 / ODPD_FDS_PER_CONNECTION);
	assert_true(def[ODPD_UL_CONNECTIONS] * ODPD_FDS_PER_CONNECTION + def[ODPD_UL_SEGMENTS] <= 1024 / 4);
	assert_int_equal(def[ODPD_UL_MAPPINGS], 65530 / 4);
	assert_int_equal(def[ODPD_UL_MAPPED], 1ull << 40);
	assert_int_equal(def[ODPD_UL_MRS], 262144);
	b.nofile = 256;
	odpd_budget_user_defaults(&c, &b, def);
	assert_int_equal(def[ODPD_UL_SEGMENTS], 32);
	assert_int_equal(def[ODPD_UL_CONNECTIONS], 32 / ODPD_FDS_PER_CONNECTION);
	b.nofile = 16;                                /* never none at all */
	odpd_budget_user_defaults(&c, &b, def);
	assert_int_equal(def[ODPD_UL_SEGMENTS], 2);
	assert_int_equal(def[ODPD_UL_CONNECTIONS], 1);
	b.nofile = 524288;                            /* systemd's hard limit: the old defaults */
	odpd_budget_user_defaults(&c, &b, def);
	assert_int_equal(def[ODPD_UL_SEGMENTS], 1024);
	assert_int_equal(def[ODPD_UL_CONNECTIONS], 64);
	b.nofile = 0;                                 /* unlimited */
	b.max_map_count = 0;                          /* unknown: the kernel's default */
	odpd_budget_user_defaults(&c, &b, def);
	assert_int_equal(def[ODPD_UL_SEGMENTS], 1024);
	assert_int_equal(def[ODPD_UL_CONNECTIONS], 64);
	assert_int_equal(def[ODPD_UL_MAPPINGS], ODPD_MAX_MAP_COUNT_DEFAULT / 4);
	odpd_conf_free(&c);
	load_ok(&c, "[limits]\ndefault-segments = 5000\ndefault-mappings = 9\n");
	b.nofile = 256;
	odpd_budget_user_defaults(&c, &b, def);
	assert_int_equal(def[ODPD_UL_SEGMENTS], 5000);  /* the file wins (odpd warns) */
	assert_int_equal(def[ODPD_UL_CONNECTIONS], 32 / ODPD_FDS_PER_CONNECTION);
	assert_int_equal(def[ODPD_UL_MAPPINGS], 9);
	odpd_conf_free(&c);
}

static void test_rule_precedence(void **state)
{
	(void)state;
	const gid_t both[] = { 9, 4343, 4242 }, sup[] = { 9, 4343 }, none[] = { 9 };
	struct odpd_conf c;
	const struct odpd_rule *r;

	load_ok(&c, rules_conf);
	assert_int_equal(c.n_rules, 9);
	/* user beats group beats cgroup */
	assert_ptr_equal(odpd_conf_match_rule(&c, 5000, 4242, both, 3, "/a/b"), &c.rules[5]);
	assert_ptr_equal(odpd_conf_match_rule(&c, 6000, 4242, both, 3, "/a/b"), &c.rules[3]);
	assert_ptr_equal(odpd_conf_match_rule(&c, 6000, 1, none, 1, "/a/b"), &c.rules[1]);
	/* a supplementary group counts; of several groups, the first in the file */
	assert_ptr_equal(odpd_conf_match_rule(&c, 6000, 1, sup, 2, NULL), &c.rules[4]);
	assert_ptr_equal(odpd_conf_match_rule(&c, 6000, 1, both, 3, NULL), &c.rules[3]);
	assert_ptr_equal(odpd_conf_match_rule(&c, 6000, 4343, none, 1, NULL), &c.rules[4]);
	assert_ptr_equal(odpd_conf_match_rule(&c, 6000, 4343, both, 3, NULL), &c.rules[3]);
	/* the longest cgroup prefix, at '/' boundaries */
	assert_ptr_equal(odpd_conf_match_rule(&c, 6000, 1, NULL, 0, "/a/b/c/d"), &c.rules[1]);
	assert_ptr_equal(odpd_conf_match_rule(&c, 6000, 1, NULL, 0, "/a/b"), &c.rules[1]);
	assert_ptr_equal(odpd_conf_match_rule(&c, 6000, 1, NULL, 0, "/a/bc"), &c.rules[2]);
	assert_ptr_equal(odpd_conf_match_rule(&c, 6000, 1, NULL, 0, "/a"), &c.rules[2]);
	assert_ptr_equal(odpd_conf_match_rule(&c, 6000, 1, NULL, 0, "/ab"), &c.rules[0]);
	assert_ptr_equal(odpd_conf_match_rule(&c, 6000, 1, NULL, 0, "/"), &c.rules[0]);
	assert_null(odpd_conf_match_rule(&c, 6000, 1, NULL, 0, NULL));
	/* a rule without max-pinned is no match */
	r = odpd_conf_match_rule(&c, 7000, 4444, NULL, 0, "/a/b/c");
	assert_ptr_equal(r, &c.rules[1]);
	assert_int_equal(r->max_pinned, 3 * KIB);
	odpd_conf_free(&c);

	/* without [cgroup /], "/ab" does not fall under "/a" */
	load_ok(&c, "[cgroup /a]\nmax-pinned = 2K\n[group 1]\nmax-pinned = 1K\n");
	assert_null(odpd_conf_match_rule(&c, 6000, 2, NULL, 0, "/ab"));
	assert_null(odpd_conf_match_rule(&c, 6000, 2, NULL, 0, "/"));
	assert_ptr_equal(odpd_conf_match_rule(&c, 6000, 2, NULL, 0, "/a/x"), &c.rules[0]);
	assert_ptr_equal(odpd_conf_match_rule(&c, 6000, 1, NULL, 0, "/a/x"), &c.rules[1]);
	odpd_conf_free(&c);

	/* no rules at all */
	odpd_conf_defaults(&c, MEM);
	assert_null(odpd_conf_match_rule(&c, 0, 0, NULL, 0, "/"));
	odpd_conf_free(&c);
}

/* remote-access: a key of rules only, decided on its own like the others */
static void test_remote_access(void **state)
{
	struct odpd_conf c;
	const struct odpd_rule *r;

	(void)state;
	load_ok(&c, "[cgroup /kubepods.slice]\nremote-access = yes\nmax-pinned = 1G\n"
		    "[user 5000]\nremote-access = no\n[group 4242]\nmax-pinned = 1K\n");
	r = odpd_conf_match_rule_for(&c, ODPD_RULE_KEY_REMOTE, 6000, 1, NULL, 0, "/kubepods.slice/pod1");
	assert_ptr_equal(r, &c.rules[0]);
	assert_true(r->remote_access);
	/* uid 5000's own rule says no, though its cgroup says yes */
	r = odpd_conf_match_rule_for(&c, ODPD_RULE_KEY_REMOTE, 5000, 1, NULL, 0, "/kubepods.slice/pod1");
	assert_ptr_equal(r, &c.rules[1]);
	assert_false(r->remote_access);
	/* a rule that does not set it is no match: [group 4242] */
	assert_null(odpd_conf_match_rule_for(&c, ODPD_RULE_KEY_REMOTE, 6000, 4242, NULL, 0, "/x"));
	/* and remote-access alone does not make a pinning rule */
	assert_ptr_equal(odpd_conf_match_rule(&c, 5000, 1, NULL, 0, NULL), NULL);
	odpd_conf_free(&c);
	load_fails("[user 5000]\nremote-access = maybe\n", 2, "bad value \"maybe\" for remote-access");
	load_fails("[limits]\nremote-access = yes\n", 2, "unknown key \"remote-access\"");
}

/* ------------------------------------------------------------ shared PDs */

static const char pd_conf[] =
	"[pd train*]\n"
	"users = 1001, root\n"
	"groups = 4242\n"
	"[pd training]\n"                   /* shadowed by train* */
	"users = 2000\n"
	"[pd closed]\n"                     /* nobody */
	"[pd ?-job]\n"
	"groups = root\n";

static void assert_refused(const struct odpd_conf *c, const char *name, uid_t uid, gid_t gid,
			   const gid_t *groups, unsigned n, uid_t creator, const char *reason)
{
	char why[256] = "";

	assert_false(odpd_conf_pd_allowed(c, name, uid, gid, groups, n, creator, why, sizeof(why)));
	assert_string_equal(why, reason);
}

static void test_pd_policy(void **state)
{
	(void)state;
	const gid_t sup[] = { 7, 4242 }, other[] = { 7, 8 }, root[] = { 0 };
	struct odpd_conf c;
	char why[256];

	load_ok(&c, pd_conf);
	/* a listed uid, whoever created it */
	assert_true(odpd_conf_pd_allowed(&c, "training", 1001, 1001, NULL, 0, 5, why, sizeof(why)));
	assert_true(odpd_conf_pd_allowed(&c, "train", 0, 5, NULL, 0, 5, why, sizeof(why)));
	/* a listed group, primary or supplementary */
	assert_true(odpd_conf_pd_allowed(&c, "train-2", 3000, 4242, NULL, 0, 5, why, sizeof(why)));
	assert_true(odpd_conf_pd_allowed(&c, "train-2", 3000, 3000, sup, 2, 5, why, sizeof(why)));
	assert_true(odpd_conf_pd_allowed(&c, "a-job", 3000, 3000, root, 1, 3000, why, sizeof(why)));
	/* neither: refused, even for its creator; the reason names the section */
	assert_refused(&c, "train-2", 3000, 3000, other, 2, 3000,
		       "[pd train*] lists neither uid 3000 nor its groups");
	assert_refused(&c, "ab-job", 3000, 3000, other, 2, 1234,
		       "no [pd] section matches \"ab-job\": only its creator, uid 1234, may join");
	/* the first matching section decides: [pd training] is never reached */
	assert_refused(&c, "training", 2000, 2000, NULL, 0, 2000,
		       "[pd train*] lists neither uid 2000 nor its groups");
	/* a section listing nobody: nobody, not even root or the creator */
	assert_refused(&c, "closed", 0, 0, root, 1, 0, "[pd closed] lists neither uid 0 nor its groups");
	/* no section: the creator only (a new PD: creator_uid is the caller) */
	assert_true(odpd_conf_pd_allowed(&c, "other", 1000, 1000, NULL, 0, 1000, why, sizeof(why)));
	assert_refused(&c, "other", 1001, 4242, sup, 2, 1000,
		       "no [pd] section matches \"other\": only its creator, uid 1000, may join");
	/* patterns match the whole name */
	assert_refused(&c, "closed2", 1, 1, NULL, 0, 2,
		       "no [pd] section matches \"closed2\": only its creator, uid 2, may join");
	/* no buffer for the reason */
	assert_false(odpd_conf_pd_allowed(&c, "closed", 0, 0, NULL, 0, 0, NULL, 0));
	odpd_conf_free(&c);

	/* without any [pd] section */
	odpd_conf_defaults(&c, MEM);
	assert_true(odpd_conf_pd_allowed(&c, "x", 5, 5, NULL, 0, 5, why, sizeof(why)));
	assert_refused(&c, "x", 0, 0, NULL, 0, 5,
		       "no [pd] section matches \"x\": only its creator, uid 5, may join");
	odpd_conf_free(&c);
}

static void test_pd_name_valid(void **state)
{
	(void)state;
	char name[80];

	assert_true(odpd_conf_pd_name_valid("a"));
	assert_true(odpd_conf_pd_name_valid("training"));
	assert_true(odpd_conf_pd_name_valid("Job_1.part-2:rank@host"));
	assert_true(odpd_conf_pd_name_valid("0123456789"));
	assert_true(odpd_conf_pd_name_valid("..."));
	memset(name, 'x', sizeof(name));
	name[63] = '\0';
	assert_true(odpd_conf_pd_name_valid(name));
	name[63] = 'x';
	name[64] = '\0';
	assert_false(odpd_conf_pd_name_valid(name));

	static const char *const bad[] = {
		"", "a b", "a/b", "a*", "a?", "a[1]", "a\n", "\xc3\xa4", "a,b", "a#", "a;b", "a=b",
		"a%b", "a+b", "~a", "a\\b",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (odpd_conf_pd_name_valid(bad[i])) {
			print_error("\"%s\" was accepted\n", bad[i]);
			fail();
		}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_issue_example),
		cmocka_unit_test(test_full_file),
		cmocka_unit_test(test_empty_file),
		cmocka_unit_test(test_missing_file),
		cmocka_unit_test(test_world_writable),
		cmocka_unit_test(test_error_keeps_parsed),
		cmocka_unit_test(test_free_reuse),
		cmocka_unit_test(test_errors_limits),
		cmocka_unit_test(test_errors_sections),
		cmocka_unit_test(test_errors_rules_and_pds),
		cmocka_unit_test(test_errors_syntax),
		cmocka_unit_test(test_names_resolved_later),
		cmocka_unit_test(test_error_buffer),
		cmocka_unit_test(test_sizes),
		cmocka_unit_test(test_meminfo_total),
		cmocka_unit_test(test_rule_precedence),
		cmocka_unit_test(test_user_limits),
		cmocka_unit_test(test_remote_access),
		cmocka_unit_test(test_budget_defaults),
		cmocka_unit_test(test_pd_policy),
		cmocka_unit_test(test_pd_name_valid),
	};

	return cmocka_run_group_tests_name("conf", tests, setup, teardown);
}
