#!/bin/sh
# mqtt-layers: the broker's folders are layers, and a folder uses only the folders below it.
# A test binary for tests/run.sh: `mqtt-layers --list` prints the test names, `mqtt-layers
# NAME` runs one; `mqtt-layers --graph` prints which folder uses which (and how many symbols).
#
# The layers, lowest first, are LAYERS below (apps/mqtt/weft-mqtt.mk and docs/weft-mqtt.md,
# "Folders", say what each holds); the objects directly in the object directory (config.o,
# metrics.o, sys.o, restore.o: the program) are the top, "top".
#
# It reads the broker's objects as built (obj/mqtt beside the tests directory this script is
# copied to, or $MQTT_OBJ_DIR): for each object, nm's undefined symbols that another object of
# the broker defines. An object may use what its own folder or a folder below defines; a use
# of a folder above (which would also close a circle: that folder already uses this one, or may)
# fails, naming the object, the symbol and where it is defined. Symbols from outside the
# broker (weft, libc, OpenSSL, SQLite, sanitizers) are not looked at. Rejected: checking the
# #include lines, which say what a file may see (broker.h's types are shared), not what it
# calls; the linker's view is what a call across layers is.
LAYERS="wire base access persist route conn bridge top"
TESTS="folders_use_only_folders_below every_object_in_a_layer"

dir=${MQTT_OBJ_DIR:-$(dirname "$0")/../obj/mqtt}
# The objects the broker links, relative to $dir: the build writes them in place of @OBJS@ as
# it copies this script (so that a stale object of a file since moved is not read); else every
# object found there.
objs="@OBJS@"

if [ "$1" = --list ]; then
	printf '%s\n' $TESTS
	exit 0
fi
case " $TESTS --graph " in
*" $1 "*) ;;
*) echo "mqtt-layers: no test named '$1'"; exit 2 ;;
esac
if [ -n "$RUNNER" ]; then
	echo "under an emulator (RUNNER=$RUNNER)"
	exit 77
fi
if ! command -v nm >/dev/null 2>&1; then
	echo "nm is not installed (Debian: binutils)"
	exit 77
fi
[ -d "$dir" ] || { echo "mqtt-layers: no objects in $dir"; exit 1; }

tmp=$(mktemp -d /tmp/weft-layers.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# objects as "folder/name.o" (top: "top/name.o"), with their defined and undefined symbols
case $objs in
@*) (cd "$dir" && find . -name '*.o' | sed 's|^\./||' | sort) > "$tmp/objs" ;;
*) printf '%s\n' $objs | sort > "$tmp/objs" ;;
esac
[ -s "$tmp/objs" ] || { echo "mqtt-layers: no objects in $dir"; exit 1; }
: > "$tmp/defs"
: > "$tmp/uses"
while read -r o; do
	case $o in */*) name=$o ;; *) name=top/$o ;; esac
	nm -g --defined-only "$dir/$o" | awk -v f="$name" 'NF >= 3 { print $3, f }' >> "$tmp/defs"
	nm -u "$dir/$o" | awk -v f="$name" '{ print $NF, f }' >> "$tmp/uses"
done < "$tmp/objs"
sort -o "$tmp/defs" "$tmp/defs"
sort -o "$tmp/uses" "$tmp/uses"
# symbol user definer
join "$tmp/uses" "$tmp/defs" | awk '$2 != $3' > "$tmp/edges"

case $1 in
every_object_in_a_layer)
	awk -v layers="$LAYERS" 'BEGIN { n = split(layers, l, " "); for (i = 1; i <= n; i++) ok[l[i]] = 1 }
		{ o = $0; if (o !~ /\//) o = "top/" o; split(o, p, "/")
		  if (!(p[1] in ok)) { print "FAIL " o ": folder " p[1] "/ is not a layer (" layers ")"; bad = 1 } }
		END { exit bad }' "$tmp/objs"
	;;
folders_use_only_folders_below)
	awk -v layers="$LAYERS" 'BEGIN { n = split(layers, l, " "); for (i = 1; i <= n; i++) rank[l[i]] = i }
		{ split($2, u, "/"); split($3, d, "/")
		  if (u[1] != d[1] && (!(u[1] in rank) || !(d[1] in rank) || rank[d[1]] > rank[u[1]])) {
			print "FAIL " $2 " uses " $1 ", defined in " $3 ": " d[1] "/ is above " u[1] "/"
			bad = 1 } }
		END { exit bad }' "$tmp/edges"
	;;
--graph)
	awk '{ split($2, u, "/"); split($3, d, "/"); if (u[1] != d[1]) n[u[1] " -> " d[1]]++ }
		END { for (e in n) print e " (" n[e] " symbols)" }' "$tmp/edges" | sort
	;;
esac
