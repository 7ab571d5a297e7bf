#!/bin/sh
# Run every test of every test binary given, each in a process of its own, with a time limit.
# Prints one line per test and ends with "N passed, N failed"; exits non-zero on any failure.
# $RUNNER prefixes each command (qemu-user for cross builds).
pass=0
fail=0
limit=${TEST_TIMEOUT:-300}
log=$(mktemp)
for bin in "$@"; do
	names=$($RUNNER "$bin" --list) || { echo "FAIL $bin --list"; fail=$((fail + 1)); continue; }
	for t in $names; do
		start=$(date +%s.%N)
		timeout -k 5 "$limit" $RUNNER "$bin" "$t" >"$log" 2>&1
		rc=$?
		if [ $rc -eq 0 ]; then
			pass=$((pass + 1))
			printf 'ok   %-40s %6.2fs\n' "$(basename "$bin") $t" "$(awk "BEGIN{print $(date +%s.%N) - $start}")"
		else
			fail=$((fail + 1))
			echo "FAIL $(basename "$bin") $t (exit $rc$([ $rc -eq 124 ] && echo ', timed out'))"
			sed 's/^/     | /' "$log" | tail -n 40
		fi
	done
done
rm -f "$log"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
