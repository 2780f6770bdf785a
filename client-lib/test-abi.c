/* SPDX-License-Identifier: MIT */
/*
 * Linked against the real libodpd.so: every API function resolves, the
 * calls that need no daemon behave as odpd.h says, the structs only ever
 * grew at their end, and (with nm) the library exports exactly the
 * functions odpd.h declares, each as the default version of the node of the
 * release that added it (ODPD_1.0 ... ODPD_1.4), and no other node; the newest
 * node and the file name (libodpd.so.MAJOR.MINOR.PATCH) agree with
 * ODPD_VERSION_MAJOR and ODPD_VERSION_MINOR.
 *
 * Usage: test-abi [NM LIBODPD.so ODPD.h]
 */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "odpd.h"

#define CHECK(expr) do { \
	if (!(expr)) { \
		fprintf(stderr, "%s:%d: CHECK(%s) failed (errno %d, errmsg \"%s\")\n", \
			__FILE__, __LINE__, #expr, errno, odpd_errmsg()); \
		exit(1); \
	} \
} while (0)

/* Fails with @err and a message that names the call. */
#define CHECK_FAIL(call, ok, err, name) do { \
	errno = 0; \
	CHECK((call) == (ok)); \
	CHECK(errno == (err)); \
	CHECK(strstr(odpd_errmsg(), name) != NULL); \
} while (0)

/*
 * Every function of the API with the version node it was added in, so that
 * linking proves each one is exported. A released entry never changes.
 */
static const struct api_fn {
	const char *name;
	void *fn;
	const char *version;
} api[] = {
#define FN(f, v) { #f, (void *)f, v }
	FN(odpd_errmsg, "ODPD_1.0"), FN(odpd_connect, "ODPD_1.0"),
	FN(odpd_disconnect, "ODPD_1.0"), FN(odpd_device_count, "ODPD_1.0"),
	FN(odpd_query_device, "ODPD_1.0"), FN(odpd_alloc, "ODPD_1.0"),
	FN(odpd_attach, "ODPD_1.0"), FN(odpd_segment_addr, "ODPD_1.0"),
	FN(odpd_segment_length, "ODPD_1.0"), FN(odpd_segment_fd, "ODPD_1.0"),
	FN(odpd_detach, "ODPD_1.0"), FN(odpd_reg, "ODPD_1.0"), FN(odpd_dereg, "ODPD_1.0"),
	FN(odpd_verify, "ODPD_1.0"), FN(odpd_reg_msgs, "ODPD_1.0"),
	FN(odpd_reg_read, "ODPD_1.0"), FN(odpd_reg_write, "ODPD_1.0"),
	FN(odpd_dereg_mr, "ODPD_1.0"), FN(odpd_default_conn, "ODPD_1.0"),
	FN(odpd_reg_attr, "ODPD_1.1"), FN(odpd_dereg_relaxed, "ODPD_1.1"),
	FN(odpd_flush_relaxed, "ODPD_1.1"), FN(odpd_join_pd, "ODPD_1.1"),
	FN(odpd_import_pd, "ODPD_1.2"), FN(odpd_advise_mr, "ODPD_1.2"),
	FN(odpd_stats, "ODPD_1.3"),
	FN(odpd_populate, "ODPD_1.4"),
#undef FN
};

#define API_N (sizeof(api) / sizeof(api[0]))

/* The version nodes, oldest first; the last is ODPD_VERSION_MAJOR.MINOR. */
static const char *const nodes[] = { "ODPD_1.0", "ODPD_1.1", "ODPD_1.2", "ODPD_1.3", "ODPD_1.4" };

#define NODES_N (sizeof(nodes) / sizeof(nodes[0]))

#define MAX_NAMES 256

struct names {
	char *v[MAX_NAMES];
	size_t n;
};

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void names_add(struct names *s, const char *name, size_t len)
{
	CHECK(s->n < MAX_NAMES);
	s->v[s->n] = strndup(name, len);
	CHECK(s->v[s->n]);
	s->n++;
}

/*
 * The functions odpd.h declares: on lines that begin at column 0 with a
 * lower-case letter (comment lines begin with "/" or " "), the odpd_ name
 * that is followed by "(".
 */
static void read_declared(const char *header, struct names *s)
{
	FILE *f = fopen(header, "re");
	char *line = NULL;
	size_t cap = 0;

	CHECK(f);
	while (getline(&line, &cap, f) >= 0) {
		if (!islower((unsigned char)line[0]))
			continue;
		for (char *p = strstr(line, "odpd_"); p; p = strstr(p + 1, "odpd_")) {
			size_t len = strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789_");

			if (p[len] == '(' && (p == line || p[-1] == ' ' || p[-1] == '*'))
				names_add(s, p, len);
		}
	}
	free(line);
	fclose(f);
	qsort(s->v, s->n, sizeof(s->v[0]), cmp_str);
}

/*
 * "ADDR T name@@ODPD_1.0" from nm into @s; the version nodes themselves are
 * "A" symbols ("ADDR A ODPD_1.0"), into @ret_nodes.
 */
static void read_exported(const char *nm, const char *lib, struct names *s, struct names *ret_nodes)
{
	char cmd[4096], *line = NULL;
	size_t cap = 0;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "'%s' -D --defined-only --with-symbol-versions '%s'", nm, lib);
	p = popen(cmd, "re");
	CHECK(p);
	while (getline(&line, &cap, p) >= 0) {
		char type, name[256];

		if (sscanf(line, "%*s %c %255s", &type, name) != 2)
			continue;
		if (type == 'A')
			names_add(ret_nodes, name, strcspn(name, "@"));
		else
			names_add(s, name, strlen(name));
	}
	free(line);
	CHECK(pclose(p) == 0);
	qsort(s->v, s->n, sizeof(s->v[0]), cmp_str);
	qsort(ret_nodes->v, ret_nodes->n, sizeof(ret_nodes->v[0]), cmp_str);
}

static const struct api_fn *api_find(const char *name)
{
	for (size_t i = 0; i < API_N; i++)
		if (strcmp(api[i].name, name) == 0)
			return &api[i];
	return NULL;
}

static void names_free(struct names *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i]);
	s->n = 0;
}

/* The nodes are exactly nodes[]; the newest and the file name match odpd.h. */
static void test_nodes(const char *lib, const struct names *found)
{
	char newest[32], suffix[64];
	size_t len = strlen(lib);

	CHECK(found->n == NODES_N);
	for (size_t i = 0; i < NODES_N; i++)   /* nodes[] is sorted too */
		CHECK(strcmp(found->v[i], nodes[i]) == 0);
	snprintf(newest, sizeof(newest), "ODPD_%d.%d", ODPD_VERSION_MAJOR, ODPD_VERSION_MINOR);
	CHECK(strcmp(nodes[NODES_N - 1], newest) == 0);
	/* libodpd.so.MAJOR.MINOR.PATCH: the package's version, whose
	 * MAJOR.MINOR is the interface's (meson.build) */
	snprintf(suffix, sizeof(suffix), "/libodpd.so.%d.%d.", ODPD_VERSION_MAJOR, ODPD_VERSION_MINOR);
	const char *p = strstr(lib, suffix);
	CHECK(p && p[strlen(suffix)] && strspn(p + strlen(suffix), "0123456789") == strlen(p + strlen(suffix)));
	(void)len;
}

static void test_exports(const char *nm, const char *lib, const char *header)
{
	struct names declared = { .n = 0 }, exported = { .n = 0 }, found_nodes = { .n = 0 };
	unsigned per_node[NODES_N] = { 0 };
	bool ok;

	read_declared(header, &declared);
	read_exported(nm, lib, &exported, &found_nodes);
	/* api[] lists exactly what odpd.h declares */
	CHECK(declared.n == API_N);
	for (size_t i = 0; i < declared.n; i++)
		CHECK(api_find(declared.v[i]) != NULL);

	/* "name@@NODE": exported as the default version, of its own node */
	ok = declared.n == exported.n;
	for (size_t i = 0; i < declared.n && i < exported.n; i++) {
		const struct api_fn *f = api_find(declared.v[i]);
		size_t len = strlen(declared.v[i]);

		if (strncmp(exported.v[i], declared.v[i], len) != 0 ||
		    strncmp(exported.v[i] + len, "@@", 2) != 0 ||
		    strcmp(exported.v[i] + len + 2, f->version) != 0) {
			fprintf(stderr, "declared %s (%s), exported %s\n", declared.v[i], f->version,
				exported.v[i]);
			ok = false;
		}
		for (size_t n = 0; n < NODES_N; n++)
			per_node[n] += strcmp(f->version, nodes[n]) == 0;
	}
	if (!ok) {
		fprintf(stderr, "exported:\n");
		for (size_t i = 0; i < exported.n; i++)
			fprintf(stderr, "  %s\n", exported.v[i]);
	}
	CHECK(ok);
	test_nodes(lib, &found_nodes);
	printf("exports: %zu functions:", exported.n);
	for (size_t n = 0; n < NODES_N; n++)
		printf(" %u at %s", per_node[n], nodes[n]);
	printf("\n");
	names_free(&declared);
	names_free(&exported);
	names_free(&found_nodes);
}

/*
 * Structs the library fills or reads only ever grow at their end: the fields
 * of 1.0 keep their offsets (LP64), the fields of 1.1 come after them, and
 * those of 1.2 after those.
 */
static void test_layout(void)
{
#if UINTPTR_MAX == UINT64_MAX
	CHECK(offsetof(struct odpd_mr, addr) == 0 && offsetof(struct odpd_mr, length) == 8);
	CHECK(offsetof(struct odpd_mr, iova) == 16 && offsetof(struct odpd_mr, lkey) == 24);
	CHECK(offsetof(struct odpd_mr, rkey) == 28 && offsetof(struct odpd_mr, access) == 32);
	CHECK(offsetof(struct odpd_mr, handle) == 40);
#endif
	CHECK(offsetof(struct odpd_mr, generation) >= offsetof(struct odpd_mr, handle) + sizeof(uint64_t));
	CHECK(offsetof(struct odpd_mr, cache_hit) > offsetof(struct odpd_mr, generation));
	CHECK(offsetof(struct odpd_mr, prefetch_errno) > offsetof(struct odpd_mr, cache_hit));
	/* comp_mask first: what the caller set is readable at any struct size */
	CHECK(offsetof(struct odpd_reg_attr, comp_mask) == 0);
	CHECK(offsetof(struct odpd_reg_attr, access) < offsetof(struct odpd_reg_attr, flags));
	CHECK(ODPD_REG_ATTR_ACCESS == 1 && ODPD_REG_ATTR_FLAGS == 2);
	CHECK(ODPD_REG_NO_CACHE == 1 && ODPD_REG_NO_POPULATE == 2 && ODPD_REG_PREFETCH == 4);
	/* the first versions' sizes, which the size-taking calls accept, stay
	 * what they were when released (LP64) */
#if UINTPTR_MAX == UINT64_MAX
	CHECK(ODPD_DEVICE_ATTR_SIZE_1_0 == 212);
	CHECK(ODPD_STATS_SIZE_1_3 == 60);
#endif
	CHECK(sizeof(struct odpd_device_attr) >= ODPD_DEVICE_ATTR_SIZE_1_0);
	CHECK(sizeof(struct odpd_stats) >= ODPD_STATS_SIZE_1_3);
}

int main(int argc, char **argv)
{
	struct odpd_device_attr attr;
	uint32_t crc;

	if (argc == 4)
		test_exports(argv[1], argv[2], argv[3]);
	else
		printf("exports: not checked (no nm)\n");
	test_layout();

	for (size_t i = 0; i < API_N; i++)
		CHECK(api[i].fn != NULL);
	CHECK(strcmp(odpd_errmsg(), "") == 0);

	/* No daemon at the path. */
	CHECK_FAIL(odpd_connect("/nonexistent/odpd.sock", NULL), NULL, ENOENT, "/nonexistent/odpd.sock");
	CHECK(setenv(ODPD_SOCKET_ENV, "/nonexistent/env.sock", 1) == 0);
	CHECK_FAIL(odpd_connect(NULL, NULL), NULL, ENOENT, "/nonexistent/env.sock");
	CHECK_FAIL(odpd_default_conn(), NULL, ENOENT, "/nonexistent/env.sock");

	/* A call that succeeds clears the message. */
	CHECK(odpd_device_count(NULL) == 0);
	odpd_disconnect(NULL);
	CHECK_FAIL(odpd_query_device(NULL, 0, &attr, sizeof(attr)), -1, EINVAL, "odpd_query_device");

	/* NULL objects are EINVAL, not a crash. */
	CHECK_FAIL(odpd_alloc(NULL, 4096, 0), NULL, EINVAL, "odpd_alloc");
	CHECK_FAIL(odpd_attach(NULL, 0, NULL, 0), NULL, EINVAL, "odpd_attach");
	CHECK_FAIL(odpd_detach(NULL), -1, EINVAL, "odpd_detach");
	CHECK_FAIL(odpd_reg(NULL, NULL, 1, 0), NULL, EINVAL, "odpd_reg");
	CHECK_FAIL(odpd_reg_attr(NULL, NULL, 1, NULL), NULL, EINVAL, "odpd_reg_attr");
	CHECK_FAIL(odpd_dereg(NULL), -1, EINVAL, "odpd_dereg");
	CHECK_FAIL(odpd_dereg_relaxed(NULL), -1, EINVAL, "odpd_dereg_relaxed");
	CHECK_FAIL(odpd_flush_relaxed(NULL), -1, EINVAL, "odpd_flush_relaxed");
	CHECK_FAIL(odpd_join_pd(NULL, "pd"), -1, EINVAL, "odpd_join_pd");
	CHECK_FAIL(odpd_verify(NULL, NULL, 0, &crc), -1, EINVAL, "odpd_verify");
	CHECK_FAIL(odpd_reg_msgs(NULL, NULL, 1), NULL, EINVAL, "odpd_reg_msgs");
	CHECK_FAIL(odpd_reg_read(NULL, NULL, 1), NULL, EINVAL, "odpd_reg_read");
	CHECK_FAIL(odpd_reg_write(NULL, NULL, 1), NULL, EINVAL, "odpd_reg_write");
	CHECK_FAIL(odpd_dereg_mr(NULL), -1, EINVAL, "odpd_dereg_mr");
	CHECK(odpd_segment_addr(NULL) == NULL);
	CHECK(odpd_segment_length(NULL) == 0);
	CHECK(odpd_segment_fd(NULL) == -1);
	printf("ok\n");
	return 0;
}
