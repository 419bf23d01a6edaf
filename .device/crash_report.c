// .device/crash_report.c: where a process dies, in one line, for .device/cpu_crash.py (issue 30, point 6).
//
// Loaded with LD_PRELOAD (a C program) or ctypes.CDLL (a Python child, after faulthandler.enable()), its
// constructor installs a handler for SIGSEGV, SIGILL, SIGBUS and SIGFPE that writes to stderr:
//   crash_report: signal 11 code 128 addr 0x0 pc 0x7f.. in /path/libggml-cpu.so.0 (+0x4a2f0) near ggml_graph_compute
//   crash_report: AMX permission xcomp_perm=0x602e7 xcomp_supp=0x602e7     (arch_prctl ARCH_GET_XCOMP_PERM/SUPP)
//   crash_report: openmp 7f..-7f.. r-xp ... /usr/lib/x86_64-linux-gnu/libgomp.so.1   (each OpenMP runtime mapped)
// then the glibc backtrace, then it restores the handler that was there before and returns: the faulting
// instruction runs again and faults into that handler (Python's faulthandler prints the Python stack; the default
// action ends the process with the same signal). code 128 (SI_KERNEL) on SIGSEGV is a general-protection fault
// (a misaligned aligned vector load, a bad AMX tile configuration), 1/2 (SEGV_MAPERR/ACCERR) a bad pointer.
// The library offset goes to `addr2line -f -C -e LIB OFFSET` for the function's name in an unstripped build.
//
// Build: cc -shared -fPIC -O1 -o crash_report.so crash_report.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define ARCH_GET_XCOMP_SUPP 0x1021
#define ARCH_GET_XCOMP_PERM 0x1022
#define ALT_STACK_BYTES (256 * 1024)  // signal frames with AMX tile state are ~11 KB: room for that and more

static const int SIGNALS[] = {SIGSEGV, SIGILL, SIGBUS, SIGFPE};
#define N_SIGNALS (sizeof(SIGNALS) / sizeof(SIGNALS[0]))
static struct sigaction previous[N_SIGNALS];
static char alt_stack[ALT_STACK_BYTES];

static void say(const char *text) {
    ssize_t unused = write(2, text, strlen(text));
    (void) unused;
}

void crash_report_amx(void) {  // also called by cpu_crash.py's `facts`
    unsigned long long perm = 0, supp = 0;
    long rc_perm = syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &perm);
    long rc_supp = syscall(SYS_arch_prctl, ARCH_GET_XCOMP_SUPP, &supp);
    char line[160];
    snprintf(line, sizeof line, "crash_report: AMX permission xcomp_perm=%#llx (rc %ld) xcomp_supp=%#llx (rc %ld)\n",
             perm, rc_perm, supp, rc_supp);
    say(line);
}

static void openmp_runtimes(void) {  // the maps lines of every OpenMP runtime (libgomp, libomp, libiomp5)
    char buf[8192], line[512];
    size_t used = 0;
    int fd = open("/proc/self/maps", O_RDONLY);
    if (fd < 0) {
        return;
    }
    ssize_t got;
    while ((got = read(fd, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < got; i++) {
            if (buf[i] != '\n' && used < sizeof line - 2) {
                line[used++] = buf[i];
                continue;
            }
            line[used] = '\0';
            if (strstr(line, "omp") && strstr(line, "r-xp")) {
                say("crash_report: openmp ");
                say(line);
                say("\n");
            }
            used = 0;
        }
    }
    close(fd);
}

static void on_fault(int sig, siginfo_t *info, void *context) {
    ucontext_t *uc = (ucontext_t *) context;
    uintptr_t pc = (uintptr_t) uc->uc_mcontext.gregs[REG_RIP];
    Dl_info where = {0};
    dladdr((void *) pc, &where);
    char line[768];
    snprintf(line, sizeof line, "crash_report: signal %d code %d addr %p pc %#lx in %s (+%#lx) near %s thread %ld\n",
             sig, info->si_code, info->si_addr, (unsigned long) pc, where.dli_fname ? where.dli_fname : "?",
             (unsigned long) (pc - (uintptr_t) where.dli_fbase), where.dli_sname ? where.dli_sname : "?",
             (long) syscall(SYS_gettid));
    say(line);
    crash_report_amx();
    openmp_runtimes();
    void *frames[48];
    int n = backtrace(frames, 48);
    backtrace_symbols_fd(frames, n, 2);
    for (size_t i = 0; i < N_SIGNALS; i++) {
        if (SIGNALS[i] == sig) {
            sigaction(sig, &previous[i], NULL);  // returning re-runs the instruction: it faults into that one
        }
    }
}

__attribute__((constructor)) static void install(void) {
    void *warm[2];
    backtrace(warm, 2);  // loads libgcc_s now, not inside the handler
    stack_t ss = {.ss_sp = alt_stack, .ss_size = sizeof alt_stack, .ss_flags = 0};
    sigaltstack(&ss, NULL);  // this thread's; a stack overflow elsewhere still shows as a plain SIGSEGV
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < N_SIGNALS; i++) {
        sigaction(SIGNALS[i], &sa, &previous[i]);
    }
}
