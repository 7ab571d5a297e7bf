#!/bin/bash
# mqtt-bridge: weft-mqtt's bridges (bridge/bridge.c) against a real mosquitto as the remote
# broker, with mosquitto_pub and mosquitto_sub as the clients on both sides. A test binary for
# tests/run.sh: `mqtt-bridge --list` prints the test names, `mqtt-bridge NAME` runs one.
#
# Each test makes its own directory, starts mosquitto (`mosquitto -c`, on a free 127.0.0.1
# port) and weft-mqtt from this build (bin/weft-mqtt beside the tests directory this script is
# copied to) with a bridge to it, and stops both at the end: weft-mqtt by SIGTERM, which must
# end it cleanly (exit 0, nothing from a sanitizer in its log), so the ASan and TSan builds
# check the bridge's code paths as well.
#
# How a test knows a path is up without sleeping on a guess: a collector (mosquitto_sub writing
# "topic qos payload" lines) subscribes to the topics under test and to a probe topic; the
# probe is published at the other end, again and again, until the collector has it. Then the
# bridge is connected, its subscriptions are in place and the collector is listening. A test
# then publishes, waits for exactly the lines it expects, waits a little more so that a
# duplicate (a loop) would show, and compares.
#
# Every test is skipped (exit 77, which tests/run.sh shows as `skip NAME: why`) under an
# emulator ($RUNNER non-empty) and where mosquitto or mosquitto-clients (Debian packages) are
# missing.
bindir=$(cd "$(dirname "$0")/../bin" 2>/dev/null && pwd)
WEFT="$bindir/weft-mqtt"
PATH=$PATH:/usr/sbin
TESTS="directions_v311 directions_v5 qos prefixes no_loop credentials tls reconnect
local_clean persistence addresses retain max_packet unsubscribe notifications weft_to_weft mosquitto_to_weft keepalive config_errors config_every_option"

why=
if [ -n "$RUNNER" ]; then
	why="under an emulator (RUNNER=$RUNNER)"
elif ! command -v mosquitto >/dev/null 2>&1; then
	why="mosquitto is not installed (Debian: mosquitto)"
elif ! command -v mosquitto_sub >/dev/null 2>&1 || ! command -v mosquitto_passwd >/dev/null 2>&1; then
	why="mosquitto_pub/mosquitto_sub are not installed (Debian: mosquitto-clients)"
fi
if [ "$1" = --list ]; then
	printf '%s\n' $TESTS
	exit 0
fi
case " $(echo $TESTS) " in
*" $1 "*) ;;
*) echo "mqtt-bridge: no test named '$1'"; exit 2 ;;
esac
skip() { echo "$1"; exit 77; }
[ -z "$why" ] || skip "$why"
[ -x "$WEFT" ] || { echo "mqtt-bridge: $WEFT is not built"; exit 1; }

dir=$(mktemp -d /tmp/weft-bridge.XXXXXX)
chmod 755 "$dir" # mosquitto started as root reads its files as user mosquitto unless "user root"
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do
		for i in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.02; done
		kill -KILL "$p" 2>/dev/null
	done
	rm -rf "$dir"
}
trap cleanup EXIT

fail() {
	echo "FAIL: $*"
	for f in "$dir"/*.log "$dir"/*.out; do
		[ -f "$f" ] && { echo "--- $(basename "$f")"; tail -n 25 "$f"; }
	done
	exit 1
}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
	local p
	while :; do
		p=$((10000 + RANDOM % 22000)) # below the ephemeral ports outgoing connections take
		listening $p || { echo $p; return; }
	done
}
# wait_port PORT PID: until something accepts on PORT (10 s), while PID lives
wait_port() {
	for i in $(seq 500); do
		listening "$1" && return 0
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.02
	done
	return 1
}

RPORT=$(free_port)
LPORT=$(free_port)

# The remote: $dir/remote.conf, to which the caller may add lines first.
remote_conf() {
	{
		echo "user root"
		echo "listener $RPORT 127.0.0.1"
		echo "allow_anonymous true"
		echo "log_type all"
	} > "$dir/remote.conf"
}
start_remote() {
	for try in 1 2 3; do
		mosquitto -c "$dir/remote.conf" >> "$dir/remote.log" 2>&1 &
		RPID=$!
		pids+=($RPID)
		wait_port $RPORT $RPID && { RSTARTED=1; return 0; }
		# the first time only: a restart must be on the port the bridge dials
		[ -z "$RSTARTED" ] && grep -q "Address already in use" "$dir/remote.log" || break
		retry_port RPORT "$dir/remote.conf"
	done
	fail "mosquitto did not start"
}
# a port found free may be taken before the broker binds it: then another one, in the file
retry_port() { # retry_port VAR FILE
	local old=${!1} new
	new=$(free_port)
	sed -i "s/listener $old /listener $new /" "$2"
	eval "$1=$new"
}
stop_remote() {
	kill -TERM $RPID
	wait $RPID 2>/dev/null
}

# weft-mqtt with $dir/weft.conf: a listener and a bridge "r1" to the remote, then "$@" lines.
weft_conf() {
	{
		echo "listener $LPORT 127.0.0.1"
		echo "connection r1"
		echo "address 127.0.0.1:$RPORT"
		echo "remote_clientid br1"
		echo "restart_timeout 1"
		printf '%s\n' "$@"
	} > "$dir/weft.conf"
}
start_weft() {
	for try in 1 2 3; do
		"$WEFT" -v -c "$dir/weft.conf" >> "$dir/weft.log" 2>&1 &
		WPID=$!
		pids+=($WPID)
		wait_port $LPORT $WPID && return 0
		grep -q "cannot listen on 127.0.0.1:$LPORT: Address already in use" "$dir/weft.log" ||
			break
		retry_port LPORT "$dir/weft.conf"
	done
	fail "weft-mqtt did not start"
}
# SIGTERM: weft-mqtt must end cleanly, without a sanitizer's report
stop_weft() {
	kill -TERM $WPID
	wait $WPID
	local rc=$?
	[ $rc -eq 0 ] || fail "weft-mqtt exited with $rc"
	! grep -qE "Sanitizer|runtime error" "$dir/weft.log" || fail "a sanitizer's report in weft.log"
}

# collect NAME PORT [mosquitto_sub options...] TOPIC...: a subscriber (QoS 2) writing lines
# "topic qos payload" to $dir/NAME.out
collect() {
	local name=$1 port=$2 args=()
	shift 2
	while [ $# -gt 0 ]; do
		case $1 in
		-c | -E) args+=("$1"); shift ;;
		-*) args+=("$1" "$2"); shift 2 ;;
		*) args+=(-t "$1"); shift ;;
		esac
	done
	: > "$dir/$name.out"
	mosquitto_sub -p $port -q 2 -F '%t %q %p' "${args[@]}" >> "$dir/$name.out" 2>> "$dir/$name.log" &
	pids+=($!)
	eval "${name}_pid=$!"
}
# ready NAME PORT TOPIC [SEEN]: publish "probe" to TOPIC on PORT until collector NAME has a
# line for SEEN (the topic it arrives as; TOPIC by default)
ready() {
	local seen=${4:-$3}
	for i in $(seq 150); do
		mosquitto_pub -p $2 -t "$3" -m probe
		grep -q "^$seen " "$dir/$1.out" && return 0
		sleep 0.1
	done
	fail "$3 published on port $2 never reached $1 as $seen"
}
# expect NAME LINE...: the collector's lines (probes aside), in any order, are exactly these
expect() {
	local name=$1 want got
	shift
	want=$(printf '%s\n' "$@" | sort)
	for i in $(seq 200); do
		got=$(grep -v ' probe$' "$dir/$name.out" | sort)
		[ "$got" = "$want" ] && break
		sleep 0.05
	done
	sleep 0.5 # a message twice (a loop) would show by now
	got=$(grep -v ' probe$' "$dir/$name.out" | sort)
	[ "$got" = "$want" ] || fail "$name has
$got
but should have exactly
$want"
}
pub() { mosquitto_pub "$@" || fail "mosquitto_pub $*"; }
# state PORT TOPIC VALUE: wait (10 s) until the retained value of TOPIC on PORT is VALUE
state() {
	local v
	for i in $(seq 50); do
		v=$(mosquitto_sub -p $1 -t "$2" -C 1 -W 1 2>/dev/null)
		[ "$v" = "$3" ] && return 0
		sleep 0.1
	done
	fail "$2 on port $1 is '$v', not '$3'"
}
# GET /metrics, without curl (not among CI's packages)
metrics() {
	(
		exec 3<>"/dev/tcp/127.0.0.1/$MPORT" || exit 1
		printf 'GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n' >&3
		timeout 5 cat <&3
	)
}

# ---- the tests ----------------------------------------------------------------------------------

# out, in and both, QoS 0/1/2 each delivered exactly once; the Prometheus lines
directions() {
	MPORT=$(free_port)
	remote_conf
	start_remote
	weft_conf "bridge_protocol_version $1" "topic out/# out 2" "topic in/# in 2" \
		"topic both/# both 2" "metrics_listener $MPORT 127.0.0.1"
	start_weft
	collect R $RPORT out/# in/# both/#
	collect L $LPORT out/# in/# both/#
	ready R $LPORT out/probe
	ready L $RPORT in/probe
	ready R $LPORT both/probe
	ready L $RPORT both/probe
	for q in 0 1 2; do
		pub -p $LPORT -t out/a -q $q -m o$q
		pub -p $RPORT -t in/a -q $q -m i$q
		pub -p $LPORT -t both/l -q $q -m bl$q
		pub -p $RPORT -t both/r -q $q -m br$q
	done
	# what goes against the direction stays where it was published
	pub -p $RPORT -t out/back -q 1 -m nope
	pub -p $LPORT -t in/back -q 1 -m nope
	local common=("out/a 0 o0" "out/a 1 o1" "out/a 2 o2" "in/a 0 i0" "in/a 1 i1" "in/a 2 i2"
		"both/l 0 bl0" "both/l 1 bl1" "both/l 2 bl2" "both/r 0 br0" "both/r 1 br1"
		"both/r 2 br2")
	expect R "${common[@]}" "out/back 1 nope"
	expect L "${common[@]}" "in/back 1 nope"
	local m
	m=$(metrics)
	echo "$m" | grep -q '^weft_mqtt_bridge_up{bridge="r1"} 1$' || fail "bridge_up: $m"
	local sent recv
	sent=$(echo "$m" | sed -n 's/^weft_mqtt_bridge_messages_sent_total{bridge="r1"} //p')
	recv=$(echo "$m" | sed -n 's/^weft_mqtt_bridge_messages_received_total{bridge="r1"} //p')
	# 6 messages and at least 2 probes each way
	[ "$sent" -ge 8 ] && [ "$recv" -ge 8 ] || fail "sent $sent received $recv: $m"
	echo "bridge counters: sent $sent, received $recv"
	stop_weft
}

t_directions_v311() { directions mqttv311; }
t_directions_v5() { directions mqttv50; }

# The QoS of each side is the lower of the publisher's and the bridge topic's
t_qos() {
	remote_conf
	start_remote
	weft_conf "topic q1/# both 1" "topic q0/# out 0"
	start_weft
	collect R $RPORT q1/# q0/#
	collect L $LPORT q1/#
	ready R $LPORT q1/probe
	ready L $RPORT q1/probe
	pub -p $LPORT -t q1/a -q 2 -m a
	pub -p $LPORT -t q1/c -q 0 -m c
	pub -p $RPORT -t q1/b -q 2 -m b
	pub -p $LPORT -t q0/a -q 2 -m d
	expect R "q1/a 1 a" "q1/c 0 c" "q1/b 2 b" "q0/a 0 d"
	expect L "q1/a 2 a" "q1/c 0 c" "q1/b 1 b"
	stop_weft
}

# Local and remote prefixes, both ways; "" patterns map one topic; "" prefixes are none
t_prefixes() {
	remote_conf
	start_remote
	weft_conf "topic sensors/# both 1 local/ remote/" "topic \"\" out 1 lone/topic far/topic" \
		"topic \"\" in 1 near/x away/x" "topic cmd/+ in 1 \"\" site1/"
	start_weft
	collect R $RPORT '#'
	collect L $LPORT '#'
	ready R $LPORT local/sensors/probe remote/sensors/probe
	ready L $RPORT remote/sensors/probe local/sensors/probe
	ready L $RPORT site1/cmd/probe cmd/probe
	pub -p $LPORT -t local/sensors/t -q 1 -m 21
	pub -p $RPORT -t remote/sensors/h -q 1 -m 40
	pub -p $LPORT -t lone/topic -q 1 -m one
	pub -p $LPORT -t lone/topic/deeper -q 1 -m notmapped
	pub -p $RPORT -t away/x -q 1 -m two
	pub -p $RPORT -t site1/cmd/go -q 1 -m three
	pub -p $LPORT -t sensors/t -q 1 -m unprefixed
	pub -p $RPORT -t cmd/go -q 1 -m unprefixed
	expect R "remote/sensors/t 1 21" "remote/sensors/h 1 40" "far/topic 1 one" "away/x 1 two" \
		"site1/cmd/go 1 three" "cmd/go 1 unprefixed"
	expect L "local/sensors/t 1 21" "local/sensors/h 1 40" "lone/topic 1 one" \
		"lone/topic/deeper 1 notmapped" "near/x 1 two" "cmd/go 1 three" "sensors/t 1 unprefixed"
	stop_weft
}

# "#" both ways, with 3.1.1 (try_private) and 5.0 bridges at once: every message once on each
# side, nothing echoed back
t_no_loop() {
	remote_conf
	start_remote
	weft_conf "topic a/# both 2" "connection r5" "address 127.0.0.1:$RPORT" \
		"remote_clientid br5" "bridge_protocol_version mqttv50" "topic b/# both 2"
	start_weft
	collect R $RPORT a/# b/#
	collect L $LPORT a/# b/#
	ready R $LPORT a/probe
	ready L $RPORT a/probe
	ready R $LPORT b/probe
	ready L $RPORT b/probe
	for q in 0 1 2; do
		pub -p $LPORT -t a/l -q $q -m $q
		pub -p $RPORT -t a/r -q $q -m $q
		pub -p $LPORT -t b/l -q $q -m $q
		pub -p $RPORT -t b/r -q $q -m $q
	done
	local all=()
	for q in 0 1 2; do all+=("a/l $q $q" "a/r $q $q" "b/l $q $q" "b/r $q $q"); done
	expect R "${all[@]}"
	expect L "${all[@]}"
	stop_weft
}

# remote_username/remote_password against mosquitto's password_file; a wrong password is
# refused and said so
t_credentials() {
	mosquitto_passwd -b -c "$dir/passwd" bridgeuser 's3cret' || fail mosquitto_passwd
	mosquitto_passwd -b "$dir/passwd" reader 'r' || fail mosquitto_passwd
	chmod 644 "$dir/passwd"
	{
		echo "user root"
		echo "listener $RPORT 127.0.0.1"
		echo "allow_anonymous false"
		echo "password_file $dir/passwd"
	} > "$dir/remote.conf"
	start_remote
	weft_conf "remote_username bridgeuser" "remote_password s3cret" "topic up/# out 1" \
		"connection bad" "address 127.0.0.1:$RPORT" "remote_clientid brbad" \
		"remote_username bridgeuser" "remote_password wrong" "topic bad/# out 1"
	start_weft
	collect R $RPORT -u reader -P r up/# bad/#
	ready R $LPORT up/probe
	pub -p $LPORT -t up/x -q 1 -m authed
	pub -p $LPORT -t bad/x -q 1 -m never
	expect R "up/x 1 authed"
	grep -q "bridge bad: 127.0.0.1:$RPORT refused the connection: " "$dir/weft.log" ||
		fail "no refusal logged for the bad password"
	grep -q "bridge r1: connected" "$dir/weft.log" || fail "r1 did not connect"
	stop_weft
}

# TLS to a mosquitto TLS listener that requires client certificates: verified by CA and host
# name; a host name the certificate does not name fails unless bridge_insecure; an unknown CA
# fails
t_tls() {
	command -v openssl >/dev/null || skip "no openssl command (Debian: openssl)"
	local NEWKEY="-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes"
	(
		cd "$dir" && set -e
		exec > gen.log 2>&1
		openssl req -x509 $NEWKEY -keyout ca.key -out ca.crt -subj /CN=bridge-test-ca -days 2
		openssl req -x509 $NEWKEY -keyout other.key -out other.crt -subj /CN=other-ca -days 2
		printf 'subjectAltName=IP:127.0.0.1\n' > san.ext
		openssl req $NEWKEY -keyout server.key -out server.csr -subj /CN=remote
		openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
			-extfile san.ext -out server.crt
		openssl req $NEWKEY -keyout client.key -out client.csr -subj /CN=bridge
		openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
			-out client.crt
		mkdir capath && cp ca.crt capath/ && openssl rehash capath
	) || fail "openssl could not make the certificates"
	TPORT=$(free_port)
	chmod 644 "$dir"/*.key
	{
		echo "user root"
		echo "per_listener_settings false"
		echo "allow_anonymous true"
		echo "listener $RPORT 127.0.0.1"
		echo "listener $TPORT 127.0.0.1"
		echo "cafile $dir/ca.crt"
		echo "certfile $dir/server.crt"
		echo "keyfile $dir/server.key"
		echo "require_certificate true"
	} > "$dir/remote.conf"
	start_remote
	local cert=("bridge_certfile $dir/client.crt" "bridge_keyfile $dir/client.key")
	{
		echo "listener $LPORT 127.0.0.1"
		echo "connection good"
		echo "address 127.0.0.1:$TPORT"
		echo "remote_clientid brgood"
		echo "bridge_cafile $dir/ca.crt"
		printf '%s\n' "${cert[@]}"
		echo "topic good/# both 1"
		echo "connection capath"
		echo "address 127.0.0.1:$TPORT"
		echo "remote_clientid brcapath"
		echo "bridge_capath $dir/capath"
		echo "bridge_tls_version tlsv1.3"
		printf '%s\n' "${cert[@]}"
		echo "topic capath/# out 1"
		echo "connection wrongname"
		echo "address localhost:$TPORT"
		echo "remote_clientid brname"
		echo "bridge_cafile $dir/ca.crt"
		printf '%s\n' "${cert[@]}"
		echo "topic wrongname/# out 1"
		echo "connection insecure"
		echo "address localhost:$TPORT"
		echo "remote_clientid brinsecure"
		echo "bridge_cafile $dir/ca.crt"
		echo "bridge_insecure true"
		printf '%s\n' "${cert[@]}"
		echo "topic insecure/# out 1"
		echo "connection otherca"
		echo "address 127.0.0.1:$TPORT"
		echo "remote_clientid brother"
		echo "bridge_cafile $dir/other.crt"
		printf '%s\n' "${cert[@]}"
		echo "topic otherca/# out 1"
	} > "$dir/weft.conf"
	"$WEFT" -v -c "$dir/weft.conf" >> "$dir/weft.log" 2>&1 &
	WPID=$!
	pids+=($WPID)
	if ! wait_port $LPORT $WPID; then
		grep -q "needs a weft-mqtt built with OpenSSL" "$dir/weft.log" &&
			skip "weft-mqtt built without OpenSSL"
		fail "weft-mqtt did not start"
	fi
	collect R $RPORT good/# capath/# wrongname/# insecure/# otherca/#
	collect L $LPORT good/#
	ready R $LPORT good/probe
	ready L $RPORT good/probe
	ready R $LPORT capath/probe
	ready R $LPORT insecure/probe
	for t in good capath wrongname insecure otherca; do pub -p $LPORT -t $t/x -q 1 -m $t; done
	pub -p $RPORT -t good/y -q 1 -m back
	expect R "good/x 1 good" "capath/x 1 capath" "insecure/x 1 insecure" "good/y 1 back"
	expect L "good/x 1 good" "good/y 1 back"
	grep -q "bridge wrongname: localhost:$TPORT: TLS: .*certificate verify failed" \
		"$dir/weft.log" || fail "no TLS failure logged for the wrong host name"
	grep -q "bridge otherca: 127.0.0.1:$TPORT: TLS: .*certificate verify failed" \
		"$dir/weft.log" || fail "no TLS failure logged for the unknown CA"
	stop_weft
}

# The remote goes away and comes back on the same port: the bridge reconnects, a QoS 1 message
# published locally meanwhile is delivered (cleansession false), and messages flow again
t_reconnect() {
	remote_conf
	{
		echo "persistence true"
		echo "persistence_location $dir/"
	} >> "$dir/remote.conf"
	start_remote
	weft_conf "topic rc/# both 1" "cleansession false"
	start_weft
	collect L $LPORT rc/#
	ready L $RPORT rc/probe
	# a remote subscriber with a session of its own, to collect what arrives while it is away
	mosquitto_sub -p $RPORT -c -i rsub -q 1 -t rc/# -E || fail "mosquitto_sub -E"
	state $LPORT '$SYS/broker/connection/br1/state' 1
	stop_remote
	state $LPORT '$SYS/broker/connection/br1/state' 0
	pub -p $LPORT -t rc/down -q 1 -m while-down
	start_remote
	collect R $RPORT -c -i rsub rc/#
	expect R "rc/down 1 while-down"
	state $LPORT '$SYS/broker/connection/br1/state' 1
	ready L $RPORT rc/probe2
	pub -p $RPORT -t rc/up -q 1 -m again
	pub -p $LPORT -t rc/up2 -q 1 -m again2
	expect L "rc/down 1 while-down" "rc/up 1 again" "rc/up2 1 again2"
	expect R "rc/down 1 while-down" "rc/up 1 again" "rc/up2 1 again2"
	[ "$(grep -c 'bridge r1: connected' "$dir/weft.log")" -ge 2 ] || fail "no reconnection logged"
	stop_weft
}

# cleansession true (and so local_cleansession): what is published while the remote is away is
# not kept for it; what is published after the reconnection goes
t_local_clean() {
	remote_conf
	{
		echo "persistence true"
		echo "persistence_location $dir/"
	} >> "$dir/remote.conf"
	start_remote
	weft_conf "topic lc/# out 1" "cleansession true"
	start_weft
	# a remote subscriber with a session of its own: it would get lc/down whenever it came
	mosquitto_sub -p $RPORT -c -i rsub -q 1 -t lc/# -E || fail "mosquitto_sub -E"
	state $LPORT '$SYS/broker/connection/br1/state' 1
	stop_remote
	state $LPORT '$SYS/broker/connection/br1/state' 0
	pub -p $LPORT -t lc/down -q 1 -m dropped
	start_remote
	collect R $RPORT -c -i rsub lc/#
	ready R $LPORT lc/probe
	pub -p $LPORT -t lc/up -q 1 -m sent
	expect R "lc/up 1 sent"
	stop_weft
}

# persistence true: a QoS 1 message queued for an absent remote survives a restart of
# weft-mqtt, in the bridge's stored session, and goes out when the remote is back
t_persistence() {
	remote_conf
	{
		echo "persistence true"
		echo "persistence_location $dir/"
	} >> "$dir/remote.conf"
	start_remote
	mkdir "$dir/store"
	weft_conf "topic ps/# out 1" "persistence true" "persistence_location $dir/store"
	"$WEFT" -c "$dir/weft.conf" >> "$dir/weft.log" 2>&1 &
	WPID=$!
	pids+=($WPID)
	if ! wait_port $LPORT $WPID; then
		grep -q "persistence" "$dir/weft.log" &&
			skip "weft-mqtt built without persistence: $(cat "$dir/weft.log")"
		fail "weft-mqtt did not start"
	fi
	mosquitto_sub -p $RPORT -c -i rsub -q 1 -t ps/# -E || fail "mosquitto_sub -E"
	state $LPORT '$SYS/broker/connection/br1/state' 1
	stop_remote
	state $LPORT '$SYS/broker/connection/br1/state' 0
	pub -p $LPORT -t ps/kept -q 1 -m across-restarts
	stop_weft
	start_weft
	grep -q "persistence: 1 sessions" "$dir/weft.log" || fail "the bridge's session was not stored"
	start_remote
	collect R $RPORT -c -i rsub ps/#
	expect R "ps/kept 1 across-restarts"
	stop_weft
}

# addresses: the first does not answer, the bridge goes on to the next
t_addresses() {
	remote_conf
	start_remote
	local dead
	dead=$(free_port)
	{
		echo "listener $LPORT 127.0.0.1"
		echo "connection r1"
		echo "addresses 127.0.0.1:$dead 127.0.0.1:$RPORT"
		echo "remote_clientid br1"
		echo "restart_timeout 1"
		echo "topic ad/# out 1"
	} > "$dir/weft.conf"
	start_weft
	collect R $RPORT ad/#
	ready R $LPORT ad/probe
	pub -p $LPORT -t ad/x -q 1 -m second
	expect R "ad/x 1 second"
	grep -q "bridge r1: 127.0.0.1:$dead: Connection refused" "$dir/weft.log" ||
		fail "the first address was not tried"
	grep -q "bridge r1: connected to 127.0.0.1:$RPORT" "$dir/weft.log" || fail "not connected"
	stop_weft
}

# Retained messages cross with their flag (a local one published before the bridge connects
# goes out when it does); bridge_outgoing_retain false clears the flag
t_retain() {
	remote_conf
	start_remote
	pub -p $RPORT -t rin/old -r -q 1 -m remote-retained
	weft_conf "topic rout/# out 1" "topic rin/# in 1" "connection flat" \
		"address 127.0.0.1:$RPORT" "remote_clientid brflat" "topic flat/# out 1" \
		"bridge_outgoing_retain false" "restart_timeout 1"
	start_weft
	pub -p $LPORT -t rout/early -r -q 1 -m early # maybe before the bridge is up: still goes
	state $RPORT '$SYS/broker/connection/br1/state' 1
	state $RPORT '$SYS/broker/connection/brflat/state' 1
	collect R $RPORT rout/# flat/#
	ready R $LPORT rout/probe
	ready R $LPORT flat/probe
	pub -p $LPORT -t rout/late -r -q 1 -m late
	pub -p $LPORT -t flat/x -r -q 1 -m notretained
	expect R "rout/early 1 early" "rout/late 1 late" "flat/x 1 notretained"
	# a new subscriber at the remote sees what is retained there
	state $RPORT rout/early early
	state $RPORT rout/late late
	[ -z "$(mosquitto_sub -p $RPORT -t flat/x -C 1 -W 1 2>/dev/null)" ] ||
		fail "flat/x is retained at the remote"
	state $LPORT rin/old remote-retained
	stop_weft
}

# bridge_max_packet_size: a PUBLISH larger than it is not sent to the remote
t_max_packet() {
	remote_conf
	start_remote
	weft_conf "topic mp/# out 1" "bridge_max_packet_size 200"
	start_weft
	collect R $RPORT mp/#
	ready R $LPORT mp/probe
	local big
	big=$(head -c 300 /dev/zero | tr '\0' x)
	pub -p $LPORT -t mp/big -q 1 -m "$big"
	pub -p $LPORT -t mp/small -q 1 -m small
	expect R "mp/small 1 small"
	stop_weft
}

# bridge_attempt_unsubscribe (on by default): a topic that came in and is now only out is
# unsubscribed from the remote session kept since (cleansession false)
t_unsubscribe() {
	remote_conf
	start_remote
	weft_conf "topic au/# in 1" "cleansession false"
	start_weft
	collect L $LPORT au/#
	ready L $RPORT au/probe
	stop_weft
	weft_conf "topic au/# out 1" "cleansession false" "$@"
	start_weft
	collect L2 $LPORT au/#
	collect R $RPORT au/#
	ready L2 $LPORT au/probe
	ready R $LPORT au/probe
	pub -p $RPORT -t au/x -q 1 -m came-in
	expect R "au/x 1 came-in"
	expect L2 # nothing: the remote no longer sends au/# to the bridge
	stop_weft
}

# $SYS/broker/connection/<remote_clientid>/state (or notification_topic): 1 on both sides when
# up; 0 locally when the remote goes; 0 at the remote when weft-mqtt stops cleanly, and by the
# will when it dies
t_notifications() {
	remote_conf
	start_remote
	weft_conf "topic n/# out 0" "connection r2" "address 127.0.0.1:$RPORT" "remote_clientid br2" \
		"notification_topic bridges/r2/state" "topic m/# out 0" "restart_timeout 1" \
		"connection r3" "address 127.0.0.1:$RPORT" "remote_clientid br3" \
		"notifications_local_only true" "topic o/# out 0"
	start_weft
	state $RPORT '$SYS/broker/connection/br1/state' 1
	state $LPORT '$SYS/broker/connection/br1/state' 1
	state $RPORT bridges/r2/state 1
	state $LPORT bridges/r2/state 1
	state $LPORT '$SYS/broker/connection/br3/state' 1
	[ -z "$(mosquitto_sub -p $RPORT -t '$SYS/broker/connection/br3/state' -C 1 -W 1 2>/dev/null)" ] ||
		fail "notifications_local_only: the remote has a state for br3"
	stop_remote
	state $LPORT '$SYS/broker/connection/br1/state' 0
	state $LPORT bridges/r2/state 0
	start_remote
	state $LPORT bridges/r2/state 1
	state $RPORT bridges/r2/state 1
	stop_weft
	state $RPORT '$SYS/broker/connection/br1/state' 0
	state $RPORT bridges/r2/state 0
	start_weft
	state $RPORT bridges/r2/state 1
	kill -KILL $WPID
	wait $WPID 2>/dev/null
	state $RPORT bridges/r2/state 0 # the will
	state $RPORT '$SYS/broker/connection/br1/state' 0
}

# A second weft-mqtt as the remote, through a 3.1.1 bridge (try_private: weft-mqtt as a server
# takes the bridge bit, as mosquitto does) and a 5.0 one: both ways, each message once
t_weft_to_weft() {
	printf 'listener %s 127.0.0.1\n' $RPORT > "$dir/remote.conf"
	"$WEFT" -c "$dir/remote.conf" >> "$dir/remote.log" 2>&1 &
	RPID=$!
	pids+=($RPID)
	wait_port $RPORT $RPID || fail "the remote weft-mqtt did not start"
	weft_conf "topic w3/# both 1" "connection r5" "address 127.0.0.1:$RPORT" \
		"remote_clientid br5" "bridge_protocol_version mqttv50" "topic w5/# both 1"
	start_weft
	collect R $RPORT w3/# w5/#
	collect L $LPORT w3/# w5/#
	for t in w3 w5; do
		ready R $LPORT $t/probe
		ready L $RPORT $t/probe
		pub -p $LPORT -t $t/l -q 1 -m l
		pub -p $RPORT -t $t/r -q 1 -m r
	done
	expect R "w3/l 1 l" "w3/r 1 r" "w5/l 1 l" "w5/r 1 r"
	expect L "w3/l 1 l" "w3/r 1 r" "w5/l 1 l" "w5/r 1 r"
	stop_weft
	kill -TERM $RPID
	wait $RPID || fail "the remote weft-mqtt did not exit cleanly"
	! grep -qE "Sanitizer|runtime error" "$dir/remote.log" || fail "a sanitizer's report in remote.log"
}

# The other way round: mosquitto's own bridge (3.1.1, try_private, its defaults) to weft-mqtt
# as the remote, "both": each message once on each side
t_mosquitto_to_weft() {
	weft_conf_plain() { printf 'listener %s 127.0.0.1\n' $LPORT > "$dir/weft.conf"; }
	weft_conf_plain
	start_weft
	{
		echo "user root"
		echo "listener $RPORT 127.0.0.1"
		echo "allow_anonymous true"
		echo "connection toweft"
		echo "address 127.0.0.1:$LPORT"
		echo "remote_clientid mosq"
		echo "topic mw/# both 2"
	} > "$dir/remote.conf"
	start_remote
	collect R $RPORT mw/#
	collect L $LPORT mw/#
	ready R $LPORT mw/probe
	ready L $RPORT mw/probe
	for q in 0 1 2; do
		pub -p $LPORT -t mw/w -q $q -m $q
		pub -p $RPORT -t mw/m -q $q -m $q
	done
	local all=("mw/w 0 0" "mw/w 1 1" "mw/w 2 2" "mw/m 0 0" "mw/m 1 1" "mw/m 2 2")
	expect R "${all[@]}"
	expect L "${all[@]}"
	stop_weft
}

# keepalive_interval: with nothing to carry, the bridge pings (mosquitto logs the PINGREQ)
t_keepalive() {
	remote_conf
	start_remote
	weft_conf "topic k/# out 0" "keepalive_interval 5"
	start_weft
	state $RPORT '$SYS/broker/connection/br1/state' 1
	for i in $(seq 80); do
		grep -q "Received PINGREQ from br1" "$dir/remote.log" && break
		sleep 0.1
	done
	grep -q "Received PINGREQ from br1" "$dir/remote.log" || fail "no PINGREQ within 8 s"
	grep -q "Client br1 .*disconnect\|br1 has exceeded timeout" "$dir/remote.log" &&
		fail "the remote dropped the bridge"
	pub -p $LPORT -t k/after -m ping
	stop_weft
}

# Every bad line is reported with file:line, and weft-mqtt does not start
t_config_errors() {
	local c="$dir/bad.conf" n=0
	check() { # check LINE_NO EXPECTED_TEXT LINES...
		local ln=$1 text=$2
		shift 2
		printf '%s\n' "$@" > "$c"
		n=$((n + 1))
		"$WEFT" -c "$c" > "$dir/err.log" 2>&1 &
		local p=$!
		pids+=($p)
		wait $p
		local rc=$?
		[ $rc -eq 2 ] || fail "case $n: exit $rc, not 2: $(cat "$dir/err.log")"
		grep -qF "$c:$ln: $text" "$dir/err.log" ||
			fail "case $n: wanted '$c:$ln: $text', got: $(cat "$dir/err.log")"
	}
	local a="address 127.0.0.1:1"
	check 1 "address needs a connection line before it" "address 127.0.0.1"
	check 3 "topic direction 'sideways' is not out, in or both" "connection x" "$a" "topic a sideways"
	check 3 "the topic's qos needs a number from 0 to 2" "connection x" "$a" "topic a out 3"
	check 3 "an empty topic pattern needs both a local and a remote prefix" "connection x" "$a" \
		'topic "" out 1 local/'
	check 3 "bad local prefix 'l/#/'" "connection x" "$a" "topic a out 1 l/#/ r/"
	check 3 "bad topic pattern 'a/#/b'" "connection x" "$a" "topic a/#/b"
	check 3 "bridge option 'round_robin' is not supported" "connection x" "$a" "round_robin true"
	check 3 "start_type: only automatic is supported" "connection x" "$a" "start_type lazy"
	check 3 "bridge_protocol_version needs mqttv311 or mqttv50" "connection x" "$a" \
		"bridge_protocol_version mqttv31"
	check 3 "keepalive_interval needs a number from 5 to 65535" "connection x" "$a" \
		"keepalive_interval 0"
	check 3 "restart_timeout's cap needs a number from 10 to 86400" "connection x" "$a" \
		"restart_timeout 10,5"
	check 2 "the address's port needs a number from 1 to 65535" "connection x" \
		"address 127.0.0.1:99999"
	check 2 "connection x has no address" "# a comment" "connection x" "topic a"
	check 1 "connection x has no topic" "connection x" "$a"
	check 4 "a second connection named 'x'" "connection x" "$a" "topic a" "connection x"
	check 4 "cleansession needs true or false" "connection x" "$a" "topic a" "cleansession yes"
	check 2 "connection x: TLS options need bridge_cafile or bridge_capath" "listener 1" \
		"connection x" "$a" \
		"topic a" "bridge_insecure true"
	check 3 "unknown option 'bridge_frobnicate'" "connection x" "$a" "bridge_frobnicate 1"
	echo "$n bad configurations refused with file:line"
}

# A configuration with every supported option starts (the remote is not there: it retries)
t_config_every_option() {
	printf 'x' > "$dir/ca.pem"
	weft_conf "addresses 127.0.0.1:1 127.0.0.1:2" "topic a/# out 0" 'topic b/# in 1 "" r/' \
		"topic c both 2 l/ r/" "remote_username u" "remote_password p" "local_clientid lc" \
		"cleansession true" "local_cleansession false" "keepalive_interval 30" \
		"bridge_protocol_version mqttv50" "try_private false" "notifications true" \
		"notifications_local_only true" "notification_topic n/state" "restart_timeout 2 10" \
		"start_type automatic" "bridge_max_packet_size 10000" "bridge_outgoing_retain false" \
		"bridge_attempt_unsubscribe false"
	start_weft
	for i in $(seq 100); do
		grep -q "bridge r1: 127.0.0.1:$RPORT: Connection refused" "$dir/weft.log" && break
		sleep 0.05
	done
	grep -q "bridge r1: 127.0.0.1:$RPORT: Connection refused" "$dir/weft.log" ||
		fail "no attempt on the first address"
	stop_weft
	# the TLS options are checked at start: a CA file that is no certificate is refused
	weft_conf "topic a out" "bridge_cafile $dir/ca.pem" "bridge_capath $dir" \
		"bridge_certfile $dir/ca.pem" "bridge_keyfile $dir/ca.pem" "bridge_insecure true" \
		"bridge_tls_version tlsv1.2"
	timeout 20 "$WEFT" -c "$dir/weft.conf" > "$dir/start.log" 2>&1
	grep -q "weft-mqtt: bridge r1: " "$dir/start.log" || fail "bad TLS files not reported: $(cat "$dir/start.log")"
}

"t_$1"
