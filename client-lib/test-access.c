/* SPDX-License-Identifier: MIT */
/* IBV_ACCESS_* to the wire's Access bits and back (access.c). */
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "libodpd-private.h"

#define CHECK(expr) do { \
	if (!(expr)) { \
		fprintf(stderr, "%s:%d: CHECK(%s) failed (errmsg \"%s\")\n", \
			__FILE__, __LINE__, #expr, odpd_errmsg()); \
		exit(1); \
	} \
} while (0)

#define ALL_REMOTE (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)

static void check_ok(unsigned ibv, uint32_t want_wire, Odpd__MrKind want_kind)
{
	uint32_t wire = 0xdead;
	Odpd__MrKind kind = ODPD__MR_KIND__MR_IMPLICIT_ODP;

	CHECK(access_to_wire("t", ibv, &wire, &kind) == 0);
	CHECK(wire == want_wire);
	CHECK(kind == want_kind);
	CHECK(access_from_wire(wire, kind) == ibv);
}

static void check_einval(unsigned ibv, const char *msg)
{
	uint32_t wire = 0xdead;
	Odpd__MrKind kind = ODPD__MR_KIND__MR_IMPLICIT_ODP;

	errmsg_clear();
	CHECK(access_to_wire("t", ibv, &wire, &kind) == -EINVAL);
	CHECK(wire == 0xdead && kind == ODPD__MR_KIND__MR_IMPLICIT_ODP);  /* untouched */
	CHECK(strncmp(odpd_errmsg(), "t: ", 3) == 0);
	CHECK(strstr(odpd_errmsg(), msg) != NULL);
}

int main(void)
{
	check_ok(0, ODPD__ACCESS__ACCESS_NONE, ODPD__MR_KIND__MR_PINNED);
	check_ok(IBV_ACCESS_LOCAL_WRITE, ODPD__ACCESS__ACCESS_LOCAL_WRITE, ODPD__MR_KIND__MR_PINNED);
	check_ok(IBV_ACCESS_REMOTE_READ, ODPD__ACCESS__ACCESS_REMOTE_READ, ODPD__MR_KIND__MR_PINNED);
	check_ok(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
		 ODPD__ACCESS__ACCESS_LOCAL_WRITE | ODPD__ACCESS__ACCESS_REMOTE_WRITE,
		 ODPD__MR_KIND__MR_PINNED);
	check_ok(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC,
		 ODPD__ACCESS__ACCESS_LOCAL_WRITE | ODPD__ACCESS__ACCESS_REMOTE_ATOMIC,
		 ODPD__MR_KIND__MR_PINNED);
	check_ok(IBV_ACCESS_LOCAL_WRITE | ALL_REMOTE, 15, ODPD__MR_KIND__MR_PINNED);
	check_ok(IBV_ACCESS_ON_DEMAND, 0, ODPD__MR_KIND__MR_ODP);
	check_ok(IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ,
		 ODPD__ACCESS__ACCESS_LOCAL_WRITE | ODPD__ACCESS__ACCESS_REMOTE_READ,
		 ODPD__MR_KIND__MR_ODP);

	/* As ibv_reg_mr: remote write and atomic need local write. */
	check_einval(IBV_ACCESS_REMOTE_WRITE, "LOCAL_WRITE");
	check_einval(IBV_ACCESS_REMOTE_ATOMIC, "LOCAL_WRITE");
	check_einval(IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ON_DEMAND, "LOCAL_WRITE");
	/* Bits odpd does not carry. */
	check_einval(IBV_ACCESS_MW_BIND | IBV_ACCESS_LOCAL_WRITE, "0x10");
	check_einval(IBV_ACCESS_ZERO_BASED, "not supported");
	check_einval(IBV_ACCESS_HUGETLB, "not supported");
	check_einval(IBV_ACCESS_RELAXED_ORDERING, "not supported");
	check_einval(1u << 31, "not supported");

	/* Back: unknown wire bits are dropped; ODP kinds add ON_DEMAND. */
	CHECK(access_from_wire(0x100 | ODPD__ACCESS__ACCESS_REMOTE_READ, ODPD__MR_KIND__MR_PINNED) ==
	      IBV_ACCESS_REMOTE_READ);
	CHECK(access_from_wire(0, ODPD__MR_KIND__MR_IMPLICIT_ODP) == IBV_ACCESS_ON_DEMAND);
	printf("ok\n");
	return 0;
}
