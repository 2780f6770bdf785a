/* SPDX-License-Identifier: MIT */
/*
 * Linked against the real libodpd.so: every API function resolves, and the
 * calls that need no daemon behave as odpd.h says.
 */
#include <errno.h>
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

int main(void)
{
	struct odpd_device_attr attr;
	uint32_t crc;

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
