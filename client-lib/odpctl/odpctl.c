/* SPDX-License-Identifier: MIT */
/*
 * odpctl - look at a running odpd.
 *
 * Speaks the wire protocol directly (proto/odpd-wire.h), not through
 * libodpd: a Hello, then one admin request, each answered by one Reply.
 * Human tables by default, one JSON object with --json.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <json.h>

#include "config.h"
#include "odpd-wire.h"


/* How long to wait for the daemon to answer one request. */
#define TIMEOUT_SEC 10

#define EXIT_USAGE 2

struct options {
	const char *socket;
	bool json;
};

static void oom(void)
{
	fputs("odpctl: out of memory\n", stderr);
	exit(EXIT_FAILURE);
}

/* "odpctl: <what>: <strerror(err)>[: <fmt...>]" on stderr. */
__attribute__((format(printf, 3, 4)))
static void fail(const char *what, int err, const char *fmt, ...)
{
	fprintf(stderr, "odpctl: %s: %s", what, strerror(err));
	if (fmt && *fmt) {
		va_list ap;

		va_start(ap, fmt);
		fputs(": ", stderr);
		vfprintf(stderr, fmt, ap);
		va_end(ap);
	}
	fputc('\n', stderr);
}

/* ------------------------------------------------------------ formatting */

#define HUMAN_LEN 24

/* 1536 -> "1.5 KiB", 4294967296 -> "4 GiB". */
static const char *human_bytes(uint64_t v, char buf[static HUMAN_LEN])
{
	static const char units[] = "KMGTPE";
	double d = (double)v;
	unsigned i = 0;

	while (i < 6 && d >= 1023.95) {
		d /= 1024;
		i++;
	}
	if (i == 0)
		snprintf(buf, HUMAN_LEN, "%" PRIu64 " B", v);
	else if (v % (UINT64_C(1) << (10 * i)) == 0)
		snprintf(buf, HUMAN_LEN, "%" PRIu64 " %ciB", v >> (10 * i), units[i - 1]);
	else
		snprintf(buf, HUMAN_LEN, "%.1f %ciB", d, units[i - 1]);
	return buf;
}

/* IBV_ODP_SUPPORT_* bits -> "SEND|RECV|...", unknown bits in hex, "-" for none. */
static const char *odp_caps(uint32_t caps, char buf[static 64])
{
	static const struct {
		uint32_t bit;
		const char *name;
	} names[] = {
		{ IBV_ODP_SUPPORT_SEND, "SEND" },
		{ IBV_ODP_SUPPORT_RECV, "RECV" },
		{ IBV_ODP_SUPPORT_WRITE, "WRITE" },
		{ IBV_ODP_SUPPORT_READ, "READ" },
		{ IBV_ODP_SUPPORT_ATOMIC, "ATOMIC" },
		{ IBV_ODP_SUPPORT_SRQ_RECV, "SRQ" },
	};
	size_t n = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (!(caps & names[i].bit))
			continue;
		caps &= ~names[i].bit;
		n += snprintf(buf + n, 64 - n, "%s%s", n ? "|" : "", names[i].name);
	}
	if (caps)
		snprintf(buf + n, 64 - n, "%s0x%" PRIx32, n ? "|" : "", caps);
	return buf[0] ? buf : "-";
}

static const char *support_name(Odpd__Support s)
{
	switch (s) {
	case ODPD__SUPPORT__SUPPORT_YES: return "yes";
	case ODPD__SUPPORT__SUPPORT_NO: return "no";
	default: return "unknown";
	}
}

/* "yes", "unknown" or "no (EOPNOTSUPP)". */
static const char *support_text(Odpd__Support s, int err, char buf[static 48])
{
	if (s != ODPD__SUPPORT__SUPPORT_NO)
		return support_name(s);
	const char *name = err > 0 ? strerrorname_np(err) : NULL;
	if (name)
		snprintf(buf, 48, "no (%s)", name);
	else
		snprintf(buf, 48, "no (errno %d)", err);
	return buf;
}

static const char *yes_no(bool b)
{
	return b ? "yes" : "no";
}

/* ---------------------------------------------------------------- tables */

/*
 * Cells are added row by row, the first row usually being the header;
 * columns are as wide as their widest cell, two spaces apart. Control
 * characters in cells (names come from clients) are shown as '?'.
 */
#define TABLE_MAX_COLS 16

struct table {
	size_t ncols;                /* 1 .. TABLE_MAX_COLS */
	size_t ncells;
	char **cells;
};

__attribute__((format(printf, 2, 3)))
static void table_add(struct table *t, const char *fmt, ...)
{
	va_list ap;
	char *s;

	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) < 0)
		oom();
	va_end(ap);
	for (char *p = s; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';

	char **cells = realloc(t->cells, (t->ncells + 1) * sizeof(*cells));
	if (!cells)
		oom();
	t->cells = cells;
	t->cells[t->ncells++] = s;
}

/* Print and empty @t. A table of at most one row (its header) prints "(none)". */
static void table_print(struct table *t, const char *title)
{
	size_t width[TABLE_MAX_COLS] = { 0 };

	printf("%s:\n", title);
	if (t->ncells <= t->ncols) {
		puts("  (none)");
	} else {
		for (size_t i = 0; i < t->ncells; i++) {
			size_t len = strlen(t->cells[i]);
			if (len > width[i % t->ncols])
				width[i % t->ncols] = len;
		}
		for (size_t i = 0; i < t->ncells; i++) {
			size_t col = i % t->ncols;
			if (col == 0)
				fputs("  ", stdout);
			if (col + 1 < t->ncols)
				printf("%-*s  ", (int)width[col], t->cells[i]);
			else
				printf("%s\n", t->cells[i]);
		}
	}
	for (size_t i = 0; i < t->ncells; i++)
		free(t->cells[i]);
	free(t->cells);
	t->cells = NULL;
	t->ncells = 0;
}

/* ------------------------------------------------------------ human output */

static void print_devices(const Odpd__StatusReply *st)
{
	struct table t = { .ncols = 9 };

	table_add(&t, "DEVICE");
	table_add(&t, "TRANSPORT");
	table_add(&t, "PORTS");
	table_add(&t, "ODP");
	table_add(&t, "IMPLICIT_ODP");
	table_add(&t, "ADVISE_MR");
	table_add(&t, "IMPORT");
	table_add(&t, "MAX_MR_SIZE");
	table_add(&t, "ODP_RC_CAPS");
	for (size_t i = 0; i < st->n_devices; i++) {
		const Odpd__Device *d = st->devices[i];
		char b1[48], b2[48], b3[HUMAN_LEN], b4[64];

		table_add(&t, "%s", d->name ? d->name : "-");
		table_add(&t, "%s", d->transport ? d->transport : "-");
		table_add(&t, "%" PRIu32, d->phys_port_cnt);
		table_add(&t, "%s", yes_no(d->odp));
		table_add(&t, "%s", yes_no(d->implicit_odp));
		table_add(&t, "%s", support_text(d->advise_mr, d->advise_mr_errno, b1));
		table_add(&t, "%s", support_text(d->import, d->import_errno, b2));
		table_add(&t, "%s", human_bytes(d->max_mr_size, b3));
		table_add(&t, "%s", odp_caps(d->odp_rc_caps, b4));
	}
	table_print(&t, "Devices");
}

static void print_clients(const Odpd__StatusReply *st)
{
	struct table t = { .ncols = 7 };

	table_add(&t, "ID");
	table_add(&t, "PID");
	table_add(&t, "UID");
	table_add(&t, "NAME");
	table_add(&t, "SEGMENTS");
	table_add(&t, "MRS");
	table_add(&t, "PINNED");
	for (size_t i = 0; i < st->n_clients; i++) {
		const Odpd__ClientInfo *c = st->clients[i];
		char b[HUMAN_LEN];

		table_add(&t, "%" PRIu64, c->id);
		table_add(&t, "%" PRId32, c->pid);
		table_add(&t, "%" PRIu32, c->uid);
		table_add(&t, "%s", c->name && *c->name ? c->name : "-");
		table_add(&t, "%" PRIu32, c->segments);
		table_add(&t, "%" PRIu32, c->mrs);
		table_add(&t, "%s", human_bytes(c->pinned_bytes, b));
	}
	table_print(&t, "Clients");
}

static void print_totals(const Odpd__StatusReply *st)
{
	struct table t = { .ncols = 2 };
	char b[HUMAN_LEN];

	table_add(&t, "Segments:");
	table_add(&t, "%" PRIu32, st->segments);
	table_add(&t, "Segment bytes:");
	table_add(&t, "%s", human_bytes(st->segment_bytes, b));
	table_add(&t, "MRs:");
	table_add(&t, "%" PRIu32, st->mrs);
	table_add(&t, "Pinned bytes:");
	table_add(&t, "%s", human_bytes(st->pinned_bytes, b));
	table_add(&t, "Registrations:");
	table_add(&t, "%" PRIu64, st->registrations);
	table_add(&t, "Deregistrations:");
	table_add(&t, "%" PRIu64, st->deregistrations);
	table_add(&t, "Errors:");
	table_add(&t, "%" PRIu64, st->errors);
	table_add(&t, "Clients releasing:");
	table_add(&t, "%" PRIu32, st->releasing);
	table_add(&t, "Daemon PID:");
	table_add(&t, "%" PRId32, st->daemon_pid);
	table_add(&t, "Daemon version:");
	table_add(&t, "%s", st->daemon_version ? st->daemon_version : "-");
	table_print(&t, "Totals");
}

static void print_human(const Odpd__StatusReply *st)
{
	print_devices(st);
	putchar('\n');
	print_clients(st);
	putchar('\n');
	print_totals(st);
}

/* ------------------------------------------------------------- JSON output */

static void put_u64(json_object *o, const char *key, uint64_t v)
{
	json_object_object_add(o, key, json_object_new_uint64(v));
}

static void put_i64(json_object *o, const char *key, int64_t v)
{
	json_object_object_add(o, key, json_object_new_int64(v));
}

static void put_str(json_object *o, const char *key, const char *v)
{
	json_object_object_add(o, key, json_object_new_string(v ? v : ""));
}

static void put_bool(json_object *o, const char *key, bool v)
{
	json_object_object_add(o, key, json_object_new_boolean(v));
}

static json_object *json_device(const Odpd__Device *d)
{
	json_object *o = json_object_new_object();

	put_str(o, "name", d->name);
	put_u64(o, "node_guid", d->node_guid);
	put_str(o, "transport", d->transport);
	put_str(o, "fw_ver", d->fw_ver);
	put_u64(o, "phys_port_cnt", d->phys_port_cnt);
	put_u64(o, "max_mr_size", d->max_mr_size);
	put_u64(o, "odp_general_caps", d->odp_general_caps);
	put_u64(o, "odp_rc_caps", d->odp_rc_caps);
	put_u64(o, "odp_uc_caps", d->odp_uc_caps);
	put_u64(o, "odp_ud_caps", d->odp_ud_caps);
	put_bool(o, "odp", d->odp);
	put_bool(o, "implicit_odp", d->implicit_odp);
	put_str(o, "advise_mr", support_name(d->advise_mr));
	put_i64(o, "advise_mr_errno", d->advise_mr_errno);
	put_str(o, "import", support_name(d->import));
	put_i64(o, "import_errno", d->import_errno);
	return o;
}

static json_object *json_client(const Odpd__ClientInfo *c)
{
	json_object *o = json_object_new_object();

	put_u64(o, "id", c->id);
	put_i64(o, "pid", c->pid);
	put_u64(o, "uid", c->uid);
	put_u64(o, "gid", c->gid);
	put_str(o, "name", c->name);
	put_u64(o, "segments", c->segments);
	put_u64(o, "segment_bytes", c->segment_bytes);
	put_u64(o, "mrs", c->mrs);
	put_u64(o, "pinned_bytes", c->pinned_bytes);
	return o;
}

static void print_json(const Odpd__StatusReply *st)
{
	json_object *root = json_object_new_object();
	json_object *daemon = json_object_new_object();
	json_object *devices = json_object_new_array();
	json_object *clients = json_object_new_array();
	json_object *totals = json_object_new_object();

	if (!root || !daemon || !devices || !clients || !totals)
		oom();
	put_str(daemon, "version", st->daemon_version);
	put_i64(daemon, "pid", st->daemon_pid);
	for (size_t i = 0; i < st->n_devices; i++)
		json_object_array_add(devices, json_device(st->devices[i]));
	for (size_t i = 0; i < st->n_clients; i++)
		json_object_array_add(clients, json_client(st->clients[i]));
	put_u64(totals, "segments", st->segments);
	put_u64(totals, "segment_bytes", st->segment_bytes);
	put_u64(totals, "mrs", st->mrs);
	put_u64(totals, "pinned_bytes", st->pinned_bytes);
	put_u64(totals, "registrations", st->registrations);
	put_u64(totals, "deregistrations", st->deregistrations);
	put_u64(totals, "errors", st->errors);
	put_u64(totals, "releasing", st->releasing);
	json_object_object_add(root, "daemon", daemon);
	json_object_object_add(root, "devices", devices);
	json_object_object_add(root, "clients", clients);
	json_object_object_add(root, "totals", totals);
	puts(json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
					    JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(root);
}

/* ----------------------------------------------------------------- talking */

/* Returns a connected socket, or -1 after printing why. */
static int connect_daemon(const char *path)
{
	struct timeval tv = { .tv_sec = TIMEOUT_SEC };
	int sock, err;
	char *what;

	if (asprintf(&what, "connect to %s", path) < 0)
		oom();
	sock = odpd_wire_connect(path);
	if (sock >= 0 && (setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
			  setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)) {
		err = errno;
		close(sock);
		sock = -err;
	}
	if (sock < 0) {
		err = -sock;
		fail(what, err, err == ENOENT || err == ECONNREFUSED ?
		     "is odpd running? (another socket: --socket or $" ODPD_SOCKET_ENV ")" : NULL);
		sock = -1;
	}
	free(what);
	return sock;
}

/*
 * Wait for the reply to request @id. Events (id 0, status 0) are skipped;
 * an error with id 0 is the daemon refusing a packet it could not read, so
 * it is ours. Returns the reply, or NULL after printing why.
 */
static Odpd__Reply *receive_reply(int sock, uint64_t id, const char *what)
{
	static uint8_t buf[ODPD_MAX_PACKET + 1];

	for (;;) {
		struct odpd_packet p;
		int r = odpd_wire_recv(sock, buf, sizeof(buf), &p, 0);

		if (r == -EAGAIN) {
			fail(what, ETIMEDOUT, "no reply from odpd within %d s", TIMEOUT_SEC);
			return NULL;
		}
		if (r < 0) {
			fail(what, -r, NULL);
			return NULL;
		}
		odpd_packet_close_fds(&p);
		if (p.eof) {
			fail(what, ECONNRESET, "odpd closed the connection");
			return NULL;
		}
		if (p.truncated || p.ctrunc) {
			fail(what, EMSGSIZE, "reply larger than %u bytes or with too many fds",
			     ODPD_MAX_PACKET);
			return NULL;
		}
		Odpd__Reply *rep = odpd__reply__unpack(NULL, p.len, buf);
		if (!rep) {
			fail(what, EBADMSG, "cannot parse odpd's reply");
			return NULL;
		}
		if (rep->id == id || (rep->id == 0 && rep->status != 0))
			return rep;
		if (rep->id != 0) {
			fail(what, EBADMSG, "reply to request %" PRIu64 ", expected %" PRIu64,
			     rep->id, id);
			odpd__reply__free_unpacked(rep, NULL);
			return NULL;
		}
		odpd__reply__free_unpacked(rep, NULL);
	}
}

/*
 * Send @req, wait for its reply, check its status and that it carries a
 * @want body. Returns the reply, or NULL after printing why.
 */
static Odpd__Reply *call(int sock, Odpd__Request *req, const char *what,
			 Odpd__Reply__BodyCase want)
{
	int r = odpd_wire_send(sock, &req->base, NULL, 0, 0);
	if (r < 0) {
		fail(what, r == -EAGAIN ? ETIMEDOUT : -r, NULL);
		return NULL;
	}

	Odpd__Reply *rep = receive_reply(sock, req->id, what);
	if (!rep)
		return NULL;
	if (rep->status != 0) {
		const char *msg = rep->message ? rep->message : "";

		fail(what, rep->status, *msg ? "%s" : NULL, msg);
		if (rep->status == EPERM && req->body_case == ODPD__REQUEST__BODY_STATUS)
			fputs("odpctl: run odpctl as root or as a member of odpd's admin group "
			      "(odpd --admin-group)\n", stderr);
	} else if (rep->body_case != want) {
		fail(what, EBADMSG, "odpd's reply lacks the expected body");
	} else {
		return rep;
	}
	odpd__reply__free_unpacked(rep, NULL);
	return NULL;
}

static int hello(int sock)
{
	Odpd__Hello body = ODPD__HELLO__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Reply *rep;

	body.has_version = true;
	body.version = ODPD_PROTOCOL_VERSION;
	body.client_name = (char *)"odpctl";
	req.has_id = true;
	req.id = 1;
	req.body_case = ODPD__REQUEST__BODY_HELLO;
	req.hello = &body;

	rep = call(sock, &req, "hello", ODPD__REPLY__BODY_HELLO);
	if (!rep)
		return -1;
	if (rep->hello->version != ODPD_PROTOCOL_VERSION) {
		fail("hello", EPROTONOSUPPORT, "odpd speaks protocol versions %" PRIu32
		     "..%" PRIu32 ", odpctl speaks %u", rep->hello->version_min,
		     rep->hello->version_max, ODPD_PROTOCOL_VERSION);
		odpd__reply__free_unpacked(rep, NULL);
		return -1;
	}
	odpd__reply__free_unpacked(rep, NULL);
	return 0;
}

static int cmd_status(int sock, const struct options *o)
{
	Odpd__Status body = ODPD__STATUS__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Reply *rep;

	req.has_id = true;
	req.id = 2;
	req.body_case = ODPD__REQUEST__BODY_STATUS;
	req.status = &body;

	rep = call(sock, &req, "status", ODPD__REPLY__BODY_STATUS_REPLY);
	if (!rep)
		return EXIT_FAILURE;
	if (o->json)
		print_json(rep->status_reply);
	else
		print_human(rep->status_reply);
	odpd__reply__free_unpacked(rep, NULL);
	return EXIT_SUCCESS;
}

/* -------------------------------------------------------------------- main */

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: odpctl [OPTIONS] COMMAND\n"
		"\n"
		"Show the state of the odpd RDMA registration daemon.\n"
		"\n"
		"Commands:\n"
		"  status            devices, clients and totals (admin)\n"
		"\n"
		"Options:\n"
		"  -s, --socket PATH odpd's socket (default: $%s, else %s)\n"
		"  -j, --json        print one JSON object instead of tables\n"
		"  -h, --help        show this help\n"
		"  -V, --version     show the version\n"
		"\n"
		"See odpctl(8).\n",
		ODPD_SOCKET_ENV, ODPD_SOCKET_DEFAULT);
}

/* Returns -1 to exit with EXIT_USAGE, 1 to exit with 0, 0 to go on. */
static int parse_args(int argc, char **argv, struct options *o)
{
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	int c;

	while ((c = getopt_long(argc, argv, "s:jhV", longopts, NULL)) != -1) {
		switch (c) {
		case 's':
			o->socket = optarg;
			break;
		case 'j':
			o->json = true;
			break;
		case 'h':
			usage(stdout);
			return 1;
		case 'V':
			printf("odpctl %s (protocol %u)\n", ODPD_VERSION, ODPD_PROTOCOL_VERSION);
			return 1;
		default:
			return -1;
		}
	}
	if (optind >= argc) {
		fputs("odpctl: no command given\n", stderr);
		return -1;
	}
	if (strcmp(argv[optind], "status") != 0) {
		fprintf(stderr, "odpctl: unknown command '%s'\n", argv[optind]);
		return -1;
	}
	if (optind + 1 < argc) {
		fprintf(stderr, "odpctl: status: unexpected argument '%s'\n", argv[optind + 1]);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct options o = { 0 };
	int r, sock;

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
			o.socket = ODPD_SOCKET_DEFAULT;
	}

	sock = connect_daemon(o.socket);
	if (sock < 0)
		return EXIT_FAILURE;
	r = hello(sock) < 0 ? EXIT_FAILURE : cmd_status(sock, &o);
	close(sock);

	errno = 0;
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fail("stdout", errno ? errno : EIO, NULL);
		return EXIT_FAILURE;
	}
	return r;
}
