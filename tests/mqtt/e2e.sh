#!/bin/sh
# mqtt-e2e: the end-to-end tests of the MQTT broker with real clients (mosquitto_pub and
# mosquitto_sub from Debian mosquitto-clients, MQTT.js from npm), as a test binary for
# tests/run.sh: `mqtt-e2e --list` prints the test names, `mqtt-e2e NAME` runs one.
#
# BROKER=weft (the default) tests weft-mqtt from this build (bin/weft-mqtt beside the tests
# directory this script is copied to); BROKER=mosquitto tests the Debian mosquitto instead,
# which is how the tests themselves are checked. Each test starts its own broker on a free
# 127.0.0.1 port. MQTT.js is installed into tests/mqtt/node_modules (npm ci, from the
# committed package-lock.json) when it is missing. one_broker_twice runs every test twice on one
# broker that runs throughout (twice.mjs).
#
# Skipped (exit 77, shown by tests/run.sh as `skip NAME: why`) under an emulator ($RUNNER
# non-empty: the broker would run under qemu, too slow for timing-based tests) and where node
# is missing, as one test named "all" (the names are listed by node); the
# mosquitto_pub/mosquitto_sub tests are skipped one by one where those are.
src=@SRC@
bindir=$(cd "$(dirname "$0")/../bin" && pwd)
export WEFT_MQTT="$bindir/weft-mqtt"
export BROKER="${BROKER:-weft}"
PATH=$PATH:/usr/sbin

why=
if [ -n "$RUNNER" ]; then
	why="under an emulator (RUNNER=$RUNNER)"
elif ! command -v node >/dev/null 2>&1; then
	why="node is not installed (Debian: nodejs npm)"
elif [ "$BROKER" = mosquitto ] && ! command -v mosquitto >/dev/null 2>&1; then
	why="BROKER=mosquitto but mosquitto is not installed"
fi

if [ "$1" = --list ]; then
	if [ -n "$why" ]; then
		echo all
		exit 0
	fi
	sh "$src/install.sh" || { echo "mqtt-e2e: could not install MQTT.js" >&2; exit 1; }
	node "$src/run.mjs" --list && echo one_broker_twice
	exit
fi
if [ -n "$why" ]; then
	echo "$why"
	exit 77
fi
if [ "$BROKER" = weft ] && [ ! -x "$WEFT_MQTT" ]; then
	echo "mqtt-e2e: $WEFT_MQTT is not built"
	exit 1
fi
[ "$1" = one_broker_twice ] && exec node "$src/twice.mjs"
exec node "$src/run.mjs" "$1"
