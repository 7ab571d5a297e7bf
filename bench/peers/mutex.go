// bench/peers/mutex.go - the contended counter of bench/mutex with Go's sync.Mutex, a baseline for
// bench/mutex (which builds and runs it when `go` is installed).
//
//	mutex N ITERS         -> prints "<ns per increment> -1"
//	mutex N ITERS timed   -> prints "<ns per increment> <longest wait for the lock in ns>"
//
// N goroutines (GOMAXPROCS: all cores) each increment one shared counter ITERS times, each
// increment inside Lock/Unlock of one global sync.Mutex: bench/mutex's loop. With "timed", as in
// the C programs, a TryLock comes first and only a failed one is followed by a timed Lock
// (that loop runs faster: a goroutine whose TryLock fails barges once more before queueing).
package main

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

var (
	mu    sync.Mutex
	count int
)

func plain(iters int, wg *sync.WaitGroup) {
	defer wg.Done()
	for i := 0; i < iters; i++ {
		mu.Lock()
		count++
		mu.Unlock()
	}
}

func timed(iters int, maxWait *int64, wg *sync.WaitGroup) {
	defer wg.Done()
	var mw int64
	for i := 0; i < iters; i++ {
		if !mu.TryLock() {
			t0 := time.Now()
			mu.Lock()
			if w := int64(time.Since(t0)); w > mw {
				mw = w
			}
		}
		count++
		mu.Unlock()
	}
	*maxWait = mw
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: mutex N ITERS [timed]")
		os.Exit(2)
	}
	isTimed := len(os.Args) > 3 && os.Args[3] == "timed"
	n, _ := strconv.Atoi(os.Args[1])
	iters, _ := strconv.Atoi(os.Args[2])
	waits := make([]int64, n)
	var wg sync.WaitGroup
	start := time.Now()
	for g := 0; g < n; g++ {
		wg.Add(1)
		if isTimed {
			go timed(iters, &waits[g], &wg)
		} else {
			go plain(iters, &wg)
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	if count != n*iters {
		fmt.Fprintf(os.Stderr, "count=%d, want %d\n", count, n*iters)
		os.Exit(1)
	}
	longest := int64(-1)
	for _, w := range waits {
		if !isTimed {
			break
		}
		if w > longest {
			longest = w
		}
	}
	fmt.Printf("%.4f %d\n", float64(elapsed.Nanoseconds())/float64(n*iters), longest)
}
