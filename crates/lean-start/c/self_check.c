/*
 * The process start-up's invariants, checked from inside the running process
 * (`interlock-cni --self-check`). They hold after glibc's own static start-up and must
 * hold after the lean one (lean_start.c), which is what the tests compare:
 *
 * - start-up:      which start-up ran (lean_start.c marks itself);
 * - tls:           the thread pointer points at its own control block, and a thread-local
 *                  variable sits below it and reads back what was written;
 * - stack-guard:   %fs:0x28 is the kernel's AT_RANDOM first word, low byte cleared;
 * - pointer-guard: %fs:0x30 is AT_RANDOM's second word;
 * - irelative:     every IRELATIVE slot holds what its resolver returns;
 * - relro:         the RELRO segment is mapped read-only;
 * - clock:         CLOCK_MONOTONIC does not go back, CLOCK_REALTIME is a current date.
 *
 * x86-64 glibc only (the offsets are that ABI's). Compiled with ordinary flags: it runs
 * after the start-up.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <link.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/auxv.h>
#include <time.h>

extern int interlock_lean_start_ran __attribute__((weak));
extern const ElfW(Rela) __rela_iplt_start[] __attribute__((weak));
extern const ElfW(Rela) __rela_iplt_end[] __attribute__((weak));

static __thread volatile int tls_probe = 42;

struct report {
    char *out;
    size_t cap;
    size_t len;
    int failures;
};

static void say(struct report *r, int ok, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void say(struct report *r, int ok, const char *name, const char *fmt, ...) {
    if (!ok)
        r->failures++;
    if (r->len >= r->cap)
        return;
    int n = snprintf(r->out + r->len, r->cap - r->len, "%-4s  %-13s  ", ok ? "ok" : "FAIL", name);
    if (n > 0)
        r->len += (size_t)n;
    if (r->len >= r->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    n = vsnprintf(r->out + r->len, r->cap - r->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        r->len += (size_t)n;
    if (r->len + 1 < r->cap) {
        r->out[r->len++] = '\n';
        r->out[r->len] = '\0';
    }
}

/* Whether every page of [start, end) is mapped without write permission. */
static int read_only(uintptr_t start, uintptr_t end) {
    FILE *maps = fopen("/proc/self/maps", "re");
    if (maps == NULL)
        return -1;
    char line[512];
    uintptr_t covered = start;
    int writable = 0;
    while (fgets(line, sizeof line, maps) != NULL) {
        unsigned long lo, hi;
        char perms[5];
        if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) != 3)
            continue;
        if (hi <= start || lo >= end)
            continue;
        if (perms[1] == 'w')
            writable = 1;
        if (lo <= covered && hi > covered)
            covered = hi;
    }
    fclose(maps);
    return !writable && covered >= end;
}

int interlock_start_up_self_check(char *out, size_t cap) {
    struct report r = {out, cap, 0, 0};
    if (cap > 0)
        out[0] = '\0';

    int lean = &interlock_lean_start_ran != NULL && interlock_lean_start_ran == 1;
    say(&r, 1, "start-up", "%s",
        lean ? "interlock's lean start-up ran (glibc 2.36's steps without CPU identification)"
             : "glibc's own start-up ran");

    uintptr_t tp;
    __asm__ volatile("movq %%fs:0, %0" : "=r"(tp));
    int tls = tp != 0 && *(const uintptr_t *)tp == tp && (uintptr_t)&tls_probe < tp &&
              tls_probe == 42;
    tls_probe = 43;
    tls = tls && tls_probe == 43;
    say(&r, tls, "tls", "thread pointer %#lx points at itself, a thread-local reads back",
        (unsigned long)tp);

    const uintptr_t *random = (const uintptr_t *)getauxval(AT_RANDOM);
    uintptr_t stack_guard, pointer_guard;
    __asm__ volatile("movq %%fs:0x28, %0" : "=r"(stack_guard));
    __asm__ volatile("movq %%fs:0x30, %0" : "=r"(pointer_guard));
    say(&r, random != NULL && stack_guard == (random[0] & ~(uintptr_t)0xff), "stack-guard",
        "%s", "%fs:0x28 is AT_RANDOM's first word with its low byte cleared");
    say(&r, random != NULL && pointer_guard == random[1], "pointer-guard", "%s",
        "%fs:0x30 is AT_RANDOM's second word");

    size_t slots = 0, wrong = 0;
    if (__rela_iplt_start != NULL && __rela_iplt_end != NULL) {
        for (const ElfW(Rela) *rel = __rela_iplt_start; rel < __rela_iplt_end; rel++) {
            slots++;
            if (ELF64_R_TYPE(rel->r_info) != R_X86_64_IRELATIVE) {
                wrong++;
                continue;
            }
            ElfW(Addr) (*resolver)(void) = (ElfW(Addr)(*)(void))rel->r_addend;
            if (*(const ElfW(Addr) *)rel->r_offset != resolver())
                wrong++;
        }
    }
    if (slots == 0)
        say(&r, 1, "irelative", "%s", "no IRELATIVE relocations (not a static binary)");
    else
        say(&r, wrong == 0, "irelative", "%zu of %zu IRELATIVE slots hold what their resolver returns",
            slots - wrong, slots);

    const ElfW(Phdr) *phdr = (const ElfW(Phdr) *)getauxval(AT_PHDR);
    size_t phnum = (size_t)getauxval(AT_PHNUM);
    uintptr_t bias = 0;
    int have_bias = 0;
    for (size_t i = 0; phdr != NULL && i < phnum; i++)
        if (phdr[i].p_type == PT_PHDR) {
            bias = (uintptr_t)phdr - phdr[i].p_vaddr;
            have_bias = 1;
        }
    for (size_t i = 0; phdr != NULL && !have_bias && i < phnum; i++)
        if (phdr[i].p_type == PT_LOAD && phdr[i].p_offset == 0) {
            bias = (uintptr_t)phdr - sizeof(ElfW(Ehdr)) - phdr[i].p_vaddr;
            have_bias = 1;
        }
    int relro_seen = 0;
    uintptr_t page = (uintptr_t)getauxval(AT_PAGESZ);
    for (size_t i = 0; phdr != NULL && page != 0 && i < phnum; i++) {
        if (phdr[i].p_type != PT_GNU_RELRO)
            continue;
        relro_seen = 1;
        uintptr_t start = (bias + phdr[i].p_vaddr) & ~(page - 1);
        uintptr_t end = (bias + phdr[i].p_vaddr + phdr[i].p_memsz) & ~(page - 1);
        if (start == end) {
            say(&r, 1, "relro", "%s", "the RELRO segment is under a page: nothing to protect");
            continue;
        }
        int ro = read_only(start, end);
        say(&r, ro == 1, "relro", "%#lx-%#lx %s", (unsigned long)start, (unsigned long)end,
            ro == 1 ? "is read-only" : ro == 0 ? "is WRITABLE" : "cannot be read from /proc/self/maps");
    }
    if (!relro_seen)
        say(&r, 1, "relro", "%s", "no RELRO segment");

    struct timespec a, b, now;
    int clock = clock_gettime(CLOCK_MONOTONIC, &a) == 0 && clock_gettime(CLOCK_MONOTONIC, &b) == 0 &&
                clock_gettime(CLOCK_REALTIME, &now) == 0 &&
                (b.tv_sec > a.tv_sec || (b.tv_sec == a.tv_sec && b.tv_nsec >= a.tv_nsec)) &&
                now.tv_sec > 1700000000;
    say(&r, clock, "clock", "%s", "CLOCK_MONOTONIC does not go back, CLOCK_REALTIME is after 2023");

    return r.failures;
}
