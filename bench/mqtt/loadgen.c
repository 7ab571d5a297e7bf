/*
 * mqtt-loadgen: a load generator for MQTT brokers, built on libmosquitto so that it is neutral
 * between the brokers it measures (weft-mqtt and mosquitto run through the same client code).
 *
 * Traffic modes (-t):
 *   fanin   P publishers all publish to one topic, S subscribers (normally 1) subscribe to it;
 *   pairs   publisher i publishes to its own topic, subscriber i subscribes to it (P == S);
 *   fanout  one publisher, S subscribers of its topic.
 * Each message carries, in a payload of at least 64 bytes, the CLOCK_MONOTONIC time it was
 * handed to libmosquitto, the publisher's index and a sequence number. Subscribers compute the
 * end-to-end latency from it (into a log-linear histogram: p50/p99/p99.9) and mark the sequence
 * number in a bitmap per (subscriber, publisher), which gives the messages lost (expected but
 * never seen) and duplicated (seen twice) once the run has drained.
 *
 * How the connections are driven: W worker threads (default 2: the generator shares the cores
 * with the broker) each own a slice of the connections and run libmosquitto's non-blocking
 * loop over them: one epoll set of their sockets (EPOLLOUT only while libmosquitto has bytes
 * waiting), mosquitto_loop_read until the socket would block (libmosquitto reads one packet
 * per call otherwise; its reads go through a buffer, see "buffered reads" below), loop_write
 * when it wants to write, loop_misc every 100 ms. A publisher publishes from its worker,
 * outside any callback, so libmosquitto writes the packet at once.
 *
 * Flow control: an open-loop publisher at full speed measures the broker's buffers, not its
 * throughput. So each publisher keeps at most -w messages per subscriber in flight end to end:
 * it may publish while (sent * fanout - delivered) < w * fanout, where delivered is counted by
 * the subscribers' workers in per-worker counters (no shared cache line on the hot path); a
 * worker whose publishers all wait sleeps until a subscriber's worker wakes it (eventfd). At
 * QoS 0 a broker may drop messages, which would close the window for good; a publisher whose
 * window stays shut for 200 ms writes the missing deliveries off (they show up as lost). In
 * fixed-rate mode (-r, messages/s in total) publishers follow a schedule instead.
 *
 * Other modes:
 *   -I N      open N idle connections (64 at a time, each batch CONNACKed before the next, over
 *             as many processes as the descriptor limit asks), report the broker's RSS before
 *             and after (-b PID), hold them -d seconds;
 *   -C seq|par  connect/CONNACK/DISCONNECT storm for -d seconds: one connection at a time, or
 *             -W threads each doing the same; reports connections/s. The client closes with an
 *             abortive close after its DISCONNECT, or thousands of TIME_WAIT sockets a second
 *             would exhaust the local ports.
 *   -O N      leave N persistent sessions offline (-W threads connect and disconnect them), then
 *             report the broker's CPU while it holds them with nothing to do (-d seconds), and
 *             the CONNACK latency of fresh clients meanwhile (offline.c).
 *
 * Sessions: clean by default, with client ids and topics named after the generator's pid
 * (lg<pid>-pub0, lg<pid>/pair/0, ...). -c makes every connection's session persistent (3.1.1:
 * clean session off; 5.0: clean start off and a session expiry interval of an hour), which a
 * broker with persistence on writes to disk: the QoS 1/2 messages of such a subscriber are
 * stored before the publisher's acknowledgement. -i PREFIX replaces lg<pid> with a fixed
 * prefix, so that a second run finds the same sessions again.
 *
 * Fresh connections are slow for their first messages (TCP and allocator warm-up, in any
 * broker), so the first -x seconds (default 0.5) of traffic are not measured: rates, CPU and
 * latencies count what arrives after them (what was sent after them, for latencies); losses
 * and duplicates count the whole run.
 *
 * With -b PID the broker's CPU time (utime+stime from /proc/PID/stat) is read at the end of the
 * warm-up and after the run drains; cpu_us_per_msg is that divided by the deliveries counted
 * in between.
 *
 * Against mosquitto 2.0.11, QoS 2 over 5.0 (-V 5 -q 2) needs -w 20 or less: with more in
 * flight, libmosquitto's subscribers drop their connections (receive maximum exceeded);
 * bench/mqtt runs 3.1.1.
 *
 * Output: one line of key=value pairs on stdout (bench/mqtt/run.sh parses it), a human summary
 * on stderr. The exit status is 1 when messages were lost at QoS 1 or 2, duplicated at QoS 2,
 * or when a connection failed (the counts are in the output at every QoS).
 */
#define _GNU_SOURCE
#include "loadgen.h"

#include <getopt.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

struct options opt = { .host = "127.0.0.1", .port = 1883, .npub = 1, .nsub = 1, .size = 64,
			.version = 4, .window = 100, .nworkers = 2, .warmup = 0.5, .keepalive = 60,
			.shape = PAIRS };

struct worker workers[MAX_WORKERS];
struct conn *pubs, *subs;
atomic_bool publishing, stop_publishing, stop_all;
_Atomic int64_t t_measure = INT64_MAX; /* the end of the warm-up */

int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void die(const char *what)
{
	fprintf(stderr, "mqtt-loadgen: %s\n", what);
	exit(2);
}

/* ---- command line ---------------------------------------------------------------------------- */

static void usage(void)
{
	fputs("usage: mqtt-loadgen [-h host] [-p port] [-t fanin|pairs|fanout] [-P publishers]\n"
	      "         [-S subscribers] [-q qos] [-s payload bytes] [-n msgs per publisher]\n"
	      "         [-d seconds] [-r total msgs/s] [-w window] [-W worker threads] [-V 3|5]\n"
	      "         [-b broker pid] [-x warm-up seconds] [-I idle connections] [-C seq|par]\n"
	      "         [-O offline sessions]\n"
	      "         [-c (persistent sessions)] [-i client id and topic prefix]\n", stderr);
	exit(2);
}

/* libmosquitto takes three descriptors per connection (the socket and a wake-up pair). */
static void raise_fd_limit(void)
{
	struct rlimit rl;
	rlim_t want = 3 * (rlim_t)(opt.idle + opt.npub + opt.nsub) + 64;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return;
	if (rl.rlim_max < want) { /* root may raise the hard limit too */
		struct rlimit more = { want, want };
		if (setrlimit(RLIMIT_NOFILE, &more) == 0)
			return;
	}
	rl.rlim_cur = rl.rlim_max;
	setrlimit(RLIMIT_NOFILE, &rl);
}

int main(int argc, char **argv)
{
	int ch;
	const char *prefix = NULL;
	while ((ch = getopt(argc, argv, "h:p:t:P:S:q:s:n:d:r:w:W:V:b:I:C:O:x:ci:")) != -1) {
		switch (ch) {
		case 'h': opt.host = optarg; break;
		case 'p': opt.port = atoi(optarg); break;
		case 't':
			opt.shape = strcmp(optarg, "fanin") == 0 ? FANIN :
				    strcmp(optarg, "fanout") == 0 ? FANOUT :
				    strcmp(optarg, "pairs") == 0 ? PAIRS : (usage(), PAIRS);
			break;
		case 'P': opt.npub = atoi(optarg); break;
		case 'S': opt.nsub = atoi(optarg); break;
		case 'q': opt.qos = atoi(optarg); break;
		case 's': opt.size = atoi(optarg); break;
		case 'n': opt.count = atol(optarg); break;
		case 'd': opt.duration = atof(optarg); break;
		case 'r': opt.rate = atof(optarg); break;
		case 'w': opt.window = atoi(optarg); break;
		case 'W': opt.nworkers = atoi(optarg); break;
		case 'V': opt.version = atoi(optarg) == 5 ? MQTT_PROTOCOL_V5 : MQTT_PROTOCOL_V311; break;
		case 'b': opt.broker_pid = atoi(optarg); break;
		case 'I': opt.idle = atoi(optarg); break;
		case 'C': opt.storm = optarg; break;
		case 'O': opt.offline = atoi(optarg); break;
		case 'x': opt.warmup = atof(optarg); break;
		case 'c': opt.persistent = true; break;
		case 'i': prefix = optarg; break;
		default: usage();
		}
	}
	if (opt.shape == FANOUT)
		opt.npub = 1;
	if (opt.shape == PAIRS)
		opt.nsub = opt.npub;
	if (opt.size < 64 || opt.size > 1 << 16)
		die("payload size must be between 64 and 65536 bytes");
	if (opt.qos < 0 || opt.qos > 2 || opt.npub < 1 || opt.nsub < 1 || opt.window < 1 ||
	    opt.nworkers < 1 || opt.nworkers > MAX_WORKERS || opt.port < 1)
		usage();
	if (!opt.idle && !opt.storm && !opt.offline && !opt.count && opt.duration <= 0)
		die("give a message count (-n) or a duration (-d)");
	if ((opt.storm || opt.offline) && opt.duration <= 0)
		die("a storm or an offline run needs a duration (-d)");
	if (prefix && (!*prefix || strlen(prefix) >= 32 || strpbrk(prefix, "+#/")))
		die("-i: a prefix of 1 to 31 characters, without + # or /");
	if (prefix)
		snprintf(opt.prefix, sizeof opt.prefix, "%s", prefix);
	else
		snprintf(opt.prefix, sizeof opt.prefix, "lg%d", (int)getpid());
	raise_fd_limit();
	mosquitto_lib_init();
	int rc = opt.storm ? run_storm() : opt.offline ? run_offline() : opt.idle ? run_idle() :
		 run_traffic();
	mosquitto_lib_cleanup();
	return rc;
}
