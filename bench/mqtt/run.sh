#!/usr/bin/env bash
# bench/mqtt: weft-mqtt against mosquitto 2.0 through the same scenarios, driven by the same
# load generator (weft-mqtt-load, on libmosquitto: neutral between the two brokers).
#
# Both brokers are started, each on a free 127.0.0.1 port with persistence off, and go through:
#   fanin     100 publishers -> 1 subscriber, one topic, QoS 0
#   pairs-q0  50 publisher/subscriber pairs, a topic each, QoS 0
#   pairs-q1  the same at QoS 1 (losses and duplicates checked)
#   fanout    1 publisher -> 100 subscribers, QoS 0
#   rate      50 pairs at a fixed 10,000 msgs/s in total, QoS 1: the latency run
#   idle      10,000 idle connections to a freshly started broker: RSS per connection
#   offline   50,000 persistent 5.0 sessions (an hour's expiry) left offline on a fresh broker:
#             its CPU while it holds them, and fresh clients' CONNACK latency meanwhile
#   storm     connect/CONNACK/DISCONNECT, one at a time and from 4 threads: connections/s
# The brokers take turns run by run (weft-mqtt, mosquitto, weft-mqtt, ...), so that changes in
# the machine's load fall on both. The traffic scenarios run $RUNS times (default 3) after a
# 0.5 s warm-up each, and report the median of: delivered msgs/s, the broker's CPU (utime+stime from /proc) per delivered message,
# and the latency quantiles from the payloads' timestamps. In the throughput scenarios each
# publisher keeps up to a window of messages in flight (-w), so their latencies are mostly that
# queue (Little's law); the fixed-rate run is the latency measurement. Ratio rows
# (weft-mqtt / mosquitto) follow. Output: JSON lines as bench/bench.h's bench_emit writes them; progress on stderr.
#
# mosquitto runs with its defaults (as Debian ships it) except: no persistence, max_connections
# -1 (unlimited), and no logging (it would log every connection of the storm). Its default
# keeps Nagle's algorithm on, which batches its small writes (less CPU per message, a little
# throughput lost where a QoS 0 subscriber never answers and delayed ACKs hold the writes);
# MOSQUITTO_NODELAY=1 runs it with set_tcp_nodelay true instead.
# The traffic scenarios also run against mqtt-floor (floor.c): not a broker but the least one
# can do here (one thread in epoll, one system call per packet in or out, nothing tracked).
# Its CPU per message is what the kernel alone charges on this machine; the "/floor" rows
# compare the brokers with it.
# RUNS, SCENARIOS (a subset of the traffic scenarios' names) and BROKERS (of "weft-mqtt",
# "weft-mqtt-1w", "mosquitto", "floor") narrow a run down while working on the broker.
# weft-mqtt runs as `weft-mqtt -p PORT` (its defaults). Where build/bin/weft-mqtt (beside this
# script's build directory) is missing, only mosquitto is measured, and stderr says so.
set -u
BENCH=mqtt
. "$(dirname "$0")/mqtt-lib.sh" # here, load, weft, RUNS, tmp, PORT, PID, emit, ...

# Start broker $1 (mosquitto, weft-mqtt, weft-mqtt-1w: WEFT_WORKERS=1, or floor) on a free
# port: PORT[$1], PID[$1].
start_broker() {
	local port
	port=$(free_port)
	if [ "$1" = floor ]; then
		"$here/bin/mqtt-floor" "$port" 2>"$tmp/$1.log" &
	elif [ "$1" = mosquitto ]; then
		cat > "$tmp/mosquitto.conf" <<-EOF
		listener $port 127.0.0.1
		allow_anonymous true
		persistence false
		max_connections -1
		log_dest none
		EOF
		[ "${MOSQUITTO_NODELAY:-0}" = 1 ] && echo "set_tcp_nodelay true" >> "$tmp/mosquitto.conf"
		(ulimit -n "$(ulimit -Hn)"; exec mosquitto -c "$tmp/mosquitto.conf") 2>"$tmp/$1.log" &
	elif [ "$1" = weft-mqtt-1w ]; then
		(ulimit -n "$(ulimit -Hn)"; WEFT_WORKERS=1 exec "$weft" -p "$port") 2>"$tmp/$1.log" &
	else
		(ulimit -n "$(ulimit -Hn)"; exec "$weft" -p "$port") 2>"$tmp/$1.log" &
	fi
	await_broker "$1" $! "$port"
}

# One run of a traffic scenario, appended to $tmp/<broker>.<scenario>.runs.
traffic() { # broker scenario args...
	local who=$1 sc=$2
	shift 2
	echo "  $who $sc: $*" >&2
	"$load" -p "${PORT[$who]}" -b "${PID[$who]}" "$@" >> "$tmp/$who.$sc.runs" ||
		echo "  $who $sc: the load generator reported a failure (above)" >&2
}

# The medians of a scenario's runs, in $tmp/<broker>.<scenario>.<metric>.
summarize() { # broker scenario
	local who=$1 sc=$2 out=$tmp/$1.$2.runs m
	for m in recv_rate cpu_us_per_msg p50_us p99_us p999_us; do
		field "$m" < "$out" | grep -v -e nan -e inf | median > "$tmp/$who.$sc.$m"
	done
	# Losses and duplicates over all runs (QoS 0 may lose; QoS 1 must not).
	awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "lost") l += kv[2];
		if (kv[1] == "dup") d += kv[2]; if (kv[1] == "sent") s += kv[2] } }
		END { printf "lost=%d dup=%d sent=%d\n", l, d, s }' "$out" > "$tmp/$who.$sc.loss"
}

report_traffic() { # broker scenario description
	local who=$1 sc=$2 what=$3 f=$tmp/$1.$2 loss
	[ -s "$f.recv_rate" ] || return 0
	loss=$(cat "$f.loss")
	emit "$who $sc" "msgs/s" "$(cat "$f.recv_rate")" "delivered; $what; $loss; median of $RUNS"
	emit "$who $sc cpu" "us/msg" "$(cat "$f.cpu_us_per_msg")" "broker CPU per delivered msg; $what"
	emit "$who $sc p50" "us" "$(cat "$f.p50_us")" "latency; $what"
	emit "$who $sc p99" "us" "$(cat "$f.p99_us")" "latency; $what"
	emit "$who $sc p99.9" "us" "$(cat "$f.p999_us")" "latency; $what"
}

ratio() { # name unit a b params: a/b
	local a b
	a=$(cat "$3" 2>/dev/null) b=$(cat "$4" 2>/dev/null)
	[ -n "$a" ] && [ -n "$b" ] && [ "$a" != null ] && [ "$b" != null ] || return 0
	emit "$1" "$2" "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.4g", b ? a / b : 0 }')" "$5"
}

SCENARIOS=${SCENARIOS:-fanin pairs-q0 pairs-q1 fanout rate}
declare -A ARGS=(
	[fanin]="-t fanin -P 100 -S 1 -q 0 -w 10 -d 2"
	[pairs-q0]="-t pairs -P 50 -q 0 -w 20 -d 2"
	[pairs-q1]="-t pairs -P 50 -q 1 -w 20 -d 2"
	[fanout]="-t fanout -S 100 -q 0 -w 20 -d 2"
	[rate]="-t pairs -P 50 -q 1 -r 10000 -d 3"
)
declare -A WHAT=(
	[fanin]="100 publishers to 1 subscriber QoS 0"
	[pairs-q0]="50 pairs QoS 0"
	[pairs-q1]="50 pairs QoS 1"
	[fanout]="1 publisher to 100 subscribers QoS 0"
	[rate]="50 pairs QoS 1 at 10000 msgs/s"
)

measure() { # brokers...
	local who sc mode up=()
	for who in "$@"; do
		if start_broker "$who"; then
			up+=("$who")
		else
			echo "bench/mqtt: $who is left out" >&2
		fi
	done
	set -- "${up[@]}"
	for sc in $SCENARIOS; do
		for _ in $(seq "$RUNS"); do
			for who in "$@"; do
				# shellcheck disable=SC2086
				traffic "$who" "$sc" ${ARGS[$sc]}
			done
		done
		for who in "$@"; do summarize "$who" "$sc"; done
	done
	# the floor speaks only enough MQTT for the traffic scenarios
	local brokers=()
	for who in "$@"; do
		if [ "$who" = floor ]; then stop_broker floor; else brokers+=("$who"); fi
	done
	set -- "${brokers[@]}"
	for mode in seq par; do
		for _ in $(seq "$RUNS"); do
			for who in "$@"; do
				echo "  $who storm $mode" >&2
				"$load" -p "${PORT[$who]}" -b "${PID[$who]}" -C $mode -W 4 -d 1 \
					>> "$tmp/$who.storm-$mode.runs"
			done
		done
		for who in "$@"; do
			field conn_rate < "$tmp/$who.storm-$mode.runs" | median > "$tmp/$who.storm-$mode.rate"
			field cpu_us_per_conn < "$tmp/$who.storm-$mode.runs" | grep -v nan | median \
				> "$tmp/$who.storm-$mode.cpu"
		done
	done
	for who in "$@"; do stop_broker "$who"; done
	# Fresh brokers, one at a time, so that the RSS counts the connections and not the heap
	# left by the traffic above.
	for who in "$@"; do
		echo "  $who idle" >&2
		start_broker "$who" || continue
		"$load" -p "${PORT[$who]}" -b "${PID[$who]}" -I 10000 -d 1 > "$tmp/$who.idle.out" ||
			echo "  $who idle: the load generator reported a failure (above)" >&2
		field rss_per_conn_bytes < "$tmp/$who.idle.out" > "$tmp/$who.idle.bytes"
		stop_broker "$who"
		echo "  $who offline" >&2
		start_broker "$who" || continue
		"$load" -p "${PORT[$who]}" -b "${PID[$who]}" -O 50000 -W 4 -V 5 -d 3 \
			> "$tmp/$who.offline.out" ||
			echo "  $who offline: the load generator reported a failure (above)" >&2
		for m in idle_cpu_pct connack_p99_us; do
			field $m < "$tmp/$who.offline.out" > "$tmp/$who.offline.$m"
		done
		stop_broker "$who"
	done
}

report() { # broker
	local who=$1 sc mode
	for sc in $SCENARIOS; do
		report_traffic "$who" "$sc" "${WHAT[$sc]}"
	done
	for mode in seq par; do
		[ -s "$tmp/$who.storm-$mode.rate" ] || continue
		emit "$who storm $mode" "conn/s" "$(cat "$tmp/$who.storm-$mode.rate")" \
			"connect+CONNACK+DISCONNECT, $([ $mode = seq ] && echo 1 thread || echo 4 threads); broker CPU $(cat "$tmp/$who.storm-$mode.cpu") us/conn; median of $RUNS"
	done
	[ -s "$tmp/$who.idle.bytes" ] &&
		emit "$who idle rss" "bytes/conn" "$(cat "$tmp/$who.idle.bytes")" \
			"broker VmRSS growth / 10000 idle connections"
	[ -s "$tmp/$who.offline.idle_cpu_pct" ] || return 0
	emit "$who offline cpu" "%" "$(cat "$tmp/$who.offline.idle_cpu_pct")" \
		"broker CPU (of one core) holding 50000 offline sessions, nothing else to do"
	emit "$who offline connack p99" "us" "$(cat "$tmp/$who.offline.connack_p99_us")" \
		"a fresh client's CONNACK latency beside 50000 offline sessions (one every 5 ms, 3 s)"
}

if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
	echo "bench/mqtt: mosquitto is not installed (Debian: mosquitto): nothing measured" >&2
	exit 0
fi
PATH=$PATH:/usr/sbin
brokers=mosquitto
if [ -x "$weft" ]; then
	# weft-mqtt with its default (a worker per core), and with one worker: like mosquitto's
	# single thread, it leaves the other core to the load generator
	brokers="weft-mqtt weft-mqtt-1w mosquitto"
else
	echo "bench/mqtt: $weft is not built: measuring mosquitto only" >&2
fi
[ -x "$here/bin/mqtt-floor" ] && brokers="$brokers floor"
brokers=${BROKERS:-$brokers}
echo "bench/mqtt: $brokers, $RUNS runs of each scenario, taking turns" >&2
# shellcheck disable=SC2086
measure $brokers
for who in $brokers; do
	report "$who"
done
ratios() { # weft broker, its label
	local sc mode w m
	for sc in $SCENARIOS; do
		w=$tmp/$1.$sc m=$tmp/mosquitto.$sc
		ratio "$2/mosquitto $sc" "x" "$w.recv_rate" "$m.recv_rate" "delivered msgs/s ratio; target >= 1"
		ratio "$2/mosquitto $sc cpu" "x" "$w.cpu_us_per_msg" "$m.cpu_us_per_msg" \
			"CPU per delivered msg ratio; target <= 0.5"
		ratio "$2/mosquitto $sc p99" "x" "$w.p99_us" "$m.p99_us" "p99 latency ratio; target <= 1 in rate"
		ratio "$2/floor $sc cpu" "x" "$w.cpu_us_per_msg" "$tmp/floor.$sc.cpu_us_per_msg" \
			"CPU per delivered msg against mqtt-floor's (one thread, a system call per packet)"
	done
	for mode in seq par; do
		ratio "$2/mosquitto storm $mode" "x" "$tmp/$1.storm-$mode.rate" \
			"$tmp/mosquitto.storm-$mode.rate" "connections/s ratio"
	done
	ratio "$2/mosquitto idle rss" "x" "$tmp/$1.idle.bytes" "$tmp/mosquitto.idle.bytes" \
		"RSS per idle connection ratio (target: at most 8192 bytes each)"
	ratio "$2/mosquitto offline connack p99" "x" "$tmp/$1.offline.connack_p99_us" \
		"$tmp/mosquitto.offline.connack_p99_us" "CONNACK p99 beside 50000 offline sessions"
}
if [ -x "$weft" ]; then
	ratios weft-mqtt weft
	ratios weft-mqtt-1w weft-1w
fi
for sc in $SCENARIOS; do
	ratio "mosquitto/floor $sc cpu" "x" "$tmp/mosquitto.$sc.cpu_us_per_msg" \
		"$tmp/floor.$sc.cpu_us_per_msg" "CPU per delivered msg against mqtt-floor's"
done
exit 0
