/* SPDX-License-Identifier: MIT */
/*
 * fuzz-request: libFuzzer target for everything a client's packets reach
 * in odpd: wire decoding (recvmsg framing, fds, protobuf), request
 * validation and dispatch, segments, refusals, admin requests, and with a
 * device (the test VM) registration: pinned and ODP MRs, prefetch, the
 * registration cache, relaxed release, flush, hit tables, verify.
 *
 * One real odpd runs in this process (odpd_manager_start: its event loop,
 * its workers, the registry, a listening socket in /tmp; the RDMA devices
 * there are: none on a build host, rxe0 in the test VM). Each input is one
 * connection: Hello, then the input's packets (fuzz-input.h), each with the
 * fds its flags ask for, and the client's own writes and punched holes in
 * the memfd it sent last; the replies are read (the segment address and
 * lkey they carry feed later packets). Then the connection closes.
 * abort() (which libFuzzer reports as a crash) unless, afterwards, odpd
 * holds nothing of it: no client, segment, mapping, MR, pinned or relaxed
 * byte, charge to its user, file it was sent, or fd beyond those after the
 * first input; nothing may leak (LeakSanitizer); and a pinned MR odpd
 * served read back by Verify must give the bytes the segment holds, unless
 * a hole was punched since (see oracle()).
 *
 * Build and run: tests/fuzz/run (clang, -Dfuzz=true).
 */
#include <dirent.h>
#include <infiniband/verbs.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "fuzz-input.h"
#include "log.h"
#include "manager.h"

static struct odpd_manager m;
static void cleanup(void);

/* The sanitizers' symbolizer (a subprocess on two pipes) starts when
 * libFuzzer first names a function it reached; init() starts it, so that its
 * fds are there before check_fds() first counts. */
void __sanitizer_symbolize_pc(void *pc, const char *fmt, char *out, size_t len) __attribute__((weak));
static char sock_path[64], conf_path[64];
static bool have_client_addr;       /* FUZZ_CLIENT_ADDR is ours to map memfds at */
static bool client_mapped;          /* a memfd is mapped there now */
/* Client-PD mode: a device context and PD of the client's own (the first
 * device's; none without a device), whose cmd_fd FUZZ_FD_CMDFD sends. */
static struct ibv_context *own_ctx;
static struct ibv_pd *own_pd;

/* FUZZ_CLIENT_ADDR back to an inaccessible reservation (no memfd mapped). */
static void client_addr_reset(void)
{
	if (have_client_addr &&
	    mmap((void *)(uintptr_t)FUZZ_CLIENT_ADDR, FUZZ_MEMFD_SIZE, PROT_NONE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED)
		abort();
	client_mapped = false;
}

static void init(void)
{
	const char *lvl = getenv("ODPD_FUZZ_LOG_LEVEL");   /* syslog's 0-7, to debug a finding */
	const char *workers = getenv("ODPD_FUZZ_WORKERS");  /* default 1; more: races between jobs */
	int level = lvl ? atoi(lvl) : LOG_CRIT;             /* refusals are the point: no log lines */
	FILE *f;

	log_setup(level);
	snprintf(sock_path, sizeof(sock_path), "/tmp/odpd-fuzz.%d.sock", (int)getpid());
	/* a short relaxed window: a connection's relaxed MRs are gone soon after it */
	snprintf(conf_path, sizeof(conf_path), "/tmp/odpd-fuzz.%d.conf", (int)getpid());
	f = fopen(conf_path, "we");
	if (!f || fputs("[limits]\nrelaxed-window-ms = 2\n", f) < 0 || fclose(f) != 0)
		abort();
	have_client_addr = mmap((void *)(uintptr_t)FUZZ_CLIENT_ADDR, FUZZ_MEMFD_SIZE, PROT_NONE,
				MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE | MAP_NORESERVE,
				-1, 0) == (void *)(uintptr_t)FUZZ_CLIENT_ADDR;
	if (!have_client_addr)
		fprintf(stderr, "fuzz-request: %#llx is taken: memfds are not mapped there\n",
			FUZZ_CLIENT_ADDR);
	m.cfg = (struct odpd_config){
		.socket_path = sock_path,
		.foreground = true,
		.workers = workers && atoi(workers) > 0 ? (unsigned)atoi(workers) : 1,
		.max_segment_size = 16u << 20,
		.window_size = 1ull << 30,
		.verify_buffer = 1u << 16,
		.verify_idle_ms = 2,            /* verifiers given back between and during inputs */
		.max_clients = 16,
		.max_segments = 64,
		.max_mrs = 256,
		.log_level = level,
		.config_path = conf_path,
		.config_given = true,           /* a Reload finds it gone: an error, defaults kept */
	};
	if (odpd_manager_start(&m) < 0)
		abort();
	if (__sanitizer_symbolize_pc) {
		char name[256];

		__sanitizer_symbolize_pc(__builtin_return_address(0), "%F", name, sizeof(name));
	}
	unlink(conf_path);                  /* read; a Reload finds none and fails (fuzzed too) */
	atexit(cleanup);
	{
		int n = 0;
		struct ibv_device **list = ibv_get_device_list(&n);

		if (list && n > 0 && (own_ctx = ibv_open_device(list[0])))
			own_pd = ibv_alloc_pd(own_ctx);
		if (list)
			ibv_free_device_list(list);
	}
}

/* What odpd holds now, for a finding's report. */
static void dump_state(const char *what)
{
	const struct odpd_account *a;

	fprintf(stderr,
		"fuzz-request: %s: clients %u (refused %u), jobs queued %u, registry jobs %u, "
		"MRs %u, PDs %s, segment mappings %u (unmapping %u), accounts %u\n",
		what, m.n_clients, m.n_refused, odpd_pool_pending(m.pool), m.registry.pending,
		m.registry.n_mrs, LIST_EMPTY(&m.registry.domains) ? "none" : "some", m.segs.count,
		m.segs.unmapping, m.registry.quota.n_accounts);
	LIST_FOREACH(a, &m.registry.quota.accounts, link) {
		fprintf(stderr, "fuzz-request:   uid %u: refs %u pinned %llu MRs %u refusing %u held",
			(unsigned)a->uid, a->refs, (unsigned long long)a->pinned, a->mrs, a->refusing);
		for (int k = 0; k < ODPD_N_UL; k++)
			fprintf(stderr, " %s %llu", odpd_user_limit_names[k], (unsigned long long)a->held[k]);
		fputc('\n', stderr);
	}
}

/* Turn the loop until @done, letting the worker finish; abort if odpd never
 * gets there within 10 s (a hang is a finding too). Timers (a refused
 * connection's wait, the relaxed window) fire from the loop, so it waits in
 * time, not in turns. */
static void pump(bool (*done)(void), const char *what)
{
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		event_base_loop(m.base, EVLOOP_NONBLOCK);
		if (done())
			return;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 10)
			break;
		usleep(10);
	}
	dump_state(what);
	fprintf(stderr, "fuzz-request: odpd did not settle: %s\n", what);
	abort();
}

static void list_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	char path[300], target[256];
	ssize_t n;

	while (d && (e = readdir(d))) {
		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		n = readlink(path, target, sizeof(target) - 1);
		target[n > 0 ? n : 0] = 0;
		fprintf(stderr, "fuzz-request:   fd %s -> %s\n", e->d_name, target);
	}
	if (d)
		closedir(d);
}

/* The files this input sent odpd (their device and inode). */
static struct {
	dev_t dev;
	ino_t ino;
} sent[256];
static unsigned n_sent;

static void note_sent(int fd)
{
	struct stat st;

	if (n_sent < sizeof(sent) / sizeof(sent[0]) && fstat(fd, &st) == 0) {
		sent[n_sent].dev = st.st_dev;
		sent[n_sent].ino = st.st_ino;
		n_sent++;
	}
}

/*
 * Once a connection is gone, odpd holds no file it was sent (a memfd, a
 * pipe, /dev/null), and has closed every fd it opened for the connection
 * (contexts, hit tables): the count is back where it was after the first
 * input (which leaves open what odpd keeps: a device's context, pagemap).
 */
static void check_fds(void)
{
	static unsigned baseline;
	unsigned n = 0;
	bool kept = false;
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	struct stat st;

	if (!d)
		abort();
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		n++;
		if (n_sent && fstatat(dirfd(d), e->d_name, &st, 0) == 0)
			for (unsigned i = 0; i < n_sent; i++)
				kept |= st.st_dev == sent[i].dev && st.st_ino == sent[i].ino;
	}
	closedir(d);
	n_sent = 0;
	if (!baseline && !kept) {
		baseline = n;
	} else if (kept || n > baseline) {
		dump_state(kept ? "a file the client sent is still open" : "file descriptors left open");
		fprintf(stderr, "fuzz-request: %u fds open, %u after the first input\n", n, baseline);
		list_fds();
		abort();
	}
}

/* Once a connection is gone, its user holds nothing in odpd. */
static void check_accounts(void)
{
	const struct odpd_account *a;
	bool bad = false;

	LIST_FOREACH(a, &m.registry.quota.accounts, link) {
		bad |= a->pinned || a->mrs || a->refusing;
		for (int k = 0; k < ODPD_N_UL; k++)
			bad |= a->held[k] != 0;
	}
	if (bad) {
		dump_state("left behind in an account");
		abort();
	}
}

static bool one_client(void)
{
	return m.n_clients == 1;
}

static bool idle(void)
{
	return odpd_pool_pending(m.pool) == 0;
}

static bool released(void)
{
	return m.n_clients == 0 && odpd_pool_pending(m.pool) == 0 && odpd_registry_idle(&m.registry);
}

static uint64_t seg_addr;            /* SegmentReply.addr odpd answered last in this input */
static uint32_t last_lkey;           /* MrReply.lkey likewise */

/*
 * The oracle of pinned MRs. A pinned MR odpd serves (registered or a cache
 * hit) holds the pages the segment has then; read back through the HCA
 * (Verify) before any hole is punched, it must give what the client sees at
 * the same addresses. The client's view is the memfd mapped at
 * FUZZ_CLIENT_ADDR, while that is the memfd attached there as a segment.
 * An MR served after a hole was punched under an older one, if it were that
 * older one, would read the pages the hole took away: what the cache's
 * invalidation (ctime, witness pages) exists to prevent.
 */
static unsigned map_gen;             /* memfds mapped at FUZZ_CLIENT_ADDR in this input */
static unsigned seg_gen;             /* map_gen of the one attached there as a segment, 0: none */
static uint64_t seg_len;             /* its length there */
static unsigned long long compared;  /* Verify replies the oracle compared, in this run */
static unsigned holes;               /* holes punched in this input */
static struct served {
	uint64_t handle, iova, length;
	unsigned seg_gen, holes;
} served[64];
static unsigned n_served;
static struct {                      /* the request sent last */
	uint64_t id;
	bool attach_here, reg_pinned, verify;
	uint64_t handle, addr, length;
} asked;

static void note_asked(const Odpd__Request *q)
{
	memset(&asked, 0, sizeof(asked));
	if (!q)
		return;
	asked.id = q->id;
	if (q->body_case == ODPD__REQUEST__BODY_ATTACH_SEGMENT && q->attach_segment)
		asked.attach_here = q->attach_segment->client_addr == FUZZ_CLIENT_ADDR;
	if (q->body_case == ODPD__REQUEST__BODY_REG_MR && q->reg_mr)
		asked.reg_pinned = q->reg_mr->kind == ODPD__MR_KIND__MR_PINNED && !q->reg_mr->client_pd;
	if (q->body_case == ODPD__REQUEST__BODY_VERIFY && q->verify && !q->verify->has_rkey) {
		asked.verify = true;
		asked.handle = q->verify->handle;
		asked.addr = q->verify->addr;
		asked.length = q->verify->length;
	}
}

/* At exit: how often the oracle compared (0 would mean it never ran). */
static void cleanup(void)
{
	fprintf(stderr, "fuzz-request: the oracle compared %llu pinned MRs read back with the segment\n",
		compared);
	unlink(sock_path);
}

/* A reply to the request sent last: what the oracle learns from it. */
static void oracle(const Odpd__Reply *r)
{
	if (r->id != asked.id || r->status != 0)
		return;
	if (asked.attach_here && r->body_case == ODPD__REPLY__BODY_SEGMENT && r->segment &&
	    r->segment->addr == FUZZ_CLIENT_ADDR && client_mapped) {
		seg_gen = map_gen;
		seg_len = r->segment->length;
	}
	/* Only an MR wholly inside that segment: another one attached beside
	 * it (another memfd) also lies in [FUZZ_CLIENT_ADDR, + FUZZ_MEMFD_SIZE)
	 * but is not what the harness's mapping shows. */
	if (asked.reg_pinned && r->body_case == ODPD__REPLY__BODY_MR && r->mr && seg_gen &&
	    seg_gen == map_gen && r->mr->mr_iova >= FUZZ_CLIENT_ADDR && r->mr->mr_length <= seg_len &&
	    r->mr->mr_iova - FUZZ_CLIENT_ADDR <= seg_len - r->mr->mr_length &&
	    n_served < sizeof(served) / sizeof(served[0]))
		served[n_served++] = (struct served){ r->mr->handle, r->mr->iova, r->mr->length,
						      seg_gen, holes };
	if (asked.verify && r->body_case == ODPD__REPLY__BODY_VERIFY && r->verify)
		for (unsigned i = 0; i < n_served; i++) {
			const struct served *v = &served[i];
			uint64_t a = asked.addr, n = asked.length;
			uint32_t crc;

			if (v->handle != asked.handle)
				continue;
			if (a == 0 && n == 0) {
				a = v->iova;
				n = v->length;
			}
			if (v->seg_gen != seg_gen || seg_gen != map_gen || v->holes != holes ||
			    a < FUZZ_CLIENT_ADDR || n > FUZZ_MEMFD_SIZE ||
			    a - FUZZ_CLIENT_ADDR > FUZZ_MEMFD_SIZE - n)
				return;
			crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), (const Bytef *)(uintptr_t)a, (uInt)n);
			compared++;
			if (crc != r->verify->crc32) {
				dump_state("a pinned MR read back other bytes than the segment holds");
				fprintf(stderr, "fuzz-request: handle %llu [%#llx, +%llu): odpd read crc32 %#x, "
					"the segment holds %#x (%u holes punched, none since it was served)\n",
					(unsigned long long)asked.handle, (unsigned long long)a,
					(unsigned long long)n, r->verify->crc32, crc, holes);
				abort();
			}
			return;
		}
}

/* Read odpd's replies, noting the segment address and lkey they carry. */
static void drain(int fd)
{
	static uint8_t buf[ODPD_MAX_PACKET + 1];
	struct odpd_packet pkt;

	while (odpd_wire_recv(fd, buf, sizeof(buf), &pkt, MSG_DONTWAIT) >= 0 && !pkt.eof) {
		Odpd__Reply *r = pkt.truncated ? NULL : odpd__reply__unpack(NULL, pkt.len, buf);

		odpd_packet_close_fds(&pkt);
		if (!r)
			continue;
		if (r->body_case == ODPD__REPLY__BODY_SEGMENT && r->segment && r->segment->has_addr)
			seg_addr = r->segment->addr;
		if (r->body_case == ODPD__REPLY__BODY_MR && r->mr && r->mr->has_lkey)
			last_lkey = r->mr->lkey;
		oracle(r);
		odpd__reply__free_unpacked(r, NULL);
	}
}

static void rebase(uint64_t *addr, bool *changed)
{
	if (seg_addr && *addr >= FUZZ_SEGMENT_ADDR && *addr - FUZZ_SEGMENT_ADDR < FUZZ_SEGMENT_SPAN) {
		*addr = seg_addr + (*addr - FUZZ_SEGMENT_ADDR);
		*changed = true;
	}
}

/* Send @rec with its segment-relative addresses made absolute (fuzz-input.h). */
static void send_record(int fd, const struct fuzz_record *rec, const int *fds, unsigned n)
{
	static uint8_t buf[ODPD_MAX_PACKET];
	Odpd__Request *q = odpd__request__unpack(NULL, rec->len, rec->data);
	bool changed = false;

	if (q && q->body_case == ODPD__REQUEST__BODY_REG_MR && q->reg_mr) {
		rebase(&q->reg_mr->addr, &changed);
		if (q->reg_mr->client_pd_handle == FUZZ_CLIENT_PD_HANDLE && own_pd) {
			q->reg_mr->client_pd_handle = own_pd->handle;
			changed = true;
		}
	} else if (q && q->body_case == ODPD__REQUEST__BODY_VERIFY && q->verify) {
		rebase(&q->verify->addr, &changed);
	} else if (q && q->body_case == ODPD__REQUEST__BODY_ADVISE_MR && q->advise_mr) {
		for (size_t i = 0; i < q->advise_mr->n_sges; i++) {
			Odpd__Sge *s = q->advise_mr->sges[i];

			rebase(&s->addr, &changed);
			if (s->lkey == FUZZ_LAST_LKEY && last_lkey) {
				s->lkey = last_lkey;
				changed = true;
			}
		}
	}
	note_asked(q);
	if (changed && odpd__request__get_packed_size(q) <= sizeof(buf))
		odpd_wire_send_buf(fd, buf, odpd__request__pack(q, buf), fds, n, MSG_DONTWAIT);
	else
		odpd_wire_send_buf(fd, rec->data, rec->len, fds, n, MSG_DONTWAIT);
	if (q)
		odpd__request__free_unpacked(q, NULL);
}

static unsigned u16_at(const struct fuzz_record *rec, size_t at)
{
	return rec->len >= at + 2 ? (unsigned)rec->data[at] | (unsigned)rec->data[at + 1] << 8 : 0;
}

/* A FUZZ_OP_* record: the client writes to or punches a hole in the memfd
 * it sent last (fuzz-input.h). */
static void client_op(const struct fuzz_record *rec)
{
	uint8_t *base = (uint8_t *)(uintptr_t)FUZZ_CLIENT_ADDR;
	const size_t pages = FUZZ_MEMFD_SIZE / 4096;

	if (!client_mapped)
		return;
	if (rec->flags & FUZZ_OP_WRITE) {
		size_t off = u16_at(rec, 0) % FUZZ_MEMFD_SIZE, len = rec->len > 2 ? rec->len - 2 : 0;

		if (len > FUZZ_MEMFD_SIZE - off)
			len = FUZZ_MEMFD_SIZE - off;
		memcpy(base + off, rec->data + 2, len);
	} else {
		size_t first = u16_at(rec, 0) % pages, n = u16_at(rec, 2) % (pages + 1);

		if (!n)
			n = 1;
		if (n > pages - first)
			n = pages - first;
		madvise(base + first * 4096, n * 4096, MADV_REMOVE);
		holes++;
	}
}

/* The fds @flags ask for (fuzz-input.h), at most ODPD_MAX_FDS + 2. */
static unsigned make_fds(uint8_t flags, int *fds)
{
	unsigned n = 0;

	if (flags & FUZZ_FD_MEMFD) {
		int fd = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		if (fd >= 0 && ftruncate(fd, FUZZ_MEMFD_SIZE) == 0 &&
		    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0) {
			if (have_client_addr &&
			    mmap((void *)(uintptr_t)FUZZ_CLIENT_ADDR, FUZZ_MEMFD_SIZE, PROT_READ | PROT_WRITE,
				 MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)
				abort();
			client_mapped = have_client_addr;
			map_gen++;
			fds[n++] = fd;
		} else if (fd >= 0) {
			close(fd);
		}
	}
	if (flags & FUZZ_FD_UNSEALED) {
		int fd = memfd_create("fuzz-unsealed", MFD_CLOEXEC);
		if (fd >= 0 && ftruncate(fd, 4096) == 0)
			fds[n++] = fd;
		else if (fd >= 0)
			close(fd);
	}
	if (flags & FUZZ_FD_PIPE) {
		int p[2];
		if (pipe2(p, O_CLOEXEC) == 0) {
			fds[n++] = p[0];
			close(p[1]);
		}
	}
	if (flags & FUZZ_FD_DEVNULL) {
		int fd = open("/dev/null", O_RDWR | O_CLOEXEC);
		if (fd >= 0)
			fds[n++] = fd;
	}
	/* /dev/null and the uverbs device stay open elsewhere (fd 0, own_ctx):
	 * not noted; the count still sees a copy odpd keeps */
	for (unsigned i = 0; i < n; i++)
		if (!(flags & FUZZ_FD_DEVNULL) || i + 1 < n)
			note_sent(fds[i]);
	if ((flags & FUZZ_FD_CMDFD) && own_pd) {
		int fd = fcntl(own_ctx->cmd_fd, F_DUPFD_CLOEXEC, 0);
		if (fd >= 0)
			fds[n++] = fd;
	}
	return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool started;
	struct fuzz_reader rd = { data, size };
	struct fuzz_record rec;
	int fd;

	if (!started) {
		init();
		started = true;
	}
	seg_addr = 0;
	last_lkey = 0;
	map_gen = seg_gen = holes = n_served = 0;
	seg_len = 0;
	memset(&asked, 0, sizeof(asked));
	fd = odpd_wire_connect(sock_path);
	if (fd < 0)
		abort();
	pump(one_client, "the connection accepted");
	fuzz_send_hello(fd);
	pump(idle, "Hello answered");
	drain(fd);
	while (fuzz_next(&rd, &rec)) {
		int fds[8];
		unsigned n;

		if (rec.flags & (FUZZ_OP_WRITE | FUZZ_OP_PUNCH)) {
			client_op(&rec);
			pump(idle, "a write or hole punched");
			drain(fd);
			continue;
		}
		n = make_fds(rec.flags, fds);
		send_record(fd, &rec, fds, n);
		while (n)
			close(fds[--n]);
		pump(idle, "a request answered");
		drain(fd);
	}
	close(fd);
	client_addr_reset();
	pump(released, "the connection released");
	if (m.segs.count || m.segs.bytes || m.registry.n_mrs || m.registry.pinned || m.registry.n_relaxed ||
	    m.registry.relaxed_bytes || m.registry.n_hit_pinned || m.registry.odp.mrs ||
	    m.registry.odp.implicit_mrs || m.registry.odp.bytes || !LIST_EMPTY(&m.registry.holders)) {
		dump_state("left behind");
		fprintf(stderr, "fuzz-request: mapped bytes %llu, pinned %llu, relaxed %u (%llu bytes), "
			"hit-table references over pinned MRs %u, ODP MRs %u (implicit %u, %llu bytes), "
			"holders %s\n", (unsigned long long)m.segs.bytes,
			(unsigned long long)m.registry.pinned, m.registry.n_relaxed,
			(unsigned long long)m.registry.relaxed_bytes, m.registry.n_hit_pinned,
			m.registry.odp.mrs, m.registry.odp.implicit_mrs,
			(unsigned long long)m.registry.odp.bytes,
			LIST_EMPTY(&m.registry.holders) ? "none" : "some");
		abort();
	}
	check_accounts();
	check_fds();
	return 0;
}
