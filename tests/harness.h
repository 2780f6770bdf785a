/* SPDX-License-Identifier: MIT */
/*
 * harness.h - integration tests against a real odpd: start one on a private
 * socket, talk the raw protocol (to send what libodpd never would), and look
 * at the kernel's side (rdma resource show mr, VmPin) rather than odpd's.
 */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "odpd-wire.h"

struct test_daemon {
	pid_t pid;
	char dir[64];
	char sock[128];
};

/* Start $ODPD_TEST_DAEMON --foreground --socket DIR/odpd.sock
 * --verify-idle-ms 600000 [@args] (NULL-terminated) and wait until it
 * accepts connections. The long verify-idle-ms keeps a client's verifier
 * (its QPs and its bounce buffer's MR) until the client goes, as the tests'
 * counts of the kernel's objects expect; @args may say otherwise. */
void daemon_start(struct test_daemon *d, const char *const *args);
/* daemon_start again on @d's socket, once daemon_stop(@d) has stopped it. */
void daemon_restart(struct test_daemon *d, const char *const *args);
/* The next daemon_restart passes @fds (not taken) to odpd as systemd passes
 * a service its fd store: fds 3.. with LISTEN_FDS, LISTEN_FDNAMES (@names)
 * and LISTEN_PID. */
void daemon_pass_fds(const int *fds, const char *const *names, unsigned n);
/* SIGTERM, then require a clean exit within 20 s. */
void daemon_stop(struct test_daemon *d);

/*
 * systemd's notify socket and fd store, faked: a thread receives what odpd
 * sends to $NOTIFY_SOCKET (set by start, unset by stop), keeps the fds of
 * FDSTORE=1 under their FDNAME, drops them on FDSTOREREMOVE=1 and answers
 * BARRIER=1 (unless hold_barriers). A daemon started meanwhile talks to it.
 */
#define FAKE_STORE_MAX 256
struct fake_store {
	int sock;
	char dir[64];
	pthread_t thread;
	pthread_mutex_t lock;
	_Atomic bool stop;
	unsigned n, barriers;
	int fds[FAKE_STORE_MAX];
	char names[FAKE_STORE_MAX][64];
	bool hold_barriers;     /* set: BARRIER=1 is never answered (sd_notify_barrier times out) */
	unsigned max;           /* set: FileDescriptorStoreMax=, as systemd keeps it (an fd beyond
				 * it is closed); 0: FAKE_STORE_MAX */
	int held[FAKE_STORE_MAX];
	unsigned n_held;
};
void fake_store_start(struct fake_store *st);
void fake_store_stop(struct fake_store *st);
/* `odpctl --socket @sock ARGS --json`, which must exit 0, parsed; the
 * caller puts the root (json_object_put). */
struct json_object *odpctl_json(const char *sock, const char *args);
/* The first stored fd whose name starts with @prefix (still the store's), or -1. */
int fake_store_find(struct fake_store *st, const char *prefix);

/*
 * One odpd per test program, and an admin connection to it. The group setup
 * starts it; every test starts from an idle daemon (harness_test_setup); the
 * last test stops it and requires exit status 0, which under the valgrind
 * wrapper means no leak and no invalid access (a failed group teardown would
 * not fail the run, so that is a test of its own).
 */
extern struct test_daemon test_daemon;
extern int test_admin_fd;
int harness_group_setup(void **state);
int harness_test_setup(void **state);
void harness_test_daemon_exits_cleanly(void **state);
int harness_group_teardown(void **state);
/* harness_group_setup with odpd on --config FILE holding @text (removed by
 * harness_group_teardown). */
int harness_group_setup_conf(const char *text);
/* Start @d with --config PATH, a file written here with @text (@tag names
 * it; PATH goes to @path, the caller unlinks it), and @arg @val if not NULL. */
void daemon_start_conf(struct test_daemon *d, char *path, size_t cap, const char *tag, const char *text,
		       const char *arg, const char *val);
/* Run @fn(@arg) in a child as @uid (gid @uid, no supplementary groups) with
 * RLIMIT_MEMLOCK @memlock bytes, killed with the test: its exit status (fn's
 * return value), 90 if it could not become @uid, or 100 + signal. */
int run_as(uid_t uid, rlim_t memlock, int (*fn)(void *), void *arg);

/* Does the VM tier require a device (ODPD_TEST_REQUIRE_DEVICE=1)? */
bool test_require_device(void);
/* The VM's `testbed` profile (ODPD_VM_PROFILE=testbed: rdma-core 65 with the
 * rxe import patch, so import and advise_mr work), not `stock`? */
bool test_profile_testbed(void);
/* The address rdma_cm reaches rxe0 at in the VM (ODPD_VM_CM_ADDR), or NULL. */
const char *test_cm_addr(void);

/* Raw protocol (connect with odpd_wire_connect). */
/* odpd_wire_connect + a successful Hello. */
int raw_connect_hello(const char *sock);
void raw_send(int fd, Odpd__Request *req, const int *fds, unsigned nfds);
void raw_send_bytes(int fd, const void *buf, size_t len);
/* The next reply (events included); fails the test after 10 s. Free with
 * odpd__reply__free_unpacked(r, NULL). */
Odpd__Reply *raw_recv(int fd);
/* Send @req with id @id and return the reply to it. */
Odpd__Reply *raw_call(int fd, uint64_t id, Odpd__Request *req, const int *fds, unsigned nfds);
/* The same for a reply that may carry one fd: *@ret_fd, or -1. */
Odpd__Reply *raw_call_fd(int fd, uint64_t id, Odpd__Request *req, const int *fds, unsigned nfds,
			 int *ret_fd);
/* AttachSegment @fd (a sealed memfd) as request @id; the segment's client address. */
uint64_t raw_attach(int fd_conn, uint64_t id, int fd);
/* Make @req a client-PD RegMr of one page at @addr, local write, into the
 * client's PD @pd_handle (the cmd_fd goes along as the packet's fd); @m is its body. */
void raw_client_pd_req(Odpd__Request *req, Odpd__RegMr *m, uint64_t addr, uint32_t pd_handle);

/* OpenHitTable as request @id with @slots slots over a new 4 KiB use table:
 * the use table's fd and mapping (the client's use words, read-write) in
 * *@use_fd and *@use, the daemon's generation table's in *@gen_fd and *@gen
 * (read-only). */
void raw_open_hit_table(int fd, uint64_t id, uint32_t slots, int *use_fd, _Atomic uint64_t **use,
			int *gen_fd, const _Atomic uint64_t **gen);
/* The same with a release ring of @ring entries wanted; what odpd granted
 * (HitTableReply.release_ring). @slots + 1 + @ring words fit in the page. */
uint32_t raw_open_hit_table_ring(int fd, uint64_t id, uint32_t slots, uint32_t ring, int *use_fd,
				 _Atomic uint64_t **use, int *gen_fd, const _Atomic uint64_t **gen);

/* Make @req a DeregMr.no_reply of @handle (@d is its body): one-way, never
 * answered. The caller sets the id. */
void raw_oneway_dereg_req(Odpd__Request *req, Odpd__DeregMr *d, uint64_t handle);

/* Expect an error reply to id @id with @status. */
void raw_expect_error(int fd, uint64_t id, Odpd__Request *req, const int *fds, unsigned nfds,
		      int status);

/* odpd's view (admin Status) and the kernel's view, for "nothing changed". */
struct snapshot {
	unsigned segments;
	uint64_t segment_bytes;
	unsigned mrs;
	uint64_t pinned_bytes;
	unsigned clients;
	int daemon_fds;          /* entries in /proc/PID/fd */
	int kernel_mrs;          /* rdma resource show mr of odpd's pid, -1 without rdma */
	long vmpin_kb;
};
/* Taken over a long-lived admin connection, so that the snapshot itself
 * opens no socket in odpd. */
void snapshot_take(const struct test_daemon *d, int admin_fd, struct snapshot *s);
/* Admin Status; free *ret_reply with odpd__reply__free_unpacked. */
Odpd__StatusReply *status_get(int admin_fd, Odpd__Reply **ret_reply);
void snapshot_assert_equal(const struct snapshot *a, const struct snapshot *b);
/* Pinned bytes the test daemon charges to @uid (distinct pages), 0 if no account. */
uint64_t quota_pinned(uid_t uid);
/* Wait (up to 20 s) until a snapshot equals @want, then assert it: for
 * releases that finish on a worker after the reply (a detached segment is
 * unmapped there). */
void snapshot_settles_to(const struct test_daemon *d, int admin_fd, const struct snapshot *want);

/* MRs the kernel holds for any thread of @pid (rdma -j resource show mr),
 * -1 if no rdma tool/device. */
int kernel_mr_count(pid_t pid);
/* The same for any resource type of `rdma resource show` (mr, qp, cq, pd);
 * @pid 0 counts every process's. */
int kernel_res_count(const char *res, pid_t pid);
/* VmPin of @pid in kB. */
long vmpin_kb(pid_t pid);
/* Open fds of @pid. */
int fd_count(pid_t pid);

/* Mappings in /proc/@pid/maps whose line contains @needle (a memfd's name),
 * and their bytes in *@ret_bytes if not NULL. */
int maps_named(pid_t pid, const char *needle, uint64_t *ret_bytes);

/*
 * At least @n free huge pages of the default size (Hugepagesize), raising
 * vm.nr_hugepages if we may (root; put back by hugepages_restore() and at
 * exit). False, with the reason printed, if there are not: skip the test.
 */
bool hugepages_free(unsigned n);
void hugepages_restore(void);

/* Poll @cond up to 20 s (not a timing assertion: the release runs on a worker). */
bool wait_until(bool (*cond)(void *arg), void *arg);
/* nanosleep @ms milliseconds. */
void sleep_ms(long ms);

/* Wait until odpd serves only the admin connection, releases no client and
 * holds no segment or MR: clients are released on a worker after they close. */
void wait_idle(int admin_fd);

/* A sealed memfd of @size bytes (F_SEAL_SHRINK | F_SEAL_GROW). */
int sealed_memfd(size_t size);

/*
 * A system bus of the test's own: dbus-daemon with a system bus's usual
 * default policy and odpd's real policy file ($ODPD_TEST_BUS_POLICY);
 * bus_start() points DBUS_SYSTEM_BUS_ADDRESS there, so daemon_start()'s odpd
 * connects to it. bus_addr: its address; bus_pid: the dbus-daemon.
 */
extern char bus_addr[160];
extern pid_t bus_pid;
void bus_start(void);
void bus_stop(void);
/* A new dbus-daemon at the same address, after the last one died (bus_pid 0). */
void bus_restart(void);
/* Run @argv as @uid (0: as we are); its stdout and stderr in @out. Returns
 * its exit status. */
int run_tool(uid_t uid, char *out, size_t cap, const char *const *argv);
/* sh -c @cmd, killed after @timeout_s: its exit status, 128 + signal, or -1
 * on the timeout. */
int run_cmd(const char *cmd, int timeout_s);
/* The first rxe link and its netdev, from `rdma link show`. */
void rdma_link(char *dev, char *netdev);

/* wait_until() conditions: the kernel holds @mrs MRs of @pid; odpd has
 * revoked a reference of the hit table whose generation words @arg maps
 * (its header word moved). */
struct kernel_want {
	pid_t pid;
	int mrs;
};
bool kernel_holds(void *arg);
bool hit_revoked(void *arg);

/* Send @v on @conn as request @id and do not wait for its answer; *@t0 is
 * when it was sent. Then wait until odpd holds @kw->mrs kernel MRs: its
 * verifier's bounce buffer is registered, and the verify is running. */
void raw_verify_begin(int conn, uint64_t id, Odpd__Verify *v, const struct kernel_want *kw,
		      struct timespec *t0);
/* Seconds since @t0 (CLOCK_MONOTONIC). */
double secs_since(const struct timespec *t0);
