#!/bin/sh
# mqtt-layers: the broker's folders are layers, and a folder uses only the folders below it.
# A test binary for tests/run.sh: `mqtt-layers --list` prints the test names, `mqtt-layers
# NAME` runs one; `mqtt-layers --graph` prints which folder uses which (and how many symbols).
#
# The layers, lowest first, are LAYERS below (apps/mqtt/weft-mqtt.mk and docs/weft-mqtt.md,
# "Folders", say what each holds); the objects directly in the object directory (config.o,
# metrics.o, sys.o, restore.o: the program) are the top, "top".
#
# Two views, both needed:
# - calls (folders_use_only_folders_below): the broker's objects as built (obj/mqtt beside the
#   tests directory this script is copied to, or $MQTT_OBJ_DIR): for each object, nm's
#   undefined symbols that another object of the broker defines. An object may use what its
#   own folder or a folder below defines; a use of a folder above (which would also close a
#   circle: that folder already uses this one, or may) fails, naming the object, the symbol
#   and where it is defined. Symbols from outside the broker (weft, libc, OpenSSL, SQLite,
#   sanitizers) are not looked at.
# - includes (includes_only_folders_below): the sources (apps/mqtt, or $MQTT_SRC_DIR), each .c
#   and .h of a layer's folder and of the top. A file may include, with #include "...", only
#   headers of its own folder or of a folder below (the top's header, broker.h, only from the
#   top); <...> is for system headers and weft's include/weft.h. Headers are found by name
#   (the build puts every folder on the -iquote path), so a name must be one header's only.
#   A violation fails, naming the file, the line and the header. The tests/ and fuzz/ folders
#   are not layers: they may include what they test.
# The calls alone would miss a header that lets a lower layer see a higher one's declarations
# (nothing links until it calls one); the includes alone would miss a call declared by hand.
LAYERS="wire base access persist route conn bridge top"
TESTS="folders_use_only_folders_below includes_only_folders_below every_object_in_a_layer"

dir=${MQTT_OBJ_DIR:-$(dirname "$0")/../obj/mqtt}
# The objects the broker links, relative to $dir: the build writes them in place of @OBJS@ as
# it copies this script (so that a stale object of a file since moved is not read); else every
# object found there.
objs="@OBJS@"
# The sources: the build writes apps/mqtt's path in place of @SRC@.
src=${MQTT_SRC_DIR:-@SRC@}
case $src in @*) src=$(dirname "$0")/../../apps/mqtt ;; esac

if [ "$1" = --list ]; then
	printf '%s\n' $TESTS
	exit 0
fi
case " $TESTS --graph " in
*" $1 "*) ;;
*) echo "mqtt-layers: no test named '$1'"; exit 2 ;;
esac
# the #include lines: no objects, no nm needed
if [ "$1" = includes_only_folders_below ]; then
	[ -d "$src" ] || { echo "mqtt-layers: no sources in $src"; exit 1; }
	cd "$src" || exit 1
	hdrs=$(mktemp /tmp/weft-layers.XXXXXX)
	trap 'rm -f "$hdrs"' EXIT
	files=$(find . \( -name '*.c' -o -name '*.h' \) | sed 's|^\./||' |
		grep -v '^\(tests\|fuzz\)/' | sort)
	# every header of the broker as "name folder" (the top's: "name top")
	for f in $files; do
		case $f in *.h) ;; *) continue ;; esac
		case $f in */*) d=${f%%/*} ;; *) d=top ;; esac
		echo "${f##*/} $d"
	done > "$hdrs"
	bad=0
	for f in $files; do
		case $f in */*) d=${f%%/*} ;; *) d=top ;; esac
		# "line header" for each #include "..."
		grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
			sed 's|^\([0-9]*\):[^"]*"\([^"]*\)".*|\1 \2|' |
			awk -v file="$f" -v folder="$d" -v layers="$LAYERS" -v hdrs="$hdrs" '
			BEGIN { n = split(layers, l, " "); for (i = 1; i <= n; i++) rank[l[i]] = i
				while ((getline h < hdrs) > 0) { split(h, p, " ")
					where[p[1]] = (p[1] in seen) ? where[p[1]] " " p[2] : p[2]
					seen[p[1]] = 1 } }
			{ at = "FAIL " file ":" $1 ": includes \"" $2 "\""; base = $2; sub(/.*\//, "", base)
			  if (!(base in seen)) {
				print at ", not a header of the broker (<...> is for system headers, weft.h)"
				bad = 1 }
			  else if (where[base] ~ / /) {
				print at ", a name several folders use (" where[base] ")"; bad = 1 }
			  else if (rank[where[base]] > rank[folder]) {
				print at " of " where[base] "/, above " folder "/"; bad = 1 } }
			END { exit bad }' || bad=1
	done
	exit $bad
fi
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
