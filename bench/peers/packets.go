// packets.go - the one-million-packet exchange of bench/packets in Go, a baseline for it.
//
// 100 producer goroutines and 100 consumer goroutines share one channel; each producer sends
// 10,000 one-word packets, each consumer receives 10,000: 10^6 packets. For each capacity given
// on the command line it prints "cap=N ns=T", T the median of -repeat runs of the whole
// exchange. GOMAXPROCS comes from the environment.
//
//	go run packets.go [-repeat 5] 0 1 1024
package main

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"
)

const (
	producers = 100
	consumers = 100
	perTask   = 10000
)

func run(capacity int) time.Duration {
	c := make(chan [1]int, capacity)
	var wg sync.WaitGroup
	start := time.Now()
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			for i := 0; i < perTask; i++ {
				c <- [1]int{0}
			}
			wg.Done()
		}()
	}
	for q := 0; q < consumers; q++ {
		wg.Add(1)
		go func() {
			for i := 0; i < perTask; i++ {
				<-c
			}
			wg.Done()
		}()
	}
	wg.Wait()
	return time.Since(start)
}

func main() {
	repeat := flag.Int("repeat", 5, "runs per capacity (the median is printed)")
	flag.Parse()
	for _, a := range flag.Args() {
		capacity, err := strconv.Atoi(a)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bad capacity", a)
			os.Exit(2)
		}
		run(capacity) // warm-up
		d := make([]time.Duration, *repeat)
		for i := range d {
			d[i] = run(capacity)
		}
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		fmt.Printf("cap=%d ns=%d\n", capacity, d[len(d)/2].Nanoseconds())
	}
}
