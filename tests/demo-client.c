/* SPDX-License-Identifier: MIT */
/*
 * demo-client: the smallest useful libodpd program. Allocates a segment,
 * writes a pattern, registers it, has the daemon read it back through the
 * MR with the HCA (verify), changes a page and verifies again. With
 * `-- CMD...`, runs CMD while it still holds the MR (e.g. odpctl status).
 *
 *   demo-client [--socket PATH] [--size BYTES] [-- CMD ARGS...]
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "demo-util.h"
#include "odpd.h"

#define CHECK(cond, what) do { if (!(cond)) { \
	fprintf(stderr, "demo-client: %s: %s: %s\n", what, strerror(errno), odpd_errmsg()); \
	return 1; } } while (0)

int main(int argc, char **argv)
{
	const char *sock = NULL;
	size_t size = 16 << 20;
	char **cmd = NULL;
	struct odpd_device_attr dev;
	uint32_t crc;

	if (demo_args(argc, argv, "demo-client", &sock, &size, &cmd))
		return 2;

	struct odpd_conn *c = odpd_connect(sock, NULL);
	CHECK(c, "odpd_connect");
	CHECK(odpd_query_device(c, 0, &dev, sizeof(dev)) == 0, "odpd_query_device");
	printf("connected; device %s (%s), ODP %s, import %s\n", dev.name, dev.transport,
	       dev.odp ? "yes" : "no", dev.import == ODPD_SUPPORT_YES ? "yes" : "no");

	struct odpd_segment *seg = odpd_alloc(c, size, 0);
	CHECK(seg, "odpd_alloc");
	unsigned char *p = odpd_segment_addr(seg);
	for (size_t i = 0; i < size; i++)
		p[i] = (unsigned char)(i * 7 + (i >> 12));
	printf("segment: %zu bytes at %p\n", size, (void *)p);

	struct odpd_mr *mr = odpd_reg(c, p, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(mr, "odpd_reg");
	printf("MR: iova %#llx length %zu lkey %#x rkey %#x\n",
	       (unsigned long long)mr->iova, mr->length, mr->lkey, mr->rkey);

	CHECK(odpd_verify(mr, NULL, 0, &crc) == 0, "odpd_verify");
	printf("verify (RDMA READ by the HCA): crc32 %08x, expected %08x: %s\n", crc,
	       crc_of(p, size), crc == crc_of(p, size) ? "MATCH" : "MISMATCH");
	if (crc != crc_of(p, size))
		return 1;
	memset(p + 4096, 0xa5, 4096);
	CHECK(odpd_verify(mr, NULL, 0, &crc) == 0, "odpd_verify");
	printf("after changing page 1: crc32 %08x, expected %08x: %s\n", crc,
	       crc_of(p, size), crc == crc_of(p, size) ? "MATCH" : "MISMATCH");
	if (crc != crc_of(p, size))
		return 1;

	int rc = 0;
	if (cmd) {
		fflush(stdout);
		rc = run_command(cmd);
	}
	CHECK(odpd_dereg(mr) == 0, "odpd_dereg");
	CHECK(odpd_detach(seg) == 0, "odpd_detach");
	odpd_disconnect(c);
	printf("deregistered and disconnected\n");
	return rc;
}
