#!/bin/sh
# Write bench/results/report.md (the table of the last run) and, where gnuplot is installed
# (Debian: gnuplot-nox, see `make bench-peers`), charts of the seed experiments:
# bench/results/mutex.png and bench/results/packets.png.
res=bench/results
in=$res/latest.jsonl
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
{
	echo "# weft benchmark report"
	echo
	echo "$(date -u +%Y-%m-%d), $cpu. Medians of 5 runs; baselines measured in the same run."
	echo
	echo "| bench | measurement | value | unit | notes |"
	echo "| --- | --- | --- | --- | --- |"
	awk -F'"' '/^\{/ { v = $0; sub(/.*"value":/, "", v); sub(/,.*/, "", v)
		printf "| %s | %s | %.4g | %s | %s |\n", $4, $8, v, $12, $18 }' "$in"
} > $res/report.md

command -v gnuplot >/dev/null 2>&1 || { echo "  (gnuplot not installed: no charts)" >&2; exit 0; }

# mutex: ns per increment against N, one line per implementation
awk -F'"' '/"bench":"mutex"/ && $8 ~ / N=[0-9]+$/ {
		n = $8; sub(/.* N=/, "", n); v = $0; sub(/.*"value":/, "", v); sub(/,.*/, "", v)
		who = $8; sub(/ N=.*/, "", who)
		if (who == "weft" && $18 ~ /^workers=1 /) next
		val[n, who] = v; ns[n] = 1 }
	END {
		for (n in ns) printf "%s %s %s %s %s %s\n", n,
			((n, "weft") in val) ? val[n, "weft"] : "?",
			((n, "pthread_mutex") in val) ? val[n, "pthread_mutex"] : "?",
			((n, "go sync.Mutex") in val) ? val[n, "go sync.Mutex"] : "?",
			((n, "gambit") in val) ? val[n, "gambit"] : "?",
			((n, "spinlock") in val) ? val[n, "spinlock"] : "?" }' "$in" |
	sort -n | (echo "N weft pthread go gambit spinlock"; cat) > $res/mutex.dat

# packets: ms for 10^6 packets by capacity, weft and Go on 1 and 2 cores
awk -F'"' '/"bench":"packets"/ && $8 ~ /^(weft|go) cap=[0-9a-z]+$/ {
		cap = $8; sub(/.*cap=/, "", cap); ms = $18; sub(/.*ms=/, "", ms); sub(/ .*/, "", ms)
		who = ($8 ~ /^weft/) ? "weft" : "go"
		cores = ($18 ~ /workers=1|GOMAXPROCS=1/) ? 1 : 2
		val[cap, who, cores] = ms; caps[cap] = 1 }
	END {
		for (c in caps) printf "%s %s %s %s %s\n", c,
			((c, "weft", 1) in val) ? val[c, "weft", 1] : "?",
			((c, "weft", 2) in val) ? val[c, "weft", 2] : "?",
			((c, "go", 1) in val) ? val[c, "go", 1] : "?",
			((c, "go", 2) in val) ? val[c, "go", 2] : "?" }' "$in" |
	sort -V | (echo "capacity weft-1-worker weft-2-workers go-GOMAXPROCS=1 go-GOMAXPROCS=2"; cat) \
	> $res/packets.dat

gnuplot <<GP
set terminal pngcairo size 900,520 noenhanced
set datafile missing "?"
set key autotitle columnhead left top
set grid ytics

set output "$res/mutex.png"
set title "N tasks x 10^6 increments under one mutex: ns per increment (lower is better)\n$cpu"
set logscale x
set xlabel "N (tasks or threads)"
set ylabel "ns per increment"
plot for [i=2:6] "$res/mutex.dat" using 1:i with linespoints lw 2

unset logscale x
set output "$res/packets.png"
set title "10^6 packets through one channel, 100 producers x 100 consumers: ms (lower is better)\n$cpu"
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set logscale y
set xlabel "channel capacity"
set ylabel "ms for 10^6 packets (log scale)"
plot for [i=2:5] "$res/packets.dat" using i:xtic(1)
GP
