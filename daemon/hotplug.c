/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <string.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>
#include <event2/event.h>
#include <systemd/sd-daemon.h>

#include "client.h"
#include "hotplug.h"
#include "log.h"
#include "manager.h"

/* A rescan at most this often: each is a walk of sysfs, and a probe per new device. */
#define RESCAN_NS 1000000000ull
/* After a node appears in /dev/infiniband: let the device finish registering. */
#define SETTLE_MS 200

/* The manager's hotplug state beyond the devices' own. */
static struct {
	int ifd;                            /* inotify */
	int wd_dir;                         /* /dev/infiniband, or -1 */
	int wd_dev;                         /* /dev, until /dev/infiniband exists */
	struct event *ev_inotify, *ev_settle;
} hp = { -1, -1, -1, NULL, NULL };

static void on_async(evutil_socket_t fd, short what, void *arg);

static int watch_start(struct odpd_manager *m, struct odpd_device *dev)
{
	struct event *ev;
	int fl = fcntl(dev->watch->async_fd, F_GETFL);

	if (fl < 0 || fcntl(dev->watch->async_fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return log_errno(LOG_ERR, errno, "%s: async event fd", dev->name);
	ev = event_new(m->base, dev->watch->async_fd, EV_READ | EV_PERSIST, on_async, m);
	if (!ev || event_add(ev, NULL) < 0) {
		if (ev)
			event_free(ev);
		return log_errno(LOG_ERR, ENOMEM, "%s: async event", dev->name);
	}
	dev->ev_watch = ev;
	return 0;
}

static void watch_stop(struct odpd_device *dev)
{
	if (dev->ev_watch)
		event_free(dev->ev_watch);
	dev->ev_watch = NULL;
}

static void status_notify(struct odpd_manager *m)
{
	sd_notifyf(0, "STATUS=Serving %u device(s)", m->devices.n_live);
}

/* Tell a client its device is gone (an event: id 0, a DeviceEvent body). */
static void notify_holder(struct odpd_holder *h, unsigned mrs, void *arg)
{
	struct odpd_client *c = (struct odpd_client *)((char *)h - offsetof(struct odpd_client, holder));
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__DeviceEvent ev = ODPD__DEVICE_EVENT__INIT;
	struct odpd_device *dev = arg;

	if (c->dead)
		return;
	ev.has_kind = 1;
	ev.kind = ODPD__DEVICE_EVENT__KIND__KIND_REMOVED;
	ev.device = dev->name;
	ev.has_mrs = 1;
	ev.mrs = mrs;
	reply.has_id = reply.has_status = 1;
	reply.body_case = ODPD__REPLY__BODY_DEVICE_EVENT;
	reply.device_event = &ev;
	odpd_client_send(c, &reply);
	log_info("client %" PRIu64 " (pid %d): told that %s was removed (%u MR(s))", c->id,
		 (int)c->cred.pid, dev->name, mrs);
}

static void device_gone(struct odpd_manager *m, struct odpd_device *dev, const char *why)
{
	if (dev->removed)
		return;
	log_warning("device %s went away (%s): its MRs are dead, its contexts closed; clients that "
		    "used it are told", dev->name, why);
	dev->removed = true;
	m->devices.n_live--;
	watch_stop(dev);
	if (dev->watch)
		ibv_close_device(dev->watch);
	dev->watch = NULL;
	odpd_registry_device_removed(&m->registry, dev, notify_holder, dev);
	status_notify(m);
}

static void on_async(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_manager *m = arg;
	struct odpd_device *dev = NULL;
	bool fatal = false;

	(void)what;
	for (unsigned i = 0; i < m->devices.n && !dev; i++)
		if (m->devices.dev[i].watch && m->devices.dev[i].watch->async_fd == fd)
			dev = &m->devices.dev[i];
	if (!dev)
		return;
	for (;;) {
		struct ibv_async_event ev;

		if (ibv_get_async_event(dev->watch, &ev) != 0) {
			if (errno != EAGAIN && errno != EINTR) {
				/* Unreadable: treat as gone rather than spin on it. */
				log_errno(LOG_ERR, errno, "%s: ibv_get_async_event", dev->name);
				fatal = true;
			}
			break;
		}
		if (ev.event_type == IBV_EVENT_DEVICE_FATAL)
			fatal = true;
		else
			log_ratelimited(LOG_INFO, "%s: async event: %s", dev->name,
					ibv_event_type_str(ev.event_type));
		ibv_ack_async_event(&ev);
	}
	if (fatal)
		device_gone(m, dev, "IBV_EVENT_DEVICE_FATAL");
}

static void rescan(struct odpd_manager *m)
{
	unsigned added[ODPD_MAX_DEVICES], gone[ODPD_MAX_DEVICES], n_gone = 0, n;

	n = odpd_devices_rescan(&m->devices, added, gone, &n_gone);
	for (unsigned i = 0; i < n_gone; i++)
		device_gone(m, &m->devices.dev[gone[i]], "no longer listed");
	for (unsigned i = 0; i < n; i++) {
		struct odpd_device *dev = &m->devices.dev[added[i]];

		if (watch_start(m, dev) < 0) {
			/* Unwatched, its removal would hang `rdma link delete`: do not use it. */
			ibv_close_device(dev->watch);
			dev->watch = NULL;
			dev->removed = true;
			m->devices.n_live--;
			continue;
		}
		log_notice("device %s appeared: usable", dev->name);
	}
	if (n || n_gone)
		status_notify(m);
}

struct odpd_device *odpd_manager_device(struct odpd_manager *m, const char *name, struct odpd_err *err)
{
	struct odpd_device *dev = odpd_devices_find(&m->devices, name);
	struct timespec ts;
	uint64_t now;

	if (dev)
		return dev;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	if (now - m->devices.scanned_ns >= RESCAN_NS) {
		rescan(m);
		dev = odpd_devices_find(&m->devices, name);
		if (dev)
			return dev;
	}
	if (name && *name) {
		struct odpd_device *old = odpd_devices_find_any(&m->devices, name);

		err_set(err, ENODEV, old ? "device %s was removed" : "no device named %s", name);
	} else {
		err_set(err, ENODEV, m->devices.n ? "odpd's devices were all removed" :
			"odpd has no RDMA device");
	}
	return NULL;
}

static void on_settle(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	rescan(arg);
}

static void watch_dir(void)
{
	hp.wd_dir = inotify_add_watch(hp.ifd, "/dev/infiniband", IN_CREATE | IN_ONLYDIR);
	if (hp.wd_dir >= 0 && hp.wd_dev >= 0) {
		inotify_rm_watch(hp.ifd, hp.wd_dev);
		hp.wd_dev = -1;
	}
}

/* Something was created in /dev/infiniband (a uverbs node: a device came),
 * or /dev/infiniband itself: rescan once things settle. */
static void on_inotify(evutil_socket_t fd, short what, void *arg)
{
	const struct timeval settle = { 0, SETTLE_MS * 1000 };
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
	bool uverbs = false;
	ssize_t n;

	(void)what;
	(void)arg;
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		for (char *p = buf; p < buf + n; p += sizeof(struct inotify_event) +
		     ((struct inotify_event *)p)->len) {
			const struct inotify_event *e = (const struct inotify_event *)p;

			if (e->wd == hp.wd_dev && e->len && strcmp(e->name, "infiniband") == 0) {
				watch_dir();
				uverbs = true;           /* its nodes may be there already */
			}
			if (e->wd == hp.wd_dir && e->len && strncmp(e->name, "uverbs", 6) == 0)
				uverbs = true;
			if (e->wd == hp.wd_dir && (e->mask & IN_IGNORED)) {
				/* /dev/infiniband went (its last device did): wait for it again */
				hp.wd_dir = -1;
				hp.wd_dev = inotify_add_watch(hp.ifd, "/dev", IN_CREATE | IN_ONLYDIR);
			}
		}
	if (uverbs)
		evtimer_add(hp.ev_settle, &settle);
}

/* Watch /dev/infiniband for new device nodes; where it cannot, requests
 * still find new devices (odpd_manager_device). */
static void inotify_start(struct odpd_manager *m)
{
	hp.ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (hp.ifd < 0) {
		log_errno(LOG_INFO, errno, "inotify: devices that appear are found by requests only");
		return;
	}
	watch_dir();
	if (hp.wd_dir < 0)
		hp.wd_dev = inotify_add_watch(hp.ifd, "/dev", IN_CREATE | IN_ONLYDIR);
	if (hp.wd_dir < 0 && hp.wd_dev < 0)
		log_errno(LOG_INFO, errno, "inotify on /dev: devices that appear are found by requests only");
	hp.ev_inotify = event_new(m->base, hp.ifd, EV_READ | EV_PERSIST, on_inotify, m);
	hp.ev_settle = evtimer_new(m->base, on_settle, m);
	if (!hp.ev_inotify || !hp.ev_settle || event_add(hp.ev_inotify, NULL) < 0)
		log_error("out of memory: devices that appear are found by requests only");
}

int odpd_hotplug_start(struct odpd_manager *m)
{
	for (unsigned i = 0; i < m->devices.n; i++)
		if (m->devices.dev[i].watch && watch_start(m, &m->devices.dev[i]) < 0)
			return -ENOMEM;
	inotify_start(m);
	return 0;
}

void odpd_hotplug_stop(struct odpd_manager *m)
{
	for (unsigned i = 0; i < m->devices.n; i++)
		watch_stop(&m->devices.dev[i]);
	if (hp.ev_inotify)
		event_free(hp.ev_inotify);
	if (hp.ev_settle)
		event_free(hp.ev_settle);
	if (hp.ifd >= 0)
		close(hp.ifd);
	hp.ev_inotify = hp.ev_settle = NULL;
	hp.ifd = hp.wd_dir = hp.wd_dev = -1;
}
