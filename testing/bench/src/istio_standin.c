/*
 * A stand-in for istio-cni's way of installing a pod's redirection: the baseline of
 * the "a meshed ADD >= 5x faster" budget (docs/performance.md), with each side paying
 * its process start. Exec'd by the bench exactly as interlock-cni is (environment,
 * stdin, pipes; timed from spawn to exit), it reads its CNI config from stdin, enters the
 * pod's network namespace (CNI_NETNS) and runs `iptables-restore --noflush` once per
 * family there, fed the rules interlock installs, waiting for each. istio-cni does the
 * same from a Go binary, which starts slower than this static C one: the baseline is a
 * lower bound of istio-cni's cost, so ratios against it favour istio.
 *
 * STANDIN_JOBS, a path fixed at compile time, lists one job per line: the restore tool,
 * a tab, the file holding its input.
 *
 * As a chained plugin under a real runtime (`interlock-bench sandbox`) it answers ADD
 * with its prevResult, as istio-cni returns the previous result unchanged, and DEL and
 * CHECK with nothing (istio-cni's DEL does no netns work).
 *
 * Built with CHAINED_NOOP instead, it is the chained no-op of that bench: it reads its
 * config and answers ADD with its prevResult, and does nothing else (no netns, no
 * restore), so a runtime's start with it costs what chaining any plugin costs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#if !defined(STANDIN_JOBS) && !defined(CHAINED_NOOP)
#error "STANDIN_JOBS (the job list's path) must be defined"
#endif

extern char **environ;

/* All of `fd`, NUL-terminated, or NULL. */
static char *slurp_fd(int fd, size_t *len) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (buf == NULL)
            return NULL;
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            free(buf);
            return NULL;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n == cap) {
            cap *= 2;
            char *bigger = realloc(buf, cap + 1);
            if (bigger == NULL)
                free(buf);
            buf = bigger;
        }
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int fail(const char *what) {
    fprintf(stderr, "istio-cni stand-in: %s: %s\n", what, strerror(errno));
    return 1;
}

#ifndef CHAINED_NOOP
static char *slurp(const char *path, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    char *buf = slurp_fd(fd, len);
    close(fd);
    return buf;
}

/* Runs `tool --noflush` with `input` on its stdin; 0 when it exits 0. */
static int restore(char *tool, const char *input, size_t len) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return fail("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[0], 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    char *argv[] = {tool, "--noflush", NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, tool, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(p[0]);
    if (rc != 0) {
        close(p[1]);
        errno = rc;
        return fail(tool);
    }
    for (size_t off = 0; off < len;) {
        ssize_t w = write(p[1], input + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    close(p[1]);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return fail("waitpid");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "istio-cni stand-in: %s --noflush failed (wait status %d)\n", tool,
                status);
        return 1;
    }
    return 0;
}

#endif

/* Prints the object under the config's "prevResult" key (nothing when there is none):
 * the result a chained plugin that changes no interface returns. */
static int print_prev_result(const char *config) {
    const char *key = strstr(config, "\"prevResult\"");
    if (key == NULL)
        return 0;
    const char *p = key + strlen("\"prevResult\"");
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ':')
        p++;
    if (*p != '{')
        return 0;
    const char *start = p;
    int depth = 0, in_string = 0;
    for (; *p != '\0'; p++) {
        if (in_string) {
            if (*p == '\\' && p[1] != '\0')
                p++;
            else if (*p == '"')
                in_string = 0;
        } else if (*p == '"') {
            in_string = 1;
        } else if (*p == '{') {
            depth++;
        } else if (*p == '}' && --depth == 0) {
            p++;
            break;
        }
    }
    if (depth != 0) {
        fputs("istio-cni stand-in: prevResult is not a complete object\n", stderr);
        return 1;
    }
    if (fwrite(start, 1, (size_t)(p - start), stdout) != (size_t)(p - start) ||
        fflush(stdout) != 0)
        return fail("writing the result");
    return 0;
}

int main(void) {
    size_t len;
    /* The CNI config: read in full, as a plugin must. */
    char *config = slurp_fd(0, &len);
    if (config == NULL)
        return fail("reading stdin");
    const char *command = getenv("CNI_COMMAND");
    if (command != NULL && strcmp(command, "VERSION") == 0) {
        fputs("{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.3.0\",\"0.3.1\","
              "\"0.4.0\",\"1.0.0\"]}",
              stdout);
        return 0;
    }
    if (command != NULL && strcmp(command, "ADD") != 0)
        return 0;
#ifdef CHAINED_NOOP
    return print_prev_result(config);
#else
    const char *netns = getenv("CNI_NETNS");
    if (netns == NULL) {
        fputs("istio-cni stand-in: CNI_NETNS is not set\n", stderr);
        return 1;
    }
    int fd = open(netns, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0)
        return fail(netns);
    close(fd);
    char *jobs = slurp(STANDIN_JOBS, &len);
    if (jobs == NULL)
        return fail(STANDIN_JOBS);
    char *save = NULL;
    for (char *line = strtok_r(jobs, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        char *tab = strchr(line, '\t');
        if (tab == NULL) {
            fprintf(stderr, "istio-cni stand-in: %s: no tab in \"%s\"\n", STANDIN_JOBS, line);
            return 1;
        }
        *tab = '\0';
        char *input = slurp(tab + 1, &len);
        if (input == NULL)
            return fail(tab + 1);
        int rc = restore(line, input, len);
        free(input);
        if (rc != 0)
            return rc;
    }
    free(jobs);
    int rc = print_prev_result(config);
    free(config);
    return rc;
#endif
}
