/* SPDX-License-Identifier: MIT */
/*
 * verbs.c - the verbs registration calls, served through odpd.
 *
 * ibv_reg_mr is a macro in <infiniband/verbs.h> that calls either the
 * ibv_reg_mr symbol or ibv_reg_mr_iova2 (for IBV_ACCESS_OPTIONAL_RANGE
 * flags that are not constant); ibv_reg_mr_iova has its own symbol. All
 * three, ibv_dereg_mr and ibv_rereg_mr are defined here, so a program
 * (and librdmacm's rdma_reg_msgs/read/write, inline calls to ibv_reg_mr)
 * reaches them first. ibv_reg_dmabuf_mr is not defined here: it goes to
 * libibverbs unchanged.
 *
 * A registration of memory in one of alloc.c's chunks is served in
 * client-PD mode (mirror_reg_pd): the chunk is attached to the default
 * connection once, odpd imports the program's context, registers into the
 * program's PD and pins the pages under its own quotas (odpd.conf), and
 * the MR is imported here; the program's QPs use its keys unchanged.
 * Whatever odpd cannot serve goes to the real function, with a line on
 * stderr naming the reason (each reason once per process; every time with
 * ODPD_PRELOAD_LOG=all), or fails with ODPD_PRELOAD_STRICT=1 (errno, and
 * odpd_errmsg() says why).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <search.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "libodpd-private.h"
#include "preload.h"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define PUBLIC __attribute__((visibility("default")))

/* libodpd's odpd_errmsg(), as built into this library (meson.build renames it) */
const char *odpd_preload_embedded_errmsg(void);

/* The last interposed call of this thread failed, and odpd_errmsg() says why. */
static _Thread_local bool failed_here;

/*
 * odpd_errmsg(): why this thread's last registration through the preload
 * failed (--strict), else what a libodpd the program links itself says.
 */
PUBLIC const char *odpd_errmsg(void)
{
	static const char *(*next)(void);
	static bool looked;

	if (failed_here)
		return odpd_preload_embedded_errmsg();
	if (!looked) {
		next = (const char *(*)(void))dlsym(RTLD_NEXT, "odpd_errmsg");
		looked = true;
	}
	return next ? next() : "";
}

/* ---------------------------------------------------------------- the real calls */

typedef struct ibv_mr *(*reg_mr_fn)(struct ibv_pd *, void *, size_t, int);
typedef struct ibv_mr *(*reg_mr_iova_fn)(struct ibv_pd *, void *, size_t, uint64_t, int);
typedef struct ibv_mr *(*reg_mr_iova2_fn)(struct ibv_pd *, void *, size_t, uint64_t, unsigned);
typedef int (*dereg_mr_fn)(struct ibv_mr *);
typedef int (*rereg_mr_fn)(struct ibv_mr *, int, struct ibv_pd *, void *, size_t, int);
/* rdma-core 65 and later (IBVERBS_1.17): a buffer of ibv_alloc_buf(), opaque here */
struct ibv_buf;
typedef struct ibv_mr *(*reg_buf_mr_fn)(struct ibv_pd *, struct ibv_buf *, void *, size_t, int);

static struct {
	reg_mr_fn reg_mr;
	reg_mr_iova_fn reg_mr_iova;
	reg_mr_iova2_fn reg_mr_iova2;
	dereg_mr_fn dereg_mr;
	rereg_mr_fn rereg_mr;
	reg_buf_mr_fn reg_buf_mr;
} real;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void *real_sym(const char *name, const char *version)
{
	void *f = dlvsym(RTLD_NEXT, name, version);

	return f ? f : dlsym(RTLD_NEXT, name);
}

static void real_resolve(void)
{
	real.reg_mr = (reg_mr_fn)real_sym("ibv_reg_mr", "IBVERBS_1.1");
	real.reg_mr_iova = (reg_mr_iova_fn)real_sym("ibv_reg_mr_iova", "IBVERBS_1.7");
	real.reg_mr_iova2 = (reg_mr_iova2_fn)real_sym("ibv_reg_mr_iova2", "IBVERBS_1.8");
	real.dereg_mr = (dereg_mr_fn)real_sym("ibv_dereg_mr", "IBVERBS_1.1");
	real.rereg_mr = (rereg_mr_fn)real_sym("ibv_rereg_mr", "IBVERBS_1.1");
	real.reg_buf_mr = (reg_buf_mr_fn)dlvsym(RTLD_NEXT, "ibv_reg_buf_mr", "IBVERBS_1.17");
}

/*
 * Set while this thread is inside a real verbs call, which may itself call
 * one of the interposed symbols (libibverbs' ibv_reg_mr calls
 * ibv_reg_mr_iova2): those go straight to the real function.
 */
static _Thread_local int in_real;

enum call { CALL_REG, CALL_REG_IOVA, CALL_REG_IOVA2, CALL_REG_BUF };

/* the ibv_buf of a CALL_REG_BUF, passed beside the common arguments */
static _Thread_local struct ibv_buf *call_buf;

static struct ibv_mr *call_real(enum call how, struct ibv_pd *pd, void *addr, size_t length,
				uint64_t iova, unsigned access)
{
	struct ibv_mr *mr = NULL;
	int e;

	pthread_once(&real_once, real_resolve);
	in_real++;
	switch (how) {
	case CALL_REG:
		mr = real.reg_mr ? real.reg_mr(pd, addr, length, (int)access) : NULL;
		break;
	case CALL_REG_IOVA:
		mr = real.reg_mr_iova ? real.reg_mr_iova(pd, addr, length, iova, (int)access) : NULL;
		break;
	case CALL_REG_IOVA2:
		mr = real.reg_mr_iova2 ? real.reg_mr_iova2(pd, addr, length, iova, access) : NULL;
		break;
	case CALL_REG_BUF:
		mr = real.reg_buf_mr ? real.reg_buf_mr(pd, call_buf, addr, length, (int)access) : NULL;
		break;
	}

	e = errno;
	in_real--;
	errno = e;
	return mr;
}

/* ---------------------------------------------------------------- settings */

static struct {
	pthread_once_t once;
	bool off;                       /* ODPD_PRELOAD=0 */
	bool strict;                    /* ODPD_PRELOAD_STRICT=1 */
	bool log_all;                   /* ODPD_PRELOAD_LOG=all */
} cfg = { .once = PTHREAD_ONCE_INIT };

static void cfg_read(void)
{
	const char *s = getenv("ODPD_PRELOAD"), *st = getenv("ODPD_PRELOAD_STRICT"),
		   *lg = getenv("ODPD_PRELOAD_LOG");

	cfg.off = s && strcmp(s, "0") == 0;
	cfg.strict = st && *st && strcmp(st, "0") != 0;
	cfg.log_all = lg && strcmp(lg, "all") == 0;
}

/* ---------------------------------------------------------------- our MRs */

/*
 * @lock guards the set of our MRs only, and is never held across a call into
 * libodpd or libibverbs: the fork handlers take it. @attach_lock serializes
 * attaching chunks, across a round trip to odpd (whose own locks libodpd's
 * fork handlers take): a child makes it anew.
 */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t attach_lock = PTHREAD_MUTEX_INITIALIZER;

/* An MR odpd serves, in a tsearch set keyed by the struct's address. */
struct served {
	const struct ibv_mr *mr;
	unsigned access;                /* IBV_ACCESS_* it was registered with */
};
static void *ours;
static atomic_uint n_ours;

void preload_verbs_lock(void)
{
	pthread_mutex_lock(&lock);
}

void preload_verbs_unlock(void)
{
	pthread_mutex_unlock(&lock);
}

void preload_verbs_fork_child(void)
{
	pthread_mutex_unlock(&lock);
	pthread_mutex_init(&attach_lock, NULL);
}

static int served_cmp(const void *a, const void *b)
{
	const struct ibv_mr *x = ((const struct served *)a)->mr, *y = ((const struct served *)b)->mr;

	return x < y ? -1 : x > y;
}

/* Is @mr served by odpd? Its access in *@ret_access. */
static bool ours_has(const struct ibv_mr *mr, unsigned *ret_access)
{
	struct served key = { .mr = mr };
	void *n = NULL;

	if (atomic_load_explicit(&n_ours, memory_order_relaxed) == 0)
		return false;
	pthread_mutex_lock(&lock);
	n = tfind(&key, &ours, served_cmp);
	if (n && ret_access)
		*ret_access = (*(struct served **)n)->access;
	pthread_mutex_unlock(&lock);
	return n != NULL;
}

static int ours_add(const struct ibv_mr *mr, unsigned access)
{
	struct served *s = malloc(sizeof(*s));
	void *n = NULL;

	if (!s)
		return -ENOMEM;
	*s = (struct served){ .mr = mr, .access = access };
	pthread_mutex_lock(&lock);
	n = tsearch(s, &ours, served_cmp);
	if (n && *(struct served **)n == s)
		atomic_fetch_add(&n_ours, 1);
	else if (n) {
		(*(struct served **)n)->access = access;
		free(s);
	}
	pthread_mutex_unlock(&lock);
	if (!n)
		free(s);
	return n ? 0 : -ENOMEM;
}

static void ours_del(const struct ibv_mr *mr)
{
	struct served key = { .mr = mr }, *s = NULL;
	void *n;

	pthread_mutex_lock(&lock);
	n = tfind(&key, &ours, served_cmp);
	if (n) {
		s = *(struct served **)n;
		tdelete(&key, &ours, served_cmp);
		atomic_fetch_sub(&n_ours, 1);
	}
	pthread_mutex_unlock(&lock);
	free(s);
}

/* ---------------------------------------------------------------- fallback reasons */

enum reason {
	R_NO_DAEMON,                    /* odpd is not running / refused the connection */
	R_NO_IMPORT,                    /* the provider cannot import */
	R_HUGETLB,
	R_FILE,
	R_DEVICE,
	R_ANON,                         /* anonymous, but not in a chunk */
	R_ODP,
	R_ACCESS,                       /* other access flags, or an iova odpd does not serve */
	R_REFUSED,                      /* odpd refused (quota, limits...) */
	R_COUNT
};

static atomic_bool logged[R_COUNT];

/* What kind of memory holds @addr: a line of /proc/self/maps, read for the reason only. */
static enum reason classify(const void *addr, char *path, size_t path_size)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[4096];
	enum reason r = R_ANON;

	path[0] = '\0';
	if (!f)
		return r;
	while (fgets(line, sizeof(line), f)) {
		unsigned long start, end, ino;
		int off = 0;

		if (sscanf(line, "%lx-%lx %*s %*s %*s %lu %n", &start, &end, &ino, &off) < 3)
			continue;
		if ((uintptr_t)addr < start || (uintptr_t)addr >= end)
			continue;
		snprintf(path, path_size, "%s", line + off);
		path[strcspn(path, "\n")] = '\0';
		if (strstr(path, "anon_hugepage") || strncmp(path, "/dev/hugepages", 14) == 0 ||
		    strstr(path, "hugetlb"))
			r = R_HUGETLB;
		else if (strncmp(path, "/dev/", 5) == 0)
			r = R_DEVICE;
		else if (ino != 0)
			r = R_FILE;
		break;
	}
	fclose(f);
	return r;
}

/* ---------------------------------------------------------------- serving through odpd */

/* The chunk's segment on @c, attached on first use. Caller holds @attach_lock. */
static int chunk_segment(const char *what, struct odpd_conn *c, struct preload_chunk *k)
{
	struct odpd_segment *seg;

	if (k->seg && k->seg_conn == c)
		return 0;
	if (!preload_chunk_fd_ok(k))
		return errmsg_set(-EBADF, "%s: the program closed the preload's segment fd %d", what,
				  k->fd);
	seg = odpd_attach(c, k->fd, (void *)k->base, k->length);
	if (!seg)
		return -errno;
	k->seg = seg;
	k->seg_conn = c;
	return 0;
}

/*
 * Register through odpd: 0 with *@ret, or a negative errno with the
 * message set and *@why the reason to log.
 */
static int serve(const char *what, struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
		 unsigned access, struct ibv_mr **ret, enum reason *why)
{
	const unsigned served = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
				IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
	struct preload_chunk *k;
	struct odpd_conn *c;
	char path[256];
	int r;

	if (access & IBV_ACCESS_ON_DEMAND) {
		*why = R_ODP;
		return errmsg_set(-EOPNOTSUPP, "%s: the access asks for ODP (IBV_ACCESS_ON_DEMAND), "
				  "which odpd-run does not serve", what);
	}
	/* Relaxed ordering is optional: a provider may ignore it (ibv_reg_mr(3)). */
	access &= ~(unsigned)IBV_ACCESS_RELAXED_ORDERING;
	if (access & ~served) {
		*why = R_ACCESS;
		return errmsg_set(-EOPNOTSUPP, "%s: access flags 0x%x are not ones odpd serves "
				  "(LOCAL_WRITE, REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC)", what,
				  access & ~served);
	}
	if (iova != (uintptr_t)addr) {
		*why = R_ACCESS;
		return errmsg_set(-EOPNOTSUPP, "%s: iova 0x%llx is not the address %p: odpd registers "
				  "with iova = address", what, (unsigned long long)iova, addr);
	}
	k = preload_alloc_on() ? preload_chunk_find((uintptr_t)addr, length) : NULL;
	if (!k) {
		*why = classify(addr, path, sizeof(path));
		switch (*why) {
		case R_HUGETLB:
			return errmsg_set(-EOPNOTSUPP, "%s: [%p, +%zu) is hugetlbfs memory (%s), which "
					  "odpd cannot map from here", what, addr, length, path);
		case R_DEVICE:
			return errmsg_set(-EOPNOTSUPP, "%s: [%p, +%zu) is device memory (%s)", what,
					  addr, length, path);
		case R_FILE:
			return errmsg_set(-EOPNOTSUPP, "%s: [%p, +%zu) is a file mapping (%s)", what,
					  addr, length, path);
		default:
			return errmsg_set(-EOPNOTSUPP, "%s: [%p, +%zu) is not in a segment: memory "
					  "allocated before the preload, on the stack or in a "
					  "smaller allocation than ODPD_PRELOAD_MIN_SIZE (%zu bytes)",
					  what, addr, length, preload_min_size());
		}
	}
	r = conn_default(&c);
	if (r < 0) {
		*why = R_NO_DAEMON;
		return r;
	}
	pthread_mutex_lock(&attach_lock);
	r = chunk_segment(what, c, k);
	pthread_mutex_unlock(&attach_lock);
	if (r >= 0)
		r = mirror_reg_pd(what, pd, addr, length, access, ret);
	if (r >= 0) {
		r = ours_add(*ret, access);
		if (r < 0) {
			mirror_dereg(what, *ret);
			r = errmsg_set(-ENOMEM, "%s: %m", what);
		}
	}
	if (r < 0)
		*why = r == -EOPNOTSUPP ? R_NO_IMPORT : r == -ENOTCONN ? R_NO_DAEMON : R_REFUSED;
	return r;
}

static struct ibv_mr *reg_common(enum call how, const char *what, struct ibv_pd *pd, void *addr,
				 size_t length, uint64_t iova, unsigned access)
{
	struct ibv_mr *mr = NULL;
	enum reason why = R_REFUSED;
	int r;

	pthread_once(&cfg.once, cfg_read);
	if (in_real || cfg.off)
		return call_real(how, pd, addr, length, iova, access);
	errmsg_clear();
	failed_here = false;
	if (!pd || !addr || !length)    /* the real call's errno for those */
		return call_real(how, pd, addr, length, iova, access);
	r = serve(what, pd, addr, length, iova, access, &mr, &why);
	if (r >= 0)
		return mr;
	const char *pre = why == R_NO_DAEMON ? "odpd is not reachable: " : "";

	if (cfg.strict) {
		preload_log("%s%s (strict: failed with %s)", pre, odpd_preload_embedded_errmsg(),
			    strerror(-r));
		failed_here = true;
		errno = -r;
		return NULL;
	}
	if (cfg.log_all || !atomic_exchange(&logged[why], true))
		preload_log("%s%s; so the program registers it itself (its memlock limit applies)",
			    pre, odpd_preload_embedded_errmsg());
	return call_real(how, pd, addr, length, iova, access);
}

PUBLIC struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return reg_common(CALL_REG, "ibv_reg_mr", pd, addr, length, (uintptr_t)addr,
			  (unsigned)access);
}

PUBLIC struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
				      int access)
{
	return reg_common(CALL_REG_IOVA, "ibv_reg_mr_iova", pd, addr, length, iova,
			  (unsigned)access);
}

PUBLIC struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
				       unsigned int access)
{
	return reg_common(CALL_REG_IOVA2, "ibv_reg_mr_iova2", pd, addr, length, iova, access);
}

/*
 * rdma-core 65's ibv_alloc_buf() takes ordinary memory with posix_memalign
 * (alloc.c's, so a large one is in a chunk), and ibv_reg_buf_mr "behaves like
 * ibv_reg_mr()" for it (ibv_alloc_buf(3)): a buffer in a chunk is served
 * like one. Anything else (a DMA-buf backed buffer) goes to the real call.
 */
PUBLIC struct ibv_mr *ibv_reg_buf_mr(struct ibv_pd *pd, struct ibv_buf *buf, void *addr,
				     size_t length, int access);
PUBLIC struct ibv_mr *ibv_reg_buf_mr(struct ibv_pd *pd, struct ibv_buf *buf, void *addr,
				     size_t length, int access)
{
	struct ibv_mr *mr;

	pthread_once(&real_once, real_resolve);
	if (!preload_chunk_find((uintptr_t)addr, length)) {
		call_buf = buf;
		mr = call_real(CALL_REG_BUF, pd, addr, length, (uintptr_t)addr, (unsigned)access);
		call_buf = NULL;
		return mr;
	}
	call_buf = buf;
	mr = reg_common(CALL_REG_BUF, "ibv_reg_buf_mr", pd, addr, length, (uintptr_t)addr,
			(unsigned)access);
	call_buf = NULL;
	return mr;
}

PUBLIC int ibv_dereg_mr(struct ibv_mr *mr)
{
	int r;

	pthread_once(&real_once, real_resolve);
	if (in_real || !ours_has(mr, NULL)) {
		in_real++;
		r = real.dereg_mr ? real.dereg_mr(mr) : ENOSYS;
		in_real--;
		return r;
	}
	errmsg_clear();
	r = mirror_dereg("ibv_dereg_mr", mr);
	if (r == -ENOTCONN && mirror_forget(mr) == 0) {
		/* odpd is gone and has let go of it: the MR is this process's to destroy */
		ours_del(mr);
		in_real++;
		r = real.dereg_mr ? real.dereg_mr(mr) : ENOSYS;
		in_real--;
		return r;
	}
	if (r < 0) {
		preload_log("%s", odpd_preload_embedded_errmsg());
		failed_here = true;
		return -r;
	}
	ours_del(mr);
	return 0;
}

/* A rereg's new MR that could not take the old one's place: deregistered, by
 * odpd or, if odpd cannot, in the program's own context. */
static void drop_fresh(struct ibv_mr *fresh)
{
	int e = errno;

	if (mirror_dereg("ibv_rereg_mr", fresh) < 0 && mirror_forget(fresh) == 0) {
		in_real++;
		if (real.dereg_mr)
			real.dereg_mr(fresh);
		in_real--;
	}
	errno = e;
}

/*
 * ibv_rereg_mr of an MR odpd serves: register the new translation, PD or
 * access through odpd, then let it take the old MR's place in the caller's
 * struct (keys change, as they may with the kernel's rereg). An MR odpd
 * cannot re-register stays as it was: IBV_REREG_MR_ERR_INPUT, with errno.
 */
PUBLIC int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length,
			int access)
{
	const char *what = "ibv_rereg_mr";
	struct ibv_mr *fresh = NULL;
	enum reason why;
	void *a;
	size_t len;
	struct ibv_pd *p;
	unsigned acc = 0;
	int r;

	pthread_once(&real_once, real_resolve);
	if (in_real || !ours_has(mr, &acc)) {
		in_real++;
		r = real.rereg_mr ? real.rereg_mr(mr, flags, pd, addr, length, access) : ENOSYS;
		in_real--;
		return r;
	}
	errmsg_clear();
	if (flags & ~(IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD |
		      IBV_REREG_MR_CHANGE_ACCESS)) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	p = flags & IBV_REREG_MR_CHANGE_PD ? pd : mr->pd;
	a = flags & IBV_REREG_MR_CHANGE_TRANSLATION ? addr : mr->addr;
	len = flags & IBV_REREG_MR_CHANGE_TRANSLATION ? length : mr->length;
	if (flags & IBV_REREG_MR_CHANGE_ACCESS)
		acc = (unsigned)access;
	r = serve(what, p, a, len, (uintptr_t)a, acc, &fresh, &why);
	if (r >= 0) {
		ours_del(fresh);
		r = mirror_swap(what, mr, fresh);
		if (r < 0)
			drop_fresh(fresh);
		else
			ours_add(mr, acc);      /* the entry exists: only its access changes */
	}
	if (r < 0) {
		preload_log("%s", odpd_preload_embedded_errmsg());
		failed_here = true;
		errno = -r;
		return IBV_REREG_MR_ERR_INPUT;
	}
	return 0;
}
