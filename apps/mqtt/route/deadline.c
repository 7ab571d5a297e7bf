/*
 * deadline.c - when each offline session next needs the reaper: its pending will's delay, or
 * its expiry, whichever comes first.
 *
 * Each session with a deadline sits in a binary min-heap, which knows the session's place
 * (s->dl_pos), so that a reconnect, which cancels the deadline, takes it out in O(log n), and
 * the heap never holds more than one entry per session. The reaper takes out only the sessions
 * whose time has come. The heap's array halves when it is under a quarter full, so a crowd of
 * offline sessions that went does not keep it. Rejected: walking the whole session table under
 * its lock, five times a second, which with many persistent sessions offline holds every
 * CONNECT behind it and costs CPU on a broker with nothing to do.
 *
 * Lock order: the table lock, then a session's lock, then dlock, which is held for heap
 * operations only.
 */
#include <stdint.h>
#include <stdlib.h>

#include <weft.h>

#include "records.h"
#include "session.h"

static struct {
	session **a; /* a[0] the earliest; s->dl_pos is its index + 1, 0 when not in the heap */
	uint32_t n, cap;
} H;
static weft_mutex dlock = WEFT_MUTEX_INIT;

static void put(uint32_t i, session *s)
{
	H.a[i] = s;
	s->dl_pos = i + 1;
}

static void sift_up(uint32_t i, session *s)
{
	while (i > 0 && H.a[(i - 1) / 2]->dl_at > s->dl_at) {
		put(i, H.a[(i - 1) / 2]);
		i = (i - 1) / 2;
	}
	put(i, s);
}

static void sift_down(uint32_t i, session *s)
{
	for (;;) {
		uint32_t c = 2 * i + 1;
		if (c >= H.n)
			break;
		if (c + 1 < H.n && H.a[c + 1]->dl_at < H.a[c]->dl_at)
			c++;
		if (H.a[c]->dl_at >= s->dl_at)
			break;
		put(i, H.a[c]);
		i = c;
	}
	put(i, s);
}

static void heap_remove(session *s)
{
	uint32_t i = s->dl_pos - 1;
	s->dl_pos = 0;
	session *last = H.a[--H.n];
	if (H.cap > 1024 && H.n < H.cap / 4) { /* 100,000 sessions came and went: shrink */
		session **a = realloc(H.a, H.cap / 2 * sizeof *a);
		if (a) {
			H.a = a;
			H.cap /= 2;
		}
	}
	if (last == s)
		return;
	if (i > 0 && H.a[(i - 1) / 2]->dl_at > last->dl_at)
		sift_up(i, last);
	else
		sift_down(i, last);
}

void deadline_set(session *s, int64_t when)
{
	WEFT_WITH_LOCK(&dlock) {
		if (s->dl_pos)
			heap_remove(s);
		if (!when)
			break;
		if (H.n == H.cap) {
			uint32_t cap = H.cap ? 2 * H.cap : 1024;
			session **a = realloc(H.a, cap * sizeof *a);
			if (!a)
				abort(); /* as session_new: the broker cannot keep its word without it */
			H.a = a;
			H.cap = cap;
		}
		s->dl_at = when;
		sift_up(H.n++, s);
	}
}

int64_t session_deadline(const session *s)
{
	int64_t t = s->expire_at;
	if (s->will_pending && (!t || s->will_at < t))
		t = s->will_at;
	return t;
}

session *deadline_due(int64_t now)
{
	session *s = NULL;
	WEFT_WITH_LOCK(&dlock) {
		if (H.n && H.a[0]->dl_at <= now) {
			s = H.a[0];
			heap_remove(s);
			session_ref(s); /* it was alive: a session leaves the heap before it ends */
		}
	}
	return s;
}

void deadline_free_all(void)
{
	WEFT_WITH_LOCK(&dlock) {
		for (uint32_t i = 0; i < H.n; i++)
			H.a[i]->dl_pos = 0;
		free(H.a);
		H.a = NULL;
		H.n = H.cap = 0;
	}
}
