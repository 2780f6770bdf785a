/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <systemd/sd-daemon.h>

#include "bus.h"
#include "client.h"
#include "hotplug.h"
#include "log.h"
#include "odpd-wire.h"
#include "journal.h"
#include "restart.h"
#include "stages.h"

/* What odpd asks of the OOM killer (-1000: never; clients are preferred). */
#define ODPD_OOM_SCORE_ADJ "-900"

/* A socket from systemd (odpd.socket), or one we create and later unlink. */
/*
 * Outside systemd nobody made the socket's directory (under systemd,
 * RuntimeDirectory= or tmpfiles.d does): make it, 0755, and its parents.
 */
static int runtime_dir(const char *sock_path)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char *slash;

	snprintf(dir, sizeof(dir), "%s", sock_path);
	slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return 0;
	*slash = 0;
	for (char *p = dir + 1; ; p++) {
		char c = *p;

		if (c != '/' && c != 0)
			continue;
		*p = 0;
		if (mkdir(dir, 0755) < 0 && errno != EEXIST)
			return log_errno(LOG_ERR, errno, "cannot create %s for the socket", dir);
		*p = c;
		if (!c)
			break;
	}
	return 0;
}

/*
 * A socket file at the path: a live odpd answers a connect(), and then this
 * one must not take its path (its clients would lose it); a stale one from
 * an odpd that died is refused (ECONNREFUSED) and may be replaced.
 */
static int socket_in_use(const struct sockaddr_un *sa)
{
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), r = 0;

	if (fd < 0)
		return log_errno(LOG_ERR, errno, "socket");
	/* EAGAIN: someone listens there with a full backlog: in use too */
	if (connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0 || errno == EAGAIN)
		r = log_errno(LOG_ERR, EADDRINUSE, "another odpd is serving %s: not taking its socket "
			      "(stop it first, or give this one --socket)", sa->sun_path);
	close(fd);
	return r;
}

static int listen_socket(struct odpd_manager *m, struct odpd_fdstore *st)
{
	struct sockaddr_un sa;
	mode_t old_umask;
	int fd, r;

	if (st->listen_fd >= 0) {
		fd = st->listen_fd;
		st->listen_fd = -1;
		log_info("listening on the socket passed by systemd (%s)", st->listen_name ? st->listen_name : "?");
		if (sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, NULL, 0) <= 0)
			return log_errno(LOG_ERR, EINVAL, "the socket from systemd is not a listening "
					 "AF_UNIX SOCK_SEQPACKET socket");
		if (evutil_make_socket_nonblocking(fd) < 0)
			return log_errno(LOG_ERR, errno, "O_NONBLOCK on the systemd socket");
		m->listen_fd = fd;
		return 0;
	}
	r = odpd_wire_sockaddr(m->cfg.socket_path, &sa);
	if (r < 0)
		return log_errno(LOG_ERR, r, "socket path \"%s\"", m->cfg.socket_path);
	r = runtime_dir(sa.sun_path);
	if (r < 0)
		return r;
	r = socket_in_use(&sa);
	if (r < 0)
		return r;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return log_errno(LOG_ERR, errno, "socket");
	unlink(sa.sun_path);                 /* a stale socket of an earlier odpd (checked above) */
	/* Access control is by SO_PEERCRED per request; the socket is open to
	 * all: mode 0666 from bind itself (never a chmod by path, which a
	 * symlink put there meanwhile would redirect). Start-up: one thread
	 * makes files. */
	old_umask = umask(0111);
	r = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old_umask);
	if (r < 0 || listen(fd, 128) < 0) {
		r = log_errno(LOG_ERR, errno, "cannot listen on %s", sa.sun_path);
		close(fd);
		return r;
	}
	m->listen_fd = fd;
	m->unlink_socket = true;
	log_info("listening on %s", sa.sun_path);
	return 0;
}

/* Stop once no client, MR, PD or mapping is left to release. */
static void maybe_stop(struct odpd_manager *m)
{
	static const struct timeval again = { 0, 10000 };

	if (m->n_clients == 0 && odpd_registry_idle(&m->registry) && m->segs.unmapping == 0)
		event_base_loopbreak(m->base);
	else
		evtimer_add(m->ev_stop, &again);
}

static void on_stop_timer(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	maybe_stop(arg);
}

static void stop_flushed(void *arg, unsigned mrs, uint64_t bytes)
{
	char b[LOG_BYTES_LEN];

	(void)arg;
	log_info("stopping: %u relaxed MR(s), %s, invalidated", mrs, log_bytes(bytes, b));
}

/* Release every client, flush, and stop once everything is released. */
static void stop_plain(struct odpd_manager *m)
{
	const struct odpd_flush_sel all = { .all = true };

	while (!LIST_EMPTY(&m->clients))
		odpd_client_disconnect(LIST_FIRST(&m->clients), "odpd is stopping");
	odpd_registry_flush(&m->registry, &all, stop_flushed, m);
	maybe_stop(m);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct odpd_manager *m = arg;
	const char *why_not;

	(void)what;
	if (m->stopping)
		return;
	sd_notify(0, "STOPPING=1");
	m->stopping = true;
	event_del(m->ev_listen);
	event_del(m->ev_listen_resume);
	why_not = sig == SIGTERM && m->cfg.live_restart ? odpd_restart_unavailable(m) : "";
	if (!why_not && !odpd_journal_on())
		why_not = "no journal (it could not be stored at the start)";
	if (!why_not) {
		log_notice("%s: keeping every MR for the next odpd (systemd's fd store)", strsignal((int)sig));
		odpd_restart_begin(m, stop_plain);
		return;
	}
	if (*why_not)
		log_notice("%s: releasing every client and stopping (MRs cannot be kept: %s)",
			   strsignal((int)sig), why_not);
	else
		log_notice("%s: releasing every client and stopping", strsignal((int)sig));
	stop_plain(m);
}

/* ---------------------------------------------------------------- watchdog */

static void wd_ping_run(struct odpd_job *job)
{
	(void)job;
}

static void wd_ping_done(struct odpd_job *job)
{
	struct odpd_manager *m = (struct odpd_manager *)((char *)job - offsetof(struct odpd_manager, wd_ping));

	m->wd_ping_pending = false;
}

/*
 * Every half of WatchdogSec: WATCHDOG=1 if the loop runs (this timer fires)
 * and the workers make progress: the previous tick's no-op job completed,
 * or, behind longer jobs, some job completed since. Workers all stuck
 * (a hung verb) stop the pings, and systemd restarts odpd.
 */
static void on_watchdog(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_manager *m = arg;
	unsigned long done = odpd_pool_completed(m->pool);
	bool progress = !m->wd_ping_pending || done != m->wd_completed;

	(void)fd;
	(void)what;
	m->wd_completed = done;
	if (!m->wd_ping_pending) {
		m->wd_ping_pending = true;
		odpd_pool_submit(m->pool, &m->wd_ping);
	}
	if (progress)
		sd_notify(0, "WATCHDOG=1");
	else
		log_ratelimited(LOG_ERR, "watchdog: no worker finished a job since the last tick (%u "
				"queued or running): not telling systemd that odpd is alive",
				odpd_pool_pending(m->pool));
}

/* ODPD_TEST_WEDGE=1, for the watchdog's test: SIGUSR1 makes every worker
 * block for good. */
static void wedge_run(struct odpd_job *job)
{
	(void)job;
	for (;;)
		pause();
}

static void on_wedge(evutil_socket_t sig, short what, void *arg)
{
	static struct odpd_job jobs[64];
	struct odpd_manager *m = arg;

	(void)sig;
	(void)what;
	log_warning("ODPD_TEST_WEDGE: SIGUSR1: blocking every worker for good");
	for (unsigned i = 0; i < m->cfg.workers && i < 64; i++) {
		jobs[i].run = wedge_run;
		jobs[i].done = NULL;
		odpd_pool_submit(m->pool, &jobs[i]);
	}
}

static int watchdog_start(struct odpd_manager *m)
{
	uint64_t usec = 0;
	struct timeval tv;
	const char *wedge = getenv("ODPD_TEST_WEDGE");

	if (wedge && strcmp(wedge, "1") == 0) {
		m->ev_wedge = evsignal_new(m->base, SIGUSR1, on_wedge, m);
		if (!m->ev_wedge || event_add(m->ev_wedge, NULL) < 0)
			return log_errno(LOG_ERR, ENOMEM, "signal event");
		log_warning("ODPD_TEST_WEDGE=1: SIGUSR1 blocks every worker (for the watchdog's test)");
	}
	if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
		return 0;
	m->wd_ping.run = wd_ping_run;
	m->wd_ping.done = wd_ping_done;
	usec /= 2;
	tv.tv_sec = (time_t)(usec / 1000000u);
	tv.tv_usec = (suseconds_t)(usec % 1000000u);
	m->ev_watchdog = event_new(m->base, -1, EV_PERSIST, on_watchdog, m);
	if (!m->ev_watchdog || event_add(m->ev_watchdog, &tv) < 0)
		return log_errno(LOG_ERR, ENOMEM, "watchdog timer");
	log_info("watchdog: WATCHDOG=1 every %llu ms while the workers make progress",
		 (unsigned long long)(usec / 1000u));
	return 0;
}

void odpd_manager_client_released(struct odpd_manager *m)
{
	m->n_clients--;
}

/* What the users of @m share, and what each may take of it by default. */
static void budget_log(struct odpd_manager *m)
{
	uint64_t def[ODPD_N_UL];

	m->budget.nofile = m->nofile;
	m->budget.max_map_count = odpd_max_map_count();
	m->budget.window_size = m->cfg.window_size;
	odpd_budget_user_defaults(&m->conf, &m->budget, def);
	char b[LOG_BYTES_LEN];

	log_info("per user by default: %llu connections and %llu segments of %llu fds, %llu mappings of "
		 "vm.max_map_count %llu, %s of the window", (unsigned long long)def[ODPD_UL_CONNECTIONS],
		 (unsigned long long)def[ODPD_UL_SEGMENTS], (unsigned long long)m->budget.nofile,
		 (unsigned long long)def[ODPD_UL_MAPPINGS], (unsigned long long)m->budget.max_map_count,
		 log_bytes(def[ODPD_UL_MAPPED], b));
	odpd_budget_warn(&m->conf, &m->budget);
}

static void log_resolved(void *arg, int level, const char *msg)
{
	(void)arg;
	log_msg(level, "configuration: %s", msg);
}

/* Warn of each name of the file that does not resolve (yet). */
static void log_unresolved(const struct odpd_conf *c)
{
	char msg[1024];

	for (unsigned i = 0; i < odpd_conf_n_unresolved(c); i++) {
		odpd_conf_unresolved_text(c, i, msg, sizeof(msg));
		log_warning("configuration: %s", msg);
	}
}

void odpd_manager_resolve_names(struct odpd_manager *m)
{
	struct timespec now;
	long long ms;

	if (!odpd_conf_n_unresolved(&m->conf))
		return;
	/* A directory service that is down may make each lookup slow: at most
	 * one round a second, in the event loop. */
	clock_gettime(CLOCK_MONOTONIC, &now);
	ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
	if (m->resolve_last_ms && ms - m->resolve_last_ms < 1000)
		return;
	m->resolve_last_ms = ms ? ms : 1;
	odpd_conf_resolve(&m->conf, log_resolved, m);
}

static int load_config(struct odpd_manager *m)
{
	uint64_t mem = odpd_meminfo_total();
	char msg[512], b[LOG_BYTES_LEN];
	int r;

	odpd_conf_defaults(&m->conf, mem);
	r = odpd_conf_load(&m->conf, m->cfg.config_path, m->cfg.config_given, mem, msg, sizeof(msg));
	if (r < 0) {
		log_error("configuration: %s", msg);
		return r;
	}
	log_unresolved(&m->conf);
	log_info("configuration: %s; max-pinned %s, max-mrs %llu, %u rule(s), %u [pd] section(s)",
		 m->conf.path ? m->conf.path : "none (defaults)", log_bytes(m->conf.max_pinned, b),
		 (unsigned long long)m->conf.max_mrs, m->conf.n_rules, m->conf.n_pds);
	budget_log(m);
	return 0;
}

int odpd_manager_reload(struct odpd_manager *m, char *msg, size_t len)
{
	uint64_t mem = odpd_meminfo_total();
	struct odpd_conf c;
	struct odpd_client *k;
	char err[512], b[LOG_BYTES_LEN];
	int r;

	odpd_conf_defaults(&c, mem);
	r = odpd_conf_load(&c, m->cfg.config_path, m->cfg.config_given, mem, err, sizeof(err));
	if (r < 0) {
		odpd_conf_free(&c);
		snprintf(msg, len, "%s; the configuration in use stays", err);
		log_error("reload: %s", msg);
		return r;
	}
	odpd_conf_free(&m->conf);
	m->conf = c;
	log_unresolved(&m->conf);
	budget_log(m);                      /* vm.max_map_count may have changed too */
	/* What each connected client may hold, worked out again from the new
	 * rules: refusals from its next request on; nothing is taken away. */
	LIST_FOREACH(k, &m->clients, link) {
		struct odpd_limit limit;

		if (k->has_holder && odpd_limit_for_client(&m->conf, k->cred.pid, k->pidfd, k->cred.uid,
							    k->cred.gid, k->groups, k->n_groups,
							    &m->budget, &limit) == 0)
			k->holder.limit = limit;
	}
	snprintf(msg, len, "%s: max-pinned %s, max-mrs %llu, %u rule(s), %u [pd] section(s)",
		 m->conf.path ? m->conf.path : "no file (defaults)", log_bytes(m->conf.max_pinned, b),
		 (unsigned long long)m->conf.max_mrs, m->conf.n_rules, m->conf.n_pds);
	log_notice("reload: %s", msg);
	return 0;
}

#ifdef ODPD_REQUEST_STAGES
/* SIGUSR2: the sums since the last one to $ODPD_STAGES_OUT, and start again */
static void on_stages(evutil_socket_t sig, short what, void *arg)
{
	(void)sig;
	(void)what;
	(void)arg;
	odpd_stage_dump();
}
#endif

static void on_hup(evutil_socket_t sig, short what, void *arg)
{
	struct odpd_manager *m = arg;
	char msg[640];

	(void)sig;
	(void)what;
	sd_notify(0, "RELOADING=1");
	odpd_manager_reload(m, msg, sizeof(msg));
	sd_notifyf(0, "READY=1\nSTATUS=Serving %u device(s)", m->devices.n_live);
}

static void on_listen_resume(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_manager *m = arg;

	(void)fd;
	(void)what;
	if (!m->stopping)
		event_add(m->ev_listen, NULL);
}

void odpd_manager_pause_listening(struct odpd_manager *m, int ms)
{
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };

	event_del(m->ev_listen);
	evtimer_add(m->ev_listen_resume, &tv);
}

/* Segments stop well before the end of the table, connections only near
 * it: what segments leave lets new clients in, and them register (device
 * contexts) and attach elsewhere once segments go. */
static int control_reload(void *ctx, char *msg, size_t len)
{
	return odpd_manager_reload(ctx, msg, len);
}

/*
 * A client's memory is the client's business: when the host runs out, the
 * OOM killer should pick a client, not odpd (whose death would cost every
 * client its MRs). Lowering it takes CAP_SYS_RESOURCE; under systemd,
 * OOMScoreAdjust= in the unit can do it instead.
 */
static void oom_protect(void)
{
	int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);

	if (fd < 0 || write(fd, ODPD_OOM_SCORE_ADJ, strlen(ODPD_OOM_SCORE_ADJ)) < 0)
		log_info("cannot set oom_score_adj to %s: %s", ODPD_OOM_SCORE_ADJ, strerror(errno));
	if (fd >= 0)
		close(fd);
}

int odpd_manager_start(struct odpd_manager *m)
{
	struct rlimit nofile;
	static const int sigs[2] = { SIGTERM, SIGINT };
	int r;

	LIST_INIT(&m->clients);
	LIST_INIT(&m->reap);
	m->control.reload = control_reload;
	m->control.ctx = m;
	for (size_t i = 0; i < sizeof(m->conn_ids) / sizeof(m->conn_ids[0]); i++)
		LIST_INIT(&m->conn_ids[i]);
	m->listen_fd = -1;
	m->fdstore.listen_fd = -1;
	signal(SIGPIPE, SIG_IGN);
	m->base = event_base_new();
	m->rbuf = malloc(ODPD_MAX_PACKET + 1);
	m->arena.buf = malloc(ODPD_ARENA_SIZE);
	if (!m->base || !m->rbuf || !m->arena.buf)
		return log_errno(LOG_ERR, ENOMEM, "start-up");
	m->ev_stop = evtimer_new(m->base, on_stop_timer, m);
	m->ev_listen_resume = evtimer_new(m->base, on_listen_resume, m);
	m->ev_reap = event_new(m->base, -1, 0, odpd_client_on_reap, m);
	if (!m->ev_stop || !m->ev_listen_resume || !m->ev_reap)
		return log_errno(LOG_ERR, ENOMEM, "start-up");
	if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY)
		m->nofile = nofile.rlim_cur;
	oom_protect();
	r = load_config(m);
	if (r < 0)
		return r;
	r = odpd_fdstore_collect(&m->fdstore, !m->cfg.no_bus);
	if (r < 0)
		return log_errno(LOG_ERR, r, "the fds systemd passed");
	m->restart = odpd_restart_read(m, &m->fdstore);
	r = -1;
	if (odpd_restart_window(m->restart, m->cfg.window_size)) {
		r = odpd_window_new_at(odpd_restart_window(m->restart, m->cfg.window_size), m->cfg.window_size,
				       &m->segs.window);
		if (r < 0) {
			log_errno(LOG_WARNING, r, "restart: the address window cannot lie where it did: "
				  "every MR of the previous odpd dropped");
			odpd_restart_drop(m, m->restart);
			m->restart = NULL;
		}
	} else if (m->restart) {
		log_warning("restart: --window-size changed: every MR of the previous odpd dropped");
		odpd_restart_drop(m, m->restart);
		m->restart = NULL;
	}
	if (r < 0)
		r = odpd_window_new(m->cfg.window_size, &m->segs.window);
	if (r < 0)
		return log_errno(LOG_ERR, r, "cannot reserve a %llu-byte address window",
				 (unsigned long long)m->cfg.window_size);
	m->implicit_without_cap = getenv("ODPD_TEST_IMPLICIT_ODP") &&
				  strcmp(getenv("ODPD_TEST_IMPLICIT_ODP"), "1") == 0;
	if (m->implicit_without_cap)
		log_warning("ODPD_TEST_IMPLICIT_ODP=1: implicit ODP requests reach the registrar on "
			    "devices without IBV_ODP_SUPPORT_IMPLICIT (for tests: the kernel refuses them)");
	r = odpd_devices_open(m->cfg.devices, m->cfg.n_devices, &m->devices);
	if (r < 0)
		return r;
	r = odpd_pool_new(m->base, m->cfg.workers, &m->pool);
	if (r < 0)
		return log_errno(LOG_ERR, r, "cannot start %u workers", m->cfg.workers);
	m->segs.pool = m->pool;
	r = odpd_registry_init(&m->registry, m->base, m->pool, &m->segs, &m->conf, &m->devices);
	if (r < 0)
		return log_errno(LOG_ERR, r, "registry");
	m->registry.verify_idle_ms = m->cfg.verify_idle_ms;
	if (getenv("ODPD_TEST_REG_DELAY_MS")) {
		m->registry.test_reg_delay_ms = (unsigned)strtoul(getenv("ODPD_TEST_REG_DELAY_MS"), NULL, 10);
		log_warning("ODPD_TEST_REG_DELAY_MS=%u: every registration waits that long after its verb, "
			    "before its handle is recorded (for tests)", m->registry.test_reg_delay_ms);
	}
	m->test_crash_kind = getenv("ODPD_TEST_CRASH_BEFORE_ANSWER");
	if (m->test_crash_kind)
		log_warning("ODPD_TEST_CRASH_BEFORE_ANSWER=%s: odpd kills itself after the journal took the "
			    "answer to the first such request of a kept connection, before it is sent; \"hello\": "
			    "at the first Hello, before its connection is kept (for tests)", m->test_crash_kind);
	odpd_client_notify_init(&m->notify, m);
	m->hotplug = (struct odpd_hotplug){ .base = m->base, .devices = &m->devices,
					    .registry = &m->registry, .notify = &m->notify };
	r = odpd_hotplug_start(&m->hotplug);
	if (r < 0)
		return r;
	if (m->restart) {
		odpd_restart_restore(m, m->restart, &m->fdstore);
		m->restart = NULL;
		odpd_client_read_oneway_first(m);
	}
	r = listen_socket(m, &m->fdstore);
	if (r >= 0 && m->cfg.live_restart && !odpd_restart_unavailable(m))
		odpd_restart_journal_start(m);
	/* What the journal does not name goes (from systemd's store too). */
	odpd_fdstore_release_unused(&m->fdstore, odpd_restart_in_use, m);
	if (r < 0)
		return r;
	r = m->cfg.no_bus ? 0 : odpd_bus_start(m);
	if (r < 0)
		return r;
	r = watchdog_start(m);
	if (r < 0)
		return r;
	m->ev_hup = evsignal_new(m->base, SIGHUP, on_hup, m);
	if (!m->ev_hup || event_add(m->ev_hup, NULL) < 0)
		return log_errno(LOG_ERR, ENOMEM, "signal event");
#ifdef ODPD_REQUEST_STAGES
	m->ev_stages = evsignal_new(m->base, SIGUSR2, on_stages, m);
	if (!m->ev_stages || event_add(m->ev_stages, NULL) < 0)
		return log_errno(LOG_ERR, ENOMEM, "signal event");
#endif
	m->ev_listen = event_new(m->base, m->listen_fd, EV_READ | EV_PERSIST, odpd_client_accept, m);
	if (!m->ev_listen || event_add(m->ev_listen, NULL) < 0)
		return log_errno(LOG_ERR, ENOMEM, "listen event");
	for (int i = 0; i < 2; i++) {
		m->ev_signals[i] = evsignal_new(m->base, sigs[i], on_signal, m);
		if (!m->ev_signals[i] || event_add(m->ev_signals[i], NULL) < 0)
			return log_errno(LOG_ERR, ENOMEM, "signal event");
	}
	return 0;
}

void odpd_manager_finish(struct odpd_manager *m)
{
	if (m->ev_reap)
		odpd_client_on_reap(-1, 0, m);    /* (a loop that ended with clients to reap) */
	if (m->ev_watchdog)
		event_free(m->ev_watchdog);
	if (m->ev_wedge)
		event_free(m->ev_wedge);
	if (m->ev_hup)
		event_free(m->ev_hup);
	if (m->ev_stages)
		event_free(m->ev_stages);
	odpd_pool_free(m->pool);              /* runs what is left (start-up failures) */
	odpd_bus_stop(m);                     /* after the last Flush() was answered */
	odpd_registry_finish(&m->registry);
	odpd_journal_stop();                  /* (after the PDs: their fds left the store) */
	odpd_conf_free(&m->conf);
	if (m->ev_stop)
		event_free(m->ev_stop);
	if (m->ev_quiesce)
		event_free(m->ev_quiesce);
	odpd_restart_free(m->restart);
	if (m->fdstore.listen_fd >= 0)
		close(m->fdstore.listen_fd);
	odpd_fdstore_release(&m->fdstore);
	if (m->ev_listen_resume)
		event_free(m->ev_listen_resume);
	if (m->ev_reap)
		event_free(m->ev_reap);
	for (int i = 0; i < 2; i++)
		if (m->ev_signals[i])
			event_free(m->ev_signals[i]);
	if (m->ev_listen)
		event_free(m->ev_listen);
	if (m->listen_fd >= 0)
		close(m->listen_fd);
	if (m->unlink_socket)
		unlink(m->cfg.socket_path);
	odpd_hotplug_stop(&m->hotplug);
	odpd_devices_close(&m->devices);
	odpd_window_free(m->segs.window);
	free(m->rbuf);
	free(m->arena.buf);
	if (m->base)
		event_base_free(m->base);
}
