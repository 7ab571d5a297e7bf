// pool.go: examples/pool.c written in Go, for the line count in pool.c's header. Build:
// GO111MODULE=off GOPATH=/usr/share/gocode go build pool.go (Debian: golang-golang-x-sync-dev).
package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

const workers, jobs = 8, 200

type pool struct {
	bad           int
	done, running atomic.Int64
}

func (p *pool) run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	ch := make(chan int)
	g.Go(func() error {
		defer close(ch)
		for job := 1; job <= jobs; job++ {
			select {
			case ch <- job:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	for i := 0; i < workers; i++ {
		g.Go(func() error {
			p.running.Add(1)
			defer p.running.Add(-1)
			for job := range ch {
				if job == p.bad {
					return errors.New("job failed")
				}
				select {
				case <-time.After(100 * time.Microsecond): // the work
				case <-ctx.Done():
					return ctx.Err()
				}
				p.done.Add(1)
			}
			return nil
		})
	}
	return g.Wait()
}

func main() {
	var a, b, c, d pool
	b.bad = 50
	fmt.Println("all jobs:", a.run(context.Background()), a.done.Load())
	fmt.Println("job 50 fails:", b.run(context.Background()), b.done.Load())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
	fmt.Println("2 ms deadline:", c.run(ctx), c.done.Load())
	cancel()
	ctx, cancel = context.WithCancel(context.Background())
	end := make(chan error)
	go func() { end <- d.run(ctx) }()
	time.Sleep(2 * time.Millisecond)
	cancel()
	fmt.Println("closer cancelled:", <-end, d.done.Load(), "done,", d.running.Load(), "running")
}
