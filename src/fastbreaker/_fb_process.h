/* Process ids for state shared between processes (SharedRegion): who holds a claim or a slot,
 * and whether that process still exists. POSIX only; SharedRegion refuses to run on Windows, where
 * these are stubs so that the extension still builds. */
#ifndef FB_PROCESS_H
#define FB_PROCESS_H

#include <stdint.h>

#if defined(_WIN32)
static inline int64_t fb_getpid(void) { return 1; }
static inline int fb_process_gone(int64_t pid) { (void)pid; return 0; }
static inline void fb_stall(int fd) { (void)fd; for (;;) {} }
#else
#include <errno.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

static inline int64_t fb_getpid(void) { return (int64_t)getpid(); }
/* 1 when no process has this id (a zombie still has it until its parent reaps it). */
static inline int fb_process_gone(int64_t pid) {
    if (pid <= 0) return 0;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}
/* The kill tests' hook: tell the test through `fd`, then never return. */
static inline void fb_stall(int fd) {
    ssize_t r = write(fd, "x", 1);
    (void)r;
    for (;;) pause();
}
#endif

#endif
