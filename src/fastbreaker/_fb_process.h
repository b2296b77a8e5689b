/* Process identity for state shared between processes (SharedRegion): who holds a claim or a
 * slot, and whether that process still exists. POSIX only; SharedRegion refuses to run on Windows,
 * where these are stubs so that the extension still builds.
 *
 * An owner is one int64 word (written and compared atomically): the pid in the low 32 bits and,
 * where the platform tells a process's start time (Linux: field 22 of /proc/<pid>/stat, in clock
 * ticks since boot), its low 31 bits above them. A pid given to a new process after its holder
 * died then no longer matches the owner: the start time differs. Elsewhere the start time is 0
 * and the owner is the pid alone (a reused pid keeps a dead holder's slot until it exits too).
 * _process.py computes the same words for the pure-Python twin. */
#ifndef FB_PROCESS_H
#define FB_PROCESS_H

#include <stdint.h>

#if defined(_WIN32)
static inline int64_t fb_owner_self(void) { return 1; }
static inline int fb_owner_gone(int64_t owner) { (void)owner; return 0; }
static inline int fb_owner_stopped(int64_t owner) { (void)owner; return 0; }
static inline void fb_pause(int64_t ns) { (void)ns; }
static inline void fb_stall(int fd) { (void)fd; for (;;) {} }
#else
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define FB_OWNER_PID(o) ((int64_t)((uint64_t)(o) & 0xFFFFFFFFu))
#define FB_OWNER_START(o) ((int64_t)((uint64_t)(o) >> 32))

/* The low 31 bits of the start time of `pid`; 0 when not known (not Linux, no such process, or
 * /proc hides it: mounted with hidepid, another user's process looks absent while it runs). */
static inline int64_t fb_start_time(int64_t pid) {
#if defined(__linux__)
    char path[48], buf[1024];
    const char *p;
    ssize_t n;
    int fd, field;
    unsigned long long start = 0;
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    p = strrchr(buf, ')');  /* the command name (field 2) may hold spaces and parentheses */
    if (p == NULL) return 0;
    for (field = 2; field < 22 && p != NULL; field++) p = strchr(p + 1, ' ');
    if (p == NULL || sscanf(p + 1, "%llu", &start) != 1) return 0;
    return (int64_t)(start & 0x7FFFFFFFu);
#else
    (void)pid;
    return 0;
#endif
}

static inline int64_t fb_owner_of(int64_t pid, int64_t start) {
    return (int64_t)(((uint64_t)(start & 0x7FFFFFFF) << 32) | ((uint64_t)pid & 0xFFFFFFFFu));
}

/* This process's owner word (call again after a fork). */
static inline int64_t fb_owner_self(void) {
    int64_t pid = (int64_t)getpid();
    return fb_owner_of(pid, fb_start_time(pid));
}

/* 1 when the owner's process is gone: no process has its pid (a zombie still has it until its
 * parent reaps it), or the process with that pid started at another time (the pid was reused).
 * A start time that cannot be read counts as the same one: a live holder is never freed. */
static inline int fb_owner_gone(int64_t owner) {
    int64_t pid = FB_OWNER_PID(owner), recorded = FB_OWNER_START(owner), now;
    if (pid <= 0) return 0;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 1;
    if (recorded == 0) return 0;
    now = fb_start_time(pid);
    return now != 0 && now != recorded;
}

/* 1 when the owner's process is seen stopped (SIGSTOP, a debugger: state T or t in
 * /proc/<pid>/stat); 0 when it runs, sleeps, or its state cannot be read (not Linux). A process
 * merely descheduled on a busy machine is not stopped. */
static inline int fb_owner_stopped(int64_t owner) {
#if defined(__linux__)
    char path[48], buf[1024];
    const char *p;
    ssize_t n;
    int fd;
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)FB_OWNER_PID(owner));
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    p = strrchr(buf, ')');
    return p != NULL && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
#else
    (void)owner;
    return 0;
#endif
}

/* Give the CPU away for about `ns` (a bounded wait on another process). */
static inline void fb_pause(int64_t ns) {
    struct timespec ts;
    ts.tv_sec = (time_t)(ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    nanosleep(&ts, NULL);
}

/* The kill tests' hook: tell the test through `fd`, then never return. */
static inline void fb_stall(int fd) {
    ssize_t r = write(fd, "x", 1);
    (void)r;
    for (;;) pause();
}
#endif

#endif
