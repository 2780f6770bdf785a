/* SPDX-License-Identifier: MIT */
/*
 * fault.c - the wrappers of fault.h. Linked into odpd only when built with
 * -Dfault_injection=true, together with -Wl,--wrap=NAME for each NAME below,
 * so that odpd's own calls (not the libraries' internal ones) reach
 * __wrap_NAME, which either fails or calls __real_NAME.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "fault.h"

static struct odpd_fault_control *ctl;
extern char __executable_start;

/* The real calls: the linker resolves __real_NAME to NAME. */
void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void *__real_reallocarray(void *p, size_t k, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
int __real_socket(int domain, int type, int protocol);
int __real_socketpair(int domain, int type, int protocol, int sv[2]);
int __real_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags);
int __real_memfd_create(const char *name, unsigned flags);
int __real_open64(const char *path, int flags, ...);
FILE *__real_fopen64(const char *path, const char *mode);
DIR *__real_opendir(const char *path);
int __real_dup3(int fd, int fd2, int flags);
int __real_fcntl64(int fd, int cmd, ...);
int __real_inotify_init1(int flags);
long __real_syscall(long nr, ...);
ssize_t __real_recvmsg(int fd, struct msghdr *mh, int flags);
struct ibv_context *__real_ibv_open_device(struct ibv_device *dev);
int __real_posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
		       const posix_spawnattr_t *attr, char *const argv[], char *const envp[]);

void odpd_fault_init(void)
{
	const char *path = getenv("ODPD_FAULT_CONTROL");
	void *p;
	int fd;

	if (!path || !*path)
		return;
	fd = __real_open64(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "odpd: ODPD_FAULT_CONTROL=%s: %s\n", path, strerror(errno));
		exit(1);
	}
	p = mmap(NULL, sizeof(*ctl), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED || ((struct odpd_fault_control *)p)->magic != ODPD_FAULT_MAGIC) {
		fprintf(stderr, "odpd: ODPD_FAULT_CONTROL=%s is not a fault control file\n", path);
		exit(1);
	}
	ctl = p;
}

bool odpd_fault_now(unsigned kind, const char *function, const void *ra)
{
	if (!ctl || !(atomic_load_explicit(&ctl->kind, memory_order_relaxed) & kind))
		return false;
	atomic_fetch_add_explicit(&ctl->calls, 1, memory_order_relaxed);
	if (atomic_fetch_sub(&ctl->countdown, 1) != 1)
		return false;
	ctl->site = (uint64_t)((const char *)ra - &__executable_start);
	snprintf(ctl->function, sizeof(ctl->function), "%s", function);
	atomic_store(&ctl->injected, 1);
	return true;
}

#define FAIL(kind, err, ret)                                                        \
	do {                                                                        \
		if (odpd_fault_now(kind, __func__ + 7, __builtin_return_address(0))) { \
			errno = (err);                                              \
			return (ret);                                               \
		}                                                                   \
	} while (0)

/* Prototypes for -Wmissing-prototypes: nothing but the linker calls these. */
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t k, size_t n);
void *__wrap_realloc(void *p, size_t n);
void *__wrap_reallocarray(void *p, size_t k, size_t n);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
int __wrap_socket(int domain, int type, int protocol);
int __wrap_socketpair(int domain, int type, int protocol, int sv[2]);
int __wrap_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags);
int __wrap_memfd_create(const char *name, unsigned flags);
int __wrap_open64(const char *path, int flags, ...);
FILE *__wrap_fopen64(const char *path, const char *mode);
DIR *__wrap_opendir(const char *path);
int __wrap_dup3(int fd, int fd2, int flags);
int __wrap_fcntl64(int fd, int cmd, ...);
int __wrap_inotify_init1(int flags);
long __wrap_syscall(long nr, ...);
ssize_t __wrap_recvmsg(int fd, struct msghdr *mh, int flags);
struct ibv_context *__wrap_ibv_open_device(struct ibv_device *dev);
int __wrap_posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
		       const posix_spawnattr_t *attr, char *const argv[], char *const envp[]);

void *__wrap_malloc(size_t n)
{
	FAIL(ODPD_FAULT_ALLOC, ENOMEM, NULL);
	return __real_malloc(n);
}

void *__wrap_calloc(size_t k, size_t n)
{
	FAIL(ODPD_FAULT_ALLOC, ENOMEM, NULL);
	return __real_calloc(k, n);
}

void *__wrap_realloc(void *p, size_t n)
{
	FAIL(ODPD_FAULT_ALLOC, ENOMEM, NULL);
	return __real_realloc(p, n);
}

void *__wrap_reallocarray(void *p, size_t k, size_t n)
{
	FAIL(ODPD_FAULT_ALLOC, ENOMEM, NULL);
	return __real_reallocarray(p, k, n);
}

char *__wrap_strdup(const char *s)
{
	FAIL(ODPD_FAULT_ALLOC, ENOMEM, NULL);
	return __real_strdup(s);
}

char *__wrap_strndup(const char *s, size_t n)
{
	FAIL(ODPD_FAULT_ALLOC, ENOMEM, NULL);
	return __real_strndup(s, n);
}

int __wrap_socket(int domain, int type, int protocol)
{
	FAIL(ODPD_FAULT_FD, EMFILE, -1);
	return __real_socket(domain, type, protocol);
}

int __wrap_socketpair(int domain, int type, int protocol, int sv[2])
{
	FAIL(ODPD_FAULT_FD, EMFILE, -1);
	return __real_socketpair(domain, type, protocol, sv);
}

int __wrap_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	FAIL(ODPD_FAULT_FD, EMFILE, -1);
	return __real_accept4(fd, addr, len, flags);
}

int __wrap_memfd_create(const char *name, unsigned flags)
{
	FAIL(ODPD_FAULT_FD, EMFILE, -1);
	return __real_memfd_create(name, flags);
}

int __wrap_open64(const char *path, int flags, ...)
{
	va_list ap;
	int mode;

	va_start(ap, flags);
	mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, int) : 0;
	va_end(ap);
	FAIL(ODPD_FAULT_FD, EMFILE, -1);
	return __real_open64(path, flags, mode);
}

FILE *__wrap_fopen64(const char *path, const char *mode)
{
	FAIL(ODPD_FAULT_FD, EMFILE, NULL);
	return __real_fopen64(path, mode);
}

DIR *__wrap_opendir(const char *path)
{
	FAIL(ODPD_FAULT_FD, EMFILE, NULL);
	return __real_opendir(path);
}

int __wrap_dup3(int fd, int fd2, int flags)
{
	FAIL(ODPD_FAULT_FD, EMFILE, -1);
	return __real_dup3(fd, fd2, flags);
}

int __wrap_fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	long arg;

	/* every command odpd uses takes an int or nothing: read one word */
	va_start(ap, cmd);
	arg = va_arg(ap, long);
	va_end(ap);
	if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)
		FAIL(ODPD_FAULT_FD, EMFILE, -1);
	return __real_fcntl64(fd, cmd, arg);
}

int __wrap_inotify_init1(int flags)
{
	FAIL(ODPD_FAULT_FD, EMFILE, -1);
	return __real_inotify_init1(flags);
}

long __wrap_syscall(long nr, ...)
{
	va_list ap;
	long a[6];

	va_start(ap, nr);
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	if (nr == SYS_pidfd_open)
		FAIL(ODPD_FAULT_FD, EMFILE, -1);
	return __real_syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

/* A packet that carries fds, when the fd table is full: the kernel drops
 * the fds and sets MSG_CTRUNC; so does this. */
ssize_t __wrap_recvmsg(int fd, struct msghdr *mh, int flags)
{
	ssize_t n = __real_recvmsg(fd, mh, flags);
	struct cmsghdr *cm;

	if (n < 0 || mh->msg_controllen == 0)
		return n;
	cm = CMSG_FIRSTHDR(mh);
	if (!cm || cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
		return n;
	if (!odpd_fault_now(ODPD_FAULT_FD, "recvmsg", __builtin_return_address(0)))
		return n;
	for (; cm; cm = CMSG_NXTHDR(mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
			int k;

			memcpy(&k, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			close(k);
		}
	}
	mh->msg_controllen = 0;
	mh->msg_flags |= MSG_CTRUNC;
	return n;
}

struct ibv_context *__wrap_ibv_open_device(struct ibv_device *dev)
{
	FAIL(ODPD_FAULT_FD, EMFILE, NULL);
	return __real_ibv_open_device(dev);
}

int __wrap_posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
		       const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	if (odpd_fault_now(ODPD_FAULT_FD, "posix_spawn", __builtin_return_address(0)))
		return EAGAIN;
	return __real_posix_spawn(pid, path, fa, attr, argv, envp);
}
