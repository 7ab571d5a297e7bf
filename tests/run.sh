#!/bin/sh
# Run every test of every test binary given, each in a process of its own, with a time limit.
# Prints one line per test and ends with "N passed, N failed, N skipped"; exits non-zero on any
# failure. A test that exits with 77 (TEST_SKIPPED, tests/test.h) could not run here: it is
# shown as `skip NAME: why`, with the last line it printed as the why, and is not counted as
# passed. $RUNNER prefixes each command (qemu-user for cross builds).
pass=0
fail=0
skip=0
limit=${TEST_TIMEOUT:-300}
log=$(mktemp)
for bin in "$@"; do
	names=$($RUNNER "$bin" --list) || { echo "FAIL $bin --list"; fail=$((fail + 1)); continue; }
	for t in $names; do
		start=$(date +%s.%N)
		timeout -k 5 "$limit" $RUNNER "$bin" "$t" >"$log" 2>&1
		rc=$?
		name="$(basename "$bin") $t"
		if [ $rc -eq 0 ]; then
			pass=$((pass + 1))
			printf 'ok   %-40s %6.2fs\n' "$name" "$(awk "BEGIN{print $(date +%s.%N) - $start}")"
		elif [ $rc -eq 77 ]; then
			skip=$((skip + 1))
			echo "skip $name: $(grep -v '^[[:space:]]*$' "$log" | tail -n 1)"
		else
			fail=$((fail + 1))
			echo "FAIL $name (exit $rc$([ $rc -eq 124 ] && echo ', timed out'))"
			sed 's/^/     | /' "$log" | tail -n 40
		fi
	done
done
rm -f "$log"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
