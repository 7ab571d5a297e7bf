/* Tests of weft-mqtt's topic tree and routing, in process: sessions without a connection
 * queue what QoS 1/2 deliveries they get, so each test publishes at QoS 2 and reads, from the
 * queues, who got what, at which QoS, with which subscription ids. Retained messages on
 * subscribe go out only as a connected client takes them (retained.c): those tests give the
 * session a connection (whose writes fail) and read its inflight window instead. */
#include <malloc.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <weft.h>

#include "conf.h"
#include "conn_public.h"
#include "epoch.h"
#include "msg.h"
#include "pool.h"
#include "records.h"
#include "retained.h"
#include "session.h"
#include "stats.h"
#include "test.h"
#include "topic.h"

void pool_fini(void);
void stats_fini(void);

static session *mk(void)
{
	session *s = calloc(1, sizeof *s);
	CHECK(s);
	weft_mutex_init(&s->lock);
	weft_cond_init(&s->idle);
	atomic_init(&s->refs, 1);
	s->window = 20;
	return s;
}

static int queued(session *s)
{
	return (int)s->nqueued;
}

/* A session whose client is connected, as far as deliveries can tell: c's writes fail (no
 * descriptor), and what was sent at QoS 1/2 stays in the inflight window. */
static session *mk_online(conn *c)
{
	session *s = mk();
	c->fd = -1;
	s->conn = c;
	return s;
}

/* Take the oldest delivery sent (inflight). */
static delivery *pop_sent(session *s)
{
	delivery *d = s->inflight;
	CHECK(d);
	s->inflight = d->next;
	if (!s->inflight)
		s->inflight_tail = NULL;
	s->ninflight--;
	return d;
}

/* Pop the oldest queued delivery (the caller frees nothing: drop() does). */
static delivery *pop(session *s)
{
	delivery *d = s->queue;
	CHECK(d);
	s->queue = d->next;
	if (!s->queue)
		s->queue_tail = NULL;
	s->nqueued--;
	return d;
}

static void drop(delivery *d)
{
	msg_unref(d->m);
	pool_free(d);
}

static int pub(const char *topic, int qos, int retain, const char *payload, session *from)
{
	msg *m = msg_new(topic, (uint16_t)strlen(topic), NULL, payload, (uint32_t)strlen(payload),
			 qos, retain, 0);
	if (retain)
		topic_retain(m);
	int n = topic_publish(m, from, NULL);
	msg_unref(m);
	return n;
}

static int sub(session *s, const char *f, int opts, uint32_t id)
{
	return topic_subscribe(s, f, (uint16_t)strlen(f), (uint8_t)opts, id);
}

static void unsub_all(session *s, const char **filters, int n)
{
	for (int i = 0; i < n; i++)
		topic_unsubscribe(s, filters[i], (uint16_t)strlen(filters[i]));
	while (s->queue)
		drop(pop(s));
}

static void setup(void)
{
	conf_defaults(&conf);
	pool_init();
	stats_init();
	topic_init();
}

static void teardown(void)
{
	topic_free_all();
	epoch_collect(1);
	stats_fini();
	pool_fini();
}

static int wildcards_main(void *arg)
{
	(void)arg;
	setup();
	session *s = mk();
	const char *f[] = { "a/+/c", "x/#", "+/z", "#" };
	CHECK_EQ(sub(s, f[0], 2, 0), 0);
	CHECK_EQ(sub(s, f[1], 2, 0), 0);
	CHECK_EQ(sub(s, f[2], 2, 0), 0);
	struct { const char *t; int want; } cases[] = {
		{ "a/b/c", 1 }, { "a/b/d", 0 }, { "a/b/c/d", 0 }, { "a//c", 1 }, { "x", 1 },
		{ "x/y/z", 1 }, { "y", 0 }, { "y/z", 1 }, { "z", 0 }, { "b/y/z", 0 }, { "/z", 1 },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		CHECK_EQ(pub(cases[i].t, 2, 0, "p", NULL), cases[i].want);
		while (s->queue)
			drop(pop(s));
	}
	/* '$' topics: not matched by a leading wildcard, matched by their own name */
	CHECK_EQ(sub(s, f[3], 2, 0), 0);
	CHECK_EQ(pub("$SYS/x", 2, 0, "p", NULL), 0);
	CHECK_EQ(sub(s, "$SYS/#", 2, 0), 0);
	CHECK_EQ(pub("$SYS/x", 2, 0, "p", NULL), 1);
	CHECK_EQ(pub("$SYS", 2, 0, "p", NULL), 1); /* "$SYS/#" matches "$SYS" */
	CHECK_EQ(pub("plain", 2, 0, "p", NULL), 1);
	unsub_all(s, f, 4);
	topic_unsubscribe(s, "$SYS/#", 6);
	CHECK_EQ(pub("a/b/c", 2, 0, "p", NULL), 0);
	CHECK_EQ(topic_sub_count(), 0);
	teardown();
	free(s);
	return 0;
}

TEST(wildcards)
{
	RUN(wildcards_main);
}

static int overlap_main(void *arg)
{
	(void)arg;
	setup();
	session *s = mk(), *t = mk();
	CHECK_EQ(sub(s, "o/#", 0, 7), 0);
	CHECK_EQ(sub(s, "o/+", 2, 9), 0);
	CHECK_EQ(sub(s, "o/x", 1, 0), 0);
	CHECK_EQ(sub(t, "o/x", 1, 3), 0);
	CHECK_EQ(sub(s, "o/x", 1, 0), 1); /* again: replaced, not added */
	CHECK_EQ(pub("o/x", 2, 0, "p", NULL), 2); /* one delivery per session */
	CHECK_EQ(queued(s), 1);
	delivery *d = pop(s);
	CHECK_EQ(d->qos, 2); /* the highest matching QoS */
	CHECK_EQ(d->nsub, 2);
	CHECK((d->subid[0] == 7 && d->subid[1] == 9) || (d->subid[0] == 9 && d->subid[1] == 7));
	drop(d);
	d = pop(t);
	CHECK_EQ(d->qos, 1);
	CHECK_EQ(d->nsub, 1);
	CHECK_EQ(d->subid[0], 3);
	drop(d);
	/* QoS is the lower of the message's and the subscription's */
	CHECK_EQ(pub("o/x", 1, 0, "p", NULL), 2);
	d = pop(s);
	CHECK_EQ(d->qos, 1);
	drop(d);
	drop(pop(t));
	const char *fs[] = { "o/#", "o/+", "o/x" }, *ft[] = { "o/x" };
	unsub_all(s, fs, 3);
	unsub_all(t, ft, 1);
	teardown();
	free(s);
	free(t);
	return 0;
}

TEST(overlapping_one_copy_highest_qos_all_ids)
{
	RUN(overlap_main);
}

static int nolocal_main(void *arg)
{
	(void)arg;
	setup();
	session *s = mk(), *t = mk();
	CHECK_EQ(sub(s, "n", 2 | SUB_NL, 0), 0);
	CHECK_EQ(sub(t, "n", 2 | SUB_RAP, 0), 0);
	CHECK_EQ(pub("n", 2, 1, "p", s), 1); /* s's own message: only t gets it */
	CHECK_EQ(queued(s), 0);
	delivery *d = pop(t);
	CHECK_EQ(d->retain, 1); /* retain as published */
	drop(d);
	CHECK_EQ(pub("n", 2, 1, "p", t), 2);
	d = pop(s);
	CHECK_EQ(d->retain, 0); /* without rap the flag is cleared */
	drop(d);
	drop(pop(t));
	const char *f[] = { "n" };
	unsub_all(s, f, 1);
	unsub_all(t, f, 1);
	teardown();
	free(s);
	free(t);
	return 0;
}

TEST(no_local_and_retain_as_published)
{
	RUN(nolocal_main);
}

static int shared_main(void *arg)
{
	(void)arg;
	setup();
	session *a = mk(), *b = mk(), *plain = mk();
	CHECK_EQ(sub(a, "$share/g/s/+", 2, 0), 0);
	CHECK_EQ(sub(b, "$share/g/s/+", 2, 0), 0);
	CHECK_EQ(sub(plain, "s/#", 2, 0), 0);
	for (int i = 0; i < 10; i++)
		CHECK_EQ(pub("s/1", 2, 0, "p", NULL), 2); /* one member, plus the plain one */
	CHECK_EQ(queued(a) + queued(b), 10);
	CHECK_EQ(queued(a), 5); /* round robin when nobody is online */
	CHECK_EQ(queued(plain), 10);
	/* a member online is preferred */
	atomic_store(&b->online, 1);
	while (a->queue)
		drop(pop(a));
	while (b->queue)
		drop(pop(b));
	for (int i = 0; i < 4; i++)
		pub("s/1", 2, 0, "p", NULL);
	CHECK_EQ(queued(b), 4);
	CHECK_EQ(queued(a), 0);
	atomic_store(&b->online, 0);
	const char *fs[] = { "$share/g/s/+" }, *fp[] = { "s/#" };
	CHECK_EQ(topic_unsubscribe(a, fs[0], (uint16_t)strlen(fs[0])), 1);
	CHECK_EQ(topic_unsubscribe(a, fs[0], (uint16_t)strlen(fs[0])), 0);
	for (int i = 0; i < 3; i++)
		pub("s/1", 2, 0, "p", NULL);
	CHECK_EQ(queued(b), 7);
	unsub_all(b, fs, 1);
	unsub_all(plain, fp, 1);
	CHECK_EQ(pub("s/1", 2, 0, "p", NULL), 0);
	teardown();
	free(a);
	free(b);
	free(plain);
	return 0;
}

TEST(shared_subscriptions)
{
	RUN(shared_main);
}

static int retained_main(void *arg)
{
	(void)arg;
	setup();
	conn c = { .peer = &conn_client_peer, .role = &conn_client_role };
	session *s = mk_online(&c);
	pub("r/a", 1, 1, "one", NULL);
	pub("r/a", 2, 1, "two", NULL); /* replaces */
	pub("r/b/c", 2, 1, "deep", NULL);
	pub("r", 2, 1, "top", NULL);
	pub("$SYS/r", 2, 1, "sys", NULL);
	pub("gone", 2, 1, "x", NULL);
	pub("gone", 2, 1, "", NULL); /* empty payload clears */
	CHECK_EQ(topic_retained_count(), 4);
	struct { const char *f; int want; } cases[] = {
		{ "r/a", 1 }, { "r/+", 1 }, { "r/#", 3 }, { "#", 3 }, { "+", 1 }, { "+/+", 1 },
		{ "+/+/+", 1 }, { "$SYS/#", 1 }, { "gone", 0 }, { "r/b/#", 1 }, { "nothing/#", 0 },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		topic_send_retained(s, cases[i].f, (uint16_t)strlen(cases[i].f), 2, 5, 0, NULL);
		if ((int)s->ninflight != cases[i].want)
			fprintf(stderr, "filter %s: %u retained, want %d\n", cases[i].f,
				s->ninflight, cases[i].want);
		CHECK_EQ(s->ninflight, cases[i].want);
		CHECK(!s->backlog); /* all sent: the window had room */
		while (s->inflight) {
			delivery *d = pop_sent(s);
			CHECK_EQ(d->retain, 1);
			CHECK_EQ(d->subid[0], 5);
			if (!strcmp(d->m->topic, "r/a"))
				CHECK(d->m->payload_len == 3 && !memcmp(d->m->payload, "two", 3));
			drop(d);
		}
	}
	/* capped at the subscription's QoS */
	topic_send_retained(s, "r/a", 3, 1, 0, 0, NULL);
	delivery *d = pop_sent(s);
	CHECK_EQ(d->qos, 1);
	drop(d);
	pool_free(s->out);
	teardown();
	free(s);
	return 0;
}

TEST(retained_messages)
{
	RUN(retained_main);
}

/* A topic of 20,000 levels is matched and retained without recursion. */
static int deep_main(void *arg)
{
	(void)arg;
	setup();
	conn c = { .peer = &conn_client_peer, .role = &conn_client_role };
	session *s = mk_online(&c);
	size_t n = 40000;
	char *t = malloc(n + 1);
	CHECK(t);
	for (size_t i = 0; i < n; i += 2)
		t[i] = 'l', t[i + 1] = '/';
	t[n - 1] = 'e';
	t[n] = 0;
	CHECK_EQ(sub(s, "l/#", 2, 0), 0);
	CHECK_EQ(pub(t, 2, 1, "deep", NULL), 1);
	drop(pop_sent(s));
	topic_send_retained(s, "#", 1, 2, 0, 0, NULL);
	CHECK_EQ(s->ninflight, 1);
	drop(pop_sent(s));
	pool_free(s->out);
	const char *f[] = { "l/#" };
	unsub_all(s, f, 1);
	free(t);
	teardown();
	free(s);
	return 0;
}

TEST(deep_topics)
{
	RUN(deep_main);
}

/* Publishers on every worker while subscriptions come and go: no lost delivery to a
 * subscription that stays, nothing freed under a reader (ASan/TSan builds check that). */
static atomic_int stop_churn;
static session *steady;

static void churn(void *arg)
{
	session *s = arg;
	char f[32];
	for (int i = 0; !atomic_load(&stop_churn); i++) {
		snprintf(f, sizeof f, "c/%d/+", i % 50);
		sub(s, f, 2, 0);
		topic_unsubscribe(s, f, (uint16_t)strlen(f));
		if (i % 16 == 0)
			epoch_collect(0);
		weft_yield();
	}
}

static void publisher(void *arg)
{
	(void)arg;
	for (int i = 0; i < (SLOW ? 300 : 3000); i++) {
		char t[32];
		snprintf(t, sizeof t, "c/%d/x", i % 50);
		pub(t, 2, 0, "p", NULL);
		if (i % 64 == 0)
			weft_yield();
	}
}

static int churn_main(void *arg)
{
	(void)arg;
	setup();
	conf.max_queued_messages = 1 << 30;
	steady = mk();
	session *c = mk();
	CHECK_EQ(sub(steady, "c/#", 2, 0), 0);
	weft_task *ch = weft_spawn(churn, c);
	weft_task *p[4];
	for (int i = 0; i < 4; i++)
		p[i] = weft_spawn(publisher, NULL);
	for (int i = 0; i < 4; i++)
		weft_join(p[i]);
	atomic_store(&stop_churn, 1);
	weft_join(ch);
	CHECK_EQ(queued(steady), 4 * (SLOW ? 300 : 3000));
	const char *f[] = { "c/#" };
	unsub_all(steady, f, 1);
	while (c->queue)
		drop(pop(c));
	teardown();
	free(steady);
	free(c);
	return 0;
}

TEST(concurrent_publish_and_subscribe)
{
	RUN(churn_main);
}

/* Filters and retained topics that come and go leave no nodes behind. */
static int prune_main(void *arg)
{
	(void)arg;
	setup();
	session *s = mk();
	CHECK_EQ(sub(s, "keep/+/x", 1, 0), 0);
	long base = topic_node_count();
	char f[64];
	for (int i = 0; i < 2000; i++) {
		snprintf(f, sizeof f, "client/%d/cmd/#", i);
		CHECK_EQ(sub(s, f, 1, 0), 0);
		snprintf(f, sizeof f, "keep/%d/x", i);
		pub(f, 1, 1, "r", NULL); /* retained, matched by keep/+/x */
	}
	CHECK(topic_node_count() > base + 4000);
	for (int i = 0; i < 2000; i++) {
		snprintf(f, sizeof f, "client/%d/cmd/#", i);
		CHECK_EQ(topic_unsubscribe(s, f, (uint16_t)strlen(f)), 1);
		snprintf(f, sizeof f, "keep/%d/x", i);
		pub(f, 1, 1, "", NULL); /* cleared */
		epoch_collect(0);
	}
	CHECK_EQ(topic_node_count(), base);
	CHECK_EQ(topic_retained_count(), 0);
	/* the tree still works after all that */
	CHECK_EQ(pub("keep/a/x", 1, 0, "p", NULL), 1);
	CHECK_EQ(sub(s, "client/7/cmd/#", 1, 0), 0);
	CHECK_EQ(pub("client/7/cmd/go", 1, 0, "p", NULL), 1);
	while (s->queue)
		drop(pop(s));
	const char *fs[] = { "keep/+/x", "client/7/cmd/#" };
	unsub_all(s, fs, 2);
	CHECK_EQ(topic_node_count(), 1);
	teardown();
	free(s);
	return 0;
}

TEST(empty_nodes_pruned)
{
	RUN(prune_main);
}

/* Bytes the heap holds (not meaningful under the sanitizers' allocators: 0 there). */
static long heap_used(void)
{
	return SLOW ? 0 : (long)mallinfo2().uordblks;
}

/* Thousands of sessions on one filter (and one shared group): subscribing and unsubscribing
 * them all leaves garbage in proportion to their number, not to its square, even before the
 * reaper frees what was retired (a copy of the subscriber array per change made 4,000
 * subscribers of a filter retire some 130 MB), and the tree's bytes come back to where they
 * were. Replacing a subscription changes its options in place. */
static int many_main(void *arg)
{
	(void)arg;
	setup();
	enum { N = 4000 };
	session **v = calloc(N, sizeof *v);
	CHECK(v);
	for (int i = 0; i < N; i++)
		v[i] = mk();
	long bytes0 = topic_bytes(), heap0 = heap_used();
	for (int i = 0; i < N; i++) {
		CHECK_EQ(sub(v[i], "many/x", 1, (uint32_t)i + 1), 0);
		CHECK_EQ(sub(v[i], "$share/g/many/x", 1, 0), 0);
	}
	CHECK(heap_used() - heap0 < N * 256L);
	CHECK(topic_bytes() - bytes0 < N * 128L);
	CHECK_EQ(pub("many/x", 1, 0, "p", NULL), N + 1);
	for (int i = 0; i < N; i++)
		while (v[i]->queue)
			drop(pop(v[i]));
	/* replaced: QoS 2 and a new id, still one delivery */
	CHECK_EQ(sub(v[7], "many/x", 2, 77), 1);
	CHECK_EQ(pub("many/x", 2, 0, "p", NULL), N + 1);
	delivery *d = pop(v[7]);
	CHECK_EQ(d->qos, 2);
	CHECK_EQ(d->nsub, 1);
	CHECK_EQ(d->subid[0], 77);
	drop(d);
	for (int i = 0; i < N; i++)
		while (v[i]->queue)
			drop(pop(v[i]));
	/* every other one leaves, then the rest: the others still get what they subscribed to */
	for (int i = 0; i < N; i += 2) {
		CHECK_EQ(topic_unsubscribe(v[i], "many/x", 6), 1);
		CHECK_EQ(topic_unsubscribe(v[i], "$share/g/many/x", 15), 1);
	}
	CHECK_EQ(topic_unsubscribe(v[0], "many/x", 6), 0);
	CHECK_EQ(pub("many/x", 1, 0, "p", NULL), N / 2 + 1);
	for (int i = 0; i < N; i++) {
		CHECK(i % 2 ? queued(v[i]) == 1 || queued(v[i]) == 2 : queued(v[i]) == 0);
		while (v[i]->queue)
			drop(pop(v[i]));
	}
	for (int i = 1; i < N; i += 2) {
		CHECK_EQ(topic_unsubscribe(v[i], "many/x", 6), 1);
		CHECK_EQ(topic_unsubscribe(v[i], "$share/g/many/x", 15), 1);
	}
	CHECK(heap_used() - heap0 < N * 256L);
	CHECK_EQ(topic_bytes(), bytes0);
	CHECK_EQ(pub("many/x", 1, 0, "p", NULL), 0);
	teardown();
	for (int i = 0; i < N; i++)
		free(v[i]);
	free(v);
	return 0;
}

TEST(many_subscribers_of_one_filter_cost_linear_memory)
{
	RUN(many_main);
}

/* A level that held 40,000 topics gives their slots back when they go, though a sibling
 * stays. */
static int wide_main(void *arg)
{
	(void)arg;
	setup();
	long empty = topic_bytes();
	session *s = mk();
	CHECK_EQ(sub(s, "wide/keep", 1, 0), 0);
	long bytes0 = topic_bytes();
	char f[64];
	for (int i = 0; i < 40000; i++) {
		snprintf(f, sizeof f, "wide/%d", i);
		CHECK_EQ(sub(s, f, 1, 0), 0);
	}
	CHECK(topic_bytes() > bytes0 + 40000L * 64);
	for (int i = 0; i < 40000; i++) {
		snprintf(f, sizeof f, "wide/%d", i);
		CHECK_EQ(topic_unsubscribe(s, f, (uint16_t)strlen(f)), 1);
		if (i % 1000 == 0)
			epoch_collect(0);
	}
	CHECK(topic_bytes() <= bytes0 + 256);
	CHECK_EQ(pub("wide/keep", 1, 0, "p", NULL), 1);
	CHECK_EQ(pub("wide/7", 1, 0, "p", NULL), 0);
	const char *fs[] = { "wide/keep" };
	unsub_all(s, fs, 1);
	CHECK_EQ(topic_bytes(), empty);
	teardown();
	free(s);
	return 0;
}

TEST(wide_level_shrinks_when_its_topics_go)
{
	RUN(wide_main);
}

/* Publishers on every worker while 64 sessions join and leave one filter and one shared group,
 * and 4 that stay have their subscriptions replaced (QoS 1, 2, 1, ...): the subscriber array
 * grows, is compacted and has entries replaced under the readers, and each subscriber that
 * stays still gets every message exactly once (its entry never missed, never seen twice), and
 * each message to the group goes to exactly one member. */
enum { STAY = 4, COME_GO = 64 };
static atomic_int stop_crowd;
static session *stay[STAY], *come_go[COME_GO];

static void crowd_churn(void *arg)
{
	(void)arg;
	for (int i = 0; !atomic_load(&stop_crowd); i++) {
		for (int k = 0; k < COME_GO; k++) {
			sub(come_go[k], "a/x", 1, 0);
			sub(come_go[k], "$share/g/g/x", 1, 0);
		}
		for (int k = 0; k < STAY; k++)
			CHECK_EQ(sub(stay[k], "a/x", 1 + (i & 1), 0), 1);
		for (int k = 0; k < COME_GO; k++) {
			topic_unsubscribe(come_go[k], "a/x", 3);
			topic_unsubscribe(come_go[k], "$share/g/g/x", 12);
		}
		if (i % 4 == 0)
			epoch_collect(0);
		weft_yield();
	}
}

static void crowd_publisher(void *arg)
{
	(void)arg;
	for (int i = 0; i < (SLOW ? 300 : 3000); i++) {
		pub("a/x", 2, 0, "p", NULL);
		pub("g/x", 2, 0, "p", NULL);
		if (i % 16 == 0)
			weft_yield();
	}
}

/* Deliveries of topic t queued for s (popped and dropped). */
static int take(session *s, const char *t)
{
	int n = 0;
	delivery *keep = NULL;
	while (s->queue) {
		delivery *d = pop(s);
		if (!strcmp(d->m->topic, t)) {
			n++;
			drop(d);
		} else {
			d->next = keep;
			keep = d;
		}
	}
	while (keep) { /* back in the queue, for the next take */
		delivery *d = keep;
		keep = d->next;
		d->next = s->queue;
		s->queue = d;
		if (!s->queue_tail)
			s->queue_tail = d;
		s->nqueued++;
	}
	return n;
}

static int crowd_main(void *arg)
{
	(void)arg;
	setup();
	conf.max_queued_messages = 1 << 30;
	for (int k = 0; k < STAY; k++) {
		stay[k] = mk();
		CHECK_EQ(sub(stay[k], "a/x", 1, 0), 0);
		CHECK_EQ(sub(stay[k], "$share/g/g/x", 1, 0), 0);
	}
	for (int k = 0; k < COME_GO; k++)
		come_go[k] = mk();
	weft_task *ch = weft_spawn(crowd_churn, NULL);
	weft_task *p[4];
	for (int i = 0; i < 4; i++)
		p[i] = weft_spawn(crowd_publisher, NULL);
	for (int i = 0; i < 4; i++)
		weft_join(p[i]);
	atomic_store(&stop_crowd, 1);
	weft_join(ch);
	int each = 4 * (SLOW ? 300 : 3000), group = 0;
	for (int k = 0; k < STAY; k++) {
		CHECK_EQ(take(stay[k], "a/x"), each);
		group += take(stay[k], "g/x");
	}
	for (int k = 0; k < COME_GO; k++) {
		take(come_go[k], "a/x");
		group += take(come_go[k], "g/x");
	}
	CHECK_EQ(group, each);
	const char *f[] = { "a/x", "$share/g/g/x" };
	for (int k = 0; k < STAY; k++)
		unsub_all(stay[k], f, 2);
	CHECK_EQ(topic_sub_count(), 0);
	teardown();
	for (int k = 0; k < STAY; k++)
		free(stay[k]);
	for (int k = 0; k < COME_GO; k++)
		free(come_go[k]);
	return 0;
}

TEST(subscribers_stay_whole_while_others_come_and_go)
{
	RUN(crowd_main);
}

/* ---- a retained backlog under live traffic ------------------------------------------------ */

/* The PUBLISHes (3.1.1) in an output buffer, in order: topic number ("x/N") and payload length. */
typedef struct seen {
	int topic;
	uint32_t len;
} seen;

static int parse_out(const uint8_t *p, size_t n, seen *v, int max)
{
	int k = 0;
	for (size_t i = 0; i < n;) {
		size_t len = 0, j = i + 1;
		for (int shift = 0;; shift += 7) {
			len |= (size_t)(p[j] & 127) << shift;
			if (!(p[j++] & 128))
				break;
		}
		CHECK_EQ(p[i] >> 4, 3);
		CHECK(k < max);
		size_t tl = (size_t)p[j] << 8 | p[j + 1];
		v[k].topic = atoi((const char *)memchr(p + j + 2, '/', tl) + 1);
		v[k++].len = (uint32_t)(len - 2 - tl - ((p[i] >> 1) & 3 ? 2 : 0));
		i = j + len;
	}
	return k;
}

static void publish_live(const char *prefix, int n, int qos, conn *by)
{
	char t[16];
	for (int i = 0; i < n; i++) {
		int tl = snprintf(t, sizeof t, "%s/%d", prefix, i);
		msg *m = msg_new(t, (uint16_t)tl, NULL, "live", 4, qos, 0, 0);
		topic_publish(m, NULL, by);
		msg_unref(m);
	}
}

static void free_by(conn *by)
{
	free(by->match.v);
	free(by->front.v);
	free(by->front_next.v);
	free(by->dirty.v);
}

/* A live message on a topic whose retained message is still pending sends that one first, but
 * only within the limits of live delivery, which hold for the live messages as they hold
 * otherwise. QoS 0, to a client that reads nothing: its output stays within qos0_queue_bytes
 * (and the two messages that may pass it), round after round of SUBSCRIBEs and live messages on
 * every topic; the live messages past the limit are dropped and counted as QoS 0 drops; none of
 * them comes before the retained message of its topic; and once the client reads, every retained
 * message of its last SUBSCRIBE comes, once. */
#define OT_N 400
#define OT_SIZE 10000
static int backlog_qos0_main(void *arg)
{
	(void)arg;
	setup();
	/* by: the publisher, whose flushes wait for its batch's end */
	conn c = { .peer = &conn_client_peer, .role = &conn_client_role },
	     by = { .peer = &conn_client_peer, .role = &conn_client_role };
	session *s = mk_online(&c);
	static char big[OT_SIZE + 1];
	memset(big, 'r', OT_SIZE);
	char t[16];
	for (int i = 0; i < OT_N; i++) {
		snprintf(t, sizeof t, "o/%d", i);
		pub(t, 0, 1, big, NULL);
	}
	CHECK_EQ(sub(s, "o/#", 0, 0), 0);
	uint64_t drop0 = stats_sum(ST_DROP_QOS0), all0 = stats_sum(ST_PUB_DROPPED);
	const size_t bound = (size_t)conf.qos0_queue_bytes + 2 * (OT_SIZE + 64);
	for (int round = 0; round < 3; round++) {
		topic_send_retained(s, "o/#", 3, 0, 0, 0, &by);
		publish_live("o", OT_N, 0, &by);
		if (s->out_len > bound)
			fprintf(stderr, "round %d: %zu bytes of output, over %zu\n", round,
				s->out_len, bound);
		CHECK(s->out_len <= bound);
	}
	static seen v[4 * OT_N];
	int nv = parse_out(s->out, s->out_len, v, 4 * OT_N), live = 0;
	static char had[OT_N];
	for (int k = 0; k < nv; k++) {
		if (v[k].len == 4) {
			live++;
			CHECK(had[v[k].topic]); /* its retained message came first */
		} else {
			CHECK_EQ(v[k].len, OT_SIZE);
			had[v[k].topic] = 1;
		}
	}
	CHECK(live > 0 && live < 3 * OT_N);
	CHECK_EQ(stats_sum(ST_DROP_QOS0) - drop0, (uint64_t)(3 * OT_N - live));
	CHECK_EQ(stats_sum(ST_PUB_DROPPED) - all0, (uint64_t)(3 * OT_N - live));
	/* the client reads: the rest of the last SUBSCRIBE's backlog, which had no room */
	static char got[OT_N];
	int n = 0;
	WEFT_WITH_LOCK(&s->lock) {
		do {
			size_t len;
			int64_t need;
			uint8_t *b = session_take_out(s, &len, &need);
			pool_free(b);
			retained_drain(s);
			nv = parse_out(s->out, s->out_len, v, 4 * OT_N);
			for (int k = 0; k < nv; k++) {
				CHECK_EQ(v[k].len, OT_SIZE);
				CHECK(!got[v[k].topic]);
				got[v[k].topic] = 1;
				n++;
			}
		} while (s->backlog);
	}
	CHECK_EQ(n, OT_N);
	pool_free(s->out);
	free_by(&by);
	teardown();
	free(s);
	return 0;
}

TEST(retained_backlog_qos0_within_live_limits)
{
	RUN(backlog_qos0_main);
}

/* The same at QoS 1: the queue beyond the window never holds more than max_queued_messages
 * (the retained messages pulled ahead of live ones count in it), a live message that finds it
 * full is dropped and counted so, and as the client acknowledges, every retained message comes
 * once, each before the live messages of its topic. */
#define OT1_N 300
static int backlog_qos1_main(void *arg)
{
	(void)arg;
	setup();
	conf.max_queued_messages = 50;
	conn c = { .peer = &conn_client_peer, .role = &conn_client_role },
	     by = { .peer = &conn_client_peer, .role = &conn_client_role };
	session *s = mk_online(&c);
	char t[16], payload[101];
	memset(payload, 'r', 100);
	payload[100] = 0;
	for (int i = 0; i < OT1_N; i++) {
		snprintf(t, sizeof t, "q/%d", i);
		pub(t, 1, 1, payload, NULL);
	}
	CHECK_EQ(sub(s, "q/#", 1, 0), 0);
	topic_send_retained(s, "q/#", 3, 1, 0, 0, &by);
	CHECK_EQ(s->ninflight, 20);
	uint64_t full0 = stats_sum(ST_DROP_QUEUE_FULL), all0 = stats_sum(ST_PUB_DROPPED);
	publish_live("q", OT1_N, 1, &by);
	if (s->nqueued > 50)
		fprintf(stderr, "%u queued, over max_queued_messages 50\n", s->nqueued);
	CHECK(s->nqueued <= 50);
	int live = 0;
	for (delivery *d = s->queue; d; d = d->next)
		live += !d->retain;
	CHECK(live > 0);
	CHECK_EQ(stats_sum(ST_DROP_QUEUE_FULL) - full0, (uint64_t)(OT1_N - live));
	CHECK_EQ(stats_sum(ST_PUB_DROPPED) - all0, (uint64_t)(OT1_N - live));
	/* the client acknowledges everything that comes */
	static char had[OT1_N];
	int retained = 0, got_live = 0;
	while (s->inflight) {
		delivery *d = s->inflight;
		int k = atoi(d->m->topic + 2);
		if (d->retain) {
			CHECK(!had[k]);
			had[k] = 1;
			retained++;
		} else {
			CHECK(had[k]);
			got_live++;
		}
		session_puback(s, d->pid, &by);
	}
	CHECK_EQ(retained, OT1_N);
	CHECK_EQ(got_live, live);
	CHECK(!s->backlog && !s->queue);
	pool_free(s->out);
	free_by(&by);
	teardown();
	free(s);
	return 0;
}

TEST(retained_backlog_qos1_within_live_limits)
{
	RUN(backlog_qos1_main);
}
