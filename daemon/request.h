/* SPDX-License-Identifier: MIT */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "client.h"
#include "error.h"
#include "odpd-wire.h"

/* Decode and act on one packet of @c. Consumes @pkt's fds on every path. */
void odpd_request_handle(struct odpd_client *c, const uint8_t *buf, size_t len, struct odpd_packet *pkt);


/* Segments (attach.c). @fd is consumed. */
void odpd_attach_segment(struct odpd_client *c, uint64_t id, const Odpd__AttachSegment *req, int fd);
void odpd_detach_segment(struct odpd_client *c, uint64_t id, const Odpd__DetachSegment *req);
void odpd_map_segment(struct odpd_client *c, uint64_t id, const Odpd__MapSegment *req);
/* Forget @s: its mapping reference and what its user was charged for it. */
void odpd_cseg_drop(struct odpd_client *c, struct odpd_cseg *s);

/* MRs (mr.c). @fd (client-PD mode, else -1) is consumed. */
void odpd_reg_mr(struct odpd_client *c, uint64_t id, const Odpd__RegMr *req, int fd);
void odpd_dereg_mr(struct odpd_client *c, uint64_t id, const Odpd__DeregMr *req);
/* OpenHitTable: @fd, the client's use table, is taken. */
void odpd_open_hit_table(struct odpd_client *c, uint64_t id, const Odpd__OpenHitTable *req, int fd);
void odpd_verify(struct odpd_client *c, uint64_t id, const Odpd__Verify *req);
void odpd_join_pd(struct odpd_client *c, uint64_t id, const Odpd__JoinPd *req);
void odpd_flush(struct odpd_client *c, uint64_t id, const Odpd__Flush *req);
void odpd_import_pd(struct odpd_client *c, uint64_t id, const Odpd__ImportPd *req);
void odpd_advise_mr(struct odpd_client *c, uint64_t id, const Odpd__AdviseMr *req);

/* Admin requests (admin.c). */
void odpd_admin_status(struct odpd_client *c, uint64_t id);
void odpd_admin_reload(struct odpd_client *c, uint64_t id);
void odpd_admin_verify(struct odpd_client *c, uint64_t id, const Odpd__AdminVerify *req);
void odpd_admin_list_mrs(struct odpd_client *c, uint64_t id, const Odpd__ListMrs *req);
