/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <unistd.h>

#include "log.h"
#include "request.h"

static struct odpd_cseg *cseg_overlapping(struct odpd_client *c, uint64_t addr, uint64_t length)
{
	struct odpd_cseg *s;

	LIST_FOREACH(s, &c->segs, link)
		if (addr < s->client_addr + s->length && s->client_addr < addr + length)
			return s;
	return NULL;
}

/*
 * Check the client's view of the segment and work out where odpd should map
 * file offset 0 (@ret_want, 0: anywhere in the window).
 */
static int attach_check(struct odpd_client *c, const Odpd__AttachSegment *req,
			const struct odpd_seginfo *info, uint64_t *ret_off, uint64_t *ret_len,
			uintptr_t *ret_want, struct odpd_err *err)
{
	uint64_t addr = req->client_addr, off = req->file_offset, len = req->length;
	const uint64_t page = info->page_size;

	if (addr == 0) {                     /* the daemon picks the address */
		if (off != 0 || (len != 0 && len != info->size))
			return err_set(err, EINVAL, "an attach without an address covers the whole "
				       "file: file_offset and length must be 0");
		*ret_off = 0;
		*ret_len = info->size;
		*ret_want = 0;
		return 0;
	}
	if (addr % page || off % page)
		return err_set(err, EINVAL, "address %#" PRIx64 " and file offset %#" PRIx64
			       " must be multiples of the page size %" PRIu64, addr, off, page);
	if (len == 0)
		return err_set(err, EINVAL, "length 0");
	if (addr + len < addr)
		return err_set(err, EINVAL, "address + length overflows");
	if (len > info->size || off > info->size - len)
		return err_set(err, EINVAL, "file range [%#" PRIx64 ", +%" PRIu64 ") is past the end "
			       "of the %" PRIu64 "-byte segment", off, len, info->size);
	int r = odpd_client_mapping_check(c->cred.pid, c->pidfd, addr, len, off, info->dev, info->ino, err);
	if (r < 0)
		return r;
	*ret_off = off;
	*ret_len = len;
	*ret_want = addr >= off ? (uintptr_t)(addr - off) : 0;
	return 0;
}

static void reply_segment(struct odpd_client *c, uint64_t id, const struct odpd_cseg *s)
{
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__SegmentReply sr = ODPD__SEGMENT_REPLY__INIT;

	sr.has_segment = sr.has_addr = sr.has_length = sr.has_file_offset = sr.has_iova_is_addr = 1;
	sr.segment = s->handle;
	sr.addr = s->client_addr;
	sr.length = s->length;
	sr.file_offset = s->file_offset;
	sr.iova_is_addr = (uintptr_t)(s->map->addr + s->file_offset) == s->client_addr;
	reply.has_id = reply.has_status = 1;
	reply.id = id;
	reply.body_case = ODPD__REPLY__BODY_SEGMENT;
	reply.segment = &sr;
	odpd_client_send(c, &reply);
}

void odpd_attach_segment(struct odpd_client *c, uint64_t id, const Odpd__AttachSegment *req, int fd)
{
	struct odpd_manager *m = c->m;
	struct odpd_err err = { 0 };
	struct odpd_seginfo info;
	struct odpd_mapping *map;
	struct odpd_cseg *s, *other;
	uint64_t off = 0, len = 0;
	uintptr_t want = 0;

	if (c->n_segs >= m->cfg.max_segments) {
		err_set(&err, EMFILE, "a client may attach at most %u segments", m->cfg.max_segments);
		goto fail;
	}
	if (odpd_segment_validate(fd, m->cfg.max_segment_size, &info, &err) < 0 ||
	    attach_check(c, req, &info, &off, &len, &want, &err) < 0)
		goto fail;
	s = calloc(1, sizeof(*s));
	if (!s) {
		err_set(&err, ENOMEM, "out of memory");
		goto fail;
	}
	if (odpd_mapping_get(&m->segs, fd, &info, want, &map, &err) < 0) {
		free(s);
		odpd_reply_err(c, id, &err);     /* fd consumed */
		return;
	}
	s->map = map;
	s->file_offset = off;
	s->length = len;
	s->client_addr = req->client_addr ? req->client_addr : (uintptr_t)map->addr;
	s->writable = info.writable && map->writable;
	other = cseg_overlapping(c, s->client_addr, s->length);
	if (other) {
		err_set(&err, EEXIST, "[%#" PRIx64 ", +%" PRIu64 ") overlaps your segment %" PRIu64,
			s->client_addr, s->length, other->handle);
		odpd_mapping_put(&m->segs, map);
		free(s);
		odpd_reply_err(c, id, &err);
		return;
	}
	s->handle = ++c->next_handle;
	LIST_INSERT_HEAD(&c->segs, s, link);
	c->n_segs++;
	log_debug("client %llu: segment %" PRIu64 " at %#" PRIx64 " (+%" PRIu64 "), odpd %p",
		  (unsigned long long)c->id, s->handle, s->client_addr, s->length,
		  (void *)(s->map->addr + s->file_offset));
	reply_segment(c, id, s);
	return;
fail:
	close(fd);
	odpd_reply_err(c, id, &err);
}

void odpd_detach_segment(struct odpd_client *c, uint64_t id, const Odpd__DetachSegment *req)
{
	Odpd__Reply reply = ODPD__REPLY__INIT;
	struct odpd_cseg *s;

	LIST_FOREACH(s, &c->segs, link)
		if (s->handle == req->segment)
			break;
	if (!s) {
		odpd_client_send_error(c, id, ENOENT, "no such segment");
		return;
	}
	if (s->n_mrs) {
		odpd_client_send_error(c, id, EBUSY, "MRs over the segment are still registered");
		return;
	}
	LIST_REMOVE(s, link);
	c->n_segs--;
	odpd_mapping_put(&c->m->segs, s->map);
	free(s);
	reply.has_id = reply.has_status = 1;
	reply.id = id;
	odpd_client_send(c, &reply);
}
