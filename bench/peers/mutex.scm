;; bench/peers/mutex.scm - the contended counter of bench/mutex in Gambit Scheme, with
;; Gambit's threads and mutexes, as a baseline for bench/mutex, which compiles it with
;; `gsc -exe` and runs it when Gambit is installed.
;;
;;   mutex N ITERS   -> prints "<ns per increment> -1"  (the wait for the lock is not timed)
;;
;; N threads each increment one global count ITERS times inside mutex-lock!/mutex-unlock! (N
;; and ITERS from the command line); the program times itself with real-time, checks the count,
;; and prints ns per increment.

(declare (standard-bindings) (extended-bindings) (fixnum) (not safe) (block))

(define count 0)

(define mut (make-mutex))

(define iters (string->number (caddr (command-line))))

(define (body)
  (let loop ((n iters))
    (if (> n 0)
        (begin
          (mutex-lock! mut)
          (set! count (+ count 1))
          (mutex-unlock! mut)
          (loop (- n 1))))))

(define (iota n)
  (let loop ((i (- n 1)) (lst '()))
    (if (>= i 0)
        (loop (- i 1) (cons i lst))
        lst)))

(define nthreads (string->number (cadr (command-line))))

(define start (real-time))

(define threads
  (map (lambda (id) (thread-start! (make-thread body)))
       (iota nthreads)))

(map thread-join! threads)

(define elapsed (fl- (real-time) start)) ; fl ops: (fixnum) makes + - * / fixnum-only

(if (not (= count (* nthreads iters)))
    (begin (display "wrong count\n" (current-error-port)) (exit 1)))

(display (fl/ (fl* elapsed 1e9) (fixnum->flonum (* nthreads iters))))
(display " -1\n")
