# bench/mqtt/lib.sh - what bench/mqtt (run.sh) and bench/mqtt-persist (persist.sh) share:
# their scratch directory, brokers started in the background and stopped on exit, JSON lines
# and medians. Sourced, after setting BENCH (the "bench" field of the JSON lines).
here=$(cd "$(dirname "$0")/.." && pwd) # the build directory
load=$here/bin/weft-mqtt-load
weft=$here/bin/weft-mqtt
RUNS=${RUNS:-3}
tmp=$(mktemp -d)
declare -A PORT PID

cleanup() {
	local who
	for who in "${!PID[@]}"; do stop_broker "$who"; done
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

emit() { # name unit value params
	printf '{"bench":"%s","name":"%s","unit":"%s","value":%s,"params":"%s"}\n' "$BENCH" "$1" "$2" "$3" "$4"
}

# A port below the ephemeral range, where the clients' TIME_WAIT sockets cannot be in the way.
free_port() {
	local p
	for _ in $(seq 100); do
		p=$((10000 + RANDOM % 20000))
		ss -Htln "sport = :$p" 2>/dev/null | grep -q . || { echo $p; return; }
	done
	echo 18883
}

# Broker $1, just started in the background as pid $2 on port $3, its stderr in $tmp/$1.log:
# note it in PID and PORT and wait until it listens (5 s at most).
await_broker() {
	PID[$1]=$2
	PORT[$1]=$3
	for _ in $(seq 100); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$3") 2>/dev/null; then
			return 0
		fi
		kill -0 "$2" 2>/dev/null || break
		sleep 0.05
	done
	echo "bench/$BENCH: $1 did not start on port $3:" >&2
	sed 's/^/    /' "$tmp/$1.log" >&2
	stop_broker "$1"
	return 1
}

# SIGTERM, and SIGKILL after 5 s (a broker with persistence writes its database on the way out).
stop_broker() {
	local pid=${PID[$1]:-}
	unset "PID[$1]"
	[ -n "$pid" ] || return 0
	kill -TERM "$pid" 2>/dev/null
	for _ in $(seq 100); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.05
	done
	kill -KILL "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
}

# field KEY < line: the value of KEY=value in the load generator's output line
field() { tr ' ' '\n' | sed -n "s/^$1=//p"; }

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "null" }'; }
