/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#include "odpd.pb-c.h"

/* Device slots: a device that goes away keeps its slot (its domains and
 * MRs refer to it) until nothing refers to it; one that comes back takes
 * a free slot or a drained one of the same name. */
#define ODPD_MAX_DEVICES 32u

/* An RDMA device as odpd probed it. Clients get contexts of their own. */
struct odpd_device {
	char name[64];
	struct ibv_device *ibdev;
	/* Open while the device is present: the kernel reports its removal
	 * (IBV_EVENT_DEVICE_FATAL) on every context, and waits for every
	 * context to be closed before the device can go (hotplug.c). */
	struct ibv_context *watch;
	void *ev_watch;                     /* struct event *, the loop's */
	bool removed;
	unsigned n_domains;                 /* the loop's: domains on this slot, open or closing */
	char transport[16];
	char fw_ver[64];
	uint64_t node_guid;           /* host byte order */
	uint32_t phys_port_cnt;
	uint64_t max_mr_size;
	uint64_t odp_general_caps;
	uint32_t odp_rc_caps, odp_uc_caps, odp_ud_caps;
	bool odp, implicit_odp;
	Odpd__Support advise_mr;
	int advise_mr_errno;
	Odpd__Support import;
	int import_errno;
};

struct odpd_devices {
	struct ibv_device **list;           /* the latest ibv_get_device_list */
	struct ibv_device ***old;           /* earlier lists: their devices may still be in use */
	unsigned n_old;
	struct odpd_device *dev;            /* [ODPD_MAX_DEVICES] */
	unsigned n;                         /* slots used, removed ones included */
	unsigned n_live;                    /* present devices */
	char *const *names;                 /* --device: only these */
	unsigned n_names;
	uint64_t scanned_ns;                /* CLOCK_MONOTONIC of the latest scan */
};

/* Open and probe every device, or only those in @names (@n_names > 0; a name
 * that is not found is an error). Zero devices is not an error. */
int odpd_devices_open(char *const *names, unsigned n_names, struct odpd_devices *ret);
void odpd_devices_close(struct odpd_devices *d);

/* Look for devices that came (back): probe each into a slot (a free one, or
 * a drained removed one of the same name) and return how many, with their
 * slot numbers in @added (ODPD_MAX_DEVICES entries). Devices no longer
 * listed that odpd still thinks present go into @gone (their removal event
 * has not come yet, or never will). On the loop. */
unsigned odpd_devices_rescan(struct odpd_devices *d, unsigned *added, unsigned *gone, unsigned *n_gone);

/* A present device: @name NULL or "": the first one. NULL if none matches. */
struct odpd_device *odpd_devices_find(struct odpd_devices *d, const char *name);
/* The slot of that name, present or removed (the latest), or NULL. */
struct odpd_device *odpd_devices_find_any(struct odpd_devices *d, const char *name);

/* Fill @out (initialized by the caller) from @dev; strings point into @dev. */
void odpd_device_to_proto(const struct odpd_device *dev, Odpd__Device *out);
/* The present devices as protobuf messages: one allocation, free() releases
 * it. Their number, or -ENOMEM. */
int odpd_devices_to_proto(const struct odpd_devices *d, Odpd__Device ***ret);
