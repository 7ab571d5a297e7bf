#!/usr/bin/env bash
# bench/mqtt-persist: what persistence costs weft-mqtt, with persistent subscribers, against
# mosquitto's persistence in the same scenarios (issue #8's "msgs/s with persistence on vs off").
#
# Three brokers, each on a free 127.0.0.1 port, taking turns run by run:
#   weft-mqtt          persistence false
#   weft-mqtt-persist  persistence true (SQLite; every QoS 1/2 message queued for a persistent
#                      session is fsynced before the publisher's PUBACK)
#   mosquitto-persist  persistence true with its default autosave (autosave_interval 1800 s):
#                      it writes its database every 30 minutes and at exit, so a crash loses
#                      what came since the last save - not the same guarantee, and said so in
#                      the output's params
# through two scenarios of weft-mqtt-load with persistent sessions (-c: clean session off,
# fixed client ids with -i, so that later runs find their sessions again), QoS 1:
#   pairs-q1    50 publisher/subscriber pairs, a topic each, 20 messages in flight per pair
#   fanout-q1   1 publisher -> 50 persistent subscribers, 20 in flight per subscriber
# RUNS (default 3) runs of DURATION seconds (default 1.5) each after a 0.5 s warm-up; reported:
# the median delivered msgs/s and p99 latency, losses and duplicates over all runs, and the
# ratios weft-mqtt-persist / weft-mqtt and weft-mqtt-persist / mosquitto-persist. About 40 s.
# RUNS, DURATION, SCENARIOS and BROKERS (of the three names above) narrow a run down.
# Output: JSON lines as bench/bench.h's bench_emit writes them; progress on stderr.
set -u
BENCH=mqtt-persist
. "$(dirname "$0")/mqtt-lib.sh" # here, load, weft, RUNS, tmp, PORT, PID, emit, ...
DURATION=${DURATION:-1.5}

start_broker() {
	local port conf=$tmp/$1.conf
	port=$(free_port)
	mkdir -p "$tmp/$1.db"
	# mosquitto started as root runs as the user mosquitto: let it write its database
	[ "$1" = mosquitto-persist ] && chmod 711 "$tmp" && chmod 777 "$tmp/$1.db"
	{
		echo "listener $port 127.0.0.1"
		echo "allow_anonymous true"
		case $1 in
		weft-mqtt) echo "persistence false" ;;
		*-persist) echo "persistence true"; echo "persistence_location $tmp/$1.db/" ;;
		esac
	} > "$conf"
	if [ "$1" = mosquitto-persist ]; then
		printf 'max_connections -1\nlog_dest none\n' >> "$conf"
		(ulimit -n "$(ulimit -Hn)"; exec mosquitto -c "$conf") 2>"$tmp/$1.log" &
	else
		(ulimit -n "$(ulimit -Hn)"; exec "$weft" -c "$conf") 2>"$tmp/$1.log" &
	fi
	await_broker "$1" $! "$port"
}

declare -A ARGS=(
	[pairs-q1]="-t pairs -P 50 -q 1 -w 20"
	[fanout-q1]="-t fanout -S 50 -q 1 -w 20"
)
declare -A WHAT=(
	[pairs-q1]="50 pairs QoS 1, persistent sessions"
	[fanout-q1]="1 publisher to 50 persistent subscribers QoS 1"
)
declare -A HOW=(
	[weft-mqtt]="persistence off"
	[weft-mqtt-persist]="persistence on: SQLite, fsync before each PUBACK (group commit)"
	[mosquitto-persist]="persistence on: mosquitto writes its database only every autosave_interval (1800 s by default) and at exit, so a crash loses what came since: not the same guarantee"
)
SCENARIOS=${SCENARIOS:-pairs-q1 fanout-q1}

PATH=$PATH:/usr/sbin
brokers=
[ -x "$weft" ] && brokers="weft-mqtt weft-mqtt-persist"
command -v mosquitto >/dev/null 2>&1 && brokers="$brokers mosquitto-persist"
brokers=${BROKERS:-$brokers}
if [ -z "$brokers" ]; then
	echo "bench/mqtt-persist: neither $weft nor mosquitto: nothing measured" >&2
	exit 0
fi
echo "bench/mqtt-persist: $brokers, $RUNS runs of $DURATION s per scenario, taking turns" >&2
up=()
for who in $brokers; do
	if start_broker "$who"; then up+=("$who"); else echo "bench/mqtt-persist: $who is left out" >&2; fi
done
for sc in $SCENARIOS; do
	for _ in $(seq "$RUNS"); do
		for who in "${up[@]}"; do
			echo "  $who $sc" >&2
			# shellcheck disable=SC2086
			"$load" -p "${PORT[$who]}" -b "${PID[$who]}" ${ARGS[$sc]} -d "$DURATION" -c -i "bp-$sc" \
				>> "$tmp/$who.$sc.runs" || echo "  $who $sc: the load generator reported a failure" >&2
		done
	done
done
for who in "${up[@]}"; do stop_broker "$who"; done
for sc in $SCENARIOS; do
	for who in "${up[@]}"; do
		f=$tmp/$who.$sc
		[ -s "$f.runs" ] || continue
		field recv_rate < "$f.runs" | median > "$f.rate"
		field p99_us < "$f.runs" | grep -v -e nan -e inf | median > "$f.p99"
		loss=$(awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "lost") l += kv[2];
			if (kv[1] == "dup") d += kv[2] } } END { printf "lost=%d dup=%d", l, d }' "$f.runs")
		emit "$who $sc" "msgs/s" "$(cat "$f.rate")" \
			"delivered; ${WHAT[$sc]}; ${HOW[$who]}; $loss; median of $RUNS"
		emit "$who $sc p99" "us" "$(cat "$f.p99")" "latency; ${WHAT[$sc]}; ${HOW[$who]}"
	done
	ratio() { # name a b params
		local a b
		a=$(cat "$tmp/$2.$sc.rate" 2>/dev/null) b=$(cat "$tmp/$3.$sc.rate" 2>/dev/null)
		[ -n "$a" ] && [ -n "$b" ] && [ "$a" != null ] && [ "$b" != null ] || return 0
		emit "$1 $sc" "x" "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.4g", b ? a / b : 0 }')" "$4"
	}
	ratio "weft persistence on/off" weft-mqtt-persist weft-mqtt \
		"delivered msgs/s with persistence on / off (what durability costs)"
	ratio "weft/mosquitto persistent" weft-mqtt-persist mosquitto-persist \
		"delivered msgs/s ratio, both with persistence on (mosquitto's not durable per message)"
done
exit 0
