/* SPDX-License-Identifier: MIT */
/*
 * odpctl - look at a running odpd and flush its registration cache.
 *
 * Speaks the wire protocol directly (proto/odpd-wire.h), not through
 * libodpd: a Hello, then admin requests (one, or one per page of ListMrs),
 * each answered by one Reply. Human tables by default, one JSON object with
 * --json. In the newer JSON (mrs, flush, and status's cache, odp, quotas and
 * totals.max_pinned) every uint64 field is a decimal string: JSON readers
 * such as jq and JavaScript round integers above 2^53.
 */
#include "odpctl.h"

/* -------------------------------------------------------------------- main */

struct command {
	const char *name;
	int (*run)(int sock, const struct options *o);
	bool filters;                /* takes --pid and --pd */
	const char *args;            /* its options, for its --help */
	const char *help;            /* what it does, for its --help */
};

static const struct command commands[] = {
	{ "status", cmd_status, false, "[-j]",
	  "Show odpd's devices, connected clients (by id), shared PDs, pinning quotas,\n"
	  "registration cache and on-demand paging counters, and totals.\n" },
	{ "mrs", cmd_mrs, true, "[-j] [--pid PID] [--pd NAME]",
	  "List the MRs of odpd's registration cache: range, length, access, kind,\n"
	  "keys, holders, state, generation. --pid: those process PID holds or last\n"
	  "released; --pd: those of the shared PD NAME.\n" },
	{ "flush", cmd_flush, true, "[-j] [--pid PID] [--pd NAME]",
	  "Deregister relaxed MRs (released, kept registered for reuse) now and wait\n"
	  "until they are (up to 120 s); prints the MRs and bytes released. MRs that\n"
	  "clients hold are not touched. --pid, --pd: only the relaxed MRs of that\n"
	  "process or shared PD.\n" },
	{ "clients", cmd_clients, false, "[-j]",
	  "List the connected clients, by id: pid, uid, name, PD, segments, MRs,\n"
	  "relaxed MRs, pinned bytes (ODP MRs pin nothing and count in no PINNED).\n" },
	{ "verify", cmd_verify, true, "[-j] [--pid PID] [--pd NAME]",
	  "Read every live MR of every client (or those --pid and --pd select) back\n"
	  "through the HCA (RDMA READ, or WRITE from the lkey for local-only MRs) and\n"
	  "print its CRC-32. This reads all of the registered memory over the device:\n"
	  "on a busy production node it takes bandwidth and time. Exit status 1 if\n"
	  "any MR could not be read.\n" },
	{ "stats", cmd_stats, false, "[-j | --prometheus]",
	  "Print odpd's counters as one flat set (the same numbers as its D-Bus\n"
	  "properties); --prometheus: the Prometheus text format, for node_exporter's\n"
	  "textfile collector.\n" },
	{ "reload", cmd_reload, false, "[-j]",
	  "Make odpd read its configuration file again (as SIGHUP does). On an error\n"
	  "in the file odpd keeps the configuration in use; odpctl prints FILE:LINE\n"
	  "and exits 1.\n" },
};

/* "odpctl CMD --help". */
static void command_usage(const struct command *c)
{
	printf("Usage: odpctl [-s PATH] %s %s\n\n%s\n"
	       "  -s, --socket PATH odpd's socket (default: $%s, else %s)\n"
	       "  -j, --json        print JSON instead of tables\n%s%s"
	       "\nSee odpctl(8).\n", c->name, c->args, c->help, ODPD_SOCKET_ENV, ODPD_SOCKET_DEFAULT,
	       c->filters ? "      --pid PID     only the MRs of process PID\n"
			    "      --pd NAME     only the MRs of the shared PD NAME\n" : "",
	       c->run == cmd_stats ? "      --prometheus  the Prometheus text format\n" : "");
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: odpctl [OPTIONS] COMMAND\n"
		"\n"
		"Show the state of the odpd RDMA registration daemon, flush its cache.\n"
		"\n"
		"Commands (admin: root or odpd --admin-group):\n"
		"  status            devices, clients, shared PDs, pinning quotas,\n"
		"                    registration cache and totals\n"
		"  mrs               the MRs of the registration cache\n"
		"  flush             deregister relaxed MRs now and wait until they are;\n"
		"                    prints the MRs and bytes released\n"
		"  clients           the connected clients\n"
		"  stats             the daemon's counters (also on D-Bus: org.odpd1)\n"
		"  verify            read every live MR of every client back through the\n"
		"                    HCA (CRC-32): reads all registered memory\n"
		"  reload            re-read odpd's configuration file (as SIGHUP does)\n"
		"\n"
		"Options:\n"
		"  -s, --socket PATH odpd's socket (default: $%s, else %s)\n"
		"  -j, --json        print one JSON object instead of tables\n"
		"      --pid PID     mrs, flush, verify: only the MRs of process PID\n"
		"      --pd NAME     mrs, flush, verify: only the MRs of the shared PD NAME\n"
		"      --prometheus  stats: the Prometheus text format (node_exporter's\n"
		"                    textfile collector)\n"
		"  -h, --help        show this help; COMMAND --help: that command's\n"
		"  -V, --version     show the version\n"
		"\n"
		"Exit status: 0 done, 1 refused by odpd (or another failure), 2 usage,\n"
		"3 odpd not running, 4 access denied. See odpctl(8).\n",
		ODPD_SOCKET_ENV, ODPD_SOCKET_DEFAULT);
}

/* --pid: a decimal process id, 1 .. INT32_MAX. */
static int parse_pid(const char *s, int32_t *ret)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || *s == '-' || *s == '+' || v < 1 || v > INT32_MAX) {
		fprintf(stderr, "odpctl: --pid: '%s' is not a process id\n", s);
		return -1;
	}
	*ret = (int32_t)v;
	return 0;
}

/* --pd: 1..63 bytes of [A-Za-z0-9._:@-], as JoinPd.name. */
static int check_pd_name(const char *s)
{
	size_t len = strlen(s);

	if (len >= 1 && len <= PD_NAME_MAX &&
	    strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:@-") == len)
		return 0;
	fprintf(stderr, "odpctl: --pd: '%s' is not a shared PD name "
		"(1..%d bytes of A-Z a-z 0-9 . _ : @ -)\n", s, PD_NAME_MAX);
	return -1;
}

/* Returns -1 to exit with EXIT_USAGE, 1 to exit with 0, 0 to go on. */
static int parse_args(int argc, char **argv, struct options *o)
{
	enum { OPT_PID = 0x100, OPT_PD, OPT_PROMETHEUS };
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },
		{ "pid", required_argument, NULL, OPT_PID },
		{ "pd", required_argument, NULL, OPT_PD },
		{ "prometheus", no_argument, NULL, OPT_PROMETHEUS },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	bool help = false;
	int c;

	while ((c = getopt_long(argc, argv, "s:jhV", longopts, NULL)) != -1) {
		switch (c) {
		case 's':
			if (!*optarg) {
				fputs("odpctl: --socket: empty path\n", stderr);
				return -1;
			}
			o->socket = optarg;
			break;
		case 'j':
			o->json = true;
			break;
		case OPT_PID:
			if (parse_pid(optarg, &o->pid) < 0)
				return -1;
			o->has_pid = true;
			break;
		case OPT_PD:
			if (check_pd_name(optarg) < 0)
				return -1;
			o->pd = optarg;
			break;
		case OPT_PROMETHEUS:
			o->prometheus = true;
			break;
		case 'h':
			help = true;
			break;
		case 'V':
			printf("odpctl %s (protocol %u)\n", ODPD_VERSION, ODPD_PROTOCOL_VERSION);
			return 1;
		default:
			return -1;
		}
	}
	if (help && optind >= argc) {
		usage(stdout);
		return 1;
	}
	if (optind >= argc) {
		fputs("odpctl: no command given\n", stderr);
		return -1;
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (strcmp(argv[optind], commands[i].name) == 0)
			o->cmd = &commands[i];
	if (!o->cmd) {
		fprintf(stderr, "odpctl: unknown command '%s'\n", argv[optind]);
		return -1;
	}
	if (help) {
		command_usage(o->cmd);
		return 1;
	}
	if (optind + 1 < argc) {
		fprintf(stderr, "odpctl: %s: unexpected argument '%s'\n", o->cmd->name,
			argv[optind + 1]);
		return -1;
	}
	if (o->prometheus && (o->cmd->run != cmd_stats || o->json)) {
		fprintf(stderr, "odpctl: %s: --prometheus applies only to stats, without --json\n",
			o->cmd->name);
		return -1;
	}
	if (!o->cmd->filters && (o->has_pid || o->pd)) {
		fprintf(stderr, "odpctl: %s: --pid and --pd apply only to mrs, flush and verify\n",
			o->cmd->name);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct options o = { 0 };
	int r, sock;

	/* getopt's complaints name argv[0]: the program, not its path */
	argv[0] = program_invocation_short_name;
	r = parse_args(argc, argv, &o);
	if (r < 0) {
		fputs("Try 'odpctl --help'.\n", stderr);
		return EXIT_USAGE;
	}
	if (r > 0)
		return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
	if (!o.socket) {
		o.socket = getenv(ODPD_SOCKET_ENV);
		if (!o.socket || !*o.socket)
			o.socket = ODPD_SOCKET_DEFAULT;     /* unset or empty: the default */
	}

	sock = connect_daemon(o.socket);
	if (sock < 0)
		return fail_status;
	r = hello(sock) < 0 ? EXIT_FAILURE : o.cmd->run(sock, &o);
	close(sock);
	if (r != EXIT_SUCCESS)
		r = fail_status;

	errno = 0;
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fail("stdout", errno ? errno : EIO, NULL);
		return EXIT_FAILURE;
	}
	return r;
}
