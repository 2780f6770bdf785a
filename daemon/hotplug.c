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

#include "hotplug.h"
#include "log.h"
#include "registry.h"

/* A rescan at most this often: each is a walk of sysfs, and a probe per new device. */
#define RESCAN_NS 1000000000ull
/* After a node appears in /dev/infiniband: let the device finish registering. */
#define SETTLE_MS 200

/* The inotify watch on /dev/infiniband. */
static struct {
	int ifd;                            /* inotify */
	int wd_dir;                         /* /dev/infiniband, or -1 */
	int wd_dev;                         /* /dev, until /dev/infiniband exists */
	struct event *ev_inotify, *ev_settle;
} ino = { -1, -1, -1, NULL, NULL };

static void on_async(evutil_socket_t fd, short what, void *arg);

/* A device's removal, as odpd_registry_device_removed's callback sees it. */
struct odpd_hotplug_gone {
	struct odpd_hotplug *hp;
	const struct odpd_device *dev;
};

static int watch_start(struct odpd_hotplug *hp, struct odpd_device *dev)
{
	struct event *ev;
	int fl = fcntl(dev->watch->async_fd, F_GETFL);

	if (fl < 0 || fcntl(dev->watch->async_fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return log_errno(LOG_ERR, errno, "%s: async event fd", dev->name);
	ev = event_new(hp->base, dev->watch->async_fd, EV_READ | EV_PERSIST, on_async, hp);
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

static void status_notify(struct odpd_hotplug *hp)
{
	sd_notifyf(0, "STATUS=Serving %u device(s)", hp->devices->n_live);
}

/* The registry found a holder with something on @arg's device: tell its
 * client, through the connection layer (notify.h). */
static void notify_holder(struct odpd_holder *h, unsigned mrs, void *arg)
{
	const struct odpd_hotplug_gone *g = arg;

	g->hp->notify->device_gone(g->hp->notify->ctx, h, g->dev->name, mrs);
}

static void device_gone(struct odpd_hotplug *hp, struct odpd_device *dev, const char *why)
{
	struct odpd_hotplug_gone g = { hp, dev };

	if (dev->removed)
		return;
	log_warning("device %s went away (%s): its MRs are dead, its contexts closed; clients that "
		    "used it are told", dev->name, why);
	dev->removed = true;
	hp->devices->n_live--;
	watch_stop(dev);
	if (dev->watch)
		ibv_close_device(dev->watch);
	dev->watch = NULL;
	odpd_registry_device_removed(hp->registry, dev, notify_holder, &g);
	status_notify(hp);
}

static void on_async(evutil_socket_t fd, short what, void *arg)
{
	struct odpd_hotplug *hp = arg;
	struct odpd_device *dev = NULL;
	bool fatal = false;

	(void)what;
	for (unsigned i = 0; i < hp->devices->n && !dev; i++)
		if (hp->devices->dev[i].watch && hp->devices->dev[i].watch->async_fd == fd)
			dev = &hp->devices->dev[i];
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
		device_gone(hp, dev, "IBV_EVENT_DEVICE_FATAL");
}

static void rescan(struct odpd_hotplug *hp)
{
	unsigned added[ODPD_MAX_DEVICES], gone[ODPD_MAX_DEVICES], n_gone = 0, n;

	n = odpd_devices_rescan(hp->devices, added, gone, &n_gone);
	for (unsigned i = 0; i < n_gone; i++)
		device_gone(hp, &hp->devices->dev[gone[i]], "no longer listed");
	for (unsigned i = 0; i < n; i++) {
		struct odpd_device *dev = &hp->devices->dev[added[i]];

		if (watch_start(hp, dev) < 0) {
			/* Unwatched, its removal would hang `rdma link delete`: do not use it. */
			ibv_close_device(dev->watch);
			dev->watch = NULL;
			dev->removed = true;
			hp->devices->n_live--;
			continue;
		}
		log_notice("device %s appeared: usable", dev->name);
	}
	if (n || n_gone)
		status_notify(hp);
}

struct odpd_device *odpd_hotplug_device(struct odpd_hotplug *hp, const char *name, struct odpd_err *err)
{
	struct odpd_device *dev = odpd_devices_find(hp->devices, name);
	struct timespec ts;
	uint64_t now;

	if (dev)
		return dev;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	if (now - hp->devices->scanned_ns >= RESCAN_NS) {
		rescan(hp);
		dev = odpd_devices_find(hp->devices, name);
		if (dev)
			return dev;
	}
	if (name && *name) {
		struct odpd_device *old = odpd_devices_find_any(hp->devices, name);

		err_set(err, ENODEV, old ? "device %s was removed" : "no device named %s", name);
	} else {
		err_set(err, ENODEV, hp->devices->n ? "odpd's devices were all removed" :
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
	ino.wd_dir = inotify_add_watch(ino.ifd, "/dev/infiniband", IN_CREATE | IN_ONLYDIR);
	if (ino.wd_dir >= 0 && ino.wd_dev >= 0) {
		inotify_rm_watch(ino.ifd, ino.wd_dev);
		ino.wd_dev = -1;
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

			if (e->wd == ino.wd_dev && e->len && strcmp(e->name, "infiniband") == 0) {
				watch_dir();
				uverbs = true;           /* its nodes may be there already */
			}
			if (e->wd == ino.wd_dir && e->len && strncmp(e->name, "uverbs", 6) == 0)
				uverbs = true;
			if (e->wd == ino.wd_dir && (e->mask & IN_IGNORED)) {
				/* /dev/infiniband went (its last device did): wait for it again */
				ino.wd_dir = -1;
				ino.wd_dev = inotify_add_watch(ino.ifd, "/dev", IN_CREATE | IN_ONLYDIR);
			}
		}
	if (uverbs)
		evtimer_add(ino.ev_settle, &settle);
}

/* Watch /dev/infiniband for new device nodes; where it cannot, requests
 * still find new devices (odpd_hotplug_device). */
static void inotify_start(struct odpd_hotplug *hp)
{
	ino.ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (ino.ifd < 0) {
		log_errno(LOG_INFO, errno, "inotify: devices that appear are found by requests only");
		return;
	}
	watch_dir();
	if (ino.wd_dir < 0)
		ino.wd_dev = inotify_add_watch(ino.ifd, "/dev", IN_CREATE | IN_ONLYDIR);
	if (ino.wd_dir < 0 && ino.wd_dev < 0)
		log_errno(LOG_INFO, errno, "inotify on /dev: devices that appear are found by requests only");
	ino.ev_inotify = event_new(hp->base, ino.ifd, EV_READ | EV_PERSIST, on_inotify, hp);
	ino.ev_settle = evtimer_new(hp->base, on_settle, hp);
	if (!ino.ev_inotify || !ino.ev_settle || event_add(ino.ev_inotify, NULL) < 0)
		log_error("out of memory: devices that appear are found by requests only");
}

int odpd_hotplug_start(struct odpd_hotplug *hp)
{
	for (unsigned i = 0; i < hp->devices->n; i++)
		if (hp->devices->dev[i].watch && watch_start(hp, &hp->devices->dev[i]) < 0)
			return -ENOMEM;
	inotify_start(hp);
	return 0;
}

void odpd_hotplug_stop(struct odpd_hotplug *hp)
{
	/* (never started: odpd failed before, e.g. reserving its window) */
	for (unsigned i = 0; hp->devices && i < hp->devices->n; i++)
		watch_stop(&hp->devices->dev[i]);
	if (ino.ev_inotify)
		event_free(ino.ev_inotify);
	if (ino.ev_settle)
		event_free(ino.ev_settle);
	if (ino.ifd >= 0)
		close(ino.ifd);
	ino.ev_inotify = ino.ev_settle = NULL;
	ino.ifd = ino.wd_dir = ino.wd_dev = -1;
}
