/* fdstore: probe systemd's fd store (issue 25). Not built by meson.
 * cc -O2 -Wall -o fdstore fdstore.c -lsystemd -libverbs
 *
 * At each start: list the fds systemd passed back (LISTEN_FDS/LISTEN_FDNAMES), bump a
 * counter kept in a memfd named "state" (created and stored on first start), and on the
 * first start also store:
 *   "hup"       a socketpair end whose peer is closed (POLLHUP), plain FDSTORE=1
 *   "hupnopoll" the same with FDPOLL=0
 *   "uverbs"    a dup of ibv_open_device()'s cmd_fd (context with one PD allocated),
 *               plain FDSTORE=1 (a uverbs file has no poll op: does systemd take it?)
 * Then READY=1 and sleep. Environment: FDSTORE_AGAIN=1 stores the received "state" fd
 * again under the same name; FDSTORE_REMOVE=1 sends FDSTOREREMOVE=1 for "hupnopoll";
 * FDSTORE_CHILD=1 has a forked child store an fd; FDSTORE_CLOSE=1 closes the received fds
 * but "state"; FDSTORE_EXIT=N exits N before READY=1. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

static void store(int fd, const char *name, int nopoll)
{
	char msg[128];
	snprintf(msg, sizeof msg, "FDSTORE=1\nFDNAME=%s%s", name, nopoll ? "\nFDPOLL=0" : "");
	int r = sd_pid_notify_with_fds(0, 0, msg, &fd, 1);
	printf("fdstore: store %s (fd %d%s): %d %s\n", name, fd, nopoll ? ", FDPOLL=0" : "", r,
	       r < 0 ? strerror(-r) : "ok");
}

int main(void)
{
	char **names = NULL;
	int n = sd_listen_fds_with_names(0, &names);
	int state = -1, have_hup = 0, have_uverbs = 0;
	printf("fdstore: pid %d started, sd_listen_fds_with_names = %d\n", getpid(), n);
	for (int i = 0; i < n; i++) {
		int fd = SD_LISTEN_FDS_START + i;
		char p[64], t[PATH_MAX] = "";
		snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
		ssize_t l = readlink(p, t, sizeof t - 1);
		if (l > 0)
			t[l] = 0;
		printf("fdstore:   fd %d name %s -> %s\n", fd, names[i], t);
		if (!strcmp(names[i], "state"))
			state = fd;
		if (!strncmp(names[i], "hup", 3))
			have_hup = 1;
		if (!strcmp(names[i], "uverbs"))
			have_uverbs = 1;
	}
	if (getenv("FDSTORE_CLOSE")) { /* keep nothing but the state: systemd alone holds the rest */
		for (int i = 0; i < n; i++)
			if (SD_LISTEN_FDS_START + i != state)
				close(SD_LISTEN_FDS_START + i);
	}
	unsigned gen = 0;
	if (state >= 0) {
		if (pread(state, &gen, sizeof gen, 0) != sizeof gen)
			perror("pread");
	} else {
		state = memfd_create("state", MFD_CLOEXEC);
		if (ftruncate(state, 4096) < 0)
			perror("ftruncate");
		store(state, "state", 0);
	}
	gen++;
	if (pwrite(state, &gen, sizeof gen, 0) != sizeof gen)
		perror("pwrite");
	printf("fdstore: generation %u\n", gen);
	if (!have_hup) {
		int sv[2];
		socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
		store(sv[0], "hup", 0);
		int sv2[2];
		socketpair(AF_UNIX, SOCK_STREAM, 0, sv2);
		store(sv2[0], "hupnopoll", 1);
		close(sv[1]);
		close(sv2[1]);
	}
	if (!have_uverbs && getenv("FDSTORE_UVERBS")) {
		struct ibv_device **l = ibv_get_device_list(NULL);
		struct ibv_context *ctx = l && l[0] ? ibv_open_device(l[0]) : NULL;
		struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
		if (!pd) {
			printf("fdstore: no device/pd: %s\n", strerror(errno));
		} else {
			printf("fdstore: pd handle %u on %s\n", pd->handle, ibv_get_device_name(l[0]));
			store(dup(ctx->cmd_fd), "uverbs", 0);
		}
	}
	if (getenv("FDSTORE_AGAIN") && state >= 0 && n > 0)
		store(state, "state", 0); /* the same fd under the same name once more */
	if (getenv("FDSTORE_REMOVE") && have_hup) {
		int r = sd_notify(0, "FDSTOREREMOVE=1\nFDNAME=hupnopoll");
		printf("fdstore: FDSTOREREMOVE=1 FDNAME=hupnopoll: %d\n", r);
	}
	if (getenv("FDSTORE_CHILD")) { /* a forked child (not the main process) stores an fd */
		if (fork() == 0) {
			int fd = memfd_create("fromchild", 0);
			store(fd, "fromchild", 0);
			_exit(0);
		}
		sleep(1);
	}
	fflush(stdout);
	if (getenv("FDSTORE_EXIT"))
		exit(atoi(getenv("FDSTORE_EXIT")));
	sd_notify(0, "READY=1");
	for (;;)
		pause();
}
