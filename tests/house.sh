#!/bin/sh
# house: rules of the source tree that a reviewer would otherwise check by hand. A test binary
# for tests/run.sh: `house --list` prints the test names, `house NAME` runs one. The build
# copies this script to $(B)/tests/house with @ROOT@ replaced by the source tree's path.
#
#   files_under_1000_lines   every .c, .h and .S under src/, apps/ and tools/ is shorter than
#                            1,000 lines: one concept per file, and a file a reader can hold
#   repository_stands_alone  no source, doc or build file points outside the repository
#                            (../shared, or the documents it was first specified in)
root='@ROOT@'
TESTS="files_under_1000_lines repository_stands_alone"

case "$1" in
--list)
	echo "$TESTS"
	exit 0 ;;
files_under_1000_lines)
	cd "$root" || exit 1
	long=$(find src apps tools -name node_modules -prune -o \
		\( -name '*.c' -o -name '*.h' -o -name '*.S' \) -type f -print |
		xargs wc -l | awk '$2 != "total" && $1 >= 1000 { print "  " $2 ": " $1 " lines" }')
	[ -z "$long" ] && exit 0
	echo "files of 1,000 lines or more (split them by concept):"
	echo "$long"
	exit 1 ;;
repository_stands_alone)
	cd "$root" || exit 1
	found=$(git ls-files 2>/dev/null | grep -v '^tests/house.sh$' |
		xargs grep -n -I -E '\.\./shared|seed documents?|shared/DESIGN' 2>/dev/null)
	if [ -z "$(git ls-files 2>/dev/null | head -1)" ]; then
		echo "not a git checkout: cannot list the repository's files"
		exit 77
	fi
	[ -z "$found" ] && exit 0
	echo "references outside the repository:"
	echo "$found"
	exit 1 ;;
*)
	echo "unknown test: $1" >&2
	exit 2 ;;
esac
