/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <string.h>
#include <unistd.h>
#include <systemd/sd-daemon.h>

#include "bus.h"
#include "conf.h"
#include "config.h"
#ifdef ODPD_FAULT_INJECTION
#include <event2/event.h>
#include "fault.h"
#endif
#include "log.h"
#include "manager.h"
#include "odpd-wire.h"

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: odpd [OPTION]...\n"
		"Register RDMA memory for client processes.\n\n"
		"  --socket PATH             listening socket (default %s)\n"
		"  --config PATH             configuration file (default %s)\n"
		"  --foreground              accepted for compatibility: odpd never daemonizes itself\n"
		"  --device NAME             use this RDMA device (repeatable; default all)\n"
		"  --workers N               registration worker threads (default 2)\n"
		"  --max-segment-size BYTES  largest segment (default 64G)\n"
		"  --window-size BYTES       address window for segments (default 4T)\n"
		"  --verify-buffer BYTES     largest verify bounce buffer of a client (default 1M)\n"
		"  --verify-idle-ms MS       free a client's idle verifier after MS (default 1000; 0: after each verify)\n"
		"  --max-clients N           most client connections at a time (default 1024)\n"
		"  --admin-group GROUP       group allowed admin requests besides root\n"
		"  --log-level LEVEL         err, warning, notice, info, debug (default info)\n"
		"  --no-bus                  no D-Bus (org.odpd1), even where there is a system bus\n"
		"  --no-live-restart         keep no journal in systemd's fd store: a restart or a\n"
		"                            crash releases every MR instead of handing them on\n"
		"  --bus-introspect          print the D-Bus introspection XML and exit\n"
		"  --check-config            read the configuration file, report what is wrong\n"
		"                            (FILE:LINE) and exit: 0 valid, 1 not\n"
		"  -h, --help                print this help and exit\n"
		"  -V, --version             print the version and exit\n",
		ODPD_SOCKET_DEFAULT, ODPD_CONF_DEFAULT);
}

/* "64G", "1M", "4096": bytes, with binary K/M/G/T suffixes. */
static int parse_size(const char *s, uint64_t *ret)
{
	static const char suffixes[] = "KMGT";
	char *end;
	unsigned shift = 0;
	uint64_t v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		return -EINVAL;
	if (*end) {
		const char *p = strchr(suffixes, *end);
		if (!p || end[1])
			return -EINVAL;
		shift = 10 * (unsigned)(p - suffixes + 1);
	}
	if (shift && v > (UINT64_MAX >> shift))
		return -EINVAL;
	*ret = v << shift;
	return 0;
}

static int parse_uint(const char *s, unsigned min, unsigned *ret)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || *s == '-' || v < min || v > 1u << 20)
		return -EINVAL;
	*ret = (unsigned)v;
	return 0;
}

enum { OPT_SOCKET = 256, OPT_FOREGROUND, OPT_DEVICE, OPT_WORKERS, OPT_MAX_SEGMENT,
       OPT_WINDOW, OPT_VERIFY_BUFFER, OPT_VERIFY_IDLE, OPT_MAX_CLIENTS, OPT_ADMIN_GROUP, OPT_LOG_LEVEL,
       OPT_HELP, OPT_VERSION, OPT_CONFIG, OPT_NO_BUS, OPT_BUS_INTROSPECT, OPT_CHECK_CONFIG, OPT_NO_LIVE_RESTART };

/* A bad command line: odpd exits with this, after one line that says what
 * is wrong and one that says where to look. */
#define EXIT_USAGE 2

static void usage_hint(void)
{
	fputs("Try 'odpd --help' for more information.\n", stderr);
}

static int parse_args(int argc, char **argv, struct odpd_config *cfg)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, OPT_SOCKET },
		{ "foreground", no_argument, NULL, OPT_FOREGROUND },
		{ "device", required_argument, NULL, OPT_DEVICE },
		{ "workers", required_argument, NULL, OPT_WORKERS },
		{ "max-segment-size", required_argument, NULL, OPT_MAX_SEGMENT },
		{ "window-size", required_argument, NULL, OPT_WINDOW },
		{ "verify-buffer", required_argument, NULL, OPT_VERIFY_BUFFER },
		{ "verify-idle-ms", required_argument, NULL, OPT_VERIFY_IDLE },
		{ "max-clients", required_argument, NULL, OPT_MAX_CLIENTS },
		{ "admin-group", required_argument, NULL, OPT_ADMIN_GROUP },
		{ "log-level", required_argument, NULL, OPT_LOG_LEVEL },
		{ "help", no_argument, NULL, OPT_HELP },
		{ "version", no_argument, NULL, OPT_VERSION },
		{ "config", required_argument, NULL, OPT_CONFIG },
		{ "no-bus", no_argument, NULL, OPT_NO_BUS },
		{ "bus-introspect", no_argument, NULL, OPT_BUS_INTROSPECT },
		{ "check-config", no_argument, NULL, OPT_CHECK_CONFIG },
		{ "no-live-restart", no_argument, NULL, OPT_NO_LIVE_RESTART },
		{ 0 }
	};
	int c, r = 0;

	while ((c = getopt_long(argc, argv, "hV", opts, NULL)) != -1) {
		switch (c) {
		case 'h': c = OPT_HELP; break;
		case 'V': c = OPT_VERSION; break;
		default: break;
		}
		switch (c) {
		case OPT_SOCKET: cfg->socket_path = optarg; break;
		case OPT_CONFIG: cfg->config_path = optarg; cfg->config_given = true; break;
		case OPT_FOREGROUND: cfg->foreground = true; break;
		case OPT_NO_BUS: cfg->no_bus = true; break;
		case OPT_NO_LIVE_RESTART: cfg->live_restart = false; break;
		case OPT_CHECK_CONFIG: cfg->check_config = true; break;
		case OPT_BUS_INTROSPECT:
			r = odpd_bus_introspect(stdout);
			if (r < 0)
				fprintf(stderr, "odpd: --bus-introspect: %s\n", strerror(-r));
			exit(r < 0 ? EXIT_FAILURE : EXIT_SUCCESS);
		case OPT_DEVICE: cfg->devices[cfg->n_devices++] = optarg; break;
		case OPT_WORKERS: r = parse_uint(optarg, 1, &cfg->workers); break;
		case OPT_MAX_SEGMENT: r = parse_size(optarg, &cfg->max_segment_size); break;
		case OPT_WINDOW: r = parse_size(optarg, &cfg->window_size); break;
		case OPT_VERIFY_BUFFER: r = parse_size(optarg, &cfg->verify_buffer); break;
		case OPT_VERIFY_IDLE: r = parse_uint(optarg, 0, &cfg->verify_idle_ms); break;
		case OPT_MAX_CLIENTS: r = parse_uint(optarg, 1, &cfg->max_clients); break;
		case OPT_ADMIN_GROUP: {
			struct group *g = getgrnam(optarg);
			if (!g) {
				fprintf(stderr, "odpd: --admin-group: no group named %s\n", optarg);
				usage_hint();
				return -EINVAL;
			}
			cfg->has_admin_gid = true;
			cfg->admin_gid = g->gr_gid;
			break;
		}
		case OPT_LOG_LEVEL:
			r = cfg->log_level = log_parse_level(optarg);
			break;
		case OPT_HELP: usage(stdout); exit(EXIT_SUCCESS);
		case OPT_VERSION: printf("odpd %s\n", ODPD_VERSION); exit(EXIT_SUCCESS);
		default: usage_hint(); return -EINVAL;     /* getopt said what */
		}
		if (r < 0) {
			fprintf(stderr, "odpd: invalid value for --%s: %s\n", opts[c - OPT_SOCKET].name, optarg);
			usage_hint();
			return r;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "odpd: unexpected argument %s\n", argv[optind]);
		usage_hint();
		return -EINVAL;
	}
	if (cfg->verify_buffer < 4096 || cfg->verify_buffer > (1u << 30) ||
	    cfg->max_segment_size > cfg->window_size) {
		fprintf(stderr, "odpd: need 4K <= --verify-buffer <= 1G and --max-segment-size <= --window-size\n");
		usage_hint();
		return -EINVAL;
	}
	return 0;
}

/*
 * Clients make odpd hold fds (connections, segments, imported contexts, fds
 * queued in replies): take the whole hard limit of RLIMIT_NOFILE, as
 * systemd recommends for daemons that need many (the soft limit stays 1024
 * for select() users; odpd uses epoll through libevent).
 */
static void raise_nofile(void)
{
	struct rlimit rl;
	rlim_t soft;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= rl.rlim_max)
		return;
	soft = rl.rlim_cur;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
		log_errno(LOG_WARNING, errno, "raising RLIMIT_NOFILE to its hard limit");
	else
		log_info("RLIMIT_NOFILE raised from %llu to %llu", (unsigned long long)soft,
			 (unsigned long long)rl.rlim_max);
}

/*
 * --check-config: read the configuration file as start-up and reload do,
 * say what is wrong (PATH:LINE: ...) or that it is valid, and exit 0 or 1.
 * Names that do not resolve yet are warnings (odpd.conf(5), USERS AND
 * GROUPS): odpd would start with them.
 */
static int check_config(const struct odpd_config *cfg)
{
	uint64_t mem = odpd_meminfo_total();
	struct odpd_conf c;
	char msg[512];
	int r;

	odpd_conf_defaults(&c, mem);
	r = odpd_conf_load(&c, cfg->config_path, cfg->config_given, mem, msg, sizeof(msg));
	if (r < 0) {
		fprintf(stderr, "odpd: %s\n", msg);
	} else {
		for (unsigned i = 0; i < odpd_conf_n_unresolved(&c); i++) {
			odpd_conf_unresolved_text(&c, i, msg, sizeof(msg));
			fprintf(stderr, "odpd: warning: %s\n", msg);
		}
		if (c.path)
			printf("%s: valid\n", c.path);
		else
			printf("%s: no such file; odpd would use the built-in defaults\n", cfg->config_path);
	}
	odpd_conf_free(&c);
	return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}

int main(int argc, char **argv)
{
	struct odpd_manager m = {
		.cfg = {
			.socket_path = ODPD_SOCKET_DEFAULT,
			.workers = 2,
			.max_segment_size = 64ull << 30,
			.window_size = 4ull << 40,
			.verify_buffer = 1u << 20,
			.verify_idle_ms = 1000,
			.max_clients = 1024,
			.max_segments = 1024,
			.max_mrs = 65536,
			.log_level = LOG_INFO,
			.config_path = ODPD_CONF_DEFAULT,
			.live_restart = true,
		},
	};
	int r;

#ifdef ODPD_FAULT_INJECTION
	/* a test build: libevent's allocations too go through fault.c's malloc */
	odpd_fault_init();
	event_set_mem_functions(malloc, realloc, free);
#endif
	argv[0] = program_invocation_short_name;        /* getopt's complaints: "odpd: ..." */
	m.cfg.devices = calloc((size_t)argc, sizeof(char *));
	if (!m.cfg.devices)
		return EXIT_FAILURE;
	if (parse_args(argc, argv, &m.cfg) < 0) {
		free(m.cfg.devices);
		return EXIT_USAGE;
	}
	if (m.cfg.check_config) {
		r = check_config(&m.cfg);
		free(m.cfg.devices);
		return r;
	}
	log_setup(m.cfg.log_level);
	raise_nofile();
	r = odpd_manager_start(&m);
	if (r == 0) {
		sd_notifyf(0, "READY=1\nSTATUS=Serving %u device(s)\nMAINPID=%d", m.devices.n_live, (int)getpid());
		log_notice("odpd %s ready: %u device(s)", ODPD_VERSION, m.devices.n_live);
		event_base_dispatch(m.base);
	}
	sd_notify(0, "STOPPING=1");
	if (m.handed_over) {
		/* The kernel objects stay with the fds in systemd's store:
		 * nothing is released, nothing deregistered. */
		log_info("stopped; the next odpd takes over");
		fflush(NULL);
		_exit(EXIT_SUCCESS);
	}
	odpd_manager_finish(&m);
	free(m.cfg.devices);
	log_info("stopped");
	return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
