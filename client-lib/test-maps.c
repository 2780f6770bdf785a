/* SPDX-License-Identifier: MIT */
/* The /proc/self/maps parser (maps.c): crafted text, then this process's own. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "libodpd-private.h"

#define CHECK(expr) do { \
	if (!(expr)) { \
		fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #expr); \
		exit(1); \
	} \
} while (0)

static const char maps_text[] =
	"00400000-00401000 r-xp 00000000 08:01 10                         /usr/bin/x\n"
	/* one memfd mapping, split by mprotect into two lines that continue one another */
	"7f0000000000-7f0000002000 rw-s 00000000 00:01 1234               /memfd:a (deleted)\n"
	"7f0000002000-7f0000003000 r--s 00002000 00:01 1234               /memfd:a (deleted)\n"
	/* adjacent, same file, but not the next offset: another mapping */
	"7f0000003000-7f0000004000 rw-s 00000000 00:01 1234               /memfd:a (deleted)\n"
	/* hole at 7f0000004000 */
	"7f0000005000-7f0000006000 rw-p 00001000 00:01 99                 /memfd:b (deleted)\n"
	"7f0000006000-7f0000007000 rw-p 00000000 00:00 0 \n"
	"ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0          [vsyscall]\n";

static int find_in(const char *text, uintptr_t addr, size_t length, struct maps_entry *e)
{
	FILE *f = fmemopen((void *)text, strlen(text), "r");
	int r;

	CHECK(f);
	r = maps_find(f, addr, length, e);
	fclose(f);
	return r;
}

static void test_parse_line(void)
{
	struct maps_entry e;

	CHECK(maps_parse_line("7f0000001000-7f0000003000 rw-s 0000a000 fd:1c 4294967297 /memfd:x (deleted)\n",
			      &e) == 0);
	CHECK(e.start == 0x7f0000001000 && e.end == 0x7f0000003000);
	CHECK(strcmp(e.perms, "rw-s") == 0 && e.shared);
	CHECK(e.offset == 0xa000);
	CHECK(e.dev_major == 0xfd && e.dev_minor == 0x1c);
	CHECK(e.inode == 4294967297ull);
	CHECK(maps_parse_line("7f0000001000-7f0000003000 r--p 00000000 00:00 0\n", &e) == 0);
	CHECK(!e.shared);

	CHECK(maps_parse_line("", &e) == -EINVAL);
	CHECK(maps_parse_line("garbage\n", &e) == -EINVAL);
	CHECK(maps_parse_line("7f0000003000-7f0000001000 rw-s 0 00:01 5\n", &e) == -EINVAL);
	CHECK(maps_parse_line("7f0000001000-7f0000003000 rw-s 0 00:01\n", &e) == -EINVAL);
}

static void test_find_crafted(void)
{
	struct maps_entry e;

	CHECK(find_in(maps_text, 0x7f0000001000, 0x1000, &e) == 0);
	CHECK(e.start == 0x7f0000000000 && e.end == 0x7f0000002000 && e.offset == 0);
	CHECK(e.shared && e.inode == 1234 && e.dev_major == 0 && e.dev_minor == 1);

	/* across the mprotect split: one mapping */
	CHECK(find_in(maps_text, 0x7f0000001000, 0x2000, &e) == 0);
	CHECK(e.start == 0x7f0000000000 && e.end == 0x7f0000003000 && strcmp(e.perms, "rw-s") == 0);

	/* into the next mapping of the same file at another offset */
	CHECK(find_in(maps_text, 0x7f0000001000, 0x3000, &e) == -ERANGE);
	/* a hole, an unmapped low address, past everything */
	CHECK(find_in(maps_text, 0x7f0000004000, 16, &e) == -ENOENT);
	CHECK(find_in(maps_text, 0x1000, 1, &e) == -ENOENT);
	CHECK(find_in(maps_text, 0xfffffffffff00000, 1, &e) == -ENOENT);
	/* into the hole */
	CHECK(find_in(maps_text, 0x7f0000003800, 0x1000, &e) == -ERANGE);
	/* private mappings are found (the caller refuses them) */
	CHECK(find_in(maps_text, 0x7f0000005000, 0x1000, &e) == 0);
	CHECK(!e.shared && e.offset == 0x1000 && e.inode == 99);
	/* private file mapping then anonymous memory: not one mapping */
	CHECK(find_in(maps_text, 0x7f0000005000, 0x2000, &e) == -ERANGE);
	/* the last line, and past its end */
	CHECK(find_in(maps_text, 0xffffffffff600000, 0x1000, &e) == 0);
	CHECK(find_in(maps_text, 0xffffffffff600000, 0x2000, &e) == -ERANGE);
	/* overflow */
	CHECK(find_in(maps_text, 0xffffffffff600000, SIZE_MAX, &e) == -ERANGE);
	/* a line that is not a maps line */
	CHECK(find_in("00400000-00401000 r-xp 00000000 08:01 10\nbroken\n", 0x7f0000000000, 1, &e) == -EIO);
	CHECK(find_in("", 0x400000, 1, &e) == -ENOENT);
}

static int find_self(const void *addr, size_t length, struct maps_entry *e)
{
	FILE *f = fopen("/proc/self/maps", "re");
	int r;

	CHECK(f);
	r = maps_find(f, (uintptr_t)addr, length, e);
	fclose(f);
	return r;
}

static void test_find_self(void)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct maps_entry e;
	struct stat st;
	uint8_t *shared, *priv;
	int fd;

	fd = memfd_create("test-maps", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	CHECK(fd >= 0);
	CHECK(ftruncate(fd, (off_t)(4 * page)) == 0);
	CHECK(fstat(fd, &st) == 0);

	/* pages 1..3 of the file, shared; then split it with mprotect */
	shared = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)page);
	CHECK(shared != MAP_FAILED);
	CHECK(find_self(shared + page, page, &e) == 0);
	CHECK(e.shared && e.start == (uintptr_t)shared && e.offset == page);
	CHECK(e.inode == (uint64_t)st.st_ino);
	CHECK(e.dev_major == major(st.st_dev) && e.dev_minor == minor(st.st_dev));
	CHECK(mprotect(shared + page, page, PROT_READ) == 0);
	CHECK(find_self(shared, 3 * page, &e) == 0);
	CHECK(e.start == (uintptr_t)shared && e.end == (uintptr_t)shared + 3 * page);
	CHECK(find_self(shared, 4 * page, &e) < 0);

	priv = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	CHECK(priv != MAP_FAILED);
	CHECK(find_self(priv, page, &e) == 0);
	CHECK(!e.shared && e.inode == (uint64_t)st.st_ino);

	CHECK(munmap(priv, page) == 0);
	CHECK(find_self(priv, page, &e) == -ENOENT || e.inode != (uint64_t)st.st_ino);
	CHECK(munmap(shared, 3 * page) == 0);
	close(fd);
}

int main(void)
{
	test_parse_line();
	test_find_crafted();
	test_find_self();
	printf("ok\n");
	return 0;
}
