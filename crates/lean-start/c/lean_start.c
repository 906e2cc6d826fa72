/*
 * interlock-cni's process start-up for the shipped static build (feature `lean-start` of
 * interlock-cni and of this crate; the build script builds it only against the glibc
 * objects pinned in glibc.pin).
 *
 * Why: a statically linked glibc program identifies the CPU before `main`: glibc 2.36's
 * `__libc_start_main` runs 43 `cpuid` instructions (CPU features, then cache sizes for
 * the string functions). On a virtual machine, where most nodes run, every `cpuid` exits
 * to the hypervisor, which makes the CPU identification a large share of the plugin's
 * process start, paid by every pod's ADD and DEL. This file provides `__libc_start_main`
 * instead of glibc's (the linker then never takes glibc's `libc-start.o`) and runs the
 * same start-up steps in the same order, without identifying the CPU.
 *
 * What changes for the process:
 * - glibc's string functions (IFUNCs) resolve to their baseline x86-64 (SSE2) variants:
 *   with the CPU feature table left empty, every resolver takes its fallback. Correct on
 *   every x86-64 CPU; a little slower on large copies, which the plugin does not make.
 * - the cache sizes the string functions consult are glibc's own defaults (below).
 * - `pthread_exit` from the main thread is not supported (glibc arms an unwind buffer
 *   for it; the plugin never calls it, and Rust's std has no way to).
 * - the program's directory is not looked up (`_dl_get_origin` below).
 * - the dynamic loader's state that only `dlopen` uses is not set up, and the vDSO is not
 *   used: clock reads are system calls (`init_first` below).
 * Everything else (TLS, stack and pointer guards, tunables, IRELATIVE relocations, libc
 * and program initialisers, atexit/fini handling) happens as in glibc's own start-up.
 *
 * The sequence is glibc 2.36's (Debian 12, the image's build stage): another glibc may
 * order or name its internal steps differently, so any other version is refused at
 * compile time, and the build script refuses any libc.a whose start-up objects are not
 * the pinned ones. `interlock-cni --self-check` (self_check.c) checks the invariants
 * this start-up must establish.
 *
 * Compiled with the flags in c/cflags (-ffreestanding, -fno-builtin,
 * -fno-stack-protector, …): before the IRELATIVE relocations are applied no string
 * function may be called, and before TLS exists no stack canary may be read.
 */
#include <elf.h>
#include <features.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#if !defined(__x86_64__) || !defined(__GLIBC__) || __GLIBC__ != 2 || __GLIBC_MINOR__ != 36
#error "lean-start mirrors glibc 2.36's static start-up on x86-64 only; build interlock-cni without the lean-start feature"
#endif

/* glibc internals the start-up calls (all in libc.a). */
extern char **__environ;
extern void *__libc_stack_end;
extern int __libc_enable_secure;
extern void *_dl_random;
extern void _dl_aux_init(ElfW(auxv_t) *auxv);
extern void __tunables_init(char **env);
extern void _dl_relocate_static_pie(void);
extern void __libc_setup_tls(void);
extern void __libc_early_init(_Bool initial);
extern void __libc_init_first(int argc, char **argv, char **env);
extern int __libc_argc;
extern char **__libc_argv;
extern void __init_misc(int argc, char **argv, char **env);
extern const ElfW(Phdr) *_dl_phdr;
extern size_t _dl_phnum;
extern size_t _dl_pagesize;
extern int _dl_stack_flags;
extern void __libc_check_standard_fds(void);
extern void *_dl_debug_initialize(ElfW(Addr) ldbase, long ns);
extern void __libc_fatal(const char *msg) __attribute__((noreturn));
extern void __pthread_initialize_minimal(void) __attribute__((weak));
extern int __cxa_atexit(void (*fn)(void *), void *arg, void *dso);
extern void exit(int status) __attribute__((noreturn));

/* Provided by the linker. */
extern const ElfW(Ehdr) __ehdr_start __attribute__((weak, visibility("hidden")));
extern const ElfW(Rela) __rela_iplt_start[] __attribute__((weak));
extern const ElfW(Rela) __rela_iplt_end[] __attribute__((weak));
typedef void (*interlock_init_fn)(int, char **, char **);
extern interlock_init_fn __preinit_array_start[], __preinit_array_end[];
extern interlock_init_fn __init_array_start[], __init_array_end[];
extern void (*__fini_array_start[])(void);
extern void (*__fini_array_end[])(void);
extern void _init(void);
extern void _fini(void);

/*
 * The string functions' tuning variables, defined by glibc's libc-start.o next to its
 * start-up (so they must be defined here, or the linker would take that object too).
 * glibc fills them from the cache sizes it asks the CPU for; these are its defaults for a
 * CPU it cannot identify (32 KiB L1d, 1 MiB shared), with the non-temporal threshold at
 * 3/4 of the shared size as glibc computes it.
 */
long int __x86_data_cache_size_half = 32 * 1024 / 2;
long int __x86_data_cache_size = 32 * 1024;
long int __x86_shared_cache_size_half = 1024 * 1024 / 2;
long int __x86_shared_cache_size = 1024 * 1024;
long int __x86_shared_non_temporal_threshold = 1024 * 1024 * 3 / 4;
long int __x86_rep_movsb_threshold = 2048;
long int __x86_rep_stosb_threshold = 2048;
long int __x86_rep_movsb_stop_threshold = 1024 * 1024 * 3 / 4;
int __x86_string_control;

/*
 * glibc's loader set-up (`_dl_non_dynamic_init`, now run only on a set-uid start, see
 * `init_first`) asks where the program lives (for `$ORIGIN` in the paths of a library a
 * static program dlopens) by reading the /proc/self/exe link, a procfs lookup. The plugin
 * never loads a library; (char *)-1 is glibc's own answer when the link cannot be read,
 * and a `$ORIGIN` path element is then skipped. Defining the function here keeps glibc's
 * (dl-origin.o) out of the binary.
 */
const char *_dl_get_origin(void) { return (const char *)-1; }

/*
 * glibc's `__libc_init_first` for a static program: record argc/argv, run the dynamic
 * loader's `_dl_non_dynamic_init`, then `__init_misc` (the program name). Most of
 * `_dl_non_dynamic_init` prepares `dlopen`, which the plugin never calls: the library
 * search paths, the LD_* variables, the object table for `_dl_find_object`, and a loader
 * object for the vDSO through which glibc then finds the vDSO's clock functions.
 * Kept, in glibc's order: the stack permissions from PT_GNU_STACK (for thread stacks)
 * and RELRO (the relocated read-only data, IRELATIVE slots included, made read-only).
 *
 * Without the vDSO, `clock_gettime` is a system call, slower per read; but a plugin
 * process reads the clock a dozen times in its life, and the vDSO's first use would
 * fault in its code and data pages, which costs more than those system calls.
 *
 * Unlike glibc's, `dl_iterate_phdr` and `_dl_find_object` do not know the program's
 * headers afterwards, so an unwinder finds no frames: the plugin aborts on panic and
 * never unwinds. A set-uid start (glibc scrubs the LD_* variables then) and a binary
 * without `__ehdr_start` take glibc's own path.
 */
static void init_first(int argc, char **argv) {
    if (__libc_enable_secure || &__ehdr_start == NULL) {
        __libc_init_first(argc, argv, __environ);
        return;
    }
    __libc_argc = argc;
    __libc_argv = argv;
    /* Where the program was loaded: its ELF header's address less the vaddr of the
     * segment that maps file offset 0 (zero unless position independent). */
    ElfW(Addr) bias = 0;
    for (size_t i = 0; i < _dl_phnum; i++)
        if (_dl_phdr[i].p_type == PT_LOAD && _dl_phdr[i].p_offset == 0)
            bias = (ElfW(Addr))&__ehdr_start - _dl_phdr[i].p_vaddr;
    for (size_t i = 0; i < _dl_phnum; i++) {
        const ElfW(Phdr) *ph = &_dl_phdr[i];
        if (ph->p_type == PT_GNU_STACK) {
            _dl_stack_flags = (int)ph->p_flags;
        } else if (ph->p_type == PT_GNU_RELRO) {
            ElfW(Addr) start = (bias + ph->p_vaddr) & ~(_dl_pagesize - 1);
            ElfW(Addr) end = (bias + ph->p_vaddr + ph->p_memsz) & ~(_dl_pagesize - 1);
            if (start != end && mprotect((void *)start, end - start, PROT_READ) != 0)
                __libc_fatal("interlock-cni: cannot apply additional memory protection after "
                             "relocation\n");
        }
    }
    __init_misc(argc, argv, __environ);
}

/* Set first thing in `__libc_start_main`: the self-check (self_check.c) reports which
 * start-up ran from it. */
__attribute__((used)) int interlock_lean_start_ran;

static void run_fini_array(void *unused) {
    (void)unused;
    size_t i = (size_t)(__fini_array_end - __fini_array_start);
    while (i-- > 0)
        __fini_array_start[i]();
    _fini();
}

static void run_init_array(interlock_init_fn *start, interlock_init_fn *end, int argc,
                           char **argv) {
    for (interlock_init_fn *f = start; f < end; f++)
        (*f)(argc, argv, __environ);
}

__attribute__((noreturn, used)) int __libc_start_main(int (*main)(int, char **, char **),
                                                      int argc, char **argv,
                                                      void (*init)(void), void (*fini)(void),
                                                      void (*rtld_fini)(void),
                                                      void *stack_end) {
    /* Since glibc 2.34 `_start` passes neither. */
    (void)init;
    (void)fini;
    interlock_lean_start_ran = 1;

    /* The environment follows argv; the auxiliary vector follows the environment. */
    char **env = &argv[argc + 1];
    __environ = env;
    __libc_stack_end = stack_end;
    char **end_of_env = env;
    while (*end_of_env != NULL)
        end_of_env++;
    _dl_aux_init((ElfW(auxv_t) *)(end_of_env + 1));
    __tunables_init(__environ);

    /* Here glibc identifies the CPU; the feature table stays empty instead. */

    _dl_relocate_static_pie();
    for (const ElfW(Rela) *r = __rela_iplt_start; r < __rela_iplt_end; r++) {
        if (ELF64_R_TYPE(r->r_info) != R_X86_64_IRELATIVE)
            __libc_fatal("interlock-cni: unexpected relocation type in a static binary\n");
        ElfW(Addr) (*resolver)(void) = (ElfW(Addr)(*)(void))r->r_addend;
        *(ElfW(Addr) *)r->r_offset = resolver();
    }

    __libc_setup_tls();
    /* The stack guard (low byte zero, as glibc makes it) and the pointer guard, both from
     * the kernel's AT_RANDOM bytes, into the thread control block (x86-64 ABI offsets). */
    const uintptr_t *random = _dl_random;
    uintptr_t stack_guard = random[0] & ~(uintptr_t)0xff;
    __asm__ volatile("movq %0, %%fs:0x28" : : "r"(stack_guard));
    if (__pthread_initialize_minimal != NULL)
        __pthread_initialize_minimal();
    uintptr_t pointer_guard = random[1];
    __asm__ volatile("movq %0, %%fs:0x30" : : "r"(pointer_guard));

    if (rtld_fini != NULL)
        __cxa_atexit((void (*)(void *))rtld_fini, NULL, NULL);
    __libc_early_init(1);
    init_first(argc, argv);
    __cxa_atexit(run_fini_array, NULL, NULL);
    if (__libc_enable_secure)
        __libc_check_standard_fds();

    run_init_array(__preinit_array_start, __preinit_array_end, argc, argv);
    _init();
    run_init_array(__init_array_start, __init_array_end, argc, argv);
    _dl_debug_initialize(0, 0);

    exit(main(argc, argv, __environ));
}
