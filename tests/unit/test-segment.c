/* SPDX-License-Identifier: MIT */
/* Unit tests of daemon/segment.c: validation, the /proc/PID/maps check and
 * the daemon's segment mappings. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "segment.h"
#include "window.h"

#define PAGE ((size_t)4096)
#define MIB ((size_t)1 << 20)
#define MAX_SIZE ((uint64_t)1 << 30)

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

/* ------------------------------------------------------------ helpers */

/* A memfd of @size bytes with @seals added (0: none). */
static int make_memfd(size_t size, unsigned flags, int seals)
{
	int fd = memfd_create("unit-seg", MFD_CLOEXEC | flags);

	assert_true(fd >= 0);
	if (size)
		assert_int_equal(ftruncate(fd, (off_t)size), 0);
	if (seals)
		assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
	return fd;
}

static int good_memfd(size_t size)
{
	return make_memfd(size, MFD_ALLOW_SEALING, F_SEAL_SHRINK | F_SEAL_GROW);
}

/* Reopen @fd through /proc/self/fd with @mode: a new open file description. */
static int reopen(int fd, int mode)
{
	char path[64];
	int r;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	r = open(path, mode | O_CLOEXEC);
	assert_true(r >= 0);
	return r;
}

/* The part of an error message before its first ':' (what is wrong, not the hint). */
static const char *what(const struct odpd_err *err)
{
	static char buf[sizeof(err->msg)];
	char *colon;

	snprintf(buf, sizeof(buf), "%s", err->msg);
	colon = strchr(buf, ':');
	if (colon)
		*colon = '\0';
	return buf;
}

static int validate(int fd, uint64_t max, struct odpd_seginfo *info, struct odpd_err *err)
{
	memset(info, 0xee, sizeof(*info));
	memset(err, 0, sizeof(*err));
	int r = odpd_segment_validate(fd, max, info, err);
	if (r < 0) {
		assert_int_equal(err->code, -r);
		assert_true(err->msg[0] != '\0');
	}
	return r;
}

static void assert_contains(const char *haystack, const char *needle)
{
	if (!strstr(haystack, needle))
		fail_msg("\"%s\" does not contain \"%s\"", haystack, needle);
}

static void assert_not_contains(const char *haystack, const char *needle)
{
	if (strstr(haystack, needle))
		fail_msg("\"%s\" contains \"%s\"", haystack, needle);
}

/* ------------------------------------------------------------ validate */

static void test_validate_regular_file(void **state)
{
	(void)state;
	struct odpd_seginfo info;
	struct odpd_err err;
	const char *dirs[] = { "/var/tmp", "/tmp" };
	int fd = -1;

	for (size_t i = 0; i < 2 && fd < 0; i++)
		fd = open(dirs[i], O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, 8192), 0);
	assert_int_equal(validate(fd, MAX_SIZE, &info, &err), -EINVAL);
	assert_contains(err.msg, "memfd");
	close(fd);
}

/* A tmpfs file (/dev/shm) is born with F_SEAL_SEAL: it can never be a segment. */
static void test_validate_dev_shm_file(void **state)
{
	(void)state;
	struct odpd_seginfo info;
	struct odpd_err err;
	int fd = open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);

	if (fd < 0)
		skip();
	assert_int_equal(ftruncate(fd, 8192), 0);
	assert_int_equal(validate(fd, MAX_SIZE, &info, &err), -EINVAL);
	assert_contains(err.msg, "MFD_ALLOW_SEALING");
	close(fd);
}

static void test_validate_pipe(void **state)
{
	(void)state;
	struct odpd_seginfo info;
	struct odpd_err err;
	int p[2];

	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	assert_int_equal(validate(p[0], MAX_SIZE, &info, &err), -EINVAL);
	assert_int_equal(validate(p[1], MAX_SIZE, &info, &err), -EINVAL);
	close(p[0]);
	close(p[1]);
}

static void test_validate_no_allow_sealing(void **state)
{
	(void)state;
	struct odpd_seginfo info;
	struct odpd_err err;
	int fd = make_memfd(8192, 0, 0);

	assert_int_equal(validate(fd, MAX_SIZE, &info, &err), -EINVAL);
	assert_contains(err.msg, "MFD_ALLOW_SEALING");
	close(fd);
}

static void test_validate_no_seals(void **state)
{
	(void)state;
	struct odpd_seginfo info;
	struct odpd_err err;
	int fd = make_memfd(8192, MFD_ALLOW_SEALING, 0);

	assert_int_equal(validate(fd, MAX_SIZE, &info, &err), -EINVAL);
	assert_contains(what(&err), "F_SEAL_SHRINK");
	assert_contains(what(&err), "F_SEAL_GROW");
	close(fd);
}

static void test_validate_only_shrink(void **state)
{
	(void)state;
	struct odpd_seginfo info;
	struct odpd_err err;
	int fd = make_memfd(8192, MFD_ALLOW_SEALING, F_SEAL_SHRINK);

	assert_int_equal(validate(fd, MAX_SIZE, &info, &err), -EINVAL);
	assert_contains(what(&err), "F_SEAL_GROW");
	assert_not_contains(what(&err), "F_SEAL_SHRINK");
	close(fd);
}

static void test_validate_only_grow(void **state)
{
	(void)state;
	struct odpd_seginfo info;
	struct odpd_err err;
	int fd = make_memfd(8192, MFD_ALLOW_SEALING, F_SEAL_GROW);

	assert_int_equal(validate(fd, MAX_SIZE, &info, &err), -EINVAL);
	assert_contains(what(&err), "F_SEAL_SHRINK");
	assert_not_contains(what(&err), "F_SEAL_GROW");
	close(fd);
}

/* Sealed shut without the size seals: can never be fixed, and says so. */
static void test_validate_sealed_without_size_seals(void **state)
{
	(void)state;
	struct odpd_seginfo info;
	struct odpd_err err;
	int fd = make_memfd(8192, MFD_ALLOW_SEALING, F_SEAL_SHRINK | F_SEAL_SEAL);

	assert_int_equal(validate(fd, MAX_SIZE, &info, &err), -EINVAL);
	assert_contains(err.msg, "F_SEAL_GROW");
	close(fd);
}

static void test_validate_good(void **state)
{
	(void)state;
	struct odpd_seginfo info;
	struct odpd_err err;
	struct stat st;
	int fd = good_memfd(3 * PAGE + 100);

	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(validate(fd, MAX_SIZE, &info, &err), 0);
	assert_int_equal(info.size, 3 * PAGE + 100);
	assert_true(info.writable);
	assert_int_equal(info.page_size, 4096);
	assert_int_equal(info.dev, st.st_dev);
	assert_int_equal(info.ino, st.st_ino);
	/* validation changes nothing about the fd */
	assert_int_equal(fcntl(fd, F_GET_SEALS), F_SEAL_SHRINK | F_SEAL_GROW);
	assert_int_equal(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDWR);
	close(fd);
}

/* All seals but the write seals: still writable. */
static void test_validate_good_sealed_shut(void **state)
{
	(void)state;
	struct odpd_seginfo info;
	struct odpd_err err;
	int fd = make_memfd(PAGE, MFD_ALLOW_SEALING, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);

	assert_int_equal(validate(fd, MAX_SIZE, &info, &err), 0);
	assert_true(info.writable);
	close(fd);
}

static void test_validate_read_only_fd(void **state)
{
	(void)state;
	struct odpd_seginfo info;
	struct odpd_err err;
	int fd = good_memfd(8192);
	int ro = reopen(fd, O_RDONLY);

	assert_int_equal(validate(ro, MAX_SIZE, &info, &err), 0);
	assert_false(info.writable);
	assert_int_equal(info.size, 8192);
	/* the read-write fd of the same inode is still writable */
	assert_int_equal(validate(fd, MAX_SIZE, &info, &err), 0);
	assert_true(info.writable);
	close(ro);
	close(fd);
}

static void test_validate_write_only_fd(void **state)
{
	(void)state;
	struct odpd_seginfo info;
	struct odpd_err err;
	int fd = good_memfd(8192);
	int wo = reopen(fd, O_WRONLY);

	assert_int_equal(validate(wo, MAX_SIZE, &info, &err), -EACCES);
	close(wo);
	close(fd);
}

static void test_validate_write_seal(void **state)
{
	(void)state;
	struct odpd_seginfo info;
	struct odpd_err err;
	int fd = make_memfd(8192, MFD_ALLOW_SEALING, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE);

	assert_int_equal(validate(fd, MAX_SIZE, &info, &err), 0);
	assert_false(info.writable);
	close(fd);

	fd = make_memfd(8192, MFD_ALLOW_SEALING, F_SEAL_SHRINK | F_SEAL_GROW);
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == 0) {   /* Linux >= 5.1 */
		assert_int_equal(validate(fd, MAX_SIZE, &info, &err), 0);
		assert_false(info.writable);
	}
	close(fd);
}

static void test_validate_empty(void **state)
{
	(void)state;
	struct odpd_seginfo info;
	struct odpd_err err;
	int fd = good_memfd(0);

	assert_int_equal(validate(fd, MAX_SIZE, &info, &err), -EINVAL);
	close(fd);
}

static void test_validate_too_big(void **state)
{
	(void)state;
	struct odpd_seginfo info;
	struct odpd_err err;
	int fd = good_memfd(4 * PAGE);

	assert_int_equal(validate(fd, 4 * PAGE - 1, &info, &err), -EFBIG);
	assert_int_equal(validate(fd, 4 * PAGE, &info, &err), 0);   /* the limit itself is fine */
	close(fd);
}

static void test_validate_hugetlb(void **state)
{
	(void)state;
	struct odpd_seginfo info;
	struct odpd_err err;
	int fd = memfd_create("unit-huge", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);

	if (fd < 0)
		skip();   /* no hugetlbfs in this kernel */
	if (ftruncate(fd, 2 * MIB) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
		close(fd);
		skip();
	}
	assert_int_equal(validate(fd, MAX_SIZE, &info, &err), 0);
	assert_true(info.page_size >= 2 * MIB);
	close(fd);
}

/* ------------------------------------------------------------ maps text */

#define SEG_DEV makedev(0x0, 0x1a)
#define SEG_INO ((ino_t)4242)

static int check_text(const char *text, uintptr_t addr, uint64_t len, uint64_t off,
		      dev_t dev, ino_t ino, struct odpd_err *err)
{
	FILE *f = fmemopen((void *)text, strlen(text), "r");
	int r;

	assert_non_null(f);
	memset(err, 0, sizeof(*err));
	r = odpd_maps_check(f, addr, len, off, dev, ino, err);
	fclose(f);
	if (r < 0)
		assert_int_equal(err->code, -r);
	return r;
}

/* Lines around the interesting ones, as a real maps file has them. */
#define HEAD \
	"55d0c0a00000-55d0c0a21000 r--p 00000000 fd:01 1311             /usr/sbin/client\n" \
	"55d0c1b4e000-55d0c1b6f000 rw-p 00000000 00:00 0                [heap]\n" \
	"7f0000000000-7f0000001000 ---p 00000000 00:00 0 \n"
#define TAIL \
	"7f1234560000-7f1234580000 r-xp 00000000 fd:01 2202             /usr/lib/libc.so.6\n" \
	"7ffd4c3e1000-7ffd4c402000 rw-p 00000000 00:00 0                [stack]\n" \
	"ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0        [vsyscall]\n"
#define SEG_NAME "/memfd:odpd-segment (deleted)"

static void test_maps_exact(void **state)
{
	(void)state;
	struct odpd_err err;
	const char *text = HEAD
		"7f0000100000-7f0000110000 rw-s 00000000 00:1a 4242             " SEG_NAME "\n"
		TAIL;

	assert_int_equal(check_text(text, 0x7f0000100000, 0x10000, 0, SEG_DEV, SEG_INO, &err), 0);
	/* a part of it, at the matching offset */
	assert_int_equal(check_text(text, 0x7f0000104000, 0x4000, 0x4000, SEG_DEV, SEG_INO, &err), 0);
	/* read-only shared mappings count too */
	const char *ro = HEAD
		"7f0000100000-7f0000110000 r--s 00002000 00:1a 4242             " SEG_NAME "\n"
		TAIL;
	assert_int_equal(check_text(ro, 0x7f0000101000, 0x1000, 0x3000, SEG_DEV, SEG_INO, &err), 0);
}

static void test_maps_two_vmas(void **state)
{
	(void)state;
	struct odpd_err err;
	/* one file range split by an mprotect: offsets continue across the split */
	const char *text = HEAD
		"7f0000100000-7f0000104000 rw-s 00010000 00:1a 4242             " SEG_NAME "\n"
		"7f0000104000-7f0000110000 r--s 00014000 00:1a 4242             " SEG_NAME "\n"
		TAIL;

	assert_int_equal(check_text(text, 0x7f0000100000, 0x10000, 0x10000, SEG_DEV, SEG_INO, &err), 0);
	assert_int_equal(check_text(text, 0x7f0000102000, 0x6000, 0x12000, SEG_DEV, SEG_INO, &err), 0);

	/* the second VMA maps the file at another offset: not one range */
	const char *bad = HEAD
		"7f0000100000-7f0000104000 rw-s 00010000 00:1a 4242             " SEG_NAME "\n"
		"7f0000104000-7f0000110000 rw-s 00000000 00:1a 4242             " SEG_NAME "\n"
		TAIL;
	assert_int_equal(check_text(bad, 0x7f0000100000, 0x10000, 0x10000, SEG_DEV, SEG_INO, &err),
			 -EINVAL);
	/* ...but its first VMA alone is fine */
	assert_int_equal(check_text(bad, 0x7f0000100000, 0x4000, 0x10000, SEG_DEV, SEG_INO, &err), 0);

	/* the second VMA is another file */
	const char *other = HEAD
		"7f0000100000-7f0000104000 rw-s 00010000 00:1a 4242             " SEG_NAME "\n"
		"7f0000104000-7f0000110000 rw-s 00014000 00:1a 4243             /memfd:other (deleted)\n"
		TAIL;
	assert_int_equal(check_text(other, 0x7f0000100000, 0x10000, 0x10000, SEG_DEV, SEG_INO, &err),
			 -EINVAL);
}

static void test_maps_hole(void **state)
{
	(void)state;
	struct odpd_err err;
	const char *text = HEAD
		"7f0000100000-7f0000104000 rw-s 00000000 00:1a 4242             " SEG_NAME "\n"
		"7f0000105000-7f0000110000 rw-s 00005000 00:1a 4242             " SEG_NAME "\n"
		TAIL;

	assert_int_equal(check_text(text, 0x7f0000100000, 0x10000, 0, SEG_DEV, SEG_INO, &err), -EINVAL);
	/* a range that starts in the hole */
	assert_int_equal(check_text(text, 0x7f0000104000, 0x2000, 0x4000, SEG_DEV, SEG_INO, &err),
			 -EINVAL);
	/* runs past the last VMA of the file */
	assert_int_equal(check_text(text, 0x7f0000105000, 0xc000, 0x5000, SEG_DEV, SEG_INO, &err),
			 -EINVAL);
	/* not mapped at all */
	assert_int_equal(check_text(text, 0x7f0000200000, 0x1000, 0, SEG_DEV, SEG_INO, &err), -EINVAL);
	/* past the end of the text */
	assert_int_equal(check_text(HEAD, 0x7f0000100000, 0x1000, 0, SEG_DEV, SEG_INO, &err), -EINVAL);
}

static void test_maps_private(void **state)
{
	(void)state;
	struct odpd_err err;
	const char *text = HEAD
		"7f0000100000-7f0000110000 rw-p 00000000 00:1a 4242             " SEG_NAME "\n"
		TAIL;

	assert_int_equal(check_text(text, 0x7f0000100000, 0x10000, 0, SEG_DEV, SEG_INO, &err), -EINVAL);
	assert_contains(err.msg, "MAP_PRIVATE");

	/* shared first half, private second half */
	const char *half = HEAD
		"7f0000100000-7f0000108000 rw-s 00000000 00:1a 4242             " SEG_NAME "\n"
		"7f0000108000-7f0000110000 rw-p 00008000 00:1a 4242             " SEG_NAME "\n"
		TAIL;
	assert_int_equal(check_text(half, 0x7f0000100000, 0x10000, 0, SEG_DEV, SEG_INO, &err), -EINVAL);
	assert_contains(err.msg, "MAP_PRIVATE");
}

static void test_maps_wrong_inode(void **state)
{
	(void)state;
	struct odpd_err err;
	const char *text = HEAD
		"7f0000100000-7f0000110000 rw-s 00000000 00:1a 4243             " SEG_NAME "\n"
		TAIL;

	assert_int_equal(check_text(text, 0x7f0000100000, 0x10000, 0, SEG_DEV, SEG_INO, &err), -EINVAL);
	/* an anonymous mapping has inode 0 */
	const char *anon = HEAD
		"7f0000100000-7f0000110000 rw-s 00000000 00:01 0                /dev/zero (deleted)\n"
		TAIL;
	assert_int_equal(check_text(anon, 0x7f0000100000, 0x10000, 0, SEG_DEV, SEG_INO, &err), -EINVAL);
}

static void test_maps_wrong_offset(void **state)
{
	(void)state;
	struct odpd_err err;
	const char *text = HEAD
		"7f0000100000-7f0000110000 rw-s 00001000 00:1a 4242             " SEG_NAME "\n"
		TAIL;

	assert_int_equal(check_text(text, 0x7f0000100000, 0x10000, 0, SEG_DEV, SEG_INO, &err), -EINVAL);
	assert_int_equal(check_text(text, 0x7f0000100000, 0x10000, 0x2000, SEG_DEV, SEG_INO, &err),
			 -EINVAL);
	assert_int_equal(check_text(text, 0x7f0000100000, 0x10000, 0x1000, SEG_DEV, SEG_INO, &err), 0);
	/* offsets are hex: 0x10000, not 10000 */
	const char *hex = HEAD
		"7f0000100000-7f0000110000 rw-s 00010000 00:1a 4242             " SEG_NAME "\n"
		TAIL;
	assert_int_equal(check_text(hex, 0x7f0000100000, 0x10000, 10000, SEG_DEV, SEG_INO, &err),
			 -EINVAL);
	assert_int_equal(check_text(hex, 0x7f0000100000, 0x10000, 0x10000, SEG_DEV, SEG_INO, &err), 0);
}

static void test_maps_wrong_device(void **state)
{
	(void)state;
	struct odpd_err err;
	const char *text = HEAD
		"7f0000100000-7f0000110000 rw-s 00000000 00:1a 4242             " SEG_NAME "\n"
		TAIL;

	/* minor differs */
	assert_int_equal(check_text(text, 0x7f0000100000, 0x10000, 0, makedev(0, 0x1b), SEG_INO, &err),
			 -EINVAL);
	/* major differs */
	assert_int_equal(check_text(text, 0x7f0000100000, 0x10000, 0, makedev(1, 0x1a), SEG_INO, &err),
			 -EINVAL);
	/* the numbers are hex in the maps file: 00:1a is minor 26, not 1 or 10 */
	assert_int_equal(check_text(text, 0x7f0000100000, 0x10000, 0, makedev(0, 26), SEG_INO, &err), 0);
	const char *big = HEAD
		"7f0000100000-7f0000110000 rw-s 00000000 103:2a 4242            " SEG_NAME "\n"
		TAIL;
	assert_int_equal(check_text(big, 0x7f0000100000, 0x10000, 0, makedev(0x103, 0x2a), SEG_INO, &err),
			 0);
	assert_int_equal(check_text(big, 0x7f0000100000, 0x10000, 0, makedev(103, 0x2a), SEG_INO, &err),
			 -EINVAL);
}

/*
 * A line longer than the parser's line buffer (a mapped file with a long
 * path) must not have its tail read as a line of its own: the client names
 * its files, so it could forge a VMA that way. Here the tail of a long path
 * claims that [0x7f0000100000, +64 KiB) is the segment, MAP_SHARED, while the
 * real VMA there is private anonymous memory.
 */
static void test_maps_long_line_not_split(void **state)
{
	(void)state;
	struct odpd_err err;
	const char *prefix = "7f00000f0000-7f00000f1000 r--s 00000000 fd:01 777 /home/user/";
	const char *forged = "7f0000100000-7f0000110000 rw-s 00000000 00:1a 4242 x";
	char text[8192], path[4096];
	size_t pos = 0;

	/* pad the path so that the forged text starts at each possible split point */
	for (size_t split = 200; split <= 1100; split++) {
		size_t pad = split - strlen(prefix);

		memset(path, 'a', pad);
		path[pad] = '\0';
		pos = (size_t)snprintf(text, sizeof(text),
				       HEAD "%s%s%s\n"
				       "7f0000100000-7f0000110000 rw-p 00000000 00:00 0 \n" TAIL,
				       prefix, path, forged);
		assert_true(pos < sizeof(text));
		if (check_text(text, 0x7f0000100000, 0x10000, 0, SEG_DEV, SEG_INO, &err) == 0)
			fail_msg("a forged VMA in the tail of a %zu-character path line was accepted "
				 "(line split after %zu characters)", strlen(prefix) + pad + strlen(forged),
				 split);
	}
}

/* ------------------------------------------------------------ live maps */

static int my_pidfd(void)
{
	int fd = (int)syscall(SYS_pidfd_open, getpid(), 0);

	return fd;   /* -1 on kernels without pidfd_open: the check then skips it */
}

static void test_client_mapping_shared(void **state)
{
	(void)state;
	struct odpd_err err = { 0 };
	struct stat st;
	int fd = good_memfd(8 * PAGE), pidfd = my_pidfd();

	assert_int_equal(fstat(fd, &st), 0);
	uint8_t *p = mmap(NULL, 8 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	assert_int_equal(odpd_client_mapping_check(getpid(), pidfd, (uintptr_t)p, 8 * PAGE, 0,
						   st.st_dev, st.st_ino, &err), 0);
	/* an inner part at its offset */
	assert_int_equal(odpd_client_mapping_check(getpid(), pidfd, (uintptr_t)p + 2 * PAGE, 3 * PAGE,
						   2 * PAGE, st.st_dev, st.st_ino, &err), 0);
	assert_int_equal(odpd_client_mapping_check(getpid(), pidfd, (uintptr_t)p + 2 * PAGE, 3 * PAGE,
						   0, st.st_dev, st.st_ino, &err), -EINVAL);
	/* split the VMA: still one consistent range */
	assert_int_equal(mprotect(p + 4 * PAGE, PAGE, PROT_READ), 0);
	assert_int_equal(odpd_client_mapping_check(getpid(), pidfd, (uintptr_t)p, 8 * PAGE, 0,
						   st.st_dev, st.st_ino, &err), 0);
	/* past the end of the mapping */
	assert_int_equal(odpd_client_mapping_check(getpid(), pidfd, (uintptr_t)p, 9 * PAGE, 0,
						   st.st_dev, st.st_ino, &err), -EINVAL);
	munmap(p, 8 * PAGE);

	/* a mapping of a later part of the file, at its offset */
	p = mmap(NULL, 2 * PAGE, PROT_READ, MAP_SHARED, fd, 4 * PAGE);
	assert_true(p != MAP_FAILED);
	assert_int_equal(odpd_client_mapping_check(getpid(), pidfd, (uintptr_t)p, 2 * PAGE, 4 * PAGE,
						   st.st_dev, st.st_ino, &err), 0);
	assert_int_equal(odpd_client_mapping_check(getpid(), pidfd, (uintptr_t)p, 2 * PAGE, 0,
						   st.st_dev, st.st_ino, &err), -EINVAL);
	munmap(p, 2 * PAGE);
	if (pidfd >= 0)
		close(pidfd);
	close(fd);
}

static void test_client_mapping_private(void **state)
{
	(void)state;
	struct odpd_err err = { 0 };
	struct stat st;
	int fd = good_memfd(8 * PAGE);

	assert_int_equal(fstat(fd, &st), 0);
	void *p = mmap(NULL, 8 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	assert_true(p != MAP_FAILED);
	assert_int_equal(odpd_client_mapping_check(getpid(), -1, (uintptr_t)p, 8 * PAGE, 0,
						   st.st_dev, st.st_ino, &err), -EINVAL);
	assert_contains(err.msg, "MAP_PRIVATE");
	munmap(p, 8 * PAGE);

	/* another memfd's shared mapping is not this segment */
	int other = good_memfd(8 * PAGE);
	p = mmap(NULL, 8 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, other, 0);
	assert_true(p != MAP_FAILED);
	assert_int_equal(odpd_client_mapping_check(getpid(), -1, (uintptr_t)p, 8 * PAGE, 0,
						   st.st_dev, st.st_ino, &err), -EINVAL);
	munmap(p, 8 * PAGE);
	close(other);
	close(fd);
}

/* A pidfd whose process is gone: the pid may have been reused. */
static void test_client_mapping_dead_pidfd(void **state)
{
	(void)state;
	struct odpd_err err = { 0 };
	struct stat st;
	int fd = good_memfd(4 * PAGE);
	pid_t child = fork();

	assert_true(child >= 0);
	if (child == 0)
		_exit(0);
	int pidfd = (int)syscall(SYS_pidfd_open, child, 0);
	assert_int_equal(waitpid(child, NULL, 0), child);
	if (pidfd < 0) {
		close(fd);
		skip();
	}
	assert_int_equal(fstat(fd, &st), 0);
	void *p = mmap(NULL, 4 * PAGE, PROT_READ, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	/* our own maps match, but the pidfd says the peer is gone */
	assert_int_equal(odpd_client_mapping_check(getpid(), pidfd, (uintptr_t)p, 4 * PAGE, 0,
						   st.st_dev, st.st_ino, &err), -ESRCH);
	/* a pid that does not exist */
	assert_int_equal(odpd_client_mapping_check(child, -1, (uintptr_t)p, 4 * PAGE, 0,
						   st.st_dev, st.st_ino, &err), -ESRCH);
	munmap(p, 4 * PAGE);
	close(pidfd);
	close(fd);
}

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

/* A live process stays alive while signals arrive: poll() on its pidfd may
 * answer EINTR (a signal pending when nothing is ready, even with timeout 0),
 * which is not an exit. A daemon gets signals (SIGHUP, a timer of the
 * fuzzer's): taking EINTR for "exited" refused connections at random. */
static void test_pidfd_alive_through_signals(void **state)
{
	(void)state;
	struct sigaction sa = { .sa_handler = on_alarm }, old;
	struct itimerval tick = { { 0, 100 }, { 0, 100 } }, off = { 0 };
	int pidfd = my_pidfd();
	unsigned dead = 0;

	if (pidfd < 0)
		skip();
	sigemptyset(&sa.sa_mask);
	assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
	assert_int_equal(setitimer(ITIMER_REAL, &tick, NULL), 0);
	for (int i = 0; i < 300000 || alarms < 2000; i++)
		dead += !odpd_pidfd_alive(pidfd);
	setitimer(ITIMER_REAL, &off, NULL);
	sigaction(SIGALRM, &old, NULL);
	print_message("%d signals during the calls\n", (int)alarms);
	assert_int_equal(dead, 0);
	close(pidfd);
}

/* ------------------------------------------------------------ mappings */

struct seg_fixture {
	struct odpd_segtable t;
};

static int seg_setup(void **state)
{
	struct seg_fixture *f = calloc(1, sizeof(*f));

	if (!f || odpd_window_new(256 * MIB, &f->t.window) < 0)
		return -1;
	*state = f;
	return 0;
}

static int seg_teardown(void **state)
{
	struct seg_fixture *f = *state;

	odpd_window_free(f->t.window);
	free(f);
	return 0;
}

static bool fd_is_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0 || errno != EBADF;
}

/* The VMA of /proc/self/smaps that contains @addr: its perms, inode and VmFlags. */
static bool smaps_of(uintptr_t addr, char perms[8], unsigned long long *ino, char *flags, size_t flen)
{
	FILE *f = fopen("/proc/self/smaps", "re");
	char line[4096];
	bool in = false, found = false;

	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		unsigned long long start, stop, off, inode;
		unsigned maj, min;
		char p[8];

		if (sscanf(line, "%llx-%llx %7s %llx %x:%x %llu", &start, &stop, p, &off,
			   &maj, &min, &inode) == 7) {
			in = start <= addr && addr < stop;
			if (in) {
				memcpy(perms, p, 8);
				*ino = inode;
				found = true;
			}
			continue;
		}
		if (in && strncmp(line, "VmFlags:", 8) == 0) {
			size_t n = strlen(line + 8);

			if (n >= flen)
				n = flen - 1;
			memcpy(flags, line + 8, n);
			flags[n] = '\0';
		}
	}
	fclose(f);
	return found;
}

static bool mapped_from(uintptr_t addr, ino_t ino)
{
	char perms[8], flags[256] = "";
	unsigned long long i;

	return smaps_of(addr, perms, &i, flags, sizeof(flags)) && i == ino;
}

static void validate_ok(int fd, struct odpd_seginfo *info)
{
	struct odpd_err err;

	assert_int_equal(validate(fd, MAX_SIZE, info, &err), 0);
}

static void test_mapping_dedup(void **state)
{
	struct seg_fixture *f = *state;
	struct odpd_segtable *t = &f->t;
	struct odpd_seginfo info, info2;
	struct odpd_mapping *m1 = NULL, *m2 = NULL;
	struct odpd_err err = { 0 };
	int fd = good_memfd(3 * PAGE + 1);
	int fd2 = reopen(fd, O_RDWR);

	validate_ok(fd, &info);
	validate_ok(fd2, &info2);
	/* take the window's first page, so that its free space is off the 2 MiB grid */
	void *pad = odpd_window_alloc(t->window, PAGE, PAGE);
	assert_non_null(pad);
	assert_int_equal(odpd_mapping_get(t, fd, &info, 0, &m1, &err), 0);
	assert_non_null(m1);
	assert_int_equal(m1->refs, 1);
	assert_int_equal(t->count, 1);
	assert_int_equal(m1->size, 4 * PAGE);     /* page rounded */
	assert_int_equal(t->bytes, 4 * PAGE);
	assert_true(m1->in_window);
	assert_true(odpd_window_contains(t->window, m1->addr, m1->size));
	assert_int_equal((uintptr_t)m1->addr % (2 * MIB), 0);   /* huge page ready */

	assert_int_equal(odpd_mapping_get(t, fd2, &info2, 0, &m2, &err), 0);
	assert_ptr_equal(m1, m2);
	assert_int_equal(m1->refs, 2);
	assert_int_equal(t->count, 1);
	assert_int_equal(t->bytes, 4 * PAGE);
	assert_false(fd_is_open(fd2));             /* the duplicate's fd was consumed */
	assert_true(fd_is_open(m1->fd));

	/* the mapping is the file: writes through either side are seen by the other */
	m1->addr[10] = 'x';
	char c = 0;
	assert_int_equal(pread(m1->fd, &c, 1, 10), 1);
	assert_int_equal(c, 'x');
	assert_int_equal(pwrite(m1->fd, "y", 1, 3 * PAGE), 1);
	assert_int_equal(m1->addr[3 * PAGE], 'y');

	/* another inode: another mapping, not overlapping */
	struct odpd_seginfo info3;
	struct odpd_mapping *m3 = NULL;
	int fd3 = good_memfd(PAGE);
	validate_ok(fd3, &info3);
	assert_int_equal(odpd_mapping_get(t, fd3, &info3, 0, &m3, &err), 0);
	assert_ptr_not_equal(m3, m1);
	assert_int_equal(t->count, 2);
	assert_int_equal(t->bytes, 5 * PAGE);
	assert_false(m3->addr < m1->addr + m1->size && m1->addr < m3->addr + m3->size);
	odpd_mapping_put(t, m3);

	int kept_fd = m1->fd;
	uintptr_t addr = (uintptr_t)m1->addr;
	odpd_mapping_put(t, m1);
	assert_int_equal(t->count, 1);
	assert_int_equal(m1->refs, 1);
	assert_true(mapped_from(addr, info.ino));
	odpd_mapping_put(t, m2);
	assert_int_equal(t->count, 0);
	assert_int_equal(t->bytes, 0);
	assert_int_equal(t->n_listed, 0);
	assert_null(t->buckets);
	assert_false(fd_is_open(kept_fd));
	assert_false(mapped_from(addr, info.ino));

	/* the window space is back, PROT_NONE */
	char perms[8], flags[256];
	unsigned long long ino;
	assert_true(smaps_of(addr, perms, &ino, flags, sizeof(flags)));
	assert_string_equal(perms, "---p");
	assert_int_equal(ino, 0);
	odpd_window_release(t->window, pad, PAGE);
}

/* A scratch address that is free right now. */
static uintptr_t free_address(size_t len)
{
	void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	assert_true(p != MAP_FAILED);
	munmap(p, len);
	return (uintptr_t)p;
}

static void test_mapping_want_addr(void **state)
{
	struct seg_fixture *f = *state;
	struct odpd_segtable *t = &f->t;
	struct odpd_seginfo info;
	struct odpd_mapping *m = NULL;
	struct odpd_err err = { 0 };
	int fd = good_memfd(4 * PAGE);

	validate_ok(fd, &info);
	/* 64 MiB of room, so that nothing else lands there meanwhile */
	uintptr_t want = free_address(64 * MIB) + 16 * MIB;
	assert_int_equal(odpd_mapping_get(t, fd, &info, want, &m, &err), 0);
	assert_int_equal((uintptr_t)m->addr, want);
	assert_false(m->in_window);
	assert_true(mapped_from(want, info.ino));
	odpd_mapping_put(t, m);
	assert_int_equal(t->count, 0);
	assert_int_equal(t->bytes, 0);
	assert_false(mapped_from(want, info.ino));
	/* unmapped, not replaced: the address is free again */
	void *q = mmap((void *)want, 4 * PAGE, PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	assert_ptr_equal(q, (void *)want);
	munmap(q, 4 * PAGE);
}

static void test_mapping_want_addr_taken(void **state)
{
	struct seg_fixture *f = *state;
	struct odpd_segtable *t = &f->t;
	struct odpd_seginfo info;
	struct odpd_mapping *m = NULL;
	struct odpd_err err = { 0 };
	int fd = good_memfd(4 * PAGE);

	validate_ok(fd, &info);
	/* something of odpd's own lives there (here: a page in the middle) */
	uintptr_t want = free_address(16 * MIB) + 4 * MIB;
	void *busy = mmap((void *)(want + PAGE), PAGE, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	assert_ptr_equal(busy, (void *)(want + PAGE));
	*(volatile char *)busy = 7;

	assert_int_equal(odpd_mapping_get(t, fd, &info, want, &m, &err), 0);
	assert_true(m->in_window);
	assert_true((uintptr_t)m->addr != want);
	assert_true(odpd_window_contains(t->window, m->addr, m->size));
	/* the busy page was left alone */
	assert_int_equal(*(volatile char *)busy, 7);
	assert_false(mapped_from(want, info.ino));
	odpd_mapping_put(t, m);
	assert_int_equal(t->count, 0);
	munmap(busy, PAGE);
}

static void test_mapping_read_only(void **state)
{
	struct seg_fixture *f = *state;
	struct odpd_segtable *t = &f->t;
	struct odpd_seginfo info;
	struct odpd_mapping *m = NULL;
	struct odpd_err err = { 0 };
	int fd = good_memfd(4 * PAGE), ro = reopen(fd, O_RDONLY);
	char perms[8], flags[256];
	unsigned long long ino;

	close(fd);
	validate_ok(ro, &info);
	assert_false(info.writable);
	assert_int_equal(odpd_mapping_get(t, ro, &info, 0, &m, &err), 0);
	assert_false(m->writable);
	assert_true(smaps_of((uintptr_t)m->addr, perms, &ino, flags, sizeof(flags)));
	assert_string_equal(perms, "r--s");
	odpd_mapping_put(t, m);
}

/* A read-only first attach must not make the inode read-only for everyone:
 * a later writable fd remaps it writable at the same address. */
static void test_mapping_read_only_then_writable(void **state)
{
	struct seg_fixture *f = *state;
	struct odpd_segtable *t = &f->t;
	struct odpd_seginfo info, info_rw;
	struct odpd_mapping *m = NULL, *m2 = NULL;
	struct odpd_err err = { 0 };
	int fd = good_memfd(4 * PAGE), ro = reopen(fd, O_RDONLY), rw = reopen(fd, O_RDWR);
	char perms[8], flags[256];
	unsigned long long ino;
	uint8_t *addr;

	validate_ok(ro, &info);
	validate_ok(rw, &info_rw);
	assert_int_equal(odpd_mapping_get(t, ro, &info, 0, &m, &err), 0);
	addr = m->addr;
	assert_false(m->writable);
	assert_int_equal(odpd_mapping_get(t, rw, &info_rw, 0, &m2, &err), 0);
	assert_ptr_equal(m2, m);
	assert_ptr_equal(m->addr, addr);
	assert_true(m->writable);
	assert_int_equal(m->refs, 2);
	assert_true(smaps_of((uintptr_t)m->addr, perms, &ino, flags, sizeof(flags)));
	assert_string_equal(perms, "rw-s");
	assert_non_null(strstr(flags, "dd"));
	m->addr[0] = 42;                         /* the same pages as the client's */
	assert_int_equal(pread(fd, perms, 1, 0), 1);
	assert_int_equal(perms[0], 42);
	/* the read-only fd was replaced by the writable file under the same
	 * number (workers may fstat it meanwhile); the new fd was consumed */
	assert_int_equal(m->fd, ro);
	assert_int_equal(fcntl(m->fd, F_GETFL) & O_ACCMODE, O_RDWR);
	assert_true(fcntl(m->fd, F_GETFD) & FD_CLOEXEC);
	assert_false(fd_is_open(rw));
	odpd_mapping_put(t, m);
	odpd_mapping_put(t, m);
	assert_int_equal(t->count, 0);
	close(fd);
}

static void test_mapping_dontdump(void **state)
{
	struct seg_fixture *f = *state;
	struct odpd_segtable *t = &f->t;
	struct odpd_seginfo info;
	struct odpd_mapping *m = NULL;
	struct odpd_err err = { 0 };
	char perms[8], flags[256] = "";
	unsigned long long ino;

	for (int pass = 0; pass < 2; pass++) {
		int fd = good_memfd(4 * PAGE);

		validate_ok(fd, &info);
		uintptr_t want = pass ? free_address(16 * MIB) + 4 * MIB : 0;
		assert_int_equal(odpd_mapping_get(t, fd, &info, want, &m, &err), 0);
		assert_int_equal(m->in_window, !pass);
		assert_true(smaps_of((uintptr_t)m->addr, perms, &ino, flags, sizeof(flags)));
		assert_int_equal(ino, info.ino);
		assert_string_equal(perms, "rw-s");
		if (!strstr(flags, " dd"))
			fail_msg("segment mapping at %p is not MADV_DONTDUMP: VmFlags:%s", (void *)m->addr,
				 flags);
		odpd_mapping_put(t, m);
	}
}

/* 300 inodes (each at 2 MiB alignment: a window of its own): the table
 * grows past its first 64 buckets, each inode is found again (a second
 * reference), and the table is gone with the last mapping. */
static void test_mapping_many(void **state)
{
	struct odpd_segtable tt = { 0 }, *t = &tt;
	enum { N = 300 };
	struct odpd_mapping *m[N], *again;
	struct odpd_seginfo info[N];
	struct odpd_err err = { 0 };

	(void)state;
	assert_int_equal(odpd_window_new(N * 2 * MIB, &t->window), 0);
	for (int i = 0; i < N; i++) {
		int fd = good_memfd(64 * 1024);

		validate_ok(fd, &info[i]);
		assert_int_equal(odpd_mapping_get(t, fd, &info[i], 0, &m[i], &err), 0);
	}
	assert_int_equal(t->n_listed, N);
	assert_true(t->n_buckets >= N / 2);
	for (int i = 0; i < N; i++) {
		int fd = dup(m[i]->fd);

		assert_int_equal(odpd_mapping_get(t, fd, &info[i], 0, &again, &err), 0);
		assert_ptr_equal(again, m[i]);
		assert_int_equal(m[i]->refs, 2);
	}
	for (int i = 0; i < N; i++) {
		odpd_mapping_put(t, m[i]);
		odpd_mapping_put(t, m[i]);
	}
	assert_int_equal(t->n_listed, 0);
	assert_null(t->buckets);
	odpd_window_free(t->window);
}

static void test_mapping_window_full(void **state)
{
	(void)state;
	struct odpd_segtable t = { 0 };
	struct odpd_seginfo info;
	struct odpd_mapping *m = NULL;
	struct odpd_err err = { 0 };
	int fd = good_memfd(16 * MIB);

	assert_int_equal(odpd_window_new(8 * MIB, &t.window), 0);
	validate_ok(fd, &info);
	assert_int_equal(odpd_mapping_get(&t, fd, &info, 0, &m, &err), -ENOMEM);
	assert_int_equal(err.code, ENOMEM);
	assert_false(fd_is_open(fd));      /* consumed on error too */
	assert_int_equal(t.count, 0);
	assert_int_equal(t.bytes, 0);
	assert_int_equal(t.n_listed, 0);
	assert_null(t.buckets);
	odpd_window_free(t.window);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_validate_regular_file),
		cmocka_unit_test(test_validate_dev_shm_file),
		cmocka_unit_test(test_validate_pipe),
		cmocka_unit_test(test_validate_no_allow_sealing),
		cmocka_unit_test(test_validate_no_seals),
		cmocka_unit_test(test_validate_only_shrink),
		cmocka_unit_test(test_validate_only_grow),
		cmocka_unit_test(test_validate_sealed_without_size_seals),
		cmocka_unit_test(test_validate_good),
		cmocka_unit_test(test_validate_good_sealed_shut),
		cmocka_unit_test(test_validate_read_only_fd),
		cmocka_unit_test(test_validate_write_only_fd),
		cmocka_unit_test(test_validate_write_seal),
		cmocka_unit_test(test_validate_empty),
		cmocka_unit_test(test_validate_too_big),
		cmocka_unit_test(test_validate_hugetlb),
		cmocka_unit_test(test_maps_exact),
		cmocka_unit_test(test_maps_two_vmas),
		cmocka_unit_test(test_maps_hole),
		cmocka_unit_test(test_maps_private),
		cmocka_unit_test(test_maps_wrong_inode),
		cmocka_unit_test(test_maps_wrong_offset),
		cmocka_unit_test(test_maps_wrong_device),
		cmocka_unit_test(test_maps_long_line_not_split),
		cmocka_unit_test(test_client_mapping_shared),
		cmocka_unit_test(test_client_mapping_private),
		cmocka_unit_test(test_client_mapping_dead_pidfd),
		cmocka_unit_test(test_pidfd_alive_through_signals),
		cmocka_unit_test_setup_teardown(test_mapping_dedup, seg_setup, seg_teardown),
		cmocka_unit_test_setup_teardown(test_mapping_want_addr, seg_setup, seg_teardown),
		cmocka_unit_test_setup_teardown(test_mapping_want_addr_taken, seg_setup, seg_teardown),
		cmocka_unit_test_setup_teardown(test_mapping_read_only, seg_setup, seg_teardown),
		cmocka_unit_test_setup_teardown(test_mapping_read_only_then_writable, seg_setup, seg_teardown),
		cmocka_unit_test_setup_teardown(test_mapping_dontdump, seg_setup, seg_teardown),
		cmocka_unit_test(test_mapping_window_full),
		cmocka_unit_test(test_mapping_many),
	};

	return cmocka_run_group_tests_name("segment", tests, NULL, NULL);
}
