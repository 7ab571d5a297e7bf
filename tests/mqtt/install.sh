#!/bin/sh
# Install MQTT.js into tests/mqtt/node_modules (npm ci, from the committed package-lock.json)
# unless it is there: the end-to-end tests (e2e.sh) and the WebSocket tests of ws.c
# (apps/mqtt/tests/ws_test.c) use it. Several test binaries may ask at once: flock makes one
# install and the others wait for it. Exit 0 when MQTT.js is there, 1 when it could not be
# installed (npm missing or failing).
dir=$(cd "$(dirname "$0")" && pwd)
[ -d "$dir/node_modules/mqtt" ] && exit 0
command -v npm >/dev/null 2>&1 || { echo "npm is not installed (Debian: npm)" >&2; exit 1; }
exec flock "$dir/package-lock.json" sh -c '
	[ -d "$1/node_modules/mqtt" ] && exit 0
	echo "installing MQTT.js (npm ci in $1)" >&2
	cd "$1" && npm ci --no-audit --no-fund --loglevel=error >&2' sh "$dir"
