#!/bin/sh
# Run every benchmark program in the directory given and print the table of their results.
# The raw JSON lines are kept in bench/results/latest.jsonl; bench/report.sh writes report.md
# and the charts beside it.
dir=$1
mkdir -p bench/results
out=bench/results/latest.jsonl
: > "$out"
echo "weft benchmarks on $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" >&2
for b in "$dir"/*; do
	[ -x "$b" ] || continue
	"$b" >> "$out" || echo "benchmark $(basename "$b") failed" >&2
done
awk -F'"' '
	BEGIN { printf "%-10s %-36s %14s  %-10s %s\n", "bench", "measurement", "value", "unit", "notes"
	        printf "%-10s %-36s %14s  %-10s %s\n", "-----", "-----------", "-----", "----", "-----" }
	/^\{/ { v = $0; sub(/.*"value":/, "", v); sub(/,.*/, "", v)
	        printf "%-10s %-36s %14.4g  %-10s %s\n", $4, $8, v, $12, $18 }' "$out"
sh bench/report.sh
