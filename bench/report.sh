#!/bin/sh
# Write bench/results/report.md (the table of the last run) and, where gnuplot is installed
# (Debian: gnuplot-nox, see `make bench-peers`), charts of the four experiments:
# bench/results/mutex.png, packets.png, dwarves.png and mqtt.png.
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

# dwarves: dwarves per second, weft's two flows against the bounds and the thread baselines
awk -F'"' '/"bench":"dwarves"/ && $8 !~ /^cpu/ {
		v = $0; sub(/.*"value":/, "", v); sub(/,.*/, "", v); printf "\"%s\" %s\n", $8, v }' "$in" \
	> $res/dwarves.dat

# mqtt: delivered msgs/s and broker CPU per message by scenario: weft-mqtt (a worker per core,
# and one worker) and mosquitto
awk -F'"' '/"bench":"mqtt"/ && $8 ~ /^(weft-mqtt|weft-mqtt-1w|mosquitto) (fanin|pairs-q0|pairs-q1|fanout|rate)( cpu)?$/ {
		n = split($8, f, " "); v = $0; sub(/.*"value":/, "", v); sub(/,.*/, "", v)
		key = f[2]; who = f[1]; what = (n == 3) ? "cpu" : "rate"
		val[key, who, what] = v; keys[key] = 1 }
	END {
		split("fanin pairs-q0 pairs-q1 fanout rate", order, " ")
		for (i = 1; i <= 5; i++) { k = order[i]; if (!(k in keys)) continue
			printf "%s", k
			for (w = 0; w < 2; w++) {
				what = w ? "cpu" : "rate"
				printf " %s %s %s",
					((k, "weft-mqtt", what) in val) ? val[k, "weft-mqtt", what] : "?",
					((k, "weft-mqtt-1w", what) in val) ? val[k, "weft-mqtt-1w", what] : "?",
					((k, "mosquitto", what) in val) ? val[k, "mosquitto", what] : "?" }
			printf "\n" } }' "$in" |
	(echo "scenario weft-mqtt weft-mqtt,1-worker mosquitto weft-mqtt weft-mqtt,1-worker mosquitto"
	 cat) > $res/mqtt.dat

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

unset logscale y
set output "$res/dwarves.png"
set title "Dwarves per second: 10,000 apples x 10 x usleep(100) (higher is better)\n$cpu"
set style histogram clustered gap 1
set key noautotitle
set key off
set xlabel ""
set ylabel "dwarves (apples) per second"
set yrange [0:*]
set xtics rotate by -20
plot "$res/dwarves.dat" using 2:xtic(1) lc rgb "#4e79a7"

set output "$res/mqtt.png"
set multiplot layout 1,2 title "weft-mqtt and mosquitto 2.0, same load generator, same run\n$cpu"
set key on autotitle columnhead left top Left reverse font ",9"
set xtics norotate font ",8"
set title "delivered msgs/s (higher is better)"
set yrange [1000:*]
set logscale y
set ylabel "msgs/s (log scale)"
plot "$res/mqtt.dat" using 2:xtic(1) lc rgb "#4e79a7", "" using 3 lc rgb "#76b7b2", \
     "" using 4 lc rgb "#f28e2b"
set title "broker CPU per delivered message (lower is better)"
unset logscale y
set yrange [0:*]
set ylabel "us of CPU per message"
plot "$res/mqtt.dat" using 5:xtic(1) lc rgb "#4e79a7", "" using 6 lc rgb "#76b7b2", \
     "" using 7 lc rgb "#f28e2b"
unset multiplot
GP
