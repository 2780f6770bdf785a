/* SPDX-License-Identifier: MIT */
/*
 * libodpd - register memory through the odpd daemon.
 *
 * Conventions (as librdmacm): calls that return int return 0 on success and
 * -1 with errno set on failure; calls that return a pointer return NULL with
 * errno set. After any failure odpd_errmsg() gives a human-readable reason
 * (the daemon's message when the daemon refused). A NULL connection, segment
 * or MR argument is EINVAL. Any call that talks to the daemon can also fail
 * with EIO (a reply the library cannot read) and ENOTCONN (the daemon closed
 * the connection). Lengths and offsets are in bytes. Access flags are the
 * IBV_ACCESS_* values of <infiniband/verbs.h>.
 *
 * Memory must live in a segment: a memfd sealed against shrinking and growing
 * (F_SEAL_SHRINK | F_SEAL_GROW) that the daemon maps too. odpd_alloc() makes
 * one; odpd_attach() hands over one you made. An address outside every
 * segment of the connection is EINVAL.
 *
 * Threads: a connection may be used from several threads; calls on it are
 * serialized. Fork: the connection socket is close-on-exec, and in a child
 * after fork() every connection inherited from the parent is closed by the
 * library; calls on it fail with ENOTCONN and touch nothing of the parent's.
 *
 * Man pages: libodpd(3) and one page per call.
 */
#ifndef ODPD_H
#define ODPD_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

struct rdma_cm_id;

/*
 * The library interface version, which the package's version carries
 * (odpd MAJOR.MINOR.PATCH, pkg-config libodpd, libodpd.so.1.MINOR.PATCH:
 * libodpd(3), VERSIONS):
 * 1.0  connections, segments, odpd_reg(), odpd_verify(), odpd_query_device(),
 *      the rdma_cm mirror (odpd_reg_msgs() ..., odpd_default_conn()) (ODPD_1.0);
 * 1.1  odpd_reg_attr(), odpd_dereg_relaxed(), odpd_flush_relaxed(),
 *      odpd_join_pd(), the generation and cache_hit fields of struct
 *      odpd_mr (ODPD_1.1; the 1.0 calls stay at ODPD_1.0);
 * 1.2  odpd_import_pd(), odpd_advise_mr(), ODPD_REG_PREFETCH (ODPD_1.2);
 * 1.3  the process-local cache: odpd_stats() and struct odpd_stats
 *      (ODPD_1.3);
 * 1.4  segment pre-fault policies: odpd_populate(), ODPD_ALLOC_POPULATE,
 *      ODPD_ALLOC_NO_POPULATE, ODPD_REG_NO_POPULATE (ODPD_1.4).
 * Structs a call fills through a size argument only grow at their end; the
 * calls accept any size from the struct's first version up
 * (ODPD_DEVICE_ATTR_SIZE_1_0, ODPD_STATS_SIZE_1_3).
 */
#define ODPD_VERSION_MAJOR 1
#define ODPD_VERSION_MINOR 4

/* Environment variable naming the daemon's socket; default below. */
#define ODPD_SOCKET_ENV "ODPD_SOCKET"
#define ODPD_SOCKET_DEFAULT "/run/odpd/odpd.sock"

struct odpd_conn;
struct odpd_segment;

/*
 * Thread-local text of the last failure of a libodpd call in this thread,
 * "what failed: reason", or "" if none. Every call that can fail resets it
 * to "" on entry. Valid until the next libodpd call in the same thread.
 */
const char *odpd_errmsg(void);

/*
 * Connect to the daemon at @socket_path (NULL: $ODPD_SOCKET, else
 * ODPD_SOCKET_DEFAULT; set-user-ID and set-group-ID programs ignore the
 * environment) and negotiate the protocol version (Hello).
 * @device names the RDMA device this connection registers on (NULL: the
 * daemon's first device).
 * Errors: ENOENT / ECONNREFUSED (no daemon at the path), EACCES (socket
 * permissions), EINVAL (empty path, or longer than sun_path),
 * EPROTONOSUPPORT (the daemon speaks no version of ours), ENODEV (@device
 * is not one of the daemon's devices), ENOMEM, EIO (malformed reply), and
 * the errors of socket(2) and connect(2).
 */
struct odpd_conn *odpd_connect(const char *socket_path, const char *device);

/*
 * Close the connection. The daemon then deregisters every MR and detaches
 * every segment the connection still held. Memory the library mapped
 * (odpd_alloc(), odpd_attach() with @addr NULL) is unmapped, the memfds of
 * odpd_alloc() are closed, and every struct odpd_mr and struct odpd_segment
 * of the connection is freed. Accepts NULL; does nothing on
 * odpd_default_conn().
 */
void odpd_disconnect(struct odpd_conn *conn);

enum odpd_support {
	ODPD_SUPPORT_UNKNOWN = 0,   /* not probed (e.g. advise_mr without ODP) */
	ODPD_SUPPORT_YES = 1,
	ODPD_SUPPORT_NO = 2,        /* the verb failed; see the matching *_errno */
};

/* One RDMA device of the daemon, as the daemon probed it at start. */
struct odpd_device_attr {
	char name[64];                 /* ibv_get_device_name() */
	char transport[16];            /* "InfiniBand", "RoCE", "iWARP", ... */
	char fw_ver[64];
	uint64_t node_guid;            /* host byte order */
	uint32_t phys_port_cnt;
	uint64_t max_mr_size;          /* bytes */
	uint64_t odp_general_caps;     /* IBV_ODP_SUPPORT, IBV_ODP_SUPPORT_IMPLICIT */
	uint32_t odp_rc_caps;          /* IBV_ODP_SUPPORT_SEND | _RECV | _WRITE | ... */
	uint32_t odp_uc_caps;
	uint32_t odp_ud_caps;
	int odp;                       /* explicit ODP MRs possible */
	int implicit_odp;              /* implicit ODP MRs possible */
	enum odpd_support advise_mr;   /* ibv_advise_mr on an ODP MR */
	int advise_mr_errno;
	enum odpd_support import;      /* ibv_import_device on a dup'ed cmd_fd */
	int import_errno;
};

/* Number of devices the daemon reported in Hello. */
unsigned odpd_device_count(const struct odpd_conn *conn);

/* The size of struct odpd_device_attr in its first version (1.0): the end
 * of its last field then, import_errno. */
#define ODPD_DEVICE_ATTR_SIZE_1_0 \
	(offsetof(struct odpd_device_attr, import_errno) + sizeof(int))

/*
 * Copy device @index (0 .. odpd_device_count() - 1) into @attr.
 * @attr_size is sizeof(*attr) at the caller's compile time, so that the
 * struct can grow: any size from ODPD_DEVICE_ATTR_SIZE_1_0 up is accepted
 * (a program built against an older header keeps working), fields past
 * @attr_size are not written, and a larger @attr_size (a caller built
 * against a newer header) gets zeros past this struct.
 * Errors: ENODEV (@index out of range), EINVAL (@attr NULL or @attr_size
 * smaller than ODPD_DEVICE_ATTR_SIZE_1_0).
 */
int odpd_query_device(const struct odpd_conn *conn, unsigned index,
		      struct odpd_device_attr *attr, size_t attr_size);

/* odpd_alloc() flags */
#define ODPD_ALLOC_HUGETLB (1u << 0)   /* MFD_HUGETLB: default huge page size */
/* Pre-fault policy "on attach" (since 1.4): fault every page of the segment
 * in before odpd_alloc() returns, in this process (its memory cgroup pays),
 * in parallel parts as odpd_populate(); a pinned registration then only
 * pins. */
#define ODPD_ALLOC_POPULATE (1u << 1)
/* Pre-fault policy "never" (since 1.4), for sparse segments: a pinned
 * registration over this segment does not fault its range in first (as
 * ODPD_REG_NO_POPULATE on every registration): the daemon's pin faults in
 * what is missing, charged to odpd's memory cgroup. */
#define ODPD_ALLOC_NO_POPULATE (1u << 2)

/*
 * Allocate a segment of @length bytes (rounded up to the page size, or the
 * huge page size with ODPD_ALLOC_HUGETLB): a sealed memfd that the daemon
 * maps first, at an address of its window, and that the library then maps
 * in this process at the same address (MAP_FIXED_NOREPLACE), so MR iova ==
 * address on both sides. If that address is taken here, the library maps it
 * elsewhere and attaches it at that address instead (pinned MRs still work;
 * see odpd_attach()). The memory is zero-filled, readable and writable.
 * Errors: EINVAL (@length 0, unknown @flags, ODPD_ALLOC_POPULATE with
 * ODPD_ALLOC_NO_POPULATE), ENOMEM (no memory, @length too large, the
 * daemon's window is full, or with ODPD_ALLOC_POPULATE the pages do not fit
 * in the memory cgroup), EFAULT (ODPD_ALLOC_POPULATE with
 * ODPD_ALLOC_HUGETLB: not enough free huge pages), EFBIG (larger than the
 * daemon's segment limit), EMFILE (the daemon's limit of segments per
 * connection), ENOTCONN (connection lost, or inherited across fork), and
 * the errors of memfd_create(2), ftruncate(2) and mmap(2).
 */
struct odpd_segment *odpd_alloc(struct odpd_conn *conn, size_t length, unsigned flags);

/*
 * Attach a segment you made: @fd is a memfd (memfd_create with
 * MFD_ALLOW_SEALING) sealed with F_SEAL_SHRINK and F_SEAL_GROW. The library
 * sends the daemon a duplicate; @fd stays yours.
 *  - @addr == NULL: the library maps the whole file (@length must be 0),
 *    where the daemon mapped it, as odpd_alloc() does; read-only if @fd is
 *    O_RDONLY or sealed against writing. odpd_detach() unmaps it.
 *  - @addr != NULL: [@addr, @addr + @length) must lie in one MAP_SHARED
 *    mapping of @fd in this process; the file offset is read from
 *    /proc/self/maps. The daemon maps the file at the same address where
 *    that is free in the daemon (iova == address for every MR kind);
 *    otherwise pinned MRs use an iova different from the daemon's address
 *    and ODP MRs over the segment are refused.
 * Errors: EINVAL (not a sealable memfd, seals missing, empty file, @addr
 * NULL with @length not 0, @length 0 with @addr, @addr not page aligned,
 * the range is not one MAP_SHARED mapping of @fd or runs past the end of
 * the file - MAP_PRIVATE is refused because the HCA would never see this
 * process's writes), EEXIST (the range overlaps a segment of this
 * connection), EFBIG (file larger than the daemon's limit), EMFILE (the
 * daemon's limit of segments per connection), EACCES (@fd is write-only),
 * EBADF (@fd not open), ESRCH (the daemon could not read this process's
 * /proc/PID/maps, or the process is exiting), ENOMEM, ENOTCONN, and the
 * errors of mmap(2). For a hugetlb memfd "page aligned" means aligned to
 * its huge page size.
 */
struct odpd_segment *odpd_attach(struct odpd_conn *conn, int fd, void *addr, size_t length);

/*
 * Pre-fault policy "on hint" (since 1.4): fault the pages of [@addr, @addr +
 * @length) (rounded out to pages; inside @seg) in now, in this process, so
 * that the pinned registrations of that range that follow only pin (their
 * own fault pass then finds every page resident and skips it, see
 * odpd_reg()). madvise(2) MADV_POPULATE_WRITE (MADV_POPULATE_READ where the
 * segment is mapped read-only) - in parallel parts of at least 8 MiB on up
 * to as many threads as the CPUs in the calling thread's affinity mask (at
 * most 8; environment ODPD_POPULATE_THREADS=N sets N, 1 never splits), which the
 * call starts and joins, with every signal blocked on them. Pages already
 * resident are not walked again. Then one request (MapSegment) has odpd map
 * its own view of the range on a worker; meanwhile other threads' calls on
 * the connection wait. Blocks until done; do not detach @seg meanwhile. A
 * kernel before 5.14 (no MADV_POPULATE_*) makes the faulting a no-op.
 * Errors: EINVAL (@seg NULL, @length 0, the range not inside @seg), ENOMEM
 * (out of memory or over the memory cgroup's limit), EFAULT (no memory
 * behind the mapping, e.g. no free huge pages), EHWPOISON. The daemon's
 * answer is not an error of the call (an older daemon does not know the
 * request; a lost connection changes nothing here).
 */
int odpd_populate(struct odpd_segment *seg, void *addr, size_t length);

/* Address of the segment's first byte in this process. */
void *odpd_segment_addr(const struct odpd_segment *seg);
/* Length of the segment in bytes. */
size_t odpd_segment_length(const struct odpd_segment *seg);
/* The segment's memfd: the library's own for odpd_alloc(), else the caller's. */
int odpd_segment_fd(const struct odpd_segment *seg);

/*
 * Detach a segment. Where the library mapped it (odpd_alloc(), odpd_attach()
 * with @addr NULL) it also unmaps the memory; for odpd_alloc() it closes the
 * memfd. On failure @seg stays attached and valid.
 * Errors: EBUSY (MRs over the segment are still registered, through
 * odpd_reg() or the mirror: deregister them first; MRs released with
 * odpd_dereg_relaxed() do not count, odpd keeps the file mapped and pinned
 * until they are invalidated), ENOTCONN.
 */
int odpd_detach(struct odpd_segment *seg);

/*
 * Use the named shared PD instead of the connection's private one: every
 * later registration of @conn goes into that PD. Only before the
 * connection's first registration (odpd_reg(), odpd_reg_attr()). The first
 * join of a name creates the PD. @name is 1 to 63 bytes of
 * [A-Za-z0-9._:@-]. The members of a shared PD share its device context,
 * its MRs and their keys: shared PDs are for processes that trust each
 * other. Members that register the same range of the same segment (one
 * memfd, each member's odpd_attach() of it), mapped at the same address
 * (as odpd_attach() with @addr NULL maps it: where the daemon did), get
 * the same MR - same lkey and rkey: one ibv_reg_mr(3), one pin, several
 * holders - unless it has remote access (see the registration cache at
 * odpd_reg()). Who may create or join is
 * the daemon's policy: the [pd PATTERN] sections of odpd.conf(5); where
 * none matches the name, only the uid that created the PD may join.
 * Errors: EINVAL (@conn or @name NULL, @name empty or longer than 63 bytes
 * - checked before anything is sent - or, from the daemon, a character
 * outside that set), EPERM (the daemon's policy refused: odpd_errmsg()
 * names the rule), EBUSY (the connection has already registered an MR),
 * EALREADY (the connection has already joined a PD), ENOMEM (in the
 * daemon), EOPNOTSUPP (an odpd older than shared PDs), ENOTCONN. The PD's device context and PD are made on its first
 * registration: their errors are odpd_reg()'s.
 */
int odpd_join_pd(struct odpd_conn *conn, const char *name);

/*
 * An MR registered by the daemon in the connection's PD. The library owns
 * it; fields are read-only. New fields are only ever appended.
 */
struct odpd_mr {
	void *addr;          /* first byte, in this process */
	size_t length;       /* bytes */
	uint64_t iova;       /* == (uintptr_t)addr */
	uint32_t lkey;
	uint32_t rkey;
	unsigned int access; /* IBV_ACCESS_* granted (a cache hit may grant more) */
	uint64_t handle;     /* the daemon's handle for the MR */
	/* since 1.1: filled by libodpd 1.1 and later only (see libodpd(3)) */
	uint64_t generation; /* the daemon's; changes whenever the MR is invalidated */
	int cache_hit;       /* 1: served by an MR already registered; 0: a new one */
	/* since 1.2: ODPD_REG_PREFETCH on a new MR: 0, or the errno ibv_advise_mr
	 * failed with (the MR is registered and usable; its pages are not mapped) */
	int prefetch_errno;
};

/*
 * Register [@addr, @addr + @length) (a range of one segment) with @access, a
 * mask of IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_READ,
 * IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_ATOMIC and IBV_ACCESS_ON_DEMAND.
 * The daemon calls ibv_reg_mr(3) (ibv_reg_mr_iova when its mapping of the
 * segment lies at another address) with iova = @addr, over the range
 * rounded out to whole pages.
 *
 * Before asking for a pinned MR (no IBV_ACCESS_ON_DEMAND), the library
 * faults the page-rounded range in this process (madvise(2)
 * MADV_POPULATE_WRITE on a writable mapping, MADV_POPULATE_READ on a
 * read-only one), so that the pages are allocated by, and charged to the
 * memory cgroup of, this process rather than odpd. A kernel without it
 * (before 5.14) is not an error. Pages faulted in stay in the segment even
 * when the daemon then refuses the registration.
 *
 * Registration cache: a registration is served from the registration cache
 * when a live or relaxed MR of the connection's PD over the same segment,
 * mapped at the same address, covers the page-rounded range with at least
 * the requested access (struct odpd_mr.cache_hit is then 1, and access may
 * hold more than was asked); an MR with remote access (REMOTE_READ, _WRITE
 * or _ATOMIC) is served again only to the connection that registered it,
 * for the same page-rounded range. A pinned MR is not served after the
 * segment's pages were replaced (FALLOC_FL_PUNCH_HOLE, MADV_REMOVE; odpd
 * notices it, see odpd(8)); a new MR is registered instead. Each
 * registration is a reference: release it with odpd_dereg() or
 * odpd_dereg_relaxed().
 *
 * The process's own cache (since 1.3): a registration that an MR this
 * connection holds - or released with odpd_dereg_relaxed() and the library
 * still keeps - would serve by the rules above is answered in this process
 * without a system call (a local hit: cache_hit 1, counted in odpd_stats()),
 * if the daemon still vouches for that MR: the daemon shares a read-only
 * table with the library in which it marks an MR invalid (its device went
 * away, a punched hole it found) or a kept reference taken back, before
 * anything else happens to it. A hole punched under a pinned MR the
 * library may serve is found by the daemon within hole-check-ms
 * (odpd.conf(5), 100 by default) or at once by odpd_flush_relaxed(); until
 * then a local hit may still return the old MR, so flush between
 * replacing pages and registering them again, or use ODPD_REG_NO_CACHE.
 * The library keeps at most ODPD_CACHE_MAX_MRS (default 256) MRs and
 * ODPD_CACHE_MAX_BYTES (default 256 MiB) released relaxed; the daemon
 * takes back any it keeps unused for a relaxed window. Set ODPD_CACHE=0
 * in the environment before odpd_connect() to ask the daemon every time.
 * When odpd restarts and keeps the connection (odpd(8), RESTART; also
 * after a crash under systemd, when a call waiting for its reply is sent
 * again by the library), the
 * library starts its cache over at its next call (since 1.4.2): what it kept
 * unused is in odpd's cache, and the first registration of a range goes to
 * odpd, which answers it from there with the same keys.
 * Not for NO_CACHE or PREFETCH registrations, implicit ODP, or the
 * librdmacm mirror.
 *
 * Pinned bytes are counted per user (the uid of the connection), as
 * distinct pages, against the user's pinning quota: by default the
 * RLIMIT_MEMLOCK of the registering process, raised or lowered by the
 * [user], [group] and [cgroup] rules of odpd.conf(5).
 *
 * Errors: EINVAL (@conn NULL, @length 0, @addr + @length overflows, range
 * not inside one segment, unknown access bits, IBV_ACCESS_REMOTE_WRITE or
 * _ATOMIC without IBV_ACCESS_LOCAL_WRITE; IBV_ACCESS_ON_DEMAND over a
 * segment odpd mapped at another address: use odpd_alloc() or odpd_attach()
 * with addr NULL), EACCES (write access on a segment sealed or opened
 * read-only), EOPNOTSUPP (IBV_ACCESS_ON_DEMAND on a device without ODP or
 * without the RC ODP caps the access needs; implicit ODP - @addr NULL,
 * @length SIZE_MAX - on a device without IBV_ODP_SUPPORT_IMPLICIT, and in
 * this version on every device, see odpd_reg(3)), ENODEV (the daemon has no
 * device, the device was removed, or - once - the first call after the
 * daemon said a device this connection used went away: its MRs there are
 * dead, odpd_dereg() them), EDQUOT (over the user's pinning quota even after odpd
 * deregistered that user's relaxed MRs to make room, or the daemon's limit
 * of 65536 MRs per connection), ENOMEM (out of memory here or in the
 * daemon; over the daemon's own limit of pinned bytes or of MRs -
 * max-pinned, max-mrs in odpd.conf(5) - even after it invalidated relaxed
 * MRs to make room; or faulting the range in failed: over this process's
 * memory cgroup limit, or part of the range is no longer mapped), EFAULT and EHWPOISON (faulting the range in hit a
 * SIGBUS, e.g. no huge page left, or a page with a memory error), the
 * errors of ibv_open_device(3)/ibv_alloc_pd(3) on the first registration
 * (the connection's context and PD are made then), the other errors of
 * ibv_reg_mr(3) as the daemon saw them, ENOTCONN.
 */
struct odpd_mr *odpd_reg(struct odpd_conn *conn, void *addr, size_t length, unsigned int access);

/* Which fields of struct odpd_reg_attr are set. */
enum odpd_reg_attr_mask {
	ODPD_REG_ATTR_ACCESS = 1 << 0,  /* access */
	ODPD_REG_ATTR_FLAGS = 1 << 1,   /* flags */
};

/* struct odpd_reg_attr.flags */
enum odpd_reg_flags {
	/* A fresh MR: no cache lookup, and never served to another registration. */
	ODPD_REG_NO_CACHE = 1 << 0,
	/* Do not fault the range in this process first (see odpd_reg()). */
	ODPD_REG_NO_POPULATE = 1 << 1,
	/* ODP MRs (IBV_ACCESS_ON_DEMAND): map the whole range before returning
	 * (ibv_advise_mr PREFETCH_WRITE with local write, else PREFETCH, with
	 * IBV_ADVISE_MR_FLAG_FLUSH) when the MR is newly registered; a cache
	 * hit is not prefetched again (use odpd_advise_mr()). The registration
	 * does not fail when the kernel refuses the prefetch: the MR comes back
	 * with that errno in prefetch_errno (and odpd counts it). EOPNOTSUPP up
	 * front where the provider has no advise_mr. Since 1.2. */
	ODPD_REG_PREFETCH = 1 << 2,
};

/*
 * What odpd_reg_attr() registers with, as rdma-core's *_attr structs: the
 * library reads only the fields that comp_mask names (a field left out is
 * 0), so the struct may grow at its end and a caller built against an
 * older header never has its bytes past its own struct read.
 */
struct odpd_reg_attr {
	uint32_t comp_mask;     /* bit mask of enum odpd_reg_attr_mask */
	unsigned int access;    /* IBV_ACCESS_*, as odpd_reg() */
	uint32_t flags;         /* bit mask of enum odpd_reg_flags */
};

/*
 * odpd_reg() with attributes: access (ODPD_REG_ATTR_ACCESS) and flags
 * (ODPD_REG_ATTR_FLAGS). @attr NULL is odpd_reg() with access 0;
 * odpd_reg(conn, addr, length, access) is odpd_reg_attr() with comp_mask
 * ODPD_REG_ATTR_ACCESS. ODPD_REG_NO_CACHE asks the daemon for a fresh MR
 * (RegMr flag REG_NO_CACHE): never a cache hit, never shared, never served
 * again. ODPD_REG_NO_POPULATE skips faulting the range in before a pinned
 * registration (the daemon's ibv_reg_mr then faults in what is missing,
 * and those pages are charged to odpd's memory cgroup).
 * Errors: those of odpd_reg(), and EINVAL for bits of comp_mask or of flags
 * that this library does not know (as ibv_create_cq_ex(3) for comp_mask),
 * before anything is sent.
 */
struct odpd_mr *odpd_reg_attr(struct odpd_conn *conn, void *addr, size_t length,
			      const struct odpd_reg_attr *attr);

/*
 * Release @mr's reference and free @mr. When it was the last reference to
 * the daemon's MR, the daemon deregisters it (ibv_dereg_mr(3)) before it
 * answers.
 * Errors: EINVAL (@mr NULL), ENOENT (not registered through this
 * connection), ENOMEM (in the daemon), ENOTCONN; on failure @mr stays
 * valid.
 */
int odpd_dereg(struct odpd_mr *mr);

/*
 * Release @mr's reference and free @mr, without waiting for
 * ibv_dereg_mr(3): returns at once. Since 1.3 the library keeps the last
 * reference of an MR it may serve again (see odpd_reg()) in this process,
 * unused, without a system call: up to ODPD_CACHE_MAX_MRS MRs (default 256)
 * and ODPD_CACHE_MAX_BYTES bytes (default 256 MiB) of them, environment
 * variables read at odpd_connect(); beyond that the least recently released
 * go to the daemon as below. The daemon takes back a kept reference that
 * stays unused for a whole relaxed window (relaxed-window-ms), and every
 * kept one on a flush (odpd_flush_relaxed(), odpctl flush); the library
 * gives them all back when a registration is refused for the user's limits
 * (EDQUOT, ENOSPC, ENOMEM) and asks once more, and before odpd_detach() of
 * their segment. Otherwise the MR stays registered (and is a cache
 * hit if requested again, see odpd_reg()) until its batch is invalidated:
 * when the daemon's batch window passes or its queue of relaxed MRs is full
 * (relaxed-window-ms, relaxed-max-mrs, relaxed-max-bytes in odpd.conf(5)),
 * when the daemon needs room (a user's pinning quota, its limits), by
 * odpd_flush_relaxed(), or by an administrator (odpctl(8)). Its pinned
 * bytes stay charged to the user until then.
 * Errors: those of odpd_dereg(); on failure @mr stays valid.
 */
int odpd_dereg_relaxed(struct odpd_mr *mr);

/*
 * Invalidate every relaxed MR (odpd_dereg_relaxed()) of the connection's
 * PD - of a shared PD (odpd_join_pd()), also those its other members
 * released - and return only when all are deregistered (ibv_dereg_mr(3)
 * in the daemon): a barrier. Afterwards no MR released relaxed before the
 * call is registered or served from the cache any longer. The daemon's
 * Flush request with no field set.
 * Errors: EINVAL (@conn NULL), ENOMEM (in the daemon), EOPNOTSUPP (an odpd
 * older than relaxed MRs), ENOTCONN.
 */
int odpd_flush_relaxed(struct odpd_conn *conn);

/*
 * Have the daemon read [@addr, @addr + @length) back through @mr with the
 * HCA and store a CRC-32 (zlib's crc32()) of those bytes in *@ret_crc32.
 * @addr NULL with @length 0: the whole MR. The daemon posts RDMA READ with
 * the MR's iova and rkey when @mr has IBV_ACCESS_REMOTE_READ, else RDMA
 * WRITE with the MR's lkey as the source, over its own loopback RC QP pair
 * on the connection's PD, through a bounded bounce buffer.
 * Errors: EINVAL (range outside @mr, only one of @addr and @length given,
 * @ret_crc32 NULL), ENOENT (@mr not registered), EIO (a work completion
 * failed - odpd_errmsg() names its status - or polling the CQ failed),
 * ETIMEDOUT (no completion within 10 s), ENETDOWN (port 1 not active, or
 * no usable GID), EBUSY (65,535 verifies through the MR already in flight,
 * from all its holders), ENOMEM, the errors of the verbs that set the QP pair up
 * (ibv_create_cq/_qp, ibv_modify_qp, ibv_reg_mr of the bounce buffer) and
 * of ibv_post_send, ENOTCONN.
 */
int odpd_verify(struct odpd_mr *mr, void *addr, size_t length, uint32_t *ret_crc32);

/*
 * Prefetch ranges of ODP MRs of @conn: ibv_advise_mr(3) in the daemon, on the
 * PD the MRs live in. @advice: IBV_ADVISE_MR_ADVICE_PREFETCH,
 * _PREFETCH_WRITE or _PREFETCH_NO_FAULT; @flags: 0 or
 * IBV_ADVISE_MR_FLAG_FLUSH. @sg_list: @num_sge (1 to 64) ranges, each with
 * addr and length (bytes) inside the ODP MR (odpd_reg() with
 * IBV_ACCESS_ON_DEMAND) whose lkey it names; all in one PD. Without FLUSH
 * the call returns once the daemon accepted the request and the prefetch
 * runs on one of its workers (its failure is counted and logged there, see
 * odpctl status); with FLUSH it returns after the pages are mapped.
 * Errors: EINVAL (@conn or @sg_list NULL, @num_sge 0 or above 64, unknown
 * advice or flags, an lkey that names no MR of @conn, a pinned MR - advising
 * one has oopsed rxe - a range outside its MR or of length 0, ranges in more
 * than one PD), EPERM (PREFETCH_WRITE on an MR without
 * IBV_ACCESS_LOCAL_WRITE), EOPNOTSUPP (the device's provider has no
 * advise_mr, e.g. rxe before rdma-core 58; odpctl status shows it), with
 * FLUSH the errors of ibv_advise_mr(3) (EFAULT, ...), ENOMEM, EIO, ENOTCONN.
 */
int odpd_advise_mr(struct odpd_conn *conn, enum ibv_advise_mr_advice advice, uint32_t flags,
		   struct ibv_sge *sg_list, uint32_t num_sge);

/*
 * Daemon-PD mode for applications: the PD that @conn's registrations live in
 * (its private PD on the connection's device, or the shared PD it joined
 * with odpd_join_pd()), imported into this process. The daemon sends a dup
 * of that PD's device context's cmd_fd and the PD's handle; the library
 * imports them with ibv_import_device(3) and ibv_import_pd(3), once per
 * connection: later calls return the same PD. Make your CQs and QPs with the
 * returned PD (and its ->context) and use the lkey and rkey of odpd_reg()
 * MRs of @conn in your work requests (addresses: struct odpd_mr's iova,
 * which is the address in this process).
 *
 * The PD belongs to the daemon: never ibv_dealloc_pd(3) it and never close
 * its context. odpd_disconnect() unimports it (ibv_unimport_pd(3)) and
 * closes this process's copy of the context; destroy your QPs, CQs and
 * anything else made in that context before. Whatever a process leaves
 * there (it was killed, say) is destroyed by the kernel when the daemon
 * closes the PD - for a private PD, when the connection ends - and no
 * process holds the context any more. The context holds nothing but the
 * PD's own objects (doc/design.md §4.3: whoever holds a context can use
 * any object in it): the members of a shared PD share one, so share PDs
 * only between processes that trust each other.
 *
 * Binds the connection to its PD as a registration does: odpd_join_pd()
 * afterwards fails with EBUSY. Import needs a provider that implements it
 * (mlx5 in upstream rdma-core today; Soft-RoCE (rxe) with the patch in
 * odpd's test bed, see doc/testing.md).
 *
 * Errors: EINVAL (@conn NULL), EOPNOTSUPP (the device's provider in the
 * daemon cannot import - odpd_query_device() shows it as import - or this
 * process's provider cannot: ibv_import_device(3) answered EOPNOTSUPP;
 * nothing is registered either way), ENODEV (the connection's device is
 * gone from the daemon), ENOMEM (in the daemon), the errors of
 * ibv_open_device(3) and ibv_alloc_pd(3) in the daemon (first use of the
 * PD) and of ibv_import_device(3) and ibv_import_pd(3) here, EIO, ENOTCONN.
 */
struct ibv_pd *odpd_import_pd(struct odpd_conn *conn);

/*
 * The librdmacm mirror: rdma_reg_msgs(3), rdma_reg_read(3), rdma_reg_write(3)
 * and rdma_dereg_mr(3), with the daemon doing the registration into id->pd
 * (client-PD mode). The library sends the daemon id->verbs->cmd_fd and
 * id->pd->handle; the daemon imports them (ibv_import_device(3),
 * ibv_import_pd(3)), registers, and the library imports the MR
 * (ibv_import_mr(3)). The returned MR's addr and length are @addr and
 * @length. Access: rdma_reg_msgs = IBV_ACCESS_LOCAL_WRITE; rdma_reg_read adds
 * IBV_ACCESS_REMOTE_READ; rdma_reg_write adds IBV_ACCESS_REMOTE_WRITE.
 *
 * These use the process's default connection (odpd_default_conn()); @addr
 * must lie in a segment of that connection.
 *
 * Errors: EOPNOTSUPP (the device cannot import - Soft-RoCE (rxe) and every
 * provider but mlx5 today, or import support unknown - in the daemon, or this
 * process's provider cannot (ibv_import_device on a dup of @id's cmd_fd,
 * tried once per device); checked before the registration is sent), EINVAL (NULL @id, @id->verbs, its device or
 * @id->pd, range outside every segment, or the daemon found the context's
 * fd is not a uverbs device), EACCES (read-only segment: all three ask for
 * local write), ENODEV
 * (@id's device is not one of the daemon's), EPERM (remote access not
 * granted to this user by the daemon's policy), EMFILE (the connection has
 * MRs in 16 device contexts already, the daemon's limit), the errors of
 * ibv_import_mr(3), and those of odpd_reg() and odpd_default_conn().
 * odpd_dereg_mr: ENOENT (@mr did not come from these calls), EINVAL (@mr
 * NULL), ENOTCONN; on failure @mr stays valid.
 */
struct ibv_mr *odpd_reg_msgs(struct rdma_cm_id *id, void *addr, size_t length);
struct ibv_mr *odpd_reg_read(struct rdma_cm_id *id, void *addr, size_t length);
struct ibv_mr *odpd_reg_write(struct rdma_cm_id *id, void *addr, size_t length);
int odpd_dereg_mr(struct ibv_mr *mr);

/* odpd_stats(): what this process's registration cache did on one connection. */
struct odpd_stats {
	uint64_t local_hits;     /* registrations answered in this process (no system call) */
	uint64_t daemon_hits;    /* answered from the daemon's registration cache */
	uint64_t misses;         /* the daemon registered a new MR (ibv_reg_mr) */
	uint64_t local_releases; /* odpd_dereg()/_relaxed() answered in this process */
	uint64_t revoked;        /* kept references the daemon took back (unused a whole window, flush) */
	uint64_t cached_mrs;     /* references kept unused now */
	uint64_t cached_bytes;   /* their MRs' registered bytes */
	int hit_table;           /* 1: the daemon shares its hit table (local hits possible) */
};

/* The size of struct odpd_stats in its first version (1.3): the end of its
 * last field then, hit_table. */
#define ODPD_STATS_SIZE_1_3 (offsetof(struct odpd_stats, hit_table) + sizeof(int))

/*
 * Copy the counters of @conn's registration cache into @stats. @stats_size
 * is sizeof(*stats) at the caller's compile time: the struct may grow at
 * its end, any size from ODPD_STATS_SIZE_1_3 up is accepted, fields past
 * @stats_size are not written, and a larger size gets zeros past this
 * struct. Needs no daemon.
 * The library reports local_hits to the daemon with each request (odpctl
 * stats, local_hits). Since 1.3.
 * Errors: EINVAL (@conn or @stats NULL, @stats_size smaller than
 * ODPD_STATS_SIZE_1_3).
 */
int odpd_stats(const struct odpd_conn *conn, struct odpd_stats *stats, size_t stats_size);

/*
 * The process-wide connection the mirror uses, connected on first use to
 * $ODPD_SOCKET or ODPD_SOCKET_DEFAULT with the daemon's first device. A
 * failed attempt is retried by the next call. In a child after fork() the
 * parent's default connection is dead (ENOTCONN) and the next call makes a
 * new one. Once the daemon has dropped it (a restart), the next call (of
 * this or of a mirror function) connects again and fails once with
 * ECONNRESET: what was registered through the old connection is gone (its
 * MRs' odpd_dereg_mr() fails with ENOTCONN); the call after that gets the
 * new connection. odpd_disconnect() ignores the current default connection.
 * Errors: those of odpd_connect(), and ECONNRESET.
 */
struct odpd_conn *odpd_default_conn(void);

#ifdef __cplusplus
}
#endif

#endif /* ODPD_H */
