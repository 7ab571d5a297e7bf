// sleepers.go - bench/sleepers in Go, its baseline: 10^5 goroutines each sleep 1 ms ten
// times. Prints "ms=T", T the median wall time of -repeat runs. GOMAXPROCS comes from the
// environment.
//
//	go run sleepers.go
package main

import (
	"flag"
	"fmt"
	"sort"
	"sync"
	"time"
)

func run(n int) time.Duration {
	var wg sync.WaitGroup
	start := time.Now()
	wg.Add(n)
	for i := 0; i < n; i++ {
		go func() {
			defer wg.Done()
			for k := 0; k < 10; k++ {
				time.Sleep(time.Millisecond)
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

func main() {
	repeat := flag.Int("repeat", 5, "runs; the median is printed")
	flag.Parse()
	var d []time.Duration
	for r := 0; r < *repeat; r++ {
		d = append(d, run(100000))
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	fmt.Printf("ms=%.3f\n", float64(d[len(d)/2].Microseconds())/1000)
}
