/*
 * sys.h - raw system calls for weft's own I/O. Under the shim (shim.c) the libc names read,
 * write, ... are weft's; weft itself must reach the kernel directly, or it would call itself.
 */
#ifndef WEFT_SYS_H
#define WEFT_SYS_H

#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define sys_read(fd, b, n) syscall(SYS_read, (fd), (b), (n))
#define sys_write(fd, b, n) syscall(SYS_write, (fd), (b), (n))
#define sys_readv(fd, v, n) syscall(SYS_readv, (fd), (v), (n))
#define sys_writev(fd, v, n) syscall(SYS_writev, (fd), (v), (n))
#define sys_recvfrom(fd, b, n, fl, a, l) syscall(SYS_recvfrom, (fd), (b), (n), (fl), (a), (l))
#define sys_sendto(fd, b, n, fl, a, l) syscall(SYS_sendto, (fd), (b), (n), (fl), (a), (l))
#define sys_recvmsg(fd, m, fl) syscall(SYS_recvmsg, (fd), (m), (fl))
#define sys_sendmsg(fd, m, fl) syscall(SYS_sendmsg, (fd), (m), (fl))
#define sys_accept4(fd, a, l, fl) syscall(SYS_accept4, (fd), (a), (l), (fl))
#define sys_connect(fd, a, l) syscall(SYS_connect, (fd), (a), (l))
#define sys_close(fd) syscall(SYS_close, (fd))
#define sys_ppoll(p, n, ts) syscall(SYS_ppoll, (p), (n), (ts), NULL, 0)
#endif
