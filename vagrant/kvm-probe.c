/* How fast does this machine's KVM run guest code? Tiny guests time a dec/jnz loop in real mode,
 * in 64-bit kernel mode (CPL 0) and in 64-bit user mode (CPL 3), and enter protected mode as
 * Linux's setup code does. With hardware virtualization every loop takes about a nanosecond per
 * iteration; a software KVM such as kvm_pvm interprets kernel-mode code (microseconds per
 * iteration), which is why a stock kernel does not boot on it (docs/testing.md, "Vagrant").
 *
 *   gcc -O1 -o /tmp/kvm-probe vagrant/kvm-probe.c && sudo /tmp/kvm-probe
 *
 * The CPL 3 guest ends in a SHUTDOWN exit (its hlt faults with no IDT): that is expected. */
#include <fcntl.h>
#include <linux/kvm.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <signal.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static void on_alarm(int s) { (void)s; }

struct guest {
    int vcpu;
    struct kvm_run *run;
    uint8_t *mem;
};

/* One VM with one vCPU and mem_size bytes of guest memory at guest address 0. */
static struct guest make_guest(size_t mem_size) {
    struct guest g;
    int kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
    if (kvm < 0) { perror("/dev/kvm"); exit(1); }
    int vm = ioctl(kvm, KVM_CREATE_VM, 0);
    g.mem = mmap(NULL, mem_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    struct kvm_userspace_memory_region region = {.slot = 0, .guest_phys_addr = 0, .memory_size = mem_size, .userspace_addr = (uint64_t)g.mem};
    if (vm < 0 || ioctl(vm, KVM_SET_USER_MEMORY_REGION, &region) < 0) { perror("KVM_CREATE_VM"); exit(1); }
    g.vcpu = ioctl(vm, KVM_CREATE_VCPU, 0);
    int run_size = ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0);
    g.run = mmap(NULL, run_size, PROT_READ | PROT_WRITE, MAP_SHARED, g.vcpu, 0);
    return g;
}

/* Runs the guest until it halts or stops otherwise, printing each exit and when it came. */
static int run_guest(const char *name, struct guest g, unsigned timeout_s) {
    struct kvm_run *r = g.run;
    double t0 = now();
    for (;;) {
        alarm(timeout_s);
        int rc = ioctl(g.vcpu, KVM_RUN, 0);
        alarm(0);
        if (rc < 0) {
            printf("%-28s no exit in %u s (still running in the kernel)\n", name, timeout_s);
            return 1;
        }
        if (r->exit_reason == KVM_EXIT_IO) {
            char c = *((char *)r + r->io.data_offset);
            printf("%-28s exit IO port 0x%x value '%c' at %.3f s\n", name, r->io.port, c, now() - t0);
        } else if (r->exit_reason == KVM_EXIT_HLT) {
            printf("%-28s exit HLT at %.3f s\n", name, now() - t0);
            return 0;
        } else if (r->exit_reason == KVM_EXIT_SHUTDOWN) {
            printf("%-28s exit SHUTDOWN (a fault with no IDT) at %.3f s\n", name, now() - t0);
            return 0;
        } else {
            printf("%-28s exit reason %d (internal error suberror %u) at %.3f s\n", name, r->exit_reason,
                   r->exit_reason == KVM_EXIT_INTERNAL_ERROR ? r->internal.suberror : 0, now() - t0);
            return 1;
        }
    }
}

/* Real mode from 0x1000, with a flat GDT at 0x500 (null, code32, data32) for the mode switch. */
static int run(const char *name, const uint8_t *code, size_t len, int loops) {
    struct guest g = make_guest(0x100000);
    memcpy(g.mem + 0x1000, code, len);
    uint64_t gdt[3] = {0, 0x00cf9a000000ffffULL, 0x00cf92000000ffffULL};
    memcpy(g.mem + 0x500, gdt, sizeof gdt);
    struct kvm_sregs sregs;
    ioctl(g.vcpu, KVM_GET_SREGS, &sregs);
    sregs.cs.base = 0; sregs.cs.selector = 0;
    ioctl(g.vcpu, KVM_SET_SREGS, &sregs);
    struct kvm_regs regs = {.rip = 0x1000, .rflags = 2, .rcx = loops};
    ioctl(g.vcpu, KVM_SET_REGS, &regs);
    return run_guest(name, g, 20);
}

/* 64-bit mode from 0x10000, identity-mapped by one 2 MB user page; CPL 3 when user_cpl3. */
static int run_long(const char *name, const uint8_t *code, size_t len, long loops, int user_cpl3) {
    struct guest g = make_guest(0x200000);
    memcpy(g.mem + 0x10000, code, len);
    uint64_t *pml4 = (void *)(g.mem + 0x2000), *pdpt = (void *)(g.mem + 0x3000), *pd = (void *)(g.mem + 0x4000);
    pml4[0] = 0x3000 | 7; pdpt[0] = 0x4000 | 7; pd[0] = 0x0 | 0x87;
    struct kvm_sregs sregs;
    ioctl(g.vcpu, KVM_GET_SREGS, &sregs);
    sregs.cr3 = 0x2000; sregs.cr4 = 1 << 5; sregs.cr0 = 0x80050033; sregs.efer = 0x500;
    struct kvm_segment seg = {.base = 0, .limit = 0xffffffff, .selector = 1 << 3, .present = 1, .type = 11, .dpl = 0, .db = 0, .s = 1, .l = 1, .g = 1};
    sregs.cs = seg; seg.type = 3; seg.selector = 2 << 3; seg.l = 0; seg.db = 1;
    sregs.ds = sregs.es = sregs.fs = sregs.gs = sregs.ss = seg;
    if (user_cpl3) {
        sregs.cs.dpl = 3; sregs.cs.selector |= 3;
        sregs.ds.dpl = sregs.es.dpl = sregs.fs.dpl = sregs.gs.dpl = sregs.ss.dpl = 3;
        sregs.ss.selector |= 3; sregs.ds.selector |= 3;
    }
    if (ioctl(g.vcpu, KVM_SET_SREGS, &sregs) < 0) { perror("KVM_SET_SREGS"); return 1; }
    struct kvm_regs regs = {.rip = 0x10000, .rflags = 2, .rcx = loops, .rsp = 0x100000};
    ioctl(g.vcpu, KVM_SET_REGS, &regs);
    return run_guest(name, g, 60);
}

int main(void) {
    signal(SIGALRM, on_alarm);
    /* real mode: out 'R'; loop ecx times; out 'r'; hlt */
    const uint8_t real[] = {0xba, 0xf8, 0x03, 0xb0, 'R', 0xee, 0x66, 0x49, 0x75, 0xfc, 0xb0, 'r', 0xee, 0xf4};
    /* mov dx,0x3f8; mov al,'R'; out dx,al; L: dec ecx; jnz L; mov al,'r'; out dx,al; hlt */
    run("real mode, 1e6 loop", real, sizeof real, 1000000);
    /* real mode -> protected mode as Linux setup does: lgdt; set CR0.PE; far jmp to 32-bit code */
    const uint8_t prot[] = {
        0xfa,                               /* cli */
        0x0f, 0x01, 0x16, 0x30, 0x10,       /* lgdt [0x1030] */
        0x0f, 0x20, 0xc0,                   /* mov eax, cr0 */
        0x66, 0x83, 0xc8, 0x01,             /* or eax, 1 */
        0x0f, 0x22, 0xc0,                   /* mov cr0, eax */
        0x66, 0xea, 0x20, 0x10, 0x00, 0x00, 0x08, 0x00, /* jmp dword 0x08:0x1020 */
        0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90,
        /* 0x1020, 32-bit: */
        0xba, 0xf8, 0x03, 0x00, 0x00,       /* mov edx, 0x3f8 */
        0xb0, 'P',                          /* mov al, 'P' */
        0xee,                               /* out dx, al */
        0xf4,                               /* hlt */
        0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90,
        /* 0x1030: GDT pointer: limit 23, base 0x500 */
        0x17, 0x00, 0x00, 0x05, 0x00, 0x00,
    };
    run("real -> protected mode", prot, sizeof prot, 0);
    /* 64-bit: mov edx,0x3f8; mov al,'L'; out dx,al; L: dec rcx; jnz L; mov al,'l'; out dx,al; hlt */
    const uint8_t lm[] = {0xba, 0xf8, 0x03, 0x00, 0x00, 0xb0, 'L', 0xee, 0x48, 0xff, 0xc9, 0x75, 0xfb, 0xb0, 'l', 0xee, 0xf4};
    run_long("long mode, 1e7 loop", lm, sizeof lm, 10000000, 0);
    /* CPL 3: the loop only (an out would fault without IOPL); it ends in a fault or a hlt #GP */
    const uint8_t lm3[] = {0x48, 0xff, 0xc9, 0x75, 0xfb, 0xf4};
    run_long("long mode CPL3, 1e9 loop", lm3, sizeof lm3, 1000000000, 1);
    return 0;
}
