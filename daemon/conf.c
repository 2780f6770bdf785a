/* SPDX-License-Identifier: MIT */
/*
 * odpd.conf, parsed with inih (odpd.conf(5)).
 *
 * inih is used through ini_parse_stream() with a reader of our own. The
 * reader counts lines (inih only reports the line of the first error, and
 * the handler is not told which line it is on), refuses lines longer than
 * inih's buffer (inih 55, Debian 12's, parses the tail of such a line as a
 * line of its own: a long comment could end in a key), and opens the
 * sections itself: inih calls the handler only for keys, so an empty section
 * ("[pd secret]", which means nobody may use those PDs) would otherwise go
 * unseen, and it truncates section names to 49 bytes, too short for a cgroup
 * path. The reader classifies each line the way inih will (comment,
 * continuation of the previous value, section header, key) so that both
 * agree on what a line is.
 *
 * inih strips inline comments that start with ';' after whitespace, but not
 * '#' ones (INI_INLINE_COMMENT_PREFIXES is ";"), so values lose a '#' comment
 * here; text after a section header's ']' is ignored by inih and checked
 * here to be a comment.
 */
#include <errno.h>
#include <fnmatch.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ini.h>

#include "conf.h"

#define MAX_RELAXED_WINDOW_MS 86400000  /* a day: ms * 10^6 stays far from overflow */
#define PD_NAME_MAX 63

enum section { SEC_NONE, SEC_LIMITS, SEC_RULE, SEC_PD, SEC_ODP };

enum limit_key { KEY_MAX_PINNED, KEY_MAX_MRS, KEY_DEFAULT_PINNED, KEY_RELAXED_WINDOW_MS,
		 KEY_RELAXED_MAX_MRS, KEY_RELAXED_MAX_BYTES, KEY_HOLE_CHECK_MS, KEY_DEFAULT_USER, /* + enum odpd_user_limit */
		 N_LIMIT_KEYS = KEY_DEFAULT_USER + ODPD_N_UL };

static const char *const limit_keys[N_LIMIT_KEYS] = {
	[KEY_MAX_PINNED] = "max-pinned",
	[KEY_MAX_MRS] = "max-mrs",
	[KEY_DEFAULT_PINNED] = "default-pinned",
	[KEY_RELAXED_WINDOW_MS] = "relaxed-window-ms",
	[KEY_RELAXED_MAX_MRS] = "relaxed-max-mrs",
	[KEY_RELAXED_MAX_BYTES] = "relaxed-max-bytes",
	[KEY_HOLE_CHECK_MS] = "hole-check-ms",
	[KEY_DEFAULT_USER + ODPD_UL_CONNECTIONS] = "default-connections",
	[KEY_DEFAULT_USER + ODPD_UL_SEGMENTS] = "default-segments",
	[KEY_DEFAULT_USER + ODPD_UL_MAPPED] = "default-mapped",
	[KEY_DEFAULT_USER + ODPD_UL_MRS] = "default-mrs",
	[KEY_DEFAULT_USER + ODPD_UL_REGISTRAR_WAITS] = "default-registrar-waits",
	[KEY_DEFAULT_USER + ODPD_UL_MAPPINGS] = "default-mappings",
};

const char *const odpd_user_limit_names[ODPD_N_UL] = {
	[ODPD_UL_CONNECTIONS] = "connections",
	[ODPD_UL_SEGMENTS] = "segments",
	[ODPD_UL_MAPPED] = "mapped",
	[ODPD_UL_MRS] = "mrs",
	[ODPD_UL_REGISTRAR_WAITS] = "registrar-waits",
	[ODPD_UL_MAPPINGS] = "mappings",
};

/* A rule's keys: max-pinned, then max-<odpd_user_limit_names>, then remote-access. */
#define N_RULE_KEYS (2 + ODPD_N_UL)

/* The state of one odpd_conf_load(). */
struct parse {
	struct odpd_conf *c;
	FILE *f;
	const char *path;
	uint64_t mem_total;
	char *buf;                  /* getline()'s */
	size_t bufsize;
	unsigned line;              /* of the line inih is working on */
	bool in_value;              /* a key was seen since the last header: inih's prev_name */
	bool cont;                  /* this line continues the previous key's value */
	enum section sec;
	unsigned sec_index;         /* in c->rules or c->pds */
	const char *sec_label;
	unsigned key_line[N_LIMIT_KEYS]; /* where each key of this section was set */
	unsigned limits_line;       /* of the [limits] header, 0 if none yet */
	unsigned odp_line;          /* of the [odp] header, 0 if none yet */
	int read_errno;
	bool failed;
	unsigned err_line;
	char *err;
	size_t errlen;
};

/* ------------------------------------------------------------ numbers */

/* @n decimal digits, nothing else. */
static int parse_digits(const char *s, size_t n, uint64_t *ret)
{
	uint64_t v = 0;

	if (n == 0)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		unsigned d = (unsigned)(s[i] - '0');

		if (s[i] < '0' || s[i] > '9' || v > (UINT64_MAX - d) / 10)
			return -EINVAL;
		v = v * 10 + d;
	}
	*ret = v;
	return 0;
}

/* @pct percent of @total, rounded down, without overflow. */
static uint64_t percent_of(uint64_t total, uint64_t pct)
{
	return total / 100 * pct + total % 100 * pct / 100;
}

int odpd_conf_parse_size(const char *s, uint64_t mem_total, uint64_t *ret)
{
	static const char suffixes[8] = "KMGTkmgt";
	size_t n = strlen(s);
	unsigned shift = 0;
	const char *p;
	uint64_t v;

	if (strcmp(s, "unlimited") == 0) {
		*ret = ODPD_UNLIMITED;
		return 0;
	}
	if (n && s[n - 1] == '%') {
		if (parse_digits(s, n - 1, &v) < 0 || v > 100)
			return -EINVAL;
		*ret = percent_of(mem_total, v);
		return 0;
	}
	if (n && (p = memchr(suffixes, s[n - 1], sizeof(suffixes)))) {
		shift = 10 * (unsigned)((p - suffixes) % 4 + 1);
		n--;
	}
	if (parse_digits(s, n, &v) < 0 || v > (UINT64_MAX >> shift))
		return -EINVAL;
	*ret = v << shift;
	return 0;
}

uint64_t odpd_meminfo_total(void)
{
	FILE *f = fopen("/proc/meminfo", "re");
	char line[256];
	uint64_t kb = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemTotal: %" SCNu64 " kB", &kb) == 1)
			break;
	fclose(f);
	return kb > UINT64_MAX / 1024 ? 0 : kb * 1024;
}

static bool is_space(char ch)
{
	return ch == ' ' || (ch >= '\t' && ch <= '\r');
}

/* ------------------------------------------------------------ errors */

static void fail(struct parse *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Record "PATH:LINE: message", the first error only, and stop the parse. */
static void fail(struct parse *p, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (p->failed)
		return;
	p->failed = true;
	p->err_line = p->line;
	if (!p->err || !p->errlen)
		return;
	n = snprintf(p->err, p->errlen, "%s:%u: ", p->path, p->line);
	if (n < 0 || (size_t)n >= p->errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
	va_end(ap);
}

static void *grow(struct parse *p, void *arr, size_t n, size_t size)
{
	void *a = reallocarray(arr, n + 1, size);

	if (!a)
		fail(p, "out of memory");
	return a;
}

/* ------------------------------------------------------------ users and groups */

/* A uid or gid written as digits: anything but (id_t)-1. */
static bool parse_id(const char *s, uint32_t *ret)
{
	uint64_t v;

	if (parse_digits(s, strlen(s), &v) < 0 || v >= UINT32_MAX)
		return false;
	*ret = (uint32_t)v;
	return true;
}

/* 0, -ENOENT for no such user, or another -errno. */
static int lookup_user(const char *name, uid_t *ret)
{
	struct passwd pw, *res = NULL;
	size_t size = 1024;
	char *buf = NULL;
	uint32_t id;
	int r;

	if (parse_id(name, &id)) {
		*ret = id;
		return 0;
	}
	do {
		char *b = realloc(buf, size *= 2);
		if (!b) {
			free(buf);
			return -ENOMEM;
		}
		buf = b;
		r = getpwnam_r(name, &pw, buf, size, &res);
	} while (r == ERANGE && size < (1u << 20));
	if (res)
		*ret = res->pw_uid;
	free(buf);
	return res ? 0 : r == 0 || r == ENOENT || r == ESRCH ? -ENOENT : -r;
}

static int lookup_group(const char *name, gid_t *ret)
{
	struct group gr, *res = NULL;
	size_t size = 1024;
	char *buf = NULL;
	uint32_t id;
	int r;

	if (parse_id(name, &id)) {
		*ret = id;
		return 0;
	}
	do {
		char *b = realloc(buf, size *= 2);
		if (!b) {
			free(buf);
			return -ENOMEM;
		}
		buf = b;
		r = getgrnam_r(name, &gr, buf, size, &res);
	} while (r == ERANGE && size < (1u << 20));
	if (res)
		*ret = res->gr_gid;
	free(buf);
	return res ? 0 : r == 0 || r == ENOENT || r == ESRCH ? -ENOENT : -r;
}

/* Report a failed lookup_user/lookup_group of @name. */
static void fail_lookup(struct parse *p, int r, const char *what, const char *name,
			const char *where)
{
	if (r == -ENOENT)
		fail(p, "unknown %s \"%s\"%s", what, name, where);
	else
		fail(p, "looking up %s \"%s\"%s: %s", what, name, where, strerror(-r));
}

/* ------------------------------------------------------------ sections */

/* "/a/b": absolute, no empty, "." or ".." component; a trailing '/' is dropped. */
static bool cgroup_path_normalize(char *s)
{
	size_t n = strlen(s);

	if (s[0] != '/')
		return false;
	while (n > 1 && s[n - 1] == '/')
		s[--n] = '\0';
	if (n == 1)
		return true;
	for (const char *c = s; c; c = strchr(c + 1, '/')) {
		size_t len = strcspn(c + 1, "/");

		if (len == 0 || (len == 1 && c[1] == '.') || (len == 2 && c[1] == '.' && c[2] == '.'))
			return false;
	}
	return true;
}

static bool pd_name_char(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
	       (ch && strchr("._:@-", ch));
}

bool odpd_conf_pd_name_valid(const char *name)
{
	size_t n = 0;

	for (; name[n]; n++)
		if (n >= PD_NAME_MAX || !pd_name_char(name[n]))
			return false;
	return n > 0;
}

/* The characters of PD names and the wildcards '*' and '?'. A bracket
 * expression cannot be written: the header would end at its ']'. */
static bool pd_pattern_valid(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!pd_name_char(*s) && *s != '*' && *s != '?')
			return false;
	return true;
}

/* The rule of the same kind and subject as @r, if any. */
static const struct odpd_rule *rule_find_same(const struct odpd_conf *c, const struct odpd_rule *r)
{
	for (unsigned i = 0; i < c->n_rules; i++) {
		const struct odpd_rule *o = &c->rules[i];

		if (o->kind != r->kind || o->unresolved || o == r)
			continue;
		if ((r->kind == ODPD_RULE_USER && o->uid == r->uid) ||
		    (r->kind == ODPD_RULE_GROUP && o->gid == r->gid) ||
		    (r->kind == ODPD_RULE_CGROUP && strcmp(o->cgroup, r->cgroup) == 0))
			return o;
	}
	return NULL;
}

/* Remember @name (of rule or [pd] @index) for odpd_conf_resolve(). */
static int add_unresolved(struct parse *p, enum odpd_unresolved_kind kind, unsigned index,
			  const char *name, int error)
{
	struct odpd_unresolved *u = grow(p, p->c->unresolved, p->c->n_unresolved, sizeof(*u));
	char *n = u ? strdup(name) : NULL;

	if (u)
		p->c->unresolved = u;
	if (!n) {
		fail(p, "out of memory");
		return -ENOMEM;
	}
	u[p->c->n_unresolved++] = (struct odpd_unresolved){ .kind = kind, .index = index, .name = n,
							     .line = p->line, .error = -error };
	return 0;
}

/* A name, not an id: an id that is no uid (4294967295, -1) stays an error. */
static bool may_resolve_later(const char *name)
{
	uint32_t id;

	return !parse_id(name, &id) && name[0] != '-' && (name[0] < '0' || name[0] > '9');
}

/* Fill @r's subject from @subject (modified: a cgroup path is normalized). */
static int rule_subject(struct parse *p, struct odpd_rule *r, const char *kind, char *subject,
			const char *label)
{
	int e;

	switch (r->kind) {
	case ODPD_RULE_USER:
		e = lookup_user(subject, &r->uid);
		break;
	case ODPD_RULE_GROUP:
		e = lookup_group(subject, &r->gid);
		break;
	default:
		if (!cgroup_path_normalize(subject)) {
			fail(p, "bad cgroup path in %s: it must be absolute, like /kubepods.slice, "
			     "without \".\", \"..\" or empty components", label);
			return -EINVAL;
		}
		r->cgroup = strdup(subject);
		e = r->cgroup ? 0 : -ENOMEM;
		break;
	}
	if (e < 0 && e != -ENOMEM && r->kind != ODPD_RULE_CGROUP && may_resolve_later(subject)) {
		r->unresolved = true;
		r->uid = (uid_t)-1;
		r->gid = (gid_t)-1;
		return add_unresolved(p, ODPD_UNRES_RULE, p->c->n_rules, subject, e);
	}
	if (e < 0)
		fail_lookup(p, e, kind, subject, "");
	return e;
}

static int open_rule(struct parse *p, enum odpd_rule_kind kind, const char *kname, char *subject,
		     const char *label)
{
	struct odpd_rule r = { .kind = kind, .line = p->line };
	const struct odpd_rule *dup;
	struct odpd_rule *rules;

	if (rule_subject(p, &r, kname, subject, label) < 0)
		return -EINVAL;
	dup = r.unresolved ? NULL : rule_find_same(p->c, &r);
	if (dup) {
		fail(p, "duplicate section %s: %s on line %u is the same %s", label, dup->label,
		     dup->line, kname);
		free(r.cgroup);
		return -EINVAL;
	}
	r.label = strdup(label);
	rules = grow(p, p->c->rules, p->c->n_rules, sizeof(*rules));
	if (!r.label || !rules) {
		fail(p, "out of memory");
		free(r.label);
		free(r.cgroup);
		return -ENOMEM;
	}
	p->c->rules = rules;
	p->sec_index = p->c->n_rules;
	rules[p->c->n_rules++] = r;
	p->sec = SEC_RULE;
	p->sec_label = r.label;
	return 0;
}

/* A [pd] section lists whom it allows; listing nobody means nobody may
 * create or join the PDs it matches, not even root or their creator. */
static int open_pd(struct parse *p, const char *pattern, const char *label)
{
	struct odpd_pd_policy pd = { .line = p->line };
	struct odpd_pd_policy *pds;

	if (!pd_pattern_valid(pattern)) {
		fail(p, "bad PD name pattern in %s: use the characters of PD names "
		     "([A-Za-z0-9._:@-]) and the wildcards * and ?", label);
		return -EINVAL;
	}
	for (unsigned i = 0; i < p->c->n_pds; i++)
		if (strcmp(p->c->pds[i].pattern, pattern) == 0) {
			fail(p, "duplicate section %s (first on line %u)", label, p->c->pds[i].line);
			return -EINVAL;
		}
	pd.pattern = strdup(pattern);
	pd.label = strdup(label);
	pds = grow(p, p->c->pds, p->c->n_pds, sizeof(*pds));
	if (!pd.pattern || !pd.label || !pds) {
		fail(p, "out of memory");
		free(pd.pattern);
		free(pd.label);
		return -ENOMEM;
	}
	p->c->pds = pds;
	p->sec_index = p->c->n_pds;
	pds[p->c->n_pds++] = pd;
	p->sec = SEC_PD;
	p->sec_label = pd.label;
	return 0;
}

static int open_limits(struct parse *p, const char *subject)
{
	if (*subject) {
		fail(p, "[limits] takes no argument, not \"%s\"", subject);
		return -EINVAL;
	}
	if (p->limits_line) {
		fail(p, "duplicate section [limits] (first on line %u)", p->limits_line);
		return -EINVAL;
	}
	p->limits_line = p->line;
	p->sec = SEC_LIMITS;
	p->sec_label = "[limits]";
	return 0;
}

static int open_odp(struct parse *p, const char *subject)
{
	if (*subject) {
		fail(p, "[odp] takes no argument, not \"%s\"", subject);
		return -EINVAL;
	}
	if (p->odp_line) {
		fail(p, "duplicate section [odp] (first on line %u)", p->odp_line);
		return -EINVAL;
	}
	p->odp_line = p->line;
	p->sec = SEC_ODP;
	p->sec_label = "[odp]";
	return 0;
}

/* @hdr: what lies between '[' and ']', trimmed; modified. */
static int open_section(struct parse *p, char *hdr)
{
	size_t klen = strcspn(hdr, " \t\f\v");
	char *subject = hdr + klen + strspn(hdr + klen, " \t\f\v");
	char label[512];

	snprintf(label, sizeof(label), "[%s]", hdr);
	hdr[klen] = '\0';
	memset(p->key_line, 0, sizeof(p->key_line));
	if (strcmp(hdr, "limits") == 0)
		return open_limits(p, subject);
	if (strcmp(hdr, "odp") == 0)
		return open_odp(p, subject);
	if (strcmp(hdr, "pd") == 0 && *subject)
		return open_pd(p, subject, label);
	if (strcmp(hdr, "user") == 0 || strcmp(hdr, "group") == 0 || strcmp(hdr, "cgroup") == 0) {
		enum odpd_rule_kind kind = hdr[0] == 'u' ? ODPD_RULE_USER :
					   hdr[0] == 'g' ? ODPD_RULE_GROUP : ODPD_RULE_CGROUP;
		if (!*subject) {
			fail(p, "[%s] needs a %s: [%s %s]", hdr, kind == ODPD_RULE_CGROUP ? "path" : "name or id",
			     hdr, kind == ODPD_RULE_CGROUP ? "/PATH" : "NAME");
			return -EINVAL;
		}
		return open_rule(p, kind, hdr, subject, label);
	}
	if (strcmp(hdr, "pd") == 0)
		fail(p, "[pd] needs a PD name pattern: [pd NAME] or [pd PATTERN*]");
	else
		fail(p, "unknown section %s (expected [limits], [odp], [user NAME], [group NAME], "
		     "[cgroup /PATH] or [pd PATTERN])", label);
	return -EINVAL;
}

/* ------------------------------------------------------------ lines */

static char *skip_space(const char *s)
{
	while (is_space(*s))
		s++;
	return (char *)s;
}

static void rstrip(char *s)
{
	size_t n = strlen(s);

	while (n && is_space(s[n - 1]))
		s[--n] = '\0';
}

/* As inih finds the end of a header or key: the first of @chars, or an
 * inline ';' comment (after whitespace), or the end. */
static const char *find_chars_or_comment(const char *s, const char *chars)
{
	bool was_space = false;

	for (; *s && !strchr(chars, *s) && !(was_space && *s == ';'); s++)
		was_space = is_space(*s);
	return s;
}

/* A '#' or ';' comment after whitespace (or at the start) ends a value. */
static void strip_comment(char *s)
{
	for (char *c = s; *c; c++)
		if ((*c == '#' || *c == ';') && (c == s || is_space(c[-1]))) {
			*c = '\0';
			break;
		}
	rstrip(s);
}

/* Classify @line as inih will and open the section it starts. False to stop. */
static bool scan_line(struct parse *p, char *line)
{
	char *s = line, *hdr;
	const char *e, *rest;
	int r;

	if (p->line == 1 && (unsigned char)s[0] == 0xEF && (unsigned char)s[1] == 0xBB &&
	    (unsigned char)s[2] == 0xBF)
		s += 3;
	s = skip_space(s);
	p->cont = false;
	if (!*s || *s == ';' || *s == '#')
		return true;
	if (p->in_value && s > line) {
		p->cont = true;
		return true;
	}
	if (*s != '[') {
		e = find_chars_or_comment(s, "=:");
		if (*e != '=' && *e != ':')
			fail(p, "expected [section], key = value or a comment");
		return !p->failed;
	}
	e = find_chars_or_comment(s + 1, "]");
	if (*e != ']') {
		fail(p, "no ']' closes the section header");
		return false;
	}
	rest = skip_space(e + 1);
	if (*rest && *rest != '#' && *rest != ';') {
		fail(p, "text after the section header: \"%.*s\" (comments start with # or ;)",
		     (int)strcspn(rest, "\r\n"), rest);
		return false;
	}
	hdr = strndup(s + 1, (size_t)(e - s - 1));
	if (!hdr) {
		fail(p, "out of memory");
		return false;
	}
	rstrip(hdr);
	p->in_value = false;
	r = open_section(p, skip_space(hdr));
	free(hdr);
	return r == 0;
}

/* inih's reader: one line from p->f, counted, and scanned. */
static char *conf_reader(char *str, int num, void *stream)
{
	struct parse *p = stream;
	ssize_t n;
	size_t len;

	if (p->failed)
		return NULL;
	n = getline(&p->buf, &p->bufsize, p->f);
	if (n < 0) {
		if (ferror(p->f))
			p->read_errno = errno ? errno : EIO;
		return NULL;
	}
	p->line++;
	len = (size_t)n;
	if (len && p->buf[len - 1] == '\n')
		len--;
	if (len && p->buf[len - 1] == '\r')
		len--;
	if (strlen(p->buf) != (size_t)n) {
		fail(p, "the line contains a NUL byte");
		return NULL;
	}
	if (num < 4 || len > (size_t)num - 3) {
		fail(p, "the line is longer than %d bytes", num - 3);
		return NULL;
	}
	memcpy(str, p->buf, (size_t)n + 1);
	return scan_line(p, str) ? str : NULL;
}

/* ------------------------------------------------------------ keys */

/* A percentage needs MemTotal, which odpd_meminfo_total() may not have found. */
static bool percent_unknown(const struct parse *p, const char *v)
{
	size_t n = strlen(v);

	return n && v[n - 1] == '%' && p->mem_total == 0;
}

static void set_size(struct parse *p, const char *key, const char *v, uint64_t *ret)
{
	if (percent_unknown(p, v))
		fail(p, "%s = %s: the size of memory is unknown (no MemTotal in /proc/meminfo); "
		     "give a size in bytes", key, v);
	else if (odpd_conf_parse_size(v, p->mem_total, ret) < 0)
		fail(p, "bad size \"%s\" for %s (use e.g. 64G, 50%% or unlimited)", v, key);
}

/* A decimal count up to @max, or "unlimited" if @unlimited. */
static void set_count(struct parse *p, const char *key, const char *v, bool unlimited,
		      uint64_t max, uint64_t *ret)
{
	uint64_t n;

	if (unlimited && strcmp(v, "unlimited") == 0)
		*ret = ODPD_UNLIMITED;
	else if (parse_digits(v, strlen(v), &n) == 0 && n <= max)
		*ret = n;
	else if (unlimited)
		fail(p, "bad number \"%s\" for %s (a decimal integer or unlimited)", v, key);
	else if (max < UINT64_MAX)
		fail(p, "bad number \"%s\" for %s (a decimal integer up to %" PRIu64 ")", v, key, max);
	else
		fail(p, "bad number \"%s\" for %s (a decimal integer)", v, key);
}

static void set_bool(struct parse *p, const char *key, const char *v, bool *ret)
{
	if (strcmp(v, "yes") == 0 || strcmp(v, "true") == 0 || strcmp(v, "1") == 0)
		*ret = true;
	else if (strcmp(v, "no") == 0 || strcmp(v, "false") == 0 || strcmp(v, "0") == 0)
		*ret = false;
	else
		fail(p, "bad value \"%s\" for %s (yes or no)", v, key);
}

static void set_default_pinned(struct parse *p, const char *v)
{
	struct odpd_conf *c = p->c;

	if (strcmp(v, "memlock") == 0) {
		c->default_pinned_memlock = true;
		c->default_pinned = 0;
	} else if (!percent_unknown(p, v) &&
		   odpd_conf_parse_size(v, p->mem_total, &c->default_pinned) == 0) {
		c->default_pinned_memlock = false;
	} else {
		fail(p, "bad value \"%s\" for default-pinned (memlock, or a size such as 8G, "
		     "10%% or unlimited)", v);
	}
}

/* A per-user limit: a size for mapped bytes, else a count; 0 is refused
 * (it would lock the user out: say so with a rule that is not there). */
static void user_limit(struct parse *p, const char *name, enum odpd_user_limit l, const char *v,
		       uint64_t *ret)
{
	uint64_t n = 0;

	if (l == ODPD_UL_MAPPED)
		set_size(p, name, v, &n);
	else
		set_count(p, name, v, true, UINT64_MAX, &n);
	if (!p->failed && n == 0)
		fail(p, "%s = 0 would refuse every request of those users", name);
	if (!p->failed)
		*ret = n;
}

static void limits_key(struct parse *p, enum limit_key key, const char *v)
{
	struct odpd_conf *c = p->c;
	const char *name = limit_keys[key];

	switch (key) {
	case KEY_MAX_PINNED:
		set_size(p, name, v, &c->max_pinned);
		break;
	case KEY_MAX_MRS:
		set_count(p, name, v, true, UINT64_MAX, &c->max_mrs);
		break;
	case KEY_DEFAULT_PINNED:
		set_default_pinned(p, v);
		break;
	case KEY_RELAXED_WINDOW_MS:
		set_count(p, name, v, false, MAX_RELAXED_WINDOW_MS, &c->relaxed_window_ms);
		break;
	case KEY_RELAXED_MAX_MRS:
		set_count(p, name, v, false, UINT64_MAX, &c->relaxed_max_mrs);
		break;
	case KEY_RELAXED_MAX_BYTES:
		set_size(p, name, v, &c->relaxed_max_bytes);
		break;
	case KEY_HOLE_CHECK_MS:
		set_count(p, name, v, false, MAX_RELAXED_WINDOW_MS, &c->hole_check_ms);
		break;
	default:
		if (key == KEY_DEFAULT_USER + ODPD_UL_MAPPED && strcmp(v, "window") == 0)
			c->user_default[ODPD_UL_MAPPED] = ODPD_MAPPED_QUARTER_WINDOW;
		else if ((key == KEY_DEFAULT_USER + ODPD_UL_CONNECTIONS ||
			  key == KEY_DEFAULT_USER + ODPD_UL_SEGMENTS ||
			  key == KEY_DEFAULT_USER + ODPD_UL_MAPPINGS) && strcmp(v, "auto") == 0)
			c->user_default[key - KEY_DEFAULT_USER] = ODPD_LIMIT_AUTO;
		else
			user_limit(p, name, (enum odpd_user_limit)(key - KEY_DEFAULT_USER), v,
				   &c->user_default[key - KEY_DEFAULT_USER]);
		break;
	}
}

/* @i: index among the rule keys (0 max-pinned, 1 + enum odpd_user_limit,
 * then remote-access). */
static void rule_key(struct parse *p, int i, const char *key, const char *v)
{
	struct odpd_rule *r = &p->c->rules[p->sec_index];

	if (i == 1 + ODPD_N_UL) {
		set_bool(p, key, v, &r->remote_access);
		r->has_remote_access = !p->failed;
		return;
	}
	if (i == 0) {
		set_size(p, key, v, &r->max_pinned);
		r->has_max_pinned = !p->failed;
		return;
	}
	user_limit(p, key, (enum odpd_user_limit)(i - 1), v, &r->max[i - 1]);
	r->has[i - 1] = !p->failed;
}

/* Append the users or groups of @v, separated by whitespace or commas. */
static void pd_list(struct parse *p, bool users, char *v)
{
	struct odpd_pd_policy *pd = &p->c->pds[p->sec_index];
	static const char sep[] = " \t\f\v,";
	char *save = NULL, where[600];

	snprintf(where, sizeof(where), " in %s of %s", users ? "users" : "groups", pd->label);
	for (char *t = strtok_r(v, sep, &save); t && !p->failed; t = strtok_r(NULL, sep, &save)) {
		uid_t uid;
		gid_t gid;
		int e = users ? lookup_user(t, &uid) : lookup_group(t, &gid);

		if (e < 0 && e != -ENOMEM && may_resolve_later(t)) {
			add_unresolved(p, users ? ODPD_UNRES_PD_USER : ODPD_UNRES_PD_GROUP, p->sec_index, t, e);
		} else if (e < 0) {
			fail_lookup(p, e, users ? "user" : "group", t, where);
		} else if (users) {
			uid_t *a = grow(p, pd->uids, pd->n_uids, sizeof(*a));
			if (a) {
				pd->uids = a;
				a[pd->n_uids++] = uid;
			}
		} else {
			gid_t *a = grow(p, pd->gids, pd->n_gids, sizeof(*a));
			if (a) {
				pd->gids = a;
				a[pd->n_gids++] = gid;
			}
		}
	}
}

/* The index of @key among the keys of the current section, -1 if unknown. */
static int key_index(const struct parse *p, const char *key)
{
	switch (p->sec) {
	case SEC_LIMITS:
		for (int i = 0; i < N_LIMIT_KEYS; i++)
			if (strcmp(key, limit_keys[i]) == 0)
				return i;
		return -1;
	case SEC_RULE:
		if (strcmp(key, "max-pinned") == 0)
			return 0;
		if (strcmp(key, "remote-access") == 0)
			return 1 + ODPD_N_UL;
		for (int i = 0; i < ODPD_N_UL; i++)
			if (strncmp(key, "max-", 4) == 0 && strcmp(key + 4, odpd_user_limit_names[i]) == 0)
				return 1 + i;
		return -1;
	case SEC_PD:
		return strcmp(key, "users") == 0 ? 0 : strcmp(key, "groups") == 0 ? 1 : -1;
	case SEC_ODP:
		return strcmp(key, "prefetch-on-register") == 0 ? 0 : -1;
	default:
		return -1;
	}
}

static const char *const section_keys[] = {
	[SEC_LIMITS] = "max-pinned, max-mrs, default-pinned, relaxed-window-ms, relaxed-max-mrs, "
		       "relaxed-max-bytes, hole-check-ms, default-connections, default-segments, default-mapped, "
		       "default-mrs, default-registrar-waits or default-mappings",
	[SEC_RULE] = "max-pinned, max-connections, max-segments, max-mapped, max-mrs, max-registrar-waits, "
		     "max-mappings or remote-access",
	[SEC_PD] = "users or groups",
	[SEC_ODP] = "prefetch-on-register",
};

static void handle_key(struct parse *p, const char *key, char *v)
{
	int i;

	if (p->sec == SEC_NONE) {
		fail(p, "key \"%s\" outside any section", key);
		return;
	}
	i = key_index(p, key);
	if (i < 0) {
		fail(p, "unknown key \"%s\" in %s (expected %s)", key, p->sec_label, section_keys[p->sec]);
		return;
	}
	if (p->cont && (p->sec != SEC_PD || strchr(v, '='))) {
		fail(p, "indented line continues the value of %s%s (do not indent keys)", key,
		     p->sec == SEC_PD ? "" : ", which takes one value");
		return;
	}
	if (!p->cont && p->key_line[i]) {
		fail(p, "duplicate key \"%s\" in %s (first on line %u)", key, p->sec_label, p->key_line[i]);
		return;
	}
	p->key_line[i] = p->line;
	if (p->sec == SEC_LIMITS)
		limits_key(p, (enum limit_key)i, v);
	else if (p->sec == SEC_ODP)
		set_bool(p, key, v, &p->c->prefetch_on_register);
	else if (p->sec == SEC_RULE)
		rule_key(p, i, key, v);
	else
		pd_list(p, i == 0, v);
}

static int conf_handler(void *user, const char *section, const char *name, const char *value)
{
	struct parse *p = user;
	char *v;

	(void)section;              /* truncated by inih; ours is p->sec */
	if (p->failed)
		return 0;
	if (!p->cont)
		p->in_value = *name != '\0';
	v = strdup(value);
	if (!v) {
		fail(p, "out of memory");
		return 0;
	}
	strip_comment(v);
	handle_key(p, name, v);
	free(v);
	return !p->failed;
}

/* ------------------------------------------------------------ the file */

void odpd_conf_defaults(struct odpd_conf *c, uint64_t mem_total)
{
	*c = (struct odpd_conf){
		.max_pinned = mem_total ? percent_of(mem_total, 50) : ODPD_UNLIMITED,
		.max_mrs = 1000000,
		.default_pinned_memlock = true,
		.relaxed_window_ms = 100,
		.relaxed_max_mrs = 4096,
		.relaxed_max_bytes = (uint64_t)1 << 30,
		.hole_check_ms = 100,
		.user_default = {
			[ODPD_UL_CONNECTIONS] = ODPD_LIMIT_AUTO,
			[ODPD_UL_SEGMENTS] = ODPD_LIMIT_AUTO,
			[ODPD_UL_MAPPED] = ODPD_MAPPED_QUARTER_WINDOW,
			[ODPD_UL_MRS] = 262144,
			[ODPD_UL_REGISTRAR_WAITS] = 4,
			[ODPD_UL_MAPPINGS] = ODPD_LIMIT_AUTO,
		},
	};
}

static void set_err(char *errbuf, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void set_err(char *errbuf, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!errbuf || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(errbuf, errlen, fmt, ap);
	va_end(ap);
}

/* Open @path; 1 if it is missing and may be, 0 if open, or -errno. */
static int conf_open(const char *path, bool must_exist, FILE **ret, char *errbuf, size_t errlen)
{
	struct stat st;
	FILE *f = fopen(path, "re");
	int e;

	if (!f) {
		e = errno;
		if (e == ENOENT && !must_exist)
			return 1;
		set_err(errbuf, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	if (fstat(fileno(f), &st) < 0) {
		e = errno;
		fclose(f);
		set_err(errbuf, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	if (S_ISDIR(st.st_mode)) {
		fclose(f);
		set_err(errbuf, errlen, "%s: is a directory", path);
		return -EISDIR;
	}
	/* it says who may pin how much and who may share a device context */
	if (S_ISREG(st.st_mode) && (st.st_mode & S_IWOTH)) {
		fclose(f);
		set_err(errbuf, errlen, "%s: anyone may write it; refusing it (chmod o-w %s)", path, path);
		return -EINVAL;
	}
	*ret = f;
	return 0;
}

int odpd_conf_load(struct odpd_conf *c, const char *path, bool must_exist, uint64_t mem_total,
		   char *errbuf, size_t errlen)
{
	struct parse p = { .c = c, .path = path, .mem_total = mem_total, .err = errbuf, .errlen = errlen };
	int r, e;

	set_err(errbuf, errlen, "%s", "");
	r = conf_open(path, must_exist, &p.f, errbuf, errlen);
	if (r)
		return r > 0 ? 0 : r;
	free(c->path);
	c->path = strdup(path);
	if (!c->path) {
		fclose(p.f);
		set_err(errbuf, errlen, "%s: out of memory", path);
		return -ENOMEM;
	}
	r = ini_parse_stream(conf_reader, &p, conf_handler, &p);
	e = p.read_errno;
	fclose(p.f);
	free(p.buf);
	if (p.failed && (r <= 0 || (unsigned)r >= p.err_line))
		return -EINVAL;
	if (r > 0) {
		/* inih found an error our reader did not foresee */
		set_err(errbuf, errlen, "%s:%d: syntax error", path, r);
		return -EINVAL;
	}
	if (r < 0 || e) {
		e = e ? e : ENOMEM;     /* -2: inih could not allocate its line */
		set_err(errbuf, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	return 0;
}

void odpd_conf_free(struct odpd_conf *c)
{
	for (unsigned i = 0; i < c->n_rules; i++) {
		free(c->rules[i].cgroup);
		free(c->rules[i].label);
	}
	for (unsigned i = 0; i < c->n_pds; i++) {
		free(c->pds[i].pattern);
		free(c->pds[i].label);
		free(c->pds[i].uids);
		free(c->pds[i].gids);
	}
	for (unsigned i = 0; i < c->n_unresolved; i++)
		free(c->unresolved[i].name);
	free(c->unresolved);
	free(c->rules);
	free(c->pds);
	free(c->path);
	*c = (struct odpd_conf){ 0 };
}

/* ------------------------------------------------------------ names resolved later */

unsigned odpd_conf_n_unresolved(const struct odpd_conf *c)
{
	return c->n_unresolved;
}

/* "[user alice]" or "users of [pd training]". */
static void unresolved_where(const struct odpd_conf *c, const struct odpd_unresolved *u, char *buf,
			     size_t len)
{
	if (u->kind == ODPD_UNRES_RULE)
		snprintf(buf, len, "%s", c->rules[u->index].label);
	else
		snprintf(buf, len, "%s of %s", u->kind == ODPD_UNRES_PD_USER ? "users" : "groups",
			 c->pds[u->index].label);
}

void odpd_conf_unresolved_text(const struct odpd_conf *c, unsigned i, char *buf, size_t len)
{
	const struct odpd_unresolved *u = &c->unresolved[i];
	bool user = u->kind == ODPD_UNRES_PD_USER ||
		    (u->kind == ODPD_UNRES_RULE && c->rules[u->index].kind == ODPD_RULE_USER);
	char where[600];

	unresolved_where(c, u, where, sizeof(where));
	if (u->error == ENOENT)
		snprintf(buf, len, "%s:%u: unknown %s \"%s\" in %s: not in force until the name resolves "
			 "(looked up again when a client connects and on reload)", c->path ? c->path : "?",
			 u->line, user ? "user" : "group", u->name, where);
	else
		snprintf(buf, len, "%s:%u: looking up %s \"%s\" in %s: %s: not in force until the name "
			 "resolves (looked up again when a client connects and on reload)",
			 c->path ? c->path : "?", u->line, user ? "user" : "group", u->name, where,
			 strerror(u->error));
}

/* Try @u once more: 1 settled (in force, or dropped as a duplicate), 0 not yet. */
static int resolve_one(struct odpd_conf *c, struct odpd_unresolved *u,
		       void (*report)(void *arg, int level, const char *msg), void *arg)
{
	char msg[1024], where[600];
	uint32_t id;
	int e;

	unresolved_where(c, u, where, sizeof(where));
	if (u->kind == ODPD_UNRES_RULE) {
		struct odpd_rule *r = &c->rules[u->index];
		const struct odpd_rule *dup;

		if (r->kind == ODPD_RULE_USER)
			e = lookup_user(u->name, &r->uid);
		else
			e = lookup_group(u->name, &r->gid);
		if (e < 0) {
			u->error = -e;
			return 0;
		}
		id = r->kind == ODPD_RULE_USER ? r->uid : r->gid;
		dup = rule_find_same(c, r);
		if (dup) {
			snprintf(msg, sizeof(msg), "%s:%u: %s now resolves to %s %u, which %s on line %u "
				 "already has: ignored", c->path ? c->path : "?", u->line, where,
				 r->kind == ODPD_RULE_USER ? "uid" : "gid", id, dup->label, dup->line);
			report(arg, 4 /* LOG_WARNING */, msg);
			return 1;           /* stays unresolved: never in force */
		}
		r->unresolved = false;
	} else {
		struct odpd_pd_policy *pd = &c->pds[u->index];
		bool user = u->kind == ODPD_UNRES_PD_USER;
		uint32_t *a;

		e = user ? lookup_user(u->name, &id) : lookup_group(u->name, &id);
		if (e < 0) {
			u->error = -e;
			return 0;
		}
		a = reallocarray(user ? pd->uids : pd->gids, (user ? pd->n_uids : pd->n_gids) + 1, sizeof(*a));
		if (!a)
			return 0;
		if (user) {
			pd->uids = a;
			a[pd->n_uids++] = id;
		} else {
			pd->gids = a;
			a[pd->n_gids++] = id;
		}
	}
	snprintf(msg, sizeof(msg), "%s:%u: \"%s\" in %s resolves now (%s %u): in force",
		 c->path ? c->path : "?", u->line, u->name, where,
		 u->kind == ODPD_UNRES_PD_USER ||
		 (u->kind == ODPD_UNRES_RULE && c->rules[u->index].kind == ODPD_RULE_USER) ? "uid" : "gid", id);
	report(arg, 5 /* LOG_NOTICE */, msg);
	return 1;
}

unsigned odpd_conf_resolve(struct odpd_conf *c, void (*report)(void *arg, int level, const char *msg),
			   void *arg)
{
	unsigned settled = 0, n = 0;

	for (unsigned i = 0; i < c->n_unresolved; i++) {
		struct odpd_unresolved *u = &c->unresolved[i];

		if (resolve_one(c, u, report, arg)) {
			free(u->name);
			settled++;
		} else {
			c->unresolved[n++] = *u;
		}
	}
	c->n_unresolved = n;
	return settled;
}

/* ------------------------------------------------------------ queries */

static bool gid_listed(const gid_t *list, unsigned n, gid_t gid)
{
	for (unsigned i = 0; i < n; i++)
		if (list[i] == gid)
			return true;
	return false;
}

/* Does the cgroup @prefix contain @cgroup, at a '/' boundary? */
static bool cgroup_contains(const char *prefix, const char *cgroup)
{
	size_t n = strlen(prefix);

	if (strcmp(prefix, "/") == 0)
		return cgroup[0] == '/';
	return strncmp(prefix, cgroup, n) == 0 && (cgroup[n] == '\0' || cgroup[n] == '/');
}

const struct odpd_rule *odpd_conf_match_rule(const struct odpd_conf *c, uid_t uid, gid_t gid,
					     const gid_t *groups, unsigned n_groups,
					     const char *cgroup)
{
	return odpd_conf_match_rule_for(c, ODPD_RULE_KEY_PINNED, uid, gid, groups, n_groups, cgroup);
}

const struct odpd_rule *odpd_conf_match_rule_for(const struct odpd_conf *c, int key, uid_t uid, gid_t gid,
						 const gid_t *groups, unsigned n_groups,
						 const char *cgroup)
{
	const struct odpd_rule *group = NULL, *cg = NULL;
	size_t cg_len = 0;

	for (unsigned i = 0; i < c->n_rules; i++) {
		const struct odpd_rule *r = &c->rules[i];

		if (r->unresolved)
			continue;
		if (key == ODPD_RULE_KEY_PINNED ? !r->has_max_pinned :
		    key == ODPD_RULE_KEY_REMOTE ? !r->has_remote_access : !r->has[key])
			continue;
		switch (r->kind) {
		case ODPD_RULE_USER:
			if (r->uid == uid)
				return r;
			break;
		case ODPD_RULE_GROUP:
			if (!group && (r->gid == gid || gid_listed(groups, n_groups, r->gid)))
				group = r;
			break;
		case ODPD_RULE_CGROUP:
			if (cgroup && cgroup_contains(r->cgroup, cgroup) &&
			    (!cg || strlen(r->cgroup) > cg_len)) {
				cg = r;
				cg_len = strlen(r->cgroup);
			}
			break;
		}
	}
	return group ? group : cg;
}

bool odpd_conf_pd_allowed(const struct odpd_conf *c, const char *name, uid_t uid, gid_t gid,
			  const gid_t *groups, unsigned n_groups, uid_t creator_uid,
			  char *why, size_t whylen)
{
	for (unsigned i = 0; i < c->n_pds; i++) {
		const struct odpd_pd_policy *pd = &c->pds[i];

		if (fnmatch(pd->pattern, name, 0) != 0)
			continue;
		for (unsigned j = 0; j < pd->n_uids; j++)
			if (pd->uids[j] == uid)
				return true;
		for (unsigned j = 0; j < pd->n_gids; j++)
			if (pd->gids[j] == gid || gid_listed(groups, n_groups, pd->gids[j]))
				return true;
		set_err(why, whylen, "%s lists neither uid %u nor its groups", pd->label, (unsigned)uid);
		return false;
	}
	if (creator_uid == uid)
		return true;
	set_err(why, whylen, "no [pd] section matches \"%s\": only its creator, uid %u, may join",
		name, (unsigned)creator_uid);
	return false;
}
