/*
 * packets - the one-million-packet program of the π-WAM contest, in weft.
 *
 * 100 producers and 100 consumers share one channel. Each producer puts 100 x 100 one-word
 * packets, each consumer takes as many: 10^6 packets through the eye of a needle. The contest's
 *
 *     producer(C) :- execute((between(1,100,_), between(1,100,_), send(3,[0])), [size(100), comm([C])]).
 *     consumer(C) :- execute((between(1,100,_), between(1,100,_), recv(3,[0])), [size(100), comm([C])]).
 *     test :- cpu_chan_new(C), create_task(producer(C)), consumer(C).
 *
 * becomes weft_execute(100, fn, channel): the shared channel is the argument.
 *
 *   usage: packets [capacity]      (default 1, a one-slot rendezvous; 0 is a hand-off;
 *                                   "unbounded" is SWI-Prolog's kind of queue)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft.h"

static void send_all(void *chan)
{
	int packet[1] = { 0 };
	for (int i = 0; i < 100; i++)
		for (int j = 0; j < 100; j++)
			weft_chan_put(chan, packet, sizeof packet);
}

static void recv_all(void *chan)
{
	int packet[1];
	for (int i = 0; i < 100; i++)
		for (int j = 0; j < 100; j++)
			weft_chan_take(chan, packet, sizeof packet);
}

/* producer(C) :- execute(send..., [size(100), comm([C])]). */
static void producer(void *chan)
{
	weft_execute(100, send_all, chan);
}

/* consumer(C) :- execute(recv..., [size(100), comm([C])]). */
static void consumer(void *chan)
{
	weft_execute(100, recv_all, chan);
}

static size_t capacity = 1;

/* test :- cpu_chan_new(C), create_task(producer(C)), consumer(C). */
static int test(void *arg)
{
	(void)arg;
	weft_chan *c = weft_chan_new(capacity, sizeof(int));
	if (!c) {
		perror("weft_chan_new");
		return 1;
	}
	int64_t t0 = weft_now();
	weft_task *p = weft_spawn(producer, c);
	consumer(c);
	weft_join(p);
	int64_t t1 = weft_now();
	weft_chan_free(c);
	char cap[24] = "unbounded";
	if (capacity != WEFT_UNBOUNDED)
		snprintf(cap, sizeof cap, "%zu", capacity);
	printf("1000000 packets, capacity %s: %.1f ms (%.1f M packets/s)\n", cap,
	       (double)(t1 - t0) / 1e6, 1e9 / (double)(t1 - t0));
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1)
		capacity = strcmp(argv[1], "unbounded") == 0 ? WEFT_UNBOUNDED : strtoul(argv[1], NULL, 10);
	return weft_run(test, NULL);
}
