/* SPDX-License-Identifier: MIT */
/*
 * Linked against the real libodpd.so: every API function resolves, the
 * calls that need no daemon behave as odpd.h says, and (with nm) the library
 * exports exactly the functions odpd.h declares, each at version ODPD_1.0.
 *
 * Usage: test-abi [NM LIBODPD.so ODPD.h]
 */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
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

/* Every function of the API, so that linking proves each one is exported. */
static void *const api[] = {
	(void *)odpd_errmsg, (void *)odpd_connect, (void *)odpd_disconnect,
	(void *)odpd_device_count, (void *)odpd_query_device, (void *)odpd_alloc,
	(void *)odpd_attach, (void *)odpd_segment_addr, (void *)odpd_segment_length,
	(void *)odpd_segment_fd, (void *)odpd_detach, (void *)odpd_reg, (void *)odpd_dereg,
	(void *)odpd_verify, (void *)odpd_reg_msgs, (void *)odpd_reg_read,
	(void *)odpd_reg_write, (void *)odpd_dereg_mr, (void *)odpd_default_conn,
};

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

/* "ADDR T name@@ODPD_1.0" from nm; the version node itself is an "A" symbol. */
static void read_exported(const char *nm, const char *lib, struct names *s)
{
	char cmd[4096], *line = NULL;
	size_t cap = 0;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "'%s' -D --defined-only --with-symbol-versions '%s'", nm, lib);
	p = popen(cmd, "re");
	CHECK(p);
	while (getline(&line, &cap, p) >= 0) {
		char type, name[256];

		if (sscanf(line, "%*s %c %255s", &type, name) == 2 && type != 'A')
			names_add(s, name, strlen(name));
	}
	free(line);
	CHECK(pclose(p) == 0);
	qsort(s->v, s->n, sizeof(s->v[0]), cmp_str);
}

static void test_exports(const char *nm, const char *lib, const char *header)
{
	struct names declared = { .n = 0 }, exported = { .n = 0 };
	bool ok;

	read_declared(header, &declared);
	read_exported(nm, lib, &exported);
	CHECK(declared.n == sizeof(api) / sizeof(api[0]));
	ok = declared.n == exported.n;
	for (size_t i = 0; i < declared.n && i < exported.n; i++) {
		size_t len = strlen(declared.v[i]);

		if (strncmp(exported.v[i], declared.v[i], len) != 0 ||
		    strcmp(exported.v[i] + len, "@@ODPD_1.0") != 0) {
			fprintf(stderr, "declared %s, exported %s\n", declared.v[i], exported.v[i]);
			ok = false;
		}
	}
	if (!ok) {
		fprintf(stderr, "exported:\n");
		for (size_t i = 0; i < exported.n; i++)
			fprintf(stderr, "  %s\n", exported.v[i]);
	}
	CHECK(ok);
	for (size_t i = 0; i < declared.n; i++)
		free(declared.v[i]);
	for (size_t i = 0; i < exported.n; i++)
		free(exported.v[i]);
	printf("exports: %zu functions, all ODPD_1.0\n", exported.n);
}

int main(int argc, char **argv)
{
	struct odpd_device_attr attr;
	uint32_t crc;

	if (argc == 4)
		test_exports(argv[1], argv[2], argv[3]);
	else
		printf("exports: not checked (no nm)\n");

	for (size_t i = 0; i < sizeof(api) / sizeof(api[0]); i++)
		CHECK(api[i] != NULL);
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
	CHECK_FAIL(odpd_dereg(NULL), -1, EINVAL, "odpd_dereg");
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
